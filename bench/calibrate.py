"""Calibrate the digital twin against published measurements (listed in docs/references.md).

The rows and their public sources: docs/references.md sections 'Performance-model facts' and
'Published RL step measurements'.

    PYTHONPATH=operator python3 -m bench.calibrate            # table + docs/calibration.md
    PYTHONPATH=operator python3 -m bench.calibrate --fit      # also search per-hardware factors

Every row is run through the twin with ONE set of efficiency factors per hardware
(rltune/twin/efficiency.py HARDWARE), never per row. Each row states the framework shapes assumed
where the source does not publish them. `--fit` runs a coordinate search over the per-hardware
factors (log error, all rows of that hardware together) and prints the table it would use.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, NamedTuple, Optional

import numpy as np

from bench.paths import ROOT
from rltune.api.models import ModelArch, ModelSpec, RLConfig, TaskSpec
from rltune.twin import TWIN_VERSION, Infeasible, efficiency, simulate_step_breakdown
from rltune.twin.rollout import replica_cost, simulate_replica
from rltune.twin.simulate import _cached_step, _weight_sync
from rltune.twin.training import train_cost
from rltune.twin.workload import Episodes

LLAMA70 = ModelArch(
    name="llama-3.3-70b", layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128, ffn=28672, vocab=128256
)
GLM355 = ModelArch(
    name="glm-4.5-355b",
    layers=92,
    dense_layers=3,
    hidden=5120,
    heads=96,
    kv_heads=8,
    head_dim=128,
    ffn=12288,
    experts=160,
    active_experts=8,
    shared_experts=1,
    expert_ffn=1536,
    vocab=151552,
)


def preset(name: str) -> ModelArch:
    return ModelSpec(preset=name).resolved()


@dataclass
class Row:
    source: str
    name: str
    hw: str
    published: dict  # metric -> value
    run: Callable[[dict], dict]  # scenario -> predicted metrics
    assumptions: str
    predicted: dict = field(default_factory=dict)


# ------------------------------------------------------------------------------------------ RL rows


def rl_row(model: ModelArch, task: TaskSpec, cfg: dict, scenario: dict, mapping: dict) -> Callable[[dict], dict]:
    c = RLConfig.model_validate(cfg)

    def run(hw_scn: dict) -> dict:
        b = simulate_step_breakdown(model, task, "H20", 8, c, {**hw_scn, **scenario})
        ph = b["phases"]
        out = {}
        for k, src in mapping.items():
            out[k] = b["duration"] if src == "step" else ph[src]
        return out

    return run


DAPO7_28K = TaskSpec(
    promptsPerStep=512,
    samplesPerPrompt=16,
    maxPromptTokens=2048,
    maxResponseTokens=28672,
    meanResponseTokens=1100,
    responseLengthCv=2.0,
)
DAPO7_20K = TaskSpec(
    promptsPerStep=512,
    samplesPerPrompt=16,
    maxPromptTokens=2048,
    maxResponseTokens=20480,
    meanResponseTokens=1000,
    responseLengthCv=2.0,
)
DAPO7_8K = TaskSpec(
    promptsPerStep=512,
    samplesPerPrompt=16,
    maxPromptTokens=2048,
    maxResponseTokens=8192,
    meanResponseTokens=1000,
    responseLengthCv=1.5,
)
GRPO30_8K = TaskSpec(promptsPerStep=512, samplesPerPrompt=16, maxPromptTokens=2048, maxResponseTokens=8192)

VERL_FSDP_7B = dict(
    rollout=dict(tp=4, gpuMemoryUtilization=0.8, maxNumSeqs=1024, maxNumBatchedTokens=30720),
    trainer=dict(tp=1, cp=4, microBatchTokens=61440, recompute="full"),
)
# verl's colocated DAPO 7B math script at the fully-async page's commit offloads the actor's params and
# optimizer and the reference (recipe/dapo/test_dapo_7b_math.sh at c711dd7: offload=True); the
# fully-async scripts keep the actor on the GPU (actor_offload=False)
VERL_FSDP_7B_COLOCATED = dict(rollout=VERL_FSDP_7B["rollout"], trainer=dict(VERL_FSDP_7B["trainer"], offload=True))
# verl's trainer.offload is its actor param/optimizer offload: the state swapped between phases, Adam on
# the GPU (docs/twin.md 'Offload'), not DeepSpeed's CPU Adam
VERL_SCN = {"mini_batches": 16, "prompt_mean_tokens": 200, "offload_swap": True}
VERL_FSDP_SCN = {**VERL_SCN, "fsdp": True}
# verl's one-step-off recipe at the page's commit (verl/experimental/one_step_off_policy/shell/ at
# b178a3c): the colocated baselines offload the actor (offload=True) and give vLLM 0.80 of the memory;
# the 4:12 scripts keep the actor on the GPU (actor_offload=False), also at 0.80
VERL_OSP_MEGATRON_COLOCATED = dict(
    gpus=16,
    rollout=dict(tp=2, gpuMemoryUtilization=0.8, maxNumSeqs=1024, maxNumBatchedTokens=10240),
    trainer=dict(tp=2, microBatchTokens=10240, recompute="full", offload=True),
)
VERL_OSP_FSDP2_COLOCATED = dict(
    gpus=16,
    rollout=dict(tp=2, gpuMemoryUtilization=0.8, maxNumSeqs=1024, maxNumBatchedTokens=22528),
    trainer=dict(tp=1, cp=4, microBatchTokens=45056, recompute="full", offload=True),
)


# The one-step-off recipe's 4:12 run of a colocated baseline's knobs (layered over them): separate pools
# (4 rollout, 12 trainer GPUs), NCCL sync, staleness 1 without partial rollout, the actor kept on the GPU
VERL_OSP_4_12 = dict(
    placement="disaggregated",
    trainerGpus=12,
    weightSync="nccl",
    trainer=dict(offload=False),
    **{"async": dict(staleness=1)},
)


def layered(*layers) -> dict:
    """Layers merged in order into a new dict: a later layer's keys replace an earlier one's, nested
    mappings merged key by key. A layer is a mapping or the name of one of this module's constants
    (as the `twin` blocks of bench/data/published_steps.yaml name them)."""
    out: dict = {}
    for layer in layers:
        for k, v in (globals()[layer] if isinstance(layer, str) else layer).items():
            out[k] = layered(out[k], v) if isinstance(out.get(k), dict) and isinstance(v, dict) else copy.deepcopy(v)
    return out


M = {"step": "step", "gen": "generation", "old_log_prob": "old_logprob", "update": "training"}
MA = {"step": "step", "gen (trainer wait)": "waiting", "update": "training"}

RL_ROWS = [
    Row(
        "verl fully_async.md",
        "Qwen2.5-Math-7B DAPO 28k colocated 32xH20",
        "H20",
        {"step": 790.10, "gen": 357.41, "old_log_prob": 107.71, "update": 313.81},
        rl_row(preset("qwen2.5-7b"), DAPO7_28K, dict(gpus=32, **VERL_FSDP_7B_COLOCATED), VERL_FSDP_SCN, M),
        "FSDP2+Ulysses sp4 (as cp4), rollout tp4, gmu 0.8, maxNumSeqs 1024, ckpt on, 16 mini-batches, "
        "actor param/optimizer offload (recipe/dapo/test_dapo_7b_math.sh), mean response 1,100, CV 2 "
        "(assumed: the update times bound the trained tokens to ~1k/sample at H20 peak)",
    ),
    Row(
        "verl fully_async.md",
        "Qwen2.5-Math-7B DAPO 28k colocated 64xH20",
        "H20",
        {"step": 365.28, "gen": 150.72, "old_log_prob": 70.26, "update": 133.41},
        rl_row(preset("qwen2.5-7b"), DAPO7_28K, dict(gpus=64, **VERL_FSDP_7B_COLOCATED), VERL_FSDP_SCN, M),
        "as above",
    ),
    Row(
        "verl fully_async.md",
        "Qwen2.5-Math-7B DAPO 28k colocated 128xH20",
        "H20",
        {"step": 356.30, "gen": 177.85, "old_log_prob": 53.92, "update": 113.81},
        rl_row(preset("qwen2.5-7b"), DAPO7_28K, dict(gpus=128, **VERL_FSDP_7B_COLOCATED), VERL_FSDP_SCN, M),
        "as above",
    ),
    Row(
        "verl fully_async.md",
        "same, fully async 64:64 (staleness 0.5, partial rollout)",
        "H20",
        {"step": 150.63, "gen (trainer wait)": 33.14, "update": 113.16},
        rl_row(
            preset("qwen2.5-7b"),
            DAPO7_28K,
            dict(
                gpus=128,
                placement="disaggregated",
                trainerGpus=64,
                weightSync="nccl",
                **{"async": dict(staleness=1, partialRollout=True)},
                **VERL_FSDP_7B,
            ),
            {**VERL_FSDP_SCN, "rollout_logprobs": True},
            MA,
        ),
        "verl staleness_threshold 0.5 -> staleness 1; rollout log-probs (no old_log_prob pass); NCCL sync",
    ),
    Row(
        "verl fully_async.md",
        "same, fully async 32:32",
        "H20",
        {"step": 189.26, "gen (trainer wait)": 28.46, "update": 156.98},
        rl_row(
            preset("qwen2.5-7b"),
            DAPO7_28K,
            dict(
                gpus=64,
                placement="disaggregated",
                trainerGpus=32,
                weightSync="nccl",
                **{"async": dict(staleness=1, partialRollout=True)},
                **VERL_FSDP_7B,
            ),
            {**VERL_FSDP_SCN, "rollout_logprobs": True},
            MA,
        ),
        "as above",
    ),
    Row(
        "verl fully_async.md",
        "same, fully async 16:16",
        "H20",
        {"step": 294.77, "gen (trainer wait)": 21.26, "update": 269.80},
        rl_row(
            preset("qwen2.5-7b"),
            DAPO7_28K,
            dict(
                gpus=32,
                placement="disaggregated",
                trainerGpus=16,
                weightSync="nccl",
                **{"async": dict(staleness=1, partialRollout=True)},
                **VERL_FSDP_7B,
            ),
            {**VERL_FSDP_SCN, "rollout_logprobs": True},
            MA,
        ),
        "as above",
    ),
    Row(
        "verl one_step_off.md",
        "Qwen2.5-Math-7B DAPO 8k colocated 16xH20 (vLLM+Megatron)",
        "H20",
        {"step": 699, "gen": 207, "old_log_prob": 119, "update": 344},
        rl_row(
            preset("qwen2.5-7b"),
            DAPO7_8K,
            VERL_OSP_MEGATRON_COLOCATED,
            VERL_SCN,
            M,
        ),
        "Megatron tp2, mbt 10k, full recompute, param/optimizer offload; rollout tp2 gmu 0.8 (the recipe's "
        "colocated script); 512x16; mean response 1,000, CV 1.5 (assumed)",
    ),
    Row(
        "verl one_step_off.md",
        "same, one-step-off 4 rollout : 12 train GPUs",
        "H20",
        {"step": 566, "old_log_prob": 120, "update": 347},
        rl_row(
            preset("qwen2.5-7b"),
            DAPO7_8K,
            layered(VERL_OSP_MEGATRON_COLOCATED, VERL_OSP_4_12),
            VERL_SCN,
            {"step": "step", "old_log_prob": "old_logprob", "update": "training"},
        ),
        "staleness 1 without partial rollout",
    ),
    Row(
        "verl one_step_off.md",
        "Qwen2.5-Math-7B DAPO 20k colocated 16xH20 (vLLM+FSDP2)",
        "H20",
        {"step": 749, "gen": 321, "old_log_prob": 88, "update": 286},
        rl_row(
            preset("qwen2.5-7b"),
            DAPO7_20K,
            VERL_OSP_FSDP2_COLOCATED,
            VERL_FSDP_SCN,
            M,
        ),
        "FSDP2 sp4 (cp4), param/optimizer offload; rollout tp2 gmu 0.8 (the recipe's colocated script); "
        "mean response 1,000, CV 2 (assumed)",
    ),
    Row(
        "verl fully_async.md (30B)",
        "Qwen3-30B-A3B GRPO 8k colocated 128xH20",
        "H20",
        {"step": 497.9, "gen": 348.1, "old_log_prob": 28.7, "ref": 20.9, "update": 86.3},
        rl_row(
            preset("qwen3-30b-a3b"),
            GRPO30_8K,
            dict(
                gpus=128,
                rollout=dict(tp=4, expertParallel=True, gpuMemoryUtilization=0.6, maxNumSeqs=1024),
                trainer=dict(tp=1, ep=8, microBatchTokens=16384, recompute="full"),
            ),
            {**VERL_SCN, "reference_policy": True},
            {**M, "ref": "ref_logprob"},
        ),
        "batch shape not published: 512x16 assumed, mean response 2,048 (max/4); Megatron ep8; rollout tp4 EP",
    ),
]


# ------------------------------------------------------------------------------------------ inference rows


def infer_row(
    model: ModelArch, gpu_type: str, tp: int, fp8: bool, isl: int, osl: int, ep: bool = False, seqs: int = 2048
) -> Callable[[dict], dict]:
    """Max-throughput serving of identical requests on one engine replica: output tok/s/GPU."""
    task = TaskSpec(promptsPerStep=1, samplesPerPrompt=1, maxPromptTokens=isl, maxResponseTokens=osl)
    cfg = RLConfig.model_validate(
        dict(
            gpus=tp,
            rollout=dict(
                tp=tp, fp8=fp8, expertParallel=ep, gpuMemoryUtilization=0.92, maxNumSeqs=seqs, maxNumBatchedTokens=16384
            ),
        )
    )

    def run(hw_scn: dict) -> dict:
        eff = efficiency.efficiency(gpu_type, hw_scn)
        rc = replica_cost(model, task, gpu_type, 8, cfg, eff)
        n = 3 * seqs
        ep_ = Episodes(prompt=np.full(n, isl), gen=np.full(n, osl, dtype=np.int64))
        res = simulate_replica(rc, ep_, list(range(n)), cfg)
        return {"output tok/s/GPU": n * osl / res.end / tp}

    return run


INFER_ROWS = [
    Row(
        "TensorRT-LLM perf overview",
        "Llama-3.3-70B 1k/1k B200 FP4 TP1",
        "B200",
        {"output tok/s/GPU": 6920},
        infer_row(LLAMA70, "B200", 1, True, 1000, 1000),
        "FP4 modelled as FP8 weights (twin has no FP4)",
    ),
    Row(
        "TensorRT-LLM perf overview",
        "Llama-3.3-70B 1k/1k H200 FP8 TP2",
        "H200",
        {"output tok/s/GPU": 2587},
        infer_row(LLAMA70, "H200", 2, True, 1000, 1000),
        "fp8 rollout, maxNumSeqs 2048",
    ),
    Row(
        "TensorRT-LLM perf overview",
        "Llama-3.3-70B 1k/1k H100 FP8 TP2",
        "H100",
        {"output tok/s/GPU": 2209},
        infer_row(LLAMA70, "H100", 2, True, 1000, 1000),
        "fp8 rollout",
    ),
    Row(
        "TensorRT-LLM perf overview",
        "Qwen3-235B-A22B 1k/1k B200 FP4",
        "B200",
        {"output tok/s/GPU": 5764},
        infer_row(preset("qwen3-235b-a22b"), "B200", 4, True, 1000, 1000, ep=True),
        "FP4 as FP8; TP4 + expert parallel assumed",
    ),
    Row(
        "TensorRT-LLM perf overview",
        "Qwen3-235B-A22B 1k/1k H200 FP8",
        "H200",
        {"output tok/s/GPU": 3288},
        infer_row(preset("qwen3-235b-a22b"), "H200", 4, True, 1000, 1000, ep=True),
        "TP4 + EP assumed",
    ),
    Row(
        "TensorRT-LLM perf overview",
        "Qwen3-235B-A22B 1k/1k H100 FP8",
        "H100",
        {"output tok/s/GPU": 1932},
        infer_row(preset("qwen3-235b-a22b"), "H100", 8, True, 1000, 1000, ep=True),
        "TP8 + EP assumed",
    ),
    Row(
        "TensorRT-LLM perf overview",
        "Qwen3-30B-A3B 1k/1k B200 FP4 TP1",
        "B200",
        {"output tok/s/GPU": 26971},
        infer_row(preset("qwen3-30b-a3b"), "B200", 1, True, 1000, 1000, seqs=4096),
        "FP4 as FP8",
    ),
    Row(
        "TensorRT-LLM perf overview",
        "Qwen3-30B-A3B 1k/32k B200 FP4 TP1",
        "B200",
        {"output tok/s/GPU": 4494},
        infer_row(preset("qwen3-30b-a3b"), "B200", 1, True, 1000, 32000, seqs=512),
        "FP4 as FP8",
    ),
]


# ------------------------------------------------------------------------------------------ training rows


def train_row(
    model: ModelArch,
    gpu_type: str,
    gpus: int,
    tp: int,
    pp: int,
    ep: int,
    seq: int,
    gbs: int,
    fp8: bool,
    recompute: str = "selective",
    gpn: int = 8,
    mbs: int = 1,
    cp: int = 1,
    etp: Optional[int] = None,
) -> Callable[[dict], dict]:
    """Pre-training throughput of one Megatron-Bridge recipe: `gbs` sequences of `seq` tokens, `mbs`
    sequences per micro-batch (split over `cp` GPUs), one optimizer step (no RL phases)."""
    trainer = dict(tp=tp, pp=pp, cp=cp, ep=ep, microBatchTokens=seq * mbs // cp, recompute=recompute)
    if etp is not None:
        trainer["etp"] = etp
    cfg = RLConfig.model_validate(dict(gpus=gpus, trainer=trainer))

    def run(hw_scn: dict) -> dict:
        eff = efficiency.efficiency(gpu_type, {**hw_scn, "mini_batches": 1, "train_fp8": fp8})
        seqs = np.full(gbs, seq)
        tc = train_cost(model, seqs, gpu_type, gpn, gpus, cfg, eff, reference=False)
        return {"train tok/s/GPU": gbs * seq / tc.training / gpus}

    return run


LLAMA8 = ModelArch(
    name="llama-3-8b", layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=14336, vocab=128256
)

LLAMA405 = ModelArch(
    name="llama-3.1-405b", layers=126, hidden=16384, heads=128, kv_heads=8, head_dim=128, ffn=53248, vocab=128256
)

# Megatron-Bridge performance summary (docs/performance-summary.md at NVIDIA-NeMo/Megatron-Bridge
# df0289c; docs/references.md), tables "26.02 NeMo Container" and "25.11 NeMo Container": every shape
# below is the table's (GPUs, GBS, MBS, sequence length, TP, PP, CP, EP; expert TP is 1 in every MoE
# recipe). Not modelled: the virtual-pipeline size (the twin's pipeline bubble is (pp - 1) /
# micro-batches); FP8-CS and FP8-MX are both the FP8 peak x fp8_train_speedup; activation recompute is
# not in the tables (selective assumed; the old DeepSeek-V3 row assumed full). Not taken: NVFP4
# rows (no FP4 in the twin), Megatron-FSDP rows (the twin's fsdp scenario is verl's eager FSDP),
# GPT-OSS (no preset), the 25.09 table's token-dropping rows (RL trains dropless; docs/twin.md
# 'Megatron MoE recipes' compares them). GB200/GB300 rows run on 4-GPU nodes: the NVLink domain is
# the rack's (catalog).
MB_SOURCE = "Megatron-Bridge perf summary"


class Recipe(NamedTuple):
    """One row of a Megatron-Bridge pre-training table, as published."""

    release: str
    hw: str
    model: str
    precision: str
    tokens_per_gpu_s: float
    gpus: int
    tp: int
    pp: int
    cp: int
    ep: int
    seq: int
    mbs: int
    gbs: int
    vp: int
    ga: int  # the table's gradient accumulations: a check on the transcription (GBS = GA x MBS x DP)

    @property
    def dp(self) -> int:
        """Data-parallel size of the dense layers."""
        return self.gpus // (self.tp * self.pp * self.cp)

    @property
    def micro_batches(self) -> int:
        """Micro-batches each pipeline stage runs per step, from the shape (GBS / (DP x MBS))."""
        return self.gbs // (self.dp * self.mbs)


# fmt: off
MEGATRON_BRIDGE_RECIPES = [
    Recipe("25.11", "H100", "q30", "FP8-CS", 5275, 16, 1, 2, 1, 8, 4096, 2, 512, 24, 32),
    Recipe("25.11", "B200", "q30", "FP8-MX", 9299, 8, 1, 1, 1, 8, 4096, 1, 512, 1, 64),
    Recipe("25.11", "GB200", "q30", "FP8-MX", 23766, 8, 1, 1, 1, 8, 4096, 4, 512, 1, 16),
    Recipe("25.11", "GB300", "q30", "FP8-MX", 28934, 8, 1, 1, 1, 8, 4096, 4, 512, 1, 16),
    Recipe("25.11", "H100", "l70", "FP8-CS", 1602, 64, 4, 8, 1, 1, 8192, 1, 128, 5, 64),
    Recipe("25.11", "B200", "l8", "FP8-CS", 30624, 8, 1, 1, 1, 1, 8192, 2, 128, 1, 8),
    Recipe("25.11", "GB200", "l8", "FP8-CS", 31508, 8, 1, 1, 1, 1, 8192, 2, 128, 1, 8),
    Recipe("25.11", "GB300", "l8", "FP8-CS", 37556, 8, 1, 1, 1, 1, 8192, 2, 128, 1, 8),
    Recipe("25.11", "B200", "dsv3", "FP8-MX", 2139, 256, 1, 16, 1, 8, 4096, 1, 2048, 1, 128),
    Recipe("25.11", "GB200", "dsv3", "FP8-MX", 4018, 256, 1, 8, 1, 32, 4096, 1, 4096, 4, 128),
    Recipe("25.11", "GB300", "dsv3", "FP8-MX", 4357, 256, 1, 2, 1, 32, 4096, 1, 4096, 4, 32),
    Recipe("25.11", "B200", "q235", "FP8-MX", 3269, 64, 1, 8, 1, 8, 4096, 1, 1024, 2, 128),
    Recipe("25.11", "GB200", "q235", "BF16", 4916, 256, 1, 8, 1, 32, 4096, 1, 8192, 3, 256),
    Recipe("25.11", "GB300", "q235", "BF16", 6131, 256, 1, 4, 1, 16, 4096, 2, 8192, 12, 32),
    Recipe("25.11", "H100", "l405", "FP8-CS", 292, 1024, 8, 8, 2, 1, 8192, 1, 512, 8, 64),
    Recipe("25.11", "B200", "l405", "FP8-CS", 661, 128, 4, 8, 2, 1, 8192, 1, 64, 8, 32),
    Recipe("25.11", "GB200", "l405", "FP8-CS", 813, 256, 4, 16, 1, 1, 8192, 1, 1536, 4, 384),
    Recipe("25.11", "GB300", "l405", "FP8-CS", 999, 256, 2, 8, 2, 1, 8192, 1, 1536, 4, 192),
    Recipe("25.11", "GB200", "dsv3", "BF16", 3139, 256, 1, 4, 1, 64, 4096, 1, 4096, 4, 64),
    Recipe("25.11", "GB300", "dsv3", "BF16", 3848, 256, 1, 2, 1, 32, 4096, 1, 4096, 4, 32),
    Recipe("26.02", "H100", "q30", "FP8-CS", 2557, 16, 1, 2, 1, 8, 4096, 1, 1024, 12, 128),
    Recipe("26.02", "B200", "q30", "FP8-MX", 9691, 8, 1, 1, 1, 8, 4096, 1, 512, 1, 64),
    Recipe("26.02", "B300", "q30", "FP8-MX", 29521, 8, 1, 1, 1, 8, 4096, 8, 512, 1, 8),
    Recipe("26.02", "GB200", "q30", "FP8-MX", 26084, 8, 1, 1, 1, 8, 4096, 4, 512, 1, 16),
    Recipe("26.02", "GB300", "q30", "FP8-MX", 30376, 8, 1, 1, 1, 8, 4096, 8, 512, 1, 8),
    Recipe("26.02", "H100", "l70", "FP8-CS", 1621, 64, 4, 8, 1, 1, 8192, 1, 256, 5, 128),
    Recipe("26.02", "GB200", "l70", "FP8-MX", 3887, 64, 2, 4, 1, 1, 8192, 1, 256, 5, 32),
    Recipe("26.02", "GB300", "l70", "FP8-MX", 4596, 64, 1, 4, 1, 1, 8192, 1, 256, 5, 16),
    Recipe("26.02", "H100", "l405", "FP8-CS", 311, 1024, 8, 8, 2, 1, 8192, 1, 1536, 8, 192),
    Recipe("26.02", "GB200", "l405", "FP8-CS", 793, 256, 4, 16, 1, 1, 8192, 1, 1536, 4, 384),
    Recipe("26.02", "GB300", "l405", "FP8-CS", 988, 256, 4, 8, 1, 1, 8192, 1, 1536, 4, 192),
    Recipe("26.02", "GB200", "l405", "FP8-MX", 786, 256, 4, 16, 1, 1, 8192, 1, 1536, 8, 384),
    Recipe("26.02", "GB300", "l405", "FP8-MX", 931, 256, 2, 8, 2, 1, 8192, 1, 1536, 4, 192),
    Recipe("26.02", "B200", "dsv3", "FP8-MX", 2689, 256, 1, 16, 1, 8, 4096, 1, 4096, 1, 256),
    Recipe("26.02", "B300", "dsv3", "FP8-MX", 2983, 256, 1, 16, 1, 8, 4096, 1, 4096, 1, 256),
    Recipe("26.02", "GB200", "dsv3", "FP8-MX", 3955, 256, 1, 4, 1, 64, 4096, 1, 4096, 4, 64),
    Recipe("26.02", "GB300", "dsv3", "FP8-MX", 4612, 256, 1, 2, 1, 32, 4096, 2, 4096, 8, 16),
    Recipe("26.02", "H100", "q235", "FP8-CS", 1633, 256, 2, 8, 1, 32, 4096, 1, 8192, 4, 512),
    Recipe("26.02", "B200", "q235", "FP8-MX", 3805, 256, 1, 8, 1, 8, 4096, 1, 8192, 1, 256),
    Recipe("26.02", "B300", "q235", "FP8-MX", 2691, 256, 1, 8, 1, 8, 4096, 1, 8192, 4, 256),
    Recipe("26.02", "GB200", "q235", "FP8-MX", 5448, 256, 1, 8, 1, 32, 4096, 1, 8192, 1, 256),
    Recipe("26.02", "GB300", "q235", "FP8-MX", 6583, 256, 1, 4, 1, 32, 4096, 2, 8192, 1, 64),
]
# fmt: on
MB_MODEL_NAMES = {
    "q30": "Qwen3-30B-A3B",
    "q235": "Qwen3-235B-A22B",
    "dsv3": "DeepSeek-V3",
    "l8": "Llama3-8B",
    "l70": "Llama3-70B",
    "l405": "Llama3.1-405B",
}


MB_MODELS = {
    "q30": preset("qwen3-30b-a3b"),
    "q235": preset("qwen3-235b-a22b"),
    "dsv3": preset("deepseek-v3"),
    "l8": LLAMA8,
    "l70": LLAMA70,
    "l405": LLAMA405,
}


def _train_rows() -> list[Row]:
    rows = []
    for r in MEGATRON_BRIDGE_RECIPES:
        gpn = 4 if r.hw.startswith("GB") else 8
        layout = " ".join(f"{k}{v}" for k, v in (("TP", r.tp), ("PP", r.pp), ("CP", r.cp), ("EP", r.ep)) if v > 1)
        vp_note = f" (VP{r.vp})" if r.vp > 1 else ""
        note = f"{r.gpus} GPUs, {layout or 'DP only'}{vp_note}, seq {r.seq}, MBS {r.mbs}, GBS {r.gbs}"
        etp = 1 if r.ep > 1 else None
        fp8 = r.precision != "BF16"
        run = train_row(
            MB_MODELS[r.model], r.hw, r.gpus, r.tp, r.pp, r.ep, r.seq, r.gbs, fp8, gpn=gpn, mbs=r.mbs, cp=r.cp, etp=etp
        )
        name = f"{MB_MODEL_NAMES[r.model]} pretrain {r.precision} {r.hw} ({r.release})"
        rows.append(Row(f"{MB_SOURCE} {r.release}", name, r.hw, {"train tok/s/GPU": r.tokens_per_gpu_s}, run, note))
    return rows


TRAIN_ROWS = _train_rows()


@dataclass(frozen=True)
class MoeLayerTime:
    """One MoE recipe's time per MoE layer and micro-batch, published and in the twin."""

    recipe: Recipe
    local_experts: int
    published_ms: float
    twin_ms: float


