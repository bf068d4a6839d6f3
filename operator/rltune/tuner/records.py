"""The operator's only door into rltune.tuner: status records <-> the tuner's TrialRecords.

The operator is stateless between reconciles: every tick it rebuilds the tuner's view (baseline +
history) from the job's status, asks it what to do, and writes the answers back, compact. Keeping
this mapping in one module keeps the handlers thin and the tuner free of Kubernetes.
"""

from __future__ import annotations

import math
from typing import Any, Optional

from ..api.models import RLConfig, RLTuningJobSpec
from ..api.status import TrialStatus

# status state <-> tuner state (the tuner speaks lower case)
_TO_TUNER = {"Pending": "pending", "Running": "running", "Scoring": "running", "Succeeded": "succeeded",
             "Rejected": "rejected", "Failed": "failed", "Unschedulable": "unschedulable",
             "MetricsUnavailable": "failed", "TimedOut": "failed", "Stopped": "stopped"}
_FROM_TUNER = {"succeeded": "Succeeded", "rejected": "Rejected", "failed": "Failed", "stopped": "Stopped",
               "cancelled": "Stopped", "unschedulable": "Unschedulable",
               "running": "Running", "pending": "Pending"}


def config_diff(baseline: RLConfig, config: RLConfig) -> dict[str, Any]:
    """Knob path -> value for every knob of `config` that differs from `baseline`."""
    b, c = baseline.flat(), config.flat()
    return {k: v for k, v in c.items() if b.get(k) != v and not (v is None and k not in b)}


def config_from_diff(baseline: RLConfig, diff: dict[str, Any]) -> RLConfig:
    return baseline.with_knobs(diff) if diff else baseline.model_copy(deep=True)


def gpus_of(spec: RLTuningJobSpec, config: RLConfig) -> int:
    return config.gpus or spec.resources.gpu_budget


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
    return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in out.items()}


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


def to_record(spec: RLTuningJobSpec, t: TrialStatus):
    from .. import tuner as T

    config = config_from_diff(spec.baseline, t.config)
    return T.TrialRecord(
        id=t.id, config=config, gpus=t.gpus or gpus_of(spec, config),
        predicted=t.predicted_seconds, predicted_std=t.predicted_std,
        summary=unflatten_summary(t.summary), objective=t.objective,
        state=_TO_TUNER.get(t.state, "failed"), reason=t.reason or "",
    )


def apply_judgement(t: TrialStatus, record, keep_rewards: bool = False) -> None:
    """Copy the tuner's verdict on a finished trial into its status record."""
    t.state = _FROM_TUNER.get(str(record.state).lower(), "Failed")  # type: ignore[assignment]
    t.reason = record.reason or t.reason
    gates = getattr(record, "gates", None) or {}
    t.gates = {k: (v if isinstance(v, bool) else str(v).startswith("pass")) for k, v in gates.items()} or None
    if t.state == "Rejected" and not t.reason:
        failed = [f"{k} {v}" for k, v in gates.items() if not (v is True or str(v).startswith("pass"))]
        t.reason = "; ".join(failed)[:300] or "rejected"
    t.objective = record.objective
    if record.summary is not None:
        t.summary = flatten_summary(record.summary, keep_rewards)
        t.measured_seconds = round(record.summary.step_time_mean, 4) if record.summary.steps else None


def make_tuner(spec: RLTuningJobSpec, trials: list[TrialStatus]):
    """A Tuner rebuilt from the status: the baseline (judged from its stored summary) + search trials."""
    from .. import tuner as T

    base = next(t for t in trials if t.kind == "baseline")
    summary = unflatten_summary(base.summary) if base.state == "Succeeded" else None
    baseline = T.baseline_record(spec, summary, id=base.id)
    if summary is None and base.state not in ACTIVE:
        baseline.state = _TO_TUNER.get(base.state, "failed")
        baseline.reason = base.reason or ""
    history = [to_record(spec, t) for t in trials if t.kind == "search"]
    return T.Tuner(spec, baseline, history)


ACTIVE = ("Pending", "Running", "Scoring")


def objective_of(spec: RLTuningJobSpec, step_seconds: float, gpus: int) -> float:
    return step_seconds * gpus if spec.objective == "gpuSecondsPerStep" else step_seconds
