"""The eight benchmark jobs (docs/benchmark.md), shaped like the public result.

Four models (presets seed-27b-dense, seed-35b-a3b, glm-flash, deepseek-flash) x two workloads
(DAPO math, agentic coding) on B300 at fixed GPU budgets. Each starts from a realistic
configuration derived from the frameworks' documented defaults (verl example scripts: colocated
hybrid engine, synchronous on-policy, rollout TP as in the examples, gpu_memory_utilization
0.5-0.6, vLLM's max_num_seqs 256, max_num_batched_tokens 8192, Megatron TP/PP/EP from the
examples with full recompute (enable_gradient_checkpointing), NCCL weight sync).

Each job has a hidden `workload.scenario`: efficiency factors of the simulated cluster that
differ from the twin's defaults, so the tuner is tested on clusters it has not seen.

The search spaces are explicit (searchSpace.knobs) and sized so that the benchmark's oracle can
evaluate every configuration on the twin (exhaustive, noiseless).

`python -m bench.jobs` writes examples/bench-<model>-<task>.yaml.
"""

from __future__ import annotations

import copy
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MATH = {
    "kind": "math",
    "promptsPerStep": 512,
    "samplesPerPrompt": 16,
    "maxPromptTokens": 1024,
    "maxResponseTokens": 20480,
    "meanResponseTokens": 5000,
    "responseLengthCv": 1.0,
}
CODING = {
    "kind": "agentic-coding",
    "promptsPerStep": 64,
    "samplesPerPrompt": 8,
    "maxPromptTokens": 4096,
    "maxResponseTokens": 65536,
    "meanResponseTokens": 20000,
    "responseLengthCv": 0.8,
    "turns": 30,
    "toolLatencySeconds": 8.0,
    "sandboxes": 512,
}

COMMON_SPACE_MATH = {
    "placement": ["colocated", "disaggregated"],
    "trainer.pp": [1, 2],
    "trainer.recompute": ["selective", "full"],
    "rollout.tp": [1, 2, 4, 8],
    "rollout.gpuMemoryUtilization": [0.6, 0.85],
    "rollout.maxNumSeqs": [256, 1024],
    "async.staleness": [0, 1],
    "async.partialRollout": [False, True],
}
FROZEN = [
    "trainer.cp",
    "trainer.offload",
    "trainer.microBatchTokens",
    "rollout.maxNumBatchedTokens",
    "rollout.cudaGraphs",
    "rollout.fp8",
    "rollout.expertParallel",
    "weightSync",
]


def _job(
    name,
    preset,
    task,
    budget,
    baseline,
    knobs,
    scenario,
    *,
    objective="stepTime",
    allow_fewer=False,
    min_gpus=None,
    max_staleness=1,
):
    space = {"knobs": knobs, "frozen": [f for f in FROZEN if f not in knobs]}
    if allow_fewer:
        space["allowFewerGpus"] = True
        if min_gpus:
            space["minGpus"] = min_gpus
    return {
        "apiVersion": "rltune.io/v1alpha1",
        "kind": "RLTuningJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "workload": {
                "framework": "twin",
                "model": {"preset": preset},
                "task": copy.deepcopy(task),
                "scenario": scenario,
            },
            "resources": {"gpuType": "B300", "gpuBudget": budget, "gpusPerNode": 8},
            "baseline": baseline,
            "searchSpace": space,
            "constraints": {
                "maxStaleness": max_staleness,
                "maxLogprobMismatch": 0.05,
                "rewardTolerance": 0.05,
                "rewardTestAlpha": 0.05,
            },
            "objective": objective,
            "budget": {"maxTrials": 16, "parallelTrials": 2, "stepsPerTrial": 4, "warmupSteps": 1},
        },
    }


def _split(budget, fracs=(0.375, 0.5)):
    return sorted({int(round(budget * f / 8)) * 8 for f in fracs})


