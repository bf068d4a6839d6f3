"""Render a winning configuration as framework overrides, ready to paste.

twin / reference: the canonical knobs as `path=value`. verl and OpenRLHF: their own option names
(docs/references.md section 'Framework knobs and metric names') where a canonical knob has a direct
counterpart; knobs without one stay canonical (prefixed `rltune.`) so nothing is silently lost.
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


# Canonical knobs whose framework option is a transformed value (option name, value mapping).
SPECIAL = {
    "verl": {
        "rollout.cudaGraphs": ("actor_rollout_ref.rollout.enforce_eager", lambda v: not v),
        "trainer.recompute": ("actor_rollout_ref.model.enable_gradient_checkpointing", lambda v: v != "none"),
        "placement": ("actor_rollout_ref.hybrid_engine", lambda v: v == "colocated"),
    },
    "openrlhf": {
        "rollout.cudaGraphs": ("--vllm.enforce_eager", lambda v: not v),
        "placement": ("--train.colocate_all", lambda v: v == "colocated"),
        "async.staleness": ("--train.async_enable", lambda v: v > 0),
    },
}
NAMES = {"verl": VERL, "openrlhf": OPENRLHF}


def render_overrides(framework: str, changes: dict[str, Any]) -> list[str]:
    if framework not in NAMES:
        return [f"{k}={_v(changes[k])}" for k in sorted(changes)]
    special, names = SPECIAL[framework], NAMES[framework]
    out = []
    for k in sorted(changes):
        v = changes[k]
        if k in special:
            opt, conv = special[k]
            out.append(f"{opt}={_v(conv(v))}")
        elif k in names:
            out.append(f"{names[k]}={_v(v)}")
        else:
            out.append(f"rltune.{k}={_v(v)}")
    return out
