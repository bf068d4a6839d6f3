"""A Tuner rebuilt from a job's status, the lifecycle's only memory: each trial's status record as a
TrialRecord, the baseline judged from its stored summary. Apart from `records` (the status records'
own helpers), so that those stay below the Tuner and nothing imports in a circle."""

from __future__ import annotations

from typing import Optional

from ..api.models import RLTuningJobSpec
from ..api.status import TrialState, TrialStatus
from .core import Tuner, baseline_record
from .gates import GateResult
from .records import baseline_trial, config_from_diff, gpus_of, unflatten_summary
from .search import Deadline
from .values import TrialRecord


def to_record(spec: RLTuningJobSpec, t: TrialStatus) -> TrialRecord:
    """A trial's status record as the Tuner's TrialRecord."""
    config = config_from_diff(spec.baseline, t.config)
    return TrialRecord(
        id=t.id,
        config=config,
        gpus=t.gpus or gpus_of(spec, config),
        predicted=t.predicted_seconds,
        predicted_std=t.predicted_std,
        summary=unflatten_summary(t.summary),
        objective=t.objective,
        state=t.state,
        reason=t.reason or "",
        cause=t.cause,
        gates={name: GateResult(passed=ok) for name, ok in (t.gates or {}).items()},
    )


def make_tuner(spec: RLTuningJobSpec, trials: list[TrialStatus], deadline: Optional[Deadline] = None) -> Tuner:
    """A Tuner rebuilt from the status: the baseline (judged from its stored summary) + search trials;
    `deadline` (search.Deadline) bounds its enumeration."""
    base = baseline_trial(trials)
    summary = unflatten_summary(base.summary) if base.state == TrialState.SUCCEEDED else None
    baseline = baseline_record(spec, summary, id=base.id)
    if summary is None and not base.state.is_active:
        baseline.state, baseline.reason = base.state, base.reason or ""
    history = [to_record(spec, t) for t in trials if t.kind == "search" and not t.superseded]
    return Tuner(spec, baseline, history, deadline)
