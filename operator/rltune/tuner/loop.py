"""The local driver of the tuning lifecycle: trials as processes of a TrialBackend.

`rltune tune --local` runs here. It is a thin loop over the same `lifecycle.step` the operator's
reconciler drives: observe the backend's trials, step, launch what the step recorded, cancel what
it tore down. So a local run profiles, searches, confirms and concludes exactly like the operator.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from ..api.models import RLTuningJobSpec, trial_spec_for
from ..api.status import RLTuningJobStatus, TrialStatus
from . import lifecycle, records, restore
from .backend import TrialBackend, TrialObservation
from .core import Tuner
from .values import TrialRecord


@dataclass
class LoopEvent:
    """A lifecycle event with the trial record it concerns (None for job-level events)."""

    event: lifecycle.Event
    record: Optional[TrialRecord] = None
    tuner: Optional[Tuner] = None


@dataclass
class LoopResult:
    status: RLTuningJobStatus
    baseline: TrialRecord
    trials: list[TrialRecord]
    best: Optional[TrialRecord]
    reason: str
    forecast_error: Optional[float]
    profile: object = None
    timeline: list[tuple[str, float, float]] = field(default_factory=list)  # (id, start, end) wall seconds


def observation(obs: TrialObservation) -> lifecycle.Observation:
    """A backend's view of a launched trial, as the lifecycle reads it."""
    if obs.state == "running":
        return lifecycle.Observation(placed=True, steps=obs.steps)
    if obs.state == "succeeded":
        return lifecycle.Observation(placed=True, done=True, steps=obs.steps)
    if obs.state == "unschedulable":
        return lifecycle.Observation(
            refused=lifecycle.Refusal(records.FailureCause.NO_MATCHING_NODES, obs.reason or "unschedulable")
        )
    return lifecycle.Observation(
        placed=True, failure=obs.reason or "trial failed", exit_code=obs.exit_code, exported_reason=obs.reason or ""
    )


def run(
    spec: RLTuningJobSpec,
    backend: TrialBackend,
    on_event: Optional[Callable[[LoopEvent], None]] = None,
    job: str = "local",
    namespace: str = "default",
    poll_s: float = 0.2,
    seed: int = 0,
    clock: Callable[[], float] = time.time,
    wait: Optional[Callable[[], None]] = None,
) -> LoopResult:
    """Tune `spec` to its end on `backend`. `clock` is the time the lifecycle reads and `wait` how
    the loop waits for news (default: sleep `poll_s`); a simulated backend passes its virtual
    clock and its own wait, so nothing sleeps."""
    wait = wait or (lambda: time.sleep(poll_s))
    status = RLTuningJobStatus()
    launched: dict[str, float] = {}
    timeline: list[tuple[str, float, float]] = []
    t_start = clock()
    seeds: dict[str, int] = {}
    while True:
        observations = {
            t.id: observation(backend.poll(t.id)) for t in status.trials if t.state.is_active and t.id in launched
        }
        d = lifecycle.step(spec, status, observations, clock())
        status = d.status
        for tid in dict.fromkeys(d.teardown):
            if tid in launched:
                backend.cancel(tid)
                timeline.append((tid, launched.pop(tid), clock() - t_start))
        for t in status.trials:
            if t.state.is_active and t.id not in launched:  # a torn-down trial is never active again
                seeds[t.id] = seed if t.kind == "baseline" else seed + len(seeds)
                backend.launch(
                    t.id,
                    trial_spec_for(
                        namespace,
                        job,
                        t.id,
                        records.spec_of_trial(spec, t),  # a pool trial runs on its pool's GPUs
                        records.config_from_diff(spec.baseline, t.config),
                        t.steps,
                        spec.budget.warmup_steps,
                        seed=seeds[t.id],
                        pushgateway_url=spec.metrics.pushgateway_url,
                    ),
                )
                launched[t.id] = clock() - t_start
        if d.events and on_event is not None:
            tuner = restore.make_tuner(spec, status.trials)
            by_id = {t.id: t for t in status.trials}
            for e in d.events:
                on_event(LoopEvent(e, _record_of(spec, by_id, e), tuner))
        if status.phase.is_terminal:
            break
        if not d.events:
            wait()
    tuner = restore.make_tuner(spec, status.trials)
    base = next(t for t in status.trials if t.kind == "baseline")
    trials = [restore.to_record(spec, t) for t in status.trials if t.kind != "baseline"]
    best = next((r for r in trials if status.best and r.id == status.best.trial), None)
    profile = tuner.profile() if base.state == "Succeeded" else None
    fe = tuner.forecast_error() if any(t.kind == "search" for t in status.trials) else None
    return LoopResult(status, restore.to_record(spec, base), trials, best, status.message or "", fe, profile, timeline)


def _record_of(spec: RLTuningJobSpec, by_id: dict[str, TrialStatus], e: lifecycle.Event) -> Optional[TrialRecord]:
    return restore.to_record(spec, by_id[e.trial]) if e.trial in by_id else None