def moe_layer_times(overrides: Optional[dict] = None) -> list[MoeLayerTime]:
    """Each MoE pre-training recipe's step time spread over the micro-batches and MoE layers a pipeline
    stage runs (bubble ignored), published and in the twin: the view that separates a GPU-bound layer
    from a host-bound floor (docs/twin.md 'Megatron MoE recipes'). Recipes the twin refuses are left out."""
    out = []
    for r, row in zip(MEGATRON_BRIDGE_RECIPES, TRAIN_ROWS):
        model = MB_MODELS[r.model]
        if not model.is_moe:
            continue
        try:
            twin = row.run((overrides or {}).get(row.hw, {}))["train tok/s/GPU"]
        except Infeasible:
            continue
        per = r.micro_batches * model.moe_layers() / r.pp  # micro-batches x a stage's MoE layers
        tokens = r.gbs * r.seq / r.gpus
        out.append(MoeLayerTime(r, model.experts // r.ep, 1e3 * tokens / r.tokens_per_gpu_s / per,
                                1e3 * tokens / twin / per))  # fmt: skip
    return out


# ------------------------------------------------------------------------------------------ weight sync rows


def sync_row(
    model: ModelArch, gpu_type: str, ranks: int, method: str, fp8: bool = False, metric: str = "sync s"
) -> Callable[[dict], dict]:
    """One weight sync between two pools of `ranks` GPUs (rollout TP 8), through the twin's own code."""
    cfg = RLConfig.model_validate(
        dict(
            gpus=2 * ranks,
            placement="disaggregated",
            trainerGpus=ranks,
            weightSync=method,
            rollout=dict(tp=8, gpuMemoryUtilization=0.9, fp8=fp8),
            trainer=dict(tp=8),
        )
    )

    def run(hw_scn: dict) -> dict:
        eff = efficiency.efficiency(gpu_type, hw_scn)
        from types import SimpleNamespace

        p = SimpleNamespace(
            gpu_type=gpu_type,
            eff=eff,
            model=model,
            cfg=cfg,
            colocated=False,
            rollout_gpus=ranks,
            train_gpus=ranks,
            gpus_per_node=8,
        )
        t, _, _ = _weight_sync(p, None)
        return {metric: t}

    return run


