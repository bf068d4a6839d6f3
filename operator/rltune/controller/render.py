"""Render a winning configuration as framework overrides, ready to paste.

twin / reference: the canonical knobs as `path=value`. verl and OpenRLHF: their own option names
(shared/REFERENCE.md section 6) where a canonical knob has a direct counterpart; knobs without one
stay canonical (prefixed `rltune.`) so nothing is silently lost.
"""

from __future__ import annotations

import json
from typing import Any

VERL = {
    "trainer.tp": "actor_rollout_ref.actor.megatron.tensor_model_parallel_size",
    "trainer.pp": "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size",
    "trainer.cp": "actor_rollout_ref.actor.megatron.context_parallel_size",
    "trainer.ep": "actor_rollout_ref.actor.megatron.expert_model_parallel_size",
    "trainer.microBatchTokens": "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
    "trainer.offload": "actor_rollout_ref.actor.fsdp_config.param_offload",
    "rollout.tp": "actor_rollout_ref.rollout.tensor_model_parallel_size",
    "rollout.gpuMemoryUtilization": "actor_rollout_ref.rollout.gpu_memory_utilization",
    "rollout.maxNumSeqs": "actor_rollout_ref.rollout.max_num_seqs",
    "rollout.maxNumBatchedTokens": "actor_rollout_ref.rollout.max_num_batched_tokens",
    "async.staleness": "async_training.staleness_threshold",
    "async.partialRollout": "async_training.partial_rollout",
}
OPENRLHF = {
    "trainer.microBatchTokens": "--train.max_tokens_per_gpu",
    "trainer.offload": "--ds.adam_offload",
    "rollout.tp": "--vllm.tensor_parallel_size",
    "rollout.gpuMemoryUtilization": "--vllm.gpu_memory_utilization",
    "async.partialRollout": "--train.partial_rollout_enable",
}


def _v(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (dict, list)):
        return json.dumps(v, separators=(",", ":"))
    return str(v)


def render_overrides(framework: str, changes: dict[str, Any]) -> list[str]:
    out = []
    for k in sorted(changes):
        v = changes[k]
        if framework == "verl":
            if k == "rollout.cudaGraphs":
                out.append(f"actor_rollout_ref.rollout.enforce_eager={_v(not v)}")
            elif k == "trainer.recompute":
                out.append(f"actor_rollout_ref.model.enable_gradient_checkpointing={_v(v != 'none')}")
            elif k == "placement":
                out.append(f"actor_rollout_ref.hybrid_engine={_v(v == 'colocated')}")
            elif k in VERL:
                out.append(f"{VERL[k]}={_v(v)}")
            else:
                out.append(f"rltune.{k}={_v(v)}")
        elif framework == "openrlhf":
            if k == "rollout.cudaGraphs":
                out.append(f"--vllm.enforce_eager={_v(not v)}")
            elif k == "placement":
                out.append(f"--train.colocate_all={_v(v == 'colocated')}")
            elif k == "async.staleness":
                out.append(f"--train.async_enable={_v(v > 0)}")
            elif k in OPENRLHF:
                out.append(f"{OPENRLHF[k]}={_v(v)}")
            else:
                out.append(f"rltune.{k}={_v(v)}")
        else:
            out.append(f"{k}={_v(v)}")
    return out