def jobs() -> list[dict]:
    out = []
    # --- seed-27b-dense (verl Qwen2.5-32B DAPO example: Megatron TP4 PP2, rollout TP4, gmu 0.6) -------------
    base = {
        "placement": "colocated",
        "trainer": {"tp": 4, "pp": 2, "recompute": "full", "microBatchTokens": 16384},
        "rollout": {"tp": 4, "gpuMemoryUtilization": 0.6, "maxNumSeqs": 256},
        "weightSync": "nccl",
    }
    kn = dict(COMMON_SPACE_MATH, **{"trainer.tp": [2, 4, 8], "trainerGpus": _split(64)})
    out.append(
        _job(
            "bench-seed-27b-dense-math",
            "seed-27b-dense",
            MATH,
            64,
            base,
            kn,
            {"hbm": 0.72, "train_mfu": 0.40, "nic": 0.5, "noise": 0.03},
        )
    )
    kc = dict(kn, **{"trainer.tp": [4, 8], "trainer.recompute": ["full"]})
    out.append(
        _job(
            "bench-seed-27b-dense-coding",
            "seed-27b-dense",
            CODING,
            64,
            base,
            kc,
            {"hbm": 0.85, "decode_compute": 0.40, "train_mfu": 0.50, "tool_cv": 1.3, "noise": 0.03},
        )
    )
    # --- seed-35b-a3b (verl Qwen3-30B-A3B Megatron example: TP2 EP8, rollout TP2, gmu 0.6) ------------------
    base = {
        "placement": "colocated",
        "trainer": {"tp": 2, "pp": 1, "ep": 8, "recompute": "full", "microBatchTokens": 16384},
        "rollout": {"tp": 2, "gpuMemoryUtilization": 0.6, "maxNumSeqs": 256},
        "weightSync": "nccl",
    }
    kn = dict(COMMON_SPACE_MATH, **{"trainer.tp": [1, 2], "trainer.ep": [4, 8], "trainerGpus": _split(32)})
    out.append(
        _job(
            "bench-seed-35b-a3b-math",
            "seed-35b-a3b",
            MATH,
            32,
            base,
            kn,
            {"hbm": 0.78, "sched_overhead": 0.0009, "moe_gemm_tokens": 384.0, "noise": 0.03},
        )
    )
    kc = dict(kn, **{"trainer.ep": [8], "trainer.pp": [1]})
    out.append(
        _job(
            "bench-seed-35b-a3b-coding",
            "seed-35b-a3b",
            CODING,
            48,
            base,
            dict(kc, trainerGpus=_split(48)),
            {"hbm": 0.82, "train_mfu": 0.38, "obs_tokens": 1600.0, "noise": 0.03},
        )
    )
    # --- glm-flash (MLA MoE; verl GLM example: TP2 EP8, rollout TP4, gmu 0.55) -------------------------------
    base = {
        "placement": "colocated",
        "trainer": {"tp": 2, "pp": 1, "ep": 8, "recompute": "full", "microBatchTokens": 16384},
        "rollout": {"tp": 4, "gpuMemoryUtilization": 0.55, "maxNumSeqs": 256},
        "weightSync": "nccl",
    }
    kn = dict(COMMON_SPACE_MATH, **{"trainer.tp": [1, 2], "trainer.ep": [4, 8], "trainerGpus": _split(48)})
    kn["rollout.tp"] = [1, 2, 4]  # 20 heads: TP 8 does not divide them
    out.append(
        _job(
            "bench-glm-flash-math",
            "glm-flash",
            MATH,
            48,
            base,
            kn,
            {"hbm": 0.76, "decode_compute": 0.5, "nvlink": 0.6, "noise": 0.03},
        )
    )
    kc = dict(kn, **{"trainer.ep": [8], "trainer.pp": [1], "trainerGpus": _split(32)})
    out.append(
        _job(
            "bench-glm-flash-coding",
            "glm-flash",
            CODING,
            32,
            base,
            kc,
            {"hbm": 0.84, "train_mfu": 0.42, "tool_cv": 1.2, "noise": 0.03},
        )
    )
    # --- deepseek-flash (MLA MoE ~97B; verl DeepSeek example: TP4 PP2 EP8, rollout TP8, gmu 0.6) -------------
    base = {
        "placement": "colocated",
        "trainer": {"tp": 4, "pp": 2, "ep": 8, "recompute": "full", "microBatchTokens": 16384},
        "rollout": {"tp": 8, "gpuMemoryUtilization": 0.6, "maxNumSeqs": 256},
        "weightSync": "nccl",
    }
    kn = dict(COMMON_SPACE_MATH, **{"trainer.tp": [2, 4], "trainer.ep": [8], "trainerGpus": _split(64)})
    out.append(
        _job(
            "bench-deepseek-flash-math",
            "deepseek-flash",
            MATH,
            64,
            base,
            kn,
            {"hbm": 0.74, "train_mfu": 0.36, "a2a_latency": 2.5e-5, "noise": 0.03},
        )
    )
    # the coding job at 56 GPUs: minimise GPU-seconds per step, fewer GPUs allowed (40 may win)
    base56 = copy.deepcopy(base)
    base56["trainer"]["pp"] = 1  # 56 GPUs: PP2 leaves 28 GPUs per stage, which EP8 does not divide
    kc = {
        "gpus": [40, 48, 56],
        "placement": ["colocated", "disaggregated"],
        "trainerGpus": [16, 24],
        "trainer.tp": [4],
        "trainer.pp": [1, 2],
        "trainer.ep": [8],
        "trainer.recompute": ["full"],
        "rollout.tp": [4, 8],
        "rollout.gpuMemoryUtilization": [0.6, 0.85],
        "rollout.maxNumSeqs": [256, 1024],
        "async.staleness": [0, 1],
        "async.partialRollout": [False, True],
    }
    out.append(
        _job(
            "bench-deepseek-flash-coding",
            "deepseek-flash",
            CODING,
            56,
            base56,
            kc,
            {"hbm": 0.8, "nic": 0.55, "train_mfu": 0.40, "noise": 0.03},
            objective="gpuSecondsPerStep",
            allow_fewer=True,
            min_gpus=40,
        )
    )
    return out


def write_examples() -> list[Path]:
    import yaml

    paths = []
    for j in jobs():
        p = ROOT / "examples" / f"{j['metadata']['name']}.yaml"
        p.parent.mkdir(exist_ok=True)
        head = (
            "# Benchmark job (bench/jobs.py; docs/benchmark.md). Generated: edit bench/jobs.py and run\n"
            "# `python -m bench.jobs`. The scenario is the simulated cluster's hidden efficiency factors.\n"
        )
        p.write_text(head + yaml.safe_dump(j, sort_keys=False))
        paths.append(p)
    return paths


if __name__ == "__main__":
    for p in write_examples():
        print(p.relative_to(ROOT))