SYNC_ROWS = [
    Row(
        "verl fully_async.md (ckpt engine)",
        "Qwen3-30B-A3B 16->16 ranks",
        "H20",
        {"sync s": 4.38},
        sync_row(preset("qwen3-30b-a3b"), "H20", 16, "checkpoint-engine"),
        "checkpoint-engine, 400 Gb/s NICs",
    ),
    Row(
        "verl fully_async.md (ckpt engine)",
        "Qwen3-235B-A22B 64->64 ranks",
        "H20",
        {"sync s": 23.7},
        sync_row(preset("qwen3-235b-a22b"), "H20", 64, "checkpoint-engine"),
        "checkpoint-engine",
    ),
    Row(
        "slime v0.1.0 release notes",
        "GLM-4.5-355B BF16 sync",
        "H100",
        {"sync s": 48.0},
        sync_row(GLM355, "H100", 64, "nccl"),
        "NCCL broadcast, 64 rollout ranks (assumed), H100",
    ),
]

ALL_ROWS = RL_ROWS + INFER_ROWS + TRAIN_ROWS + SYNC_ROWS


# ------------------------------------------------------------------------------------------ evaluation


def evaluate(rows: list[Row], overrides: dict[str, dict]) -> list[tuple[Row, str, float, float]]:
    out = []
    for row in rows:
        scn = overrides.get(row.hw, {})
        try:
            pred = row.run(scn)
        except Infeasible as e:
            pred = {k: math.nan for k in row.published}
            row.assumptions += f" [twin: infeasible: {e}]"
        row.predicted = pred
        for k, v in row.published.items():
            out.append((row, k, v, pred.get(k, math.nan)))
    return out


