"""Profile: where the baseline's step time goes, and which bottleneck to attack first."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..api.models import RLTuningJobSpec
from .summary import TrialSummary, TunerModel

Bottleneck = Literal[
    "rollout-long-tail",
    "rollout-throughput",
    "kv-bound",
    "trainer-bound",
    "weight-sync-bound",
    "imbalance",
    "unknown",  # the baseline reported a step time but no phase times
]


class Profile(TunerModel):
    step_time: float = Field(description="Mean steady-state seconds per step of the baseline.")
    phases: dict[str, float] = Field(default_factory=dict, description="Mean seconds per phase.")
    shares: dict[str, float] = Field(default_factory=dict, description="Phase seconds / step seconds.")
    rollout_seconds: float = 0.0
    trainer_seconds: float = 0.0
    trainer_idle_seconds: float = Field(0.0, description="Trainer waiting for rollouts.")
    rollout_idle_seconds: float = Field(0.0, description="Rollout waiting for weights/trainer.")
    long_tail_share: float = Field(0.0, description="Share of generation spent after the median response finished.")
    kv_pressure: float = Field(0.0, description="Peak KV-cache usage (0-1), or >1 when requests were preempted.")
    preemptions: float = 0.0
    bottleneck: Bottleneck = "rollout-throughput"
    evidence: str = ""


def _s(x: float) -> str:
    """Seconds readable at any scale: GPU steps take minutes, CPU real-mode steps under a second."""
    return f"{x:.0f}" if abs(x) >= 10 else f"{x:.2g}"


def profile(spec: RLTuningJobSpec, baseline: TrialSummary) -> Profile:
    ph = dict(baseline.phases)
    step = max(baseline.step_time_mean, 1e-9)
    if not baseline.has_phases:
        return Profile(
            step_time=baseline.step_time_mean,
            bottleneck="unknown",
            evidence=f"unknown: the baseline reported its step time ({_s(baseline.step_time_mean)} s) but no phase "
            "times: the forecaster scales the physics' own phase split to it (calibrated on the step only, wider "
            "intervals)",
        )
    gen, tail = ph.get("generation", 0.0), ph.get("generation_tail", 0.0)
    # Contract convention: `generation` is the rollout's wall time; tail and tool are parts of it.
    rollout = gen
    trainer = ph.get("old_logprob", 0.0) + ph.get("ref_logprob", 0.0) + ph.get("training", 0.0)
    sync = ph.get("weight_sync", 0.0)
    t_idle, r_idle = ph.get("waiting", 0.0), ph.get("rollout_idle", 0.0)
    tail_share = tail / gen if gen > 0 else 0.0
    kvp = baseline.kv_usage_max + (1.0 if baseline.preemptions_mean > 0 else 0.0)
    shares = {k: v / step for k, v in ph.items()}
    disagg = spec.baseline.placement == "disaggregated"
    r_share, t_share, s_share = rollout / step, trainer / step, sync / step

    if s_share >= 0.15:
        b = "weight-sync-bound"
        ev = f"weight sync takes {s_share:.0%} of the step ({sync:.1f} s)"
    elif disagg and max(t_idle, r_idle) / step >= 0.3 and spec.baseline.async_.staleness >= 1:
        b = "imbalance"
        side = "trainer" if t_idle > r_idle else "rollout"
        ev = (
            f"the {side} side idles {max(t_idle, r_idle) / step:.0%} of the step "
            f"(rollout {_s(rollout)} s vs trainer {_s(trainer)} s)"
        )
    elif t_share >= r_share:
        b = "trainer-bound"
        ev = (
            f"training side (log-prob passes + update) takes {t_share:.0%} of the step "
            f"({_s(trainer)} s) vs rollout {r_share:.0%}"
        )
    elif baseline.preemptions_mean > 0 or baseline.kv_usage_max >= 0.92:
        b = "kv-bound"
        ev = (
            f"rollout takes {r_share:.0%} of the step with the KV cache {baseline.kv_usage_max:.0%} full and "
            f"{baseline.preemptions_mean:.0f} preemptions per step"
        )
    elif tail_share >= 0.35:
        b = "rollout-long-tail"
        ev = (
            f"rollout takes {r_share:.0%} of the step and {tail_share:.0%} of generation is the long tail "
            f"after the median response finished ({_s(tail)} s)"
        )
    else:
        b = "rollout-throughput"
        ev = (
            f"rollout takes {r_share:.0%} of the step ({_s(rollout)} s); long tail {tail_share:.0%}, "
            f"KV cache peak {baseline.kv_usage_max:.0%}"
        )
    if disagg and b not in ("imbalance",) and max(t_idle, r_idle) > 0:
        ev += f"; idle trainer {_s(t_idle)} s, idle rollout {_s(r_idle)} s"
    return Profile(
        step_time=step,
        phases=ph,
        shares=shares,
        rollout_seconds=rollout,
        trainer_seconds=trainer,
        trainer_idle_seconds=t_idle,
        rollout_idle_seconds=r_idle,
        long_tail_share=tail_share,
        kv_pressure=kvp,
        preemptions=baseline.preemptions_mean,
        bottleneck=b,
        evidence=f"{b}: {ev}.",
    )
