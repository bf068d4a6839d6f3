"""Synthetic jobs and step records for the tuner's unit tests (no twin; no tests here)."""

from __future__ import annotations

import math
import random

from rltune.api.metrics import StepRecord
from rltune.api.models import RLTuningJobSpec


def job(**over) -> RLTuningJobSpec:
    d = {
        "workload": {"framework": "twin", "model": {"preset": "seed-35b-a3b"}, "task": {"kind": "math"}},
        "resources": {"gpuType": "B300", "gpuBudget": 32},
        "baseline": {"rollout": {"tp": 2, "gpuMemoryUtilization": 0.6}, "trainer": {"tp": 2, "ep": 8}},
        "budget": {"maxTrials": 8, "parallelTrials": 2, "stepsPerTrial": 6},
    }
    for k, v in over.items():
        d[k] = v
    return RLTuningJobSpec.model_validate(d)


def steps(
    phases: dict,
    n: int = 6,
    warmup: int = 1,
    reward: float = 0.5,
    reward_sd: float = 0.01,
    mismatch: float = 0.01,
    staleness: float = 0.0,
    noise: float = 0.01,
    seed: int = 0,
    duration: float | None = None,
) -> list[StepRecord]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        f = math.exp(rng.gauss(0, noise))
        ph = {k: v * f for k, v in phases.items()}
        d = (
            duration
            if duration is not None
            else ph.get("generation", 0)
            + ph.get("old_logprob", 0)
            + ph.get("ref_logprob", 0)
            + ph.get("training", 0)
            + ph.get("weight_sync", 0)
        ) * (f if duration is not None else 1.0)
        out.append(
            StepRecord(
                step=i,
                duration=d,
                phases=ph,
                generated_tokens=1e6,
                trained_tokens=1.2e6,
                staleness=staleness,
                reward=reward + rng.gauss(0, reward_sd),
                logprob_mismatch=mismatch,
                kv_usage=0.5,
                warmup=i < warmup,
            )
        )
    return out