def err(pub: float, pred: float) -> float:
    return (pred - pub) / pub * 100.0


def log_loss(results) -> float:
    errs = [abs(math.log(max(p, 1e-9) / v)) if p == p else 5.0 for _, _, v, p in results]
    return sum(errs) / max(1, len(errs))


FIT_KEYS = {
    "H20": ["hbm", "decode_compute", "prefill_mfu", "train_mfu", "fwd_ratio"],
    "H100": ["hbm", "decode_compute", "train_mfu"],
    "H200": ["hbm", "decode_compute", "train_mfu"],
    "B200": ["hbm", "decode_compute", "train_mfu"],
    "GB300": ["train_mfu"],
}


# Physically plausible ranges (docs/references.md 'GPUs': HBM ~90% in microbenchmarks, big GEMMs
# 55-70%; H20 is compute-starved so its GEMMs may run closer to peak).
BOUNDS = {
    "hbm": (0.6, 0.92),
    "decode_compute": (0.3, 0.85),
    "prefill_mfu": (0.35, 0.85),
    "train_mfu": (0.3, 0.85),
    "fwd_ratio": (0.4, 1.0),
}


def fit(rows: list[Row], rounds: int = 2) -> dict[str, dict]:
    overrides: dict[str, dict] = {}
    for hw, keys in FIT_KEYS.items():
        hw_rows = [r for r in rows if r.hw == hw]
        if not hw_rows:
            continue
        base = dataclasses.asdict(efficiency.efficiency(hw))
        cur = {k: base[k] for k in keys}
        best = log_loss(evaluate(hw_rows, {hw: cur}))
        for _ in range(rounds):
            for k in keys:
                for mult in (0.7, 0.85, 0.93, 1.07, 1.18, 1.4):
                    cand = dict(cur)
                    lo, hi = BOUNDS[k]
                    cand[k] = min(hi, max(lo, cur[k] * mult))
                    _cached_step.cache_clear()
                    loss = log_loss(evaluate(hw_rows, {hw: cand}))
                    if loss < best - 1e-4:
                        best, cur = loss, cand
        overrides[hw] = {k: round(v, 3) for k, v in cur.items()}
        print(f"fit {hw}: {overrides[hw]}  mean |log err| {best:.3f}", file=sys.stderr)
    return overrides


