"""Hidden per-hardware efficiency factors of the simulated cluster (the twin's "truth").

These never leave the twin: the forecaster in rltune.tuner must learn its own corrections from
measurements. One set of factors per hardware family (not per calibration row); values were fitted by
bench/calibrate.py against the published measurements listed in docs/references.md (sections 'GPUs',
'Performance-model facts' and 'Published RL step measurements'; results in docs/calibration.md).
A job's `workload.scenario` may override any of them (docs/twin.md).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass(frozen=True)
class Efficiency:
    # --- rollout (vLLM) -------------------------------------------------------------------
    hbm: float = 0.80  # achieved fraction of HBM bandwidth in decode (docs/references.md 'GPUs': ~90% microbench)
    decode_compute: float = 0.45  # fraction of peak FLOPs reached by decode GEMMs/attention
    prefill_mfu: float = 0.55  # fraction of peak FLOPs reached by (chunked) prefill
    sched_overhead: float = 0.002  # s of engine CPU work per iteration (scheduler, sampling, TP workers)
    sched_per_seq: float = 3e-6  # s of engine CPU work per running sequence per iteration
    launch_overhead: float = 4e-6  # s per kernel launch without CUDA graphs (enforce_eager)
    kernels_per_layer: int = 14  # kernels per layer in one decode iteration
    graph_max_batch: int = 512  # largest batch with a captured CUDA graph (vLLM default)
    activation_reserve: float = 0.04  # fraction of HBM vLLM reserves for activations / graphs
    # --- collectives -------------------------------------------------------------------------
    nvlink: float = 0.70  # achieved fraction of NVLink bandwidth in collectives
    nic: float = 0.60  # achieved fraction of scale-out bandwidth (DeepEP over RDMA ~45-58 of 100 GB/s)
    allreduce_latency: float = 20e-6  # s per small all-reduce inside a node (vLLM custom all-reduce + sync)
    a2a_latency: float = 15e-6  # s per expert-parallel all-to-all
    # s per network hop of a small cross-node collective (NIC + switch + NCCL proxy); NCCL's tree
    # all-reduce takes ~2 log2(nodes) hops (docs/twin.md 'Rollout across nodes')
    net_latency: float = 8e-6
    # --- training (Megatron/FSDP) ------------------------------------------------------------
    train_mfu: float = 0.45  # MFU of big bf16 training GEMMs at ideal shapes
    # GEMM efficiency of forward-only log-prob passes relative to training's: the same GEMMs (on an
    # H200 their rate was the update's within 6%: bench/trainer_speed.py; docs/twin.md 'Forward
    # passes'). The H20 keeps its fitted 0.60 (its log-prob phases, below).
    fwd_ratio: float = 1.0
    moe_gemm_tokens: float = 256.0  # tokens per local expert at which grouped GEMMs reach half speed
    moe_width_half: float = 1024.0  # expert FFN width at which expert GEMMs (+ glue) reach half speed
    fp8_train_speedup: float = 1.4  # achieved FP8/BF16 training speed ratio (datasheet: 2x)
    mb_half_tokens: float = 1024.0  # micro-batch tokens at which GEMM efficiency halves
    fsdp_overlap: float = 0.7  # fraction of data-parallel gradient traffic hidden behind backward
    tp_overlap: float = 0.5  # fraction of TP traffic hidden behind GEMMs
    pcie_bw: float = 25e9  # bytes/s host<->device per GPU (offload, sleep/wake)
    cpu_adam_params_per_s: float = 1.5e9  # parameters per second per GPU of a CPU Adam step
    # What trainer.offload does: False, DeepSpeed's ZeRO-Offload (OpenRLHF --ds.adam_offload: Adam on the
    # CPU every optimizer step); True, verl's actor param/optimizer offload (the state leaves the GPU
    # between phases, Adam on the GPU; verl/workers/fsdp_workers.py update_actor)
    offload_swap: bool = False
    mini_batches: int = 4  # optimizer steps (PPO mini-batches) per RL step: each is a pipeline flush
    # HBM bytes per token x layer x hidden unit of an eager (FSDP, Hugging Face) layer's element-wise
    # kernels, at this hardware's achieved bandwidth, in a forward and in a forward + backward: measured
    # on an H200 (bench/trainer_speed.py, bench/data/trainer-speed-h200/; docs/twin.md 'Eager FSDP layers')
    eager_fwd_bytes: float = 355.0
    eager_train_bytes: float = 1175.0
    # Flash-attention kernels in training and log-prob passes: forward and backward speed relative to
    # train_mfu at long sequences, and the sequence length at which they reach half of it. Fitted to
    # the H200 runs (cuDNN SDPA, 128-wide heads: forward 0.611 and backward 0.445 of dense peak,
    # half speed at 980 tokens) over train_mfu 0.85 (docs/twin.md 'Attention kernels')
    attn_fwd_ratio: float = 0.719
    attn_bwd_ratio: float = 0.524
    attn_half_len: float = 980.0
    # --- weight sync ---------------------------------------------------------------------------
    ckpt_engine_eff: float = 0.235  # checkpoint-engine fraction of NIC bandwidth (verl: 30B 16->16 in 4.38 s)
    nccl_sync_ratio: float = 0.6  # NCCL broadcast bandwidth relative to checkpoint-engine
    disk_bw: float = 2.5e9  # bytes/s per node to/from shared storage
    colocated_sync_fixed: float = 1.5  # s fixed cost of a local resharding sync
    switch_fixed: float = 3.0  # s fixed cost of a colocated rollout<->train switch (sleep/wake)
    # --- workload ----------------------------------------------------------------------------
    tool_latency: float = 20.0  # s mean tool latency per turn when the task gives none
    tool_cv: float = 1.0
    obs_tokens: float = 1200.0  # mean tool-observation tokens appended per turn
    turns: float = 20.0  # mean turns per episode when the task gives none
    sandboxes: int = 512  # concurrent sandboxes when the task gives none
    prefix_caching: bool = True  # vLLM V1 default: re-use KV of earlier turns while cached
    warmup_gen_seconds: float = 25.0  # CUDA-graph capture / compile cost of the first step
    warmup_train_factor: float = 1.15
    # --- noise ---------------------------------------------------------------------------------
    noise: float = 0.025  # lognormal sigma of step-to-step speed noise
    straggler_prob: float = 0.02  # probability a node straggles in a step
    straggler_slowdown: float = 0.25  # mean extra slowdown of a straggling node
    # --- quality -------------------------------------------------------------------------------
    reward_start: float = 0.30
    reward_gain: float = 0.25
    reward_tau: float = 25.0  # steps of the learning curve
    # stretch of reward_tau per step of policy lag: 0.08 measured on the reference GRPO loop at a time
    # constant near reward_tau (bench/lag_penalty.py, lr 3e-4: 20.6 -> 22.2 steps; docs/tuner.md). It is
    # a regime property: at a 10-step time constant the same loop measured 0.72. Was an unsourced 0.35.
    lag_penalty: float = 0.08
    fp8_tau_stretch: float = 0.1  # stretch of reward_tau with an fp8 rollout (no public source pins it)
    reward_noise: float = 0.01
    mismatch_bf16: float = 0.005
    mismatch_fp8: float = 0.035
    mismatch_per_staleness: float = 0.012
    extra: dict = field(default_factory=dict)


# Per-hardware truth. Hopper parts reach a higher fraction of their (lower) peaks; H20 is so
# compute-starved that its GEMMs run near peak while its HBM is plentiful.
HARDWARE: dict[str, dict[str, Any]] = {
    # Fitted by `bench/calibrate.py --fit` within physical bounds (docs/calibration.md). B300 and the
    # NVL72 parts have no public RL/serving rows: B300 inherits B200's factors, GB200 B200's rollout
    # and GB300's training factors.
    "H100": dict(hbm=0.92, decode_compute=0.70, prefill_mfu=0.60, train_mfu=0.85),
    # H800 is the H100 die (only NVLink differs, which the catalog carries): the same factors.
    "H800": dict(hbm=0.92, decode_compute=0.70, prefill_mfu=0.60, train_mfu=0.85),
    # H200 is the H100 die too (same SMs, clocks and dense peak; larger, faster HBM): it trains like
    # the H100. Its train_mfu was the 0.50 prior until twin 0.3.3: no H200 training row reaches the
    # fit, and on a real H200 the trainer's GEMMs ran at 77% of the dense peak (bench/trainer_speed.py).
    "H200": dict(hbm=0.92, decode_compute=0.85, prefill_mfu=0.60, train_mfu=0.85),
    "H20": dict(hbm=0.60, decode_compute=0.387, prefill_mfu=0.525, train_mfu=0.85, fwd_ratio=0.60),
    "B200": dict(hbm=0.92, decode_compute=0.795, prefill_mfu=0.55, train_mfu=0.67),
    "B300": dict(hbm=0.92, decode_compute=0.795, prefill_mfu=0.55, train_mfu=0.67),
    "GB200": dict(hbm=0.92, decode_compute=0.795, prefill_mfu=0.55, train_mfu=0.778),
    "GB300": dict(hbm=0.92, decode_compute=0.795, prefill_mfu=0.55, train_mfu=0.778),
    "CPU": dict(),
}

# Scenario keys (docs/twin.md) that are aliases or scale factors rather than field names.
ALIASES = {
    "hbm_efficiency": "hbm",
    "comm_efficiency": None,  # scales nvlink and nic
    "mfu_scale": None,  # scales train_mfu, prefill_mfu and decode_compute
    "noise": "noise",
}


def efficiency(gpu_type: str, scenario: Optional[dict] = None) -> Efficiency:
    base = dict(HARDWARE.get(gpu_type, {}))
    fields = {f.name for f in dataclasses.fields(Efficiency)}
    extra = {}
    scale_mfu = 1.0
    scale_comm = 1.0
    for k, v in (scenario or {}).items():
        if k == "mfu_scale":
            scale_mfu = float(v)
        elif k == "comm_efficiency":
            scale_comm = float(v)
        elif k in ALIASES and ALIASES[k]:
            base[ALIASES[k]] = v
        elif k in fields and k != "extra":
            base[k] = v
        else:
            extra[k] = v
    eff = Efficiency(**base, extra=extra)
    if scale_mfu != 1.0 or scale_comm != 1.0:
        eff = dataclasses.replace(
            eff,
            train_mfu=min(0.95, eff.train_mfu * scale_mfu),
            prefill_mfu=min(0.95, eff.prefill_mfu * scale_mfu),
            decode_compute=min(0.95, eff.decode_compute * scale_mfu),
            nvlink=min(0.98, eff.nvlink * scale_comm),
            nic=min(0.98, eff.nic * scale_comm),
        )
    return eff


# --------------------------------------------------------------------------- scenario validation
# Scenario keys that are not Efficiency fields but are read from `Efficiency.extra` (docs/twin.md).
EXTRA_KEYS: dict[str, type] = {
    "gpus": int,
    "reference_policy": bool,
    "rollout_logprobs": bool,
    "train_fp8": bool,
    "fsdp": bool,
    "length_cv": float,
    "prompt_mean_tokens": float,
}
# Ranges of numeric keys, (low, high, low inclusive): a factor outside them is not a cluster, it is a
# typo (a percent for a fraction, a negative time). Keys not listed must be >= 0.
_FRACTION = (0.0, 1.0, False)  # (0, 1]
_PROBABILITY = (0.0, 1.0, True)  # [0, 1]
_POSITIVE = (0.0, None, False)  # > 0
_RANGES: dict[str, tuple[float, Optional[float], bool]] = {
    **dict.fromkeys(
        (
            "hbm",
            "hbm_efficiency",
            "decode_compute",
            "prefill_mfu",
            "nvlink",
            "nic",
            "train_mfu",
            "fwd_ratio",
            "ckpt_engine_eff",
        ),
        _FRACTION,
    ),
    **dict.fromkeys(("net_latency",), _POSITIVE),
    **dict.fromkeys(("straggler_prob", "fsdp_overlap", "tp_overlap"), _PROBABILITY),
    "activation_reserve": (0.0, 0.5, True),
    **dict.fromkeys(
        (
            "mfu_scale",
            "comm_efficiency",
            "moe_gemm_tokens",
            "moe_width_half",
            "fp8_train_speedup",
            "mb_half_tokens",
            "pcie_bw",
            "cpu_adam_params_per_s",
            "nccl_sync_ratio",
            "disk_bw",
            "turns",
            "reward_tau",
            "warmup_train_factor",
            "length_cv",
            "prompt_mean_tokens",
        ),
        _POSITIVE,
    ),
    **dict.fromkeys(("kernels_per_layer", "graph_max_batch", "mini_batches", "sandboxes", "gpus"), (1.0, None, True)),
    **dict.fromkeys(("reward_start", "reward_gain"), (float("-inf"), None, True)),  # any number
}


def scenario_keys() -> dict[str, type]:
    """Every key `workload.scenario` may hold -> its type (float keys accept integers too)."""
    types = {"int": int, "float": float, "bool": bool}
    out = {
        f.name: types[f.type] if isinstance(f.type, str) else f.type
        for f in dataclasses.fields(Efficiency)
        if f.name != "extra"
    }
    out |= {"hbm_efficiency": float, "comm_efficiency": float, "mfu_scale": float}
    return out | EXTRA_KEYS


def check_scenario(scenario: Any) -> list[str]:
    """What is wrong with a job's `workload.scenario`, each as 'spec.workload.scenario.<key>: what + fix'.

    The twin reads the scenario as numbers deep inside a trial; a string where a number belongs
    would crash every trial with a TypeError, and an unknown key would be silently ignored."""
    if scenario is None:
        return []
    if not isinstance(scenario, dict):
        return [f"spec.workload.scenario: must be a map of efficiency factor -> value, not {type(scenario).__name__}"]
    import difflib

    known = scenario_keys()
    out = []
    for key, value in scenario.items():
        where = f"spec.workload.scenario.{key}"
        want = known.get(key)
        if want is None:
            near = difflib.get_close_matches(str(key), known, n=1)
            hint = (
                f"did you mean {near[0]}? (all keys: docs/twin.md, 'Scenario keys')"
                if near
                else f"the keys are the twin's efficiency factors: {', '.join(sorted(known))} (docs/twin.md)"
            )
            out.append(f"{where}: unknown key: {hint}")
            continue
        if want is bool:
            if not isinstance(value, bool):
                out.append(f"{where}: must be true or false, not {value!r}")
            continue
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or (want is int and not isinstance(value, int))
        ):
            kind = "an integer" if want is int else "a number"
            out.append(
                f"{where}: must be {kind}, not {value!r}"
                + (" (write it without quotes)" if isinstance(value, str) else "")
            )
            continue
        lo, hi, lo_incl = _RANGES.get(key, (0.0, None, True))
        if value != value or (value < lo if lo_incl else value <= lo) or (hi is not None and value > hi):
            rng = f"{'>=' if lo_incl else '>'} {lo:g}" + (f" and <= {hi:g}" if hi is not None else "")
            hint = " (a fraction, e.g. 0.8, not a percent)" if hi == 1.0 and value > 1 else ""
            out.append(f"{where}: {value!r} is out of range: must be {rng}{hint}")
    return out
