"""The tuning loop: a thin driver over Tuner methods and a TrialBackend.

Local runs (`rltune tune --local`) and the benchmark use this loop; the operator drives the same
Tuner methods from kopf handlers instead (one reconcile = one pass of the body of `run`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from ..api.models import RLTuningJobSpec, trial_spec_for
from .backend import TrialBackend, TrialObservation
from .core import TERMINAL, Tuner, TrialRecord, baseline_record
from .forecast import is_oom
from .summary import summarize


@dataclass
class Event:
    kind: str  # baseline-started, baseline-done, trial-started, trial-done, early-stopped, done
    record: Optional[TrialRecord] = None
    message: str = ""
    tuner: Optional[Tuner] = None


@dataclass
class LoopResult:
    baseline: TrialRecord
    trials: list[TrialRecord]
    best: Optional[TrialRecord]
    reason: str
    forecast_error: Optional[float]
    profile: object = None
    timeline: list[tuple[str, float, float]] = field(default_factory=list)  # (id, start, end) wall seconds


def _finish(tuner: Tuner, rec: TrialRecord, obs: TrialObservation) -> TrialRecord:
    if obs.state == "succeeded":
        return tuner.judge(rec, summarize(obs.steps))
    rec = rec.model_copy(deep=True)
    rec.state = "unschedulable" if obs.state == "unschedulable" else "failed"
    rec.reason = obs.reason or f"trial {obs.state}"
    if obs.steps:
        rec.summary = summarize(obs.steps)
    return rec


def _wait(backend: TrialBackend, tid: str, timeout: float, poll_s: float) -> TrialObservation:
    t0 = time.monotonic()
    while True:
        obs = backend.poll(tid)
        if obs.state != "running":
            return obs
        if time.monotonic() - t0 > timeout:
            backend.cancel(tid)
            return TrialObservation("failed", obs.steps, f"timed out after {timeout:.0f} s")
        time.sleep(poll_s)


def run(spec: RLTuningJobSpec, backend: TrialBackend, on_event: Callable[[Event], None] = lambda e: None,
        job: str = "local", namespace: str = "default", poll_s: float = 0.2, seed: int = 0,
        max_trials: Optional[int] = None) -> LoopResult:
    b = spec.budget
    t_start = time.monotonic()
    timeline = []
    base = baseline_record(spec)
    base.state = "running"
    on_event(Event("baseline-started", base, "profiling the baseline"))
    ts0 = time.monotonic() - t_start
    backend.launch(base.id, trial_spec_for(namespace, job, base.id, spec, base.config, b.steps_per_trial,
                                           b.warmup_steps, seed=seed, pushgateway_url=spec.metrics.pushgateway_url))
    obs = _wait(backend, base.id, b.trial_timeout_seconds, poll_s)
    timeline.append((base.id, ts0, time.monotonic() - t_start))
    tuner0 = Tuner(spec, base, [])
    base = _finish(tuner0, base, obs)
    tuner = Tuner(spec, base, [])
    on_event(Event("baseline-done", base, tuner.profile().evidence if tuner.profile() else base.reason, tuner))
    history: list[TrialRecord] = []
    if base.state != "succeeded":
        return LoopResult(base, [], None, f"baseline {base.state}: {base.reason}", None, None, timeline)
    limit = min(b.max_trials, max_trials or b.max_trials)
    running: dict[str, tuple[TrialRecord, float]] = {}
    n = 0
    reason = ""
    while True:
        tuner = Tuner(spec, base, history + [r for r, _ in running.values()])
        stop, why = tuner.done()
        if n >= limit and not running:
            reason = f"trial budget spent ({n}/{limit})"
            break
        if stop and not running:
            reason = why
            break
        used = sum(r.gpus for r, _ in running.values())
        slots = min(b.parallel_trials - len(running), limit - n)
        if not stop and slots > 0:
            props = tuner.propose(slots, spec.resources.gpu_budget - used)
            for p in props:
                n += 1
                tid = f"t{n}"
                rec = tuner.record_for(tid, p)
                rec.state = "running"
                backend.launch(tid, trial_spec_for(namespace, job, tid, spec, p.config, b.steps_per_trial,
                                                   b.warmup_steps, seed=seed + n,
                                                   pushgateway_url=spec.metrics.pushgateway_url))
                running[tid] = (rec, time.monotonic() - t_start)
                on_event(Event("trial-started", rec, f"{p.bottleneck}: {p.rationale}", tuner))
            if not props and not running:
                reason = "no configuration left to try"
                break
        # poll
        progressed = False
        for tid in list(running):
            rec, t0 = running[tid]
            obs = backend.poll(tid)
            if obs.state == "running":
                if time.monotonic() - t_start - t0 > b.trial_timeout_seconds:
                    backend.cancel(tid)
                    obs = TrialObservation("failed", obs.steps, f"timed out after {b.trial_timeout_seconds} s")
                elif obs.steps and tuner.early_stop(obs.steps, rec.gpus):
                    backend.cancel(tid)
                    rec = rec.model_copy(deep=True)
                    rec.state, rec.reason = "cancelled", "early-stopped: clearly slower than the incumbent"
                    rec.summary = summarize(obs.steps)
                    history.append(rec)
                    del running[tid]
                    timeline.append((tid, t0, time.monotonic() - t_start))
                    on_event(Event("early-stopped", rec, rec.reason, tuner))
                    progressed = True
                    continue
                else:
                    continue
            rec = _finish(tuner, rec, obs)
            history.append(rec)
            del running[tid]
            timeline.append((tid, t0, time.monotonic() - t_start))
            on_event(Event("trial-done", rec, rec.reason, tuner))
            progressed = True
        if running and not progressed:
            time.sleep(poll_s)
    tuner = Tuner(spec, base, history)
    res = LoopResult(base, history, tuner.best(), reason, tuner.forecast_error(), tuner.profile(), timeline)
    on_event(Event("done", tuner.best(), reason, tuner))
    return res