def table(results) -> tuple[str, dict]:
    lines = [
        "| source | row (hardware) | metric | published | twin | error % | assumptions |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    last = None
    for row, k, v, p in results:
        assume = row.assumptions if row is not last else ""
        src = row.source if row is not last else ""
        name = f"{row.name}" if row is not last else ""
        e = err(v, p) if p == p else math.nan
        lines.append(f"| {src} | {name} | {k} | {v:,.2f} | {p:,.2f} | {e:+.1f} | {assume} |")
        last = row
    errs = [abs(err(v, p)) for _, _, v, p in results if p == p]
    steps = [abs(err(v, p)) for r, k, v, p in results if p == p and k == "step"]
    stats = dict(
        n=len(errs),
        median=statistics.median(errs),
        max=max(errs),
        mean=sum(errs) / len(errs),
        step_median=statistics.median(steps) if steps else math.nan,
        step_max=max(steps) if steps else math.nan,
        groups={},
    )
    for label, rows in (
        ("RL steps/phases (H20)", RL_ROWS),
        ("inference", INFER_ROWS),
        ("training", TRAIN_ROWS),
        ("weight sync", SYNC_ROWS),
    ):
        ge = [abs(err(v, p)) for r, k, v, p in results if r in rows and p == p]
        if ge:
            stats["groups"][label] = (statistics.median(ge), max(ge), len(ge))
    return "\n".join(lines), stats


def write_doc(tab: str, stats: dict, path: Path) -> None:
    hw_lines = []
    for hw, d in efficiency.HARDWARE.items():
        if d:
            hw_lines.append(f"| {hw} | " + ", ".join(f"{k} {v}" for k, v in d.items()) + " |")
    groups = "\n".join(f"| {g} | {m:.1f} | {mx:.1f} | {n} |" for g, (m, mx, n) in stats["groups"].items())
    text = f"""# Twin calibration

The first section (between the generated markers) runs the published RL step times of
bench/data/published_steps.yaml through the twin with a held-out split by source and leave-one-source-out
folds (`make bench-published`, issue 14); the sections after it are the older calibration table.

Generated by `PYTHONPATH=operator python3 -m bench.calibrate` (twin {TWIN_VERSION}). Every published
measurement listed in docs/references.md (sections 'Performance-model facts' and 'Published RL step
measurements', with their sources) is run through the digital twin with **one set of efficiency
factors per hardware** (not per row); shapes the sources do not publish are assumed and named in the
last column.

## Summary

Absolute percentage error over {stats["n"]} published numbers: **median {stats["median"]:.1f}%, max
{stats["max"]:.1f}%** (mean {stats["mean"]:.1f}%). Whole RL steps only: median {stats["step_median"]:.1f}%,
max {stats["step_max"]:.1f}%.

| group | median abs error % | max abs error % | numbers |
|---|---:|---:|---:|
{groups}

Honest caveats:
- The verl rows publish neither the mean response length nor every engine knob; the assumed mean
  response length moves generation and training together, so agreement there partly reflects that
  assumption. The phase split (gen / old log-prob / update) is the stronger check.
- verl's fully_async.md swapped two update times between versions: up to commit c711dd7 the
  32-GPU colocated row reads 313.81 s and the 16:16 fully-async row 269.80 s, later versions the
  other way round. The table below uses the earlier version (docs/references.md).
- verl "gen" in fully-async rows is the trainer's wait for samples, compared with the twin's
  `waiting` phase.
- TensorRT-LLM FP4 rows are modelled as FP8 rollouts (the twin has no FP4), so they are expected
  to be under-predicted; TensorRT-LLM is also faster per GPU than vLLM, the engine the twin models.
- Megatron-Bridge rows are pre-training throughputs (FP8 GEMMs modelled at the FP8 peak), 42
  recipes from the 25.11 and 26.02 tables with their own GPU counts, micro-batch sizes and layouts.
  Until 2026-12-05 five rows carried shapes from no release (64 GPUs and MBS 1 for every
  Qwen3-30B-A3B row, GBS 1024 assumed for DeepSeek-V3); see docs/twin.md 'Megatron MoE recipes'.
- The Qwen3-30B-A3B GRPO row has no published batch shape; its error is dominated by that.
- Degrees of freedom: the per-hardware factors were fitted (`--fit`, bounded to physical ranges) on
  these same rows; the shipped factors were fitted before the pre-training rows had their real
  shapes and are kept (B300 uses B200's, GB200 GB300's). The H20 RL rows (37 numbers, 5 factors)
  are the real test.
- Llama3-8B/70B pre-training is within 15% on H100, B200, GB200 and GB300, and MoE on the
  GB200/GB300 racks within -22% to +11%. The twin refuses 9 of the 10 Llama3.1-405B and Llama3-70B
  FP8-MX GB300 recipes for memory (0-9% over the GPU; they ran). Dropless MoE at small micro-batches
  on 8-GPU nodes runs up to 5.5x slower than the twin (Qwen3-30B-A3B at MBS 1-2; docs/twin.md);
  the shipped factors do not absorb it (`--fit` would drop B200's train_mfu to 0.44 and make its
  dense row 35% too slow).
- verl's fully-async "gen" (the trainer's wait, 21-33 s) is the twin's `waiting` phase, which its
  async pipeline (rltune/api/pipeline.py: bounded run-ahead, verl's staleness_threshold as
  `async.staleFraction`, require_batches as the trainer's pieces) reports; on these rows it is still
  ~0 because the twin's streaming generation is faster than the update, and only a rollout-bound
  pipeline, or a run-ahead under one mini-batch, makes the trainer wait.
- The twin models vLLM (per-iteration engine overhead 2 ms, 20 us all-reduces); TensorRT-LLM rows
  are under-predicted by 3-44% partly for that reason.

## Per-hardware factors in use (rltune/twin/efficiency.py)

| hardware | factors (others: defaults in `Efficiency`) |
|---|---|
{chr(10).join(hw_lines)}

## Rows

{tab}
"""
    old = path.read_text() if path.exists() else ""
    begin, end = "<!-- bench.published: begin", "<!-- bench.published: end -->"
    if begin in old and end in old:  # keep bench/published.py's report (make bench-published)
        kept = begin + old.split(begin, 1)[1].split(end, 1)[0] + end
        # and the hand-written findings between that report and "## Summary"
        after = old.split(end, 1)[1]
        hand = after.split("## Summary", 1)[0].strip() if "## Summary" in after else ""
        head, rest = text.split("## Summary", 1)
        text = head + kept + ("\n\n" + hand if hand else "") + "\n\n## Summary" + rest
    path.write_text(text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit", action="store_true", help="search per-hardware factors first and use them")
    ap.add_argument("--out", default=str(ROOT / "docs" / "calibration.md"))
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--moe-layers", action="store_true", help="print the MoE recipes per layer and micro-batch")
    a = ap.parse_args(argv)
    if a.moe_layers:
        print("| recipe | local experts | MBS | published ms per MoE layer x micro-batch | twin ms |")
        print("|---|---:|---:|---:|---:|")
        for m in sorted(moe_layer_times(), key=lambda m: (m.local_experts, m.recipe.model, m.recipe.hw)):
            r = m.recipe
            name = f"{MB_MODEL_NAMES[r.model]} {r.precision} {r.hw} ({r.release})"
            print(f"| {name} | {m.local_experts} | {r.mbs} | {m.published_ms:.1f} | {m.twin_ms:.1f} |")
        return 0
    overrides = fit(ALL_ROWS) if a.fit else {}
    _cached_step.cache_clear()
    results = evaluate(ALL_ROWS, overrides)
    tab, stats = table(results)
    print(tab)
    print(
        f"\nmedian abs error {stats['median']:.1f}%  max {stats['max']:.1f}%  "
        f"(steps: median {stats['step_median']:.1f}% max {stats['step_max']:.1f}%)"
    )
    for g, (m, mx, n) in stats["groups"].items():
        print(f"  {g:24s} median {m:5.1f}%  max {mx:5.1f}%  n={n}")
    if overrides:
        print("\nfitted overrides (copy into rltune/twin/efficiency.py HARDWARE):", overrides)
    if not a.no_write and not a.fit:
        write_doc(tab, stats, Path(a.out))
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
