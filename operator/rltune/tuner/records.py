"""Trial records in the job status <-> the Tuner's TrialRecords, and the one configuration diff.

The lifecycle is stateless between steps: every step rebuilds the Tuner's view (baseline +
history) from the status, asks it what to do, and writes the answers back, compact (a trial's
configuration stored as the knobs that differ from the baseline, its summary flattened).
"""

from __future__ import annotations

import math
from typing import Any, Optional

from ..api.models import RLConfig, RLTuningJobSpec
from ..api.status import FailureCause, TrialState, TrialStatus


def config_diff(baseline: RLConfig, config: RLConfig) -> dict[str, Any]:
    """Knob path -> value for every knob of `config` that differs from `baseline`: what the status
    stores (`config_from_diff` restores the configuration exactly)."""
    b, c = baseline.flat(), config.flat()
    return {k: v for k, v in c.items() if b.get(k) != v and not (v is None and k not in b)}


def config_changes(baseline: RLConfig, config: RLConfig, gpu_budget: int) -> dict[str, tuple[Any, Any]]:
    """Knob path -> (baseline value, new value), as a person reads a change: unset GPU counts are
    the budget, a colocated configuration has no trainer split, the real-mode CPU split is left out."""
    base, k = baseline.flat(), config.flat()
    out: dict[str, tuple[Any, Any]] = {}
    for p, v in k.items():
        if p == "cpu" or p.startswith("cpu."):
            continue
        b = base.get(p)
        if b is None and v is None:
            continue
        if p == "gpus":
            b, v = b or gpu_budget, v or gpu_budget
        if p == "trainer.etp":  # unset is the dense TP (Megatron's default): show the layout's value
            b, v = baseline.trainer.expert_tp, config.trainer.expert_tp
        if p == "trainerGpus" and k.get("placement") == "colocated":
            continue
        if b != v:
            out[p] = (b, v)
    return out


def failure_cause(reason: str, exit_code: Optional[int] = None) -> FailureCause:
    """The cause of a failed trial, decided once where the failure is observed (the container's exit
    code, the trial's own one-line reason) and then kept as data."""
    from .forecast import is_oom

    return FailureCause.OUT_OF_MEMORY if is_oom(reason, exit_code) else FailureCause.CRASHED


def config_from_diff(baseline: RLConfig, diff: dict[str, Any]) -> RLConfig:
    return baseline.with_knobs(diff) if diff else baseline.model_copy(deep=True)


def spec_of_trial(spec: RLTuningJobSpec, t: TrialStatus) -> RLTuningJobSpec:
    """The job as the trial runs it: in the other pool its `pool` names, else as written."""
    from ..api.models import pool_spec

    pool = spec.resources.pool(t.pool)
    return pool_spec(spec, pool) if pool is not None else spec


def gpus_of(spec: RLTuningJobSpec, config: RLConfig) -> int:
    return spec.layout(config).gpus


def baseline_steps(spec: RLTuningJobSpec) -> int:
    """Steps of the baseline's profile. With constraints.rewardGate nonInferiority as long as the
    winner's confirmation run, whose reward is judged against it (equal lengths per side give that
    test its power); otherwise a trial's length."""
    if spec.constraints.reward_gate == "nonInferiority":
        return max(spec.budget.steps_per_trial, spec.budget.confirm_steps)
    return spec.budget.steps_per_trial


# ----------------------------------------------------------------- summaries, flat in the status


def flatten_summary(summary, keep_rewards: bool) -> dict[str, float]:
    d = summary.model_dump()
    out: dict[str, float] = {}
    for k, v in d.items():
        if k == "phases":
            for p, s in (v or {}).items():
                out[f"phases.{p}"] = float(s)
        elif k == "rewards":
            rw = list(v or [])
            if rw:
                out["rewardMean"] = sum(rw) / len(rw)
            if keep_rewards:
                for i, r in enumerate(rw):
                    out[f"rewards.{i}"] = float(r)
        elif isinstance(v, bool):
            out[k] = 1.0 if v else 0.0
        elif isinstance(v, (int, float)):
            out[k] = float(v) if math.isfinite(float(v)) else -1.0
    # NaN/inf (phases, rewards of a trial that reported NaN) is no JSON number: stored as -1 like the rest
    return {k: (round(v, 6) if math.isfinite(v) else -1.0) for k, v in out.items()}


def unflatten_summary(flat: Optional[dict[str, float]]):
    from ..tuner.summary import TrialSummary

    if not flat:
        return None
    fields = TrialSummary.model_fields
    d: dict[str, Any] = {"phases": {}, "rewards": []}
    rewards: dict[int, float] = {}
    for k, v in flat.items():
        if k.startswith("phases."):
            d["phases"][k[7:]] = v
        elif k.startswith("rewards."):
            rewards[int(k[8:])] = v
        elif k in fields:
            ann = fields[k].annotation
            d[k] = bool(v) if ann is bool else int(v) if ann is int else v
    if rewards:
        d["rewards"] = [rewards[i] for i in sorted(rewards)]
    elif "rewardMean" in flat and d.get("steps"):
        d["rewards"] = [flat["rewardMean"]] * int(d["steps"])
    return TrialSummary.model_validate(d)


# ----------------------------------------------------------------- records


def apply_judgement(t: TrialStatus, record, keep_rewards: bool = False) -> None:
    """Copy the tuner's verdict on a finished trial into its status record."""
    t.state = record.state
    t.reason = record.reason or t.reason
    t.gates = {name: g.passed for name, g in record.gates.items()} or None
    if t.state == TrialState.REJECTED and not t.reason:
        failed = [f"{name} {g}" for name, g in record.gates.items() if not g.passed]
        t.reason = "; ".join(failed)[:300] or "rejected"
    t.objective = record.objective
    if record.summary is not None:
        t.summary = flatten_summary(record.summary, keep_rewards)
        t.measured_seconds = round(record.summary.step_time, 4) if record.summary.steps else None


def baseline_trial(trials: list[TrialStatus]) -> TrialStatus:
    """The job's baseline trial: the last one recorded (a preempted baseline's retry comes after it)."""
    return [t for t in trials if t.kind == "baseline"][-1]


def cost_per_step(price_per_gpu_hour: float, gpus: int, step_seconds: float) -> float:
    """Price of one RL step: GPUs x seconds at the pool's price per GPU-hour."""
    return price_per_gpu_hour * gpus * step_seconds / 3600.0


def objective_of(spec: RLTuningJobSpec, step_seconds: float, gpus: int) -> float:
    """The job's objective of one configuration: seconds, GPU-seconds or cost per step."""
    if spec.objective == "gpuSecondsPerStep":
        return step_seconds * gpus
    if spec.objective == "costPerStep":
        return cost_per_step(spec.resources.price_per_gpu_hour or 0.0, gpus, step_seconds)
    return step_seconds
