"""The one tuning lifecycle: baseline -> profile -> search -> confirm -> conclude, as a pure step.

`step(spec, status, observations, now, generation) -> Decisions` takes the job's status (the
lifecycle's only memory), what the driver observed of each active trial (plain data), and the time;
it returns the new status and what to do: trials to start (recorded Pending: the driver creates
their pods or processes), trials to tear down, events. The operator's reconciler drives it from
pods and Prometheus (read -> step -> write); `rltune tune --local` drives it from local processes.
Nothing here knows Kubernetes, so the lifecycle is unit-tested with plain data.

    Pending -> Profiling -> Searching -> Confirming -> Succeeded
                   |            |  ^          |
                   v            v  +----------+ (the winner did not confirm: next best)
                 Failed       Failed

A job with other GPU pools (spec.resources.pools) stays Confirming for one more trial when the
forecast says the winner is cheaper per step in another pool (rltune.tuner.pools): that trial runs
there, and its measurement, not the forecast, goes into status.poolOffer.

Budget and failure accounting live in one place each: the search's budget in `_search`, failures
against `budget.maxFailedTrials` there too; the Tuner decides when the search is exhausted.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Callable, Optional

from ..api.metrics import StepRecord
from ..api.models import RLConfig, RLTuningJobSpec
from ..api.status import (
    BaselineStatus,
    BestStatus,
    Condition,
    DroppedKnob,
    FailureCause,
    Phase,
    PoolOfferStatus,
    RLTuningJobStatus,
    TrialState,
    TrialStatus,
    TuningCostStatus,
)
from . import gates, records
from .payback import tuning_cost
from .search import Deadline, explicit

if TYPE_CHECKING:
    from .core import TrialRecord
    from .summary import TrialSummary

REASON_GRACE_SECONDS = 5.0  # how long a failed trial's exported reason may take to reach the metrics store


# --------------------------------------------------------------------------- inputs and outputs


@dataclass(frozen=True)
class Refusal:
    """The driver could not start a trial: no node can hold it, or the API server refuses its pods."""

    cause: FailureCause
    message: str


@dataclass(frozen=True)
class Observation:
    """What the driver saw of one active trial (plain data; defaults: nothing seen yet)."""

    placed: bool = False  # every pod is scheduled (locally: the process was launched)
    pods: int = 1  # how many pods the trial needs (one per node it spans)
    done: bool = False  # rank 0 finished with exit code 0
    failure: str = ""  # one line on why a pod or process failed ("" = none failed)
    exit_code: Optional[int] = None
    exported_reason: Optional[str] = None  # the trial's own exported failure reason (None: none visible yet)
    pending_reason: str = ""  # the scheduler's message while not placed
    steps: Optional[list[StepRecord]] = None  # steps measured so far (None: not read this time)
    metrics_error: str = ""
    refused: Optional[Refusal] = None
    gated: str = ""  # Kueue holds the trial's pods (scheduling gate / suspended): the LocalQueue's name
    preempted: str = ""  # Kueue evicted (or the cluster preempted) the trial's pods: why ("" = not)


@dataclass(frozen=True)
class Event:
    type: str  # Normal or Warning
    reason: str
    message: str
    trial: Optional[str] = None  # the trial it concerns, if any


@dataclass
class Decisions:
    status: RLTuningJobStatus
    started: list[str] = field(default_factory=list)  # trials recorded Pending this step
    teardown: list[str] = field(default_factory=list)  # trials whose pods/processes must go
    finished: list[TrialState] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)

    def then(self, later: "Decisions") -> "Decisions":
        """This step followed by a later one (the driver's second step after a refusal)."""
        return Decisions(
            later.status,
            self.started + later.started,
            self.teardown + later.teardown,
            self.finished + later.finished,
            self.events + later.events,
        )


def _finite(x: Optional[float]) -> Optional[float]:
    return x if x is None or math.isfinite(x) else None


# --------------------------------------------------------------------------- time and conditions


def _cheaper(saving: float) -> str:
    """A saving in cost per step in words: '23% cheaper per step' / '12% dearer per step'."""
    return f"{abs(saving):.0%} {'cheaper' if saving >= 0 else 'dearer'} per step"


def now_iso(t: Optional[float] = None) -> str:
    return datetime.fromtimestamp(t if t is not None else time.time(), timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_iso(s: Optional[str]) -> Optional[float]:
    if not s:
        return None
    return datetime.strptime(s, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()


def set_condition(
    status: RLTuningJobStatus, type_: str, value: str, reason: str, message: str, gen: int, now: float
) -> None:
    for c in status.conditions:
        if c.type == type_:
            if c.status != value:
                c.last_transition_time = now_iso(now)
            c.status, c.reason, c.message, c.observed_generation = value, reason, message[:1000], gen  # type: ignore[assignment]
            return
    status.conditions.append(
        Condition(
            type=type_,
            status=value,
            reason=reason,
            message=message[:1000],  # type: ignore[arg-type]
            last_transition_time=now_iso(now),
            observed_generation=gen,
        )
    )


def set_phase(
    status: RLTuningJobStatus,
    phase: Phase,
    message: str,
    gen: int,
    now: float,
    failure: Optional[tuple[str, str]] = None,
    complete: Optional[tuple[str, str]] = None,
) -> None:
    """The phase and every condition that follows from it (kstatus Ready/Reconciling/Stalled too)."""
    status.phase = phase
    status.message = message[:500]
    set_condition(
        status,
        "Ready",
        "True" if phase == Phase.SUCCEEDED else "False",
        (complete or failure or (phase, ""))[0],
        message,
        gen,
        now,
    )
    set_condition(status, "Reconciling", "False" if phase.is_terminal else "True", phase, message, gen, now)
    set_condition(
        status, "Stalled", "True" if phase == Phase.FAILED else "False", (failure or (phase, ""))[0], message, gen, now
    )
    if phase.is_terminal:
        status.completed_at = status.completed_at or now_iso(now)
        set_condition(status, "Progressing", "False", phase, message, gen, now)
    else:
        set_condition(status, "Progressing", "True", phase, message, gen, now)
    if failure:
        set_condition(status, "Failed", "True", failure[0], failure[1], gen, now)
        set_condition(status, "Complete", "False", "Failed", failure[1], gen, now)
    elif complete:
        set_condition(status, "Complete", "True", complete[0], complete[1], gen, now)
        set_condition(status, "Failed", "False", "Succeeded", "", gen, now)
    elif not phase.is_terminal:
        set_condition(status, "Complete", "False", "InProgress", message, gen, now)
        set_condition(status, "Failed", "False", "InProgress", "", gen, now)


def refuse_spec(status: RLTuningJobStatus, reason: str, message: str, gen: int, now: float) -> Decisions:
    """The spec cannot run (invalid, unsupported, against policy): the job fails before any trial."""
    status = status.model_copy(deep=True)
    status.started_at = status.started_at or now_iso(now)
    events = (
        []
        if status.observed_generation == gen and status.phase == Phase.FAILED
        else [Event("Warning", reason, message)]
    )
    status.observed_generation = gen
    set_phase(status, Phase.FAILED, message, gen, now, failure=(reason, message))
    set_condition(status, "SpecValid", "False", reason, message, gen, now)
    return Decisions(status, events=events)


def wait_for(status: RLTuningJobStatus, condition: str, reason: str, message: str, gen: int, now: float) -> Decisions:
    """Something the cluster lacks (e.g. the KubeRay operator) keeps the job from starting: it waits,
    saying so in `condition`=False, and goes on by itself once the cluster has it."""
    status = status.model_copy(deep=True)
    status.started_at = status.started_at or now_iso(now)
    old = next((c for c in status.conditions if c.type == condition), None)
    events = (
        []
        if old is not None and old.status == "False" and old.reason == reason
        else [Event("Warning", reason, message)]
    )
    status.observed_generation = gen
    set_phase(status, Phase.PENDING, message, gen, now)
    set_condition(status, condition, "False", reason, message, gen, now)
    return Decisions(status, events=events)


# --------------------------------------------------------------------------- the step


def step(
    spec: RLTuningJobSpec,
    status: RLTuningJobStatus,
    observations: dict[str, Observation],
    now: float,
    generation: int = 1,
    budget_seconds: Optional[float] = None,
    clock: Callable[[], float] = time.monotonic,
) -> Decisions:
    """One pass of the lifecycle. Pure: `status` is not modified; the new one is in the result.

    `budget_seconds` (on `clock`; None: unbounded): how long the search's enumeration may take in
    this step. Once spent, the step proposes from what it enumerated (maybe nothing), never ends the
    search for it, and says so in condition SearchTruncated (docs/operator.md 'Bounded work per job')."""
    deadline = Deadline(budget_seconds, clock) if budget_seconds is not None else None
    lc = _Lifecycle(spec, status.model_copy(deep=True), now, generation, deadline)
    lc.run(observations)
    return lc.decisions


class _Lifecycle:
    """The state of one step, so that the methods below read like the lifecycle they implement."""

    def __init__(
        self,
        spec: RLTuningJobSpec,
        status: RLTuningJobStatus,
        now: float,
        gen: int,
        deadline: Optional[Deadline] = None,
    ):
        self.spec, self.status, self.now, self.gen = spec, status, now, gen
        self.deadline = deadline
        self.decisions = Decisions(status)
        self._tuner = None

    # ---------------------------------------------------------------- helpers

    def info(self, reason: str, message: str, trial: Optional[str] = None) -> None:
        self.decisions.events.append(Event("Normal", reason, message, trial))

    def warn(self, reason: str, message: str, trial: Optional[str] = None) -> None:
        self.decisions.events.append(Event("Warning", reason, message, trial))

    def phase(self, phase: Phase, message: str, **kw) -> None:
        set_phase(self.status, phase, message, self.gen, self.now, **kw)

    def tuner(self):
        if self._tuner is None:
            self._tuner = records.make_tuner(self.spec, self.status.trials, self.deadline)
        return self._tuner

    def active(self, kind: Optional[str] = None) -> list[TrialStatus]:
        return [t for t in self.status.trials if t.state.is_active and (kind is None or t.kind == kind)]

    def config_of(self, t: TrialStatus) -> RLConfig:
        return records.config_from_diff(self.spec.baseline, t.config)

    # ---------------------------------------------------------------- the pass

    def run(self, observations: dict[str, Observation]) -> None:
        st = self.status
        st.started_at = st.started_at or now_iso(self.now)
        set_condition(st, "SpecValid", "True", "Valid", "the spec passed validation", self.gen, self.now)
        if st.phase.is_terminal:
            if st.observed_generation == self.gen:
                return
            self.spec_changed()
        st.observed_generation = self.gen
        if st.phase in (Phase.PENDING, Phase.VALIDATING):
            self.start_baseline()
        self.metrics_availability(observations)
        for t in list(st.trials):
            if t.state.is_active:
                self.advance(t, observations.get(t.id, Observation()))
        self.decide()
        self.report_truncation()
        # NaN/inf (a trial that reported NaN) is no JSON number: the API server would refuse the write
        for t in st.trials:
            t.measured_seconds, t.objective = _finite(t.measured_seconds), _finite(t.objective)
            t.predicted_seconds, t.predicted_std = _finite(t.predicted_seconds), _finite(t.predicted_std)
        search = [t for t in st.trials if t.kind == "search" and not t.superseded]
        st.trials_done = f"{sum(1 for t in search if t.state.is_terminal)}/{self.spec.budget.max_trials}"
        st.trials_failed = sum(1 for t in search if t.state.is_failure)

    def metrics_availability(self, observations: dict[str, Observation]) -> None:
        """Condition MetricsAvailable: False (reason MetricsUnavailable, event once) while trial metrics
        cannot be read (Prometheus down, failing or not configured), True again once a read works.
        Nothing is scored meanwhile: a finished trial waits in Scoring, up to budget.metricsTimeoutSeconds."""
        errors = sorted(o.metrics_error for o in observations.values() if o.metrics_error)
        old = next((c for c in self.status.conditions if c.type == "MetricsAvailable"), None)
        if errors:
            msg = "trial metrics cannot be read: " + re.sub(r" at 0x[0-9a-f]+", "", errors[0])
            if old is None or old.status != "False":
                self.warn("MetricsUnavailable", msg)
            set_condition(self.status, "MetricsAvailable", "False", "MetricsUnavailable", msg, self.gen, self.now)
        elif any(o.steps is not None for o in observations.values()):
            msg = "trial metrics are read from Prometheus"
            set_condition(self.status, "MetricsAvailable", "True", "MetricsAvailable", msg, self.gen, self.now)

    def report_truncation(self) -> None:
        """Condition SearchTruncated: True (reason TickBudget, a Warning event when it turns True) when the
        step's budget ran out before the search had weighed the whole space, False again (reason
        Complete) once an enumeration finishes in time. Absent for a job that was never truncated."""
        d = self.deadline
        if d is None:
            return
        old = next((c for c in self.status.conditions if c.type == "SearchTruncated"), None)
        if d.truncated:
            msg = (
                f"the search ran past its budget of {d.seconds:g}s for this tick (operator setting "
                f"tickBudgetSeconds): {'; '.join(d.truncated)}; it proposes from what it weighed and does not end "
                "the search on it: list fewer values in spec.searchSpace.knobs or freeze knobs"
            )
            if old is None or old.status != "True":
                self.warn("SearchTruncated", msg)
            set_condition(self.status, "SearchTruncated", "True", "TickBudget", msg, self.gen, self.now)
        elif old is not None and d.completed:
            msg = f"the search weighed the whole space within its budget of {d.seconds:g}s"
            set_condition(self.status, "SearchTruncated", "False", "Complete", msg, self.gen, self.now)

    def spec_changed(self) -> None:
        """A finished job whose spec changed: resume the search, or start over without a baseline."""
        st = self.status
        base = next((t for t in st.trials if t.kind == "baseline"), None)
        if base is not None and base.state == TrialState.SUCCEEDED:
            self.info("Resumed", f"spec changed (generation {self.gen}): searching again")
            st.completed_at = None
            st.best = None if st.best and not st.best.confirmed else st.best
            self.phase(Phase.SEARCHING, "resumed after a spec change")
        else:  # it ended before a baseline was measured (invalid spec, no node for it): start over
            self.info("Restarted", f"spec changed (generation {self.gen}): profiling the baseline again")
            st.trials = [t for t in st.trials if t.kind != "baseline"]
            st.baseline, st.completed_at = None, None
            self.phase(Phase.PENDING, "spec changed: starting over")

    # ---------------------------------------------------------------- trials

    def add_trial(
        self,
        trial_id: str,
        kind: str,
        config: RLConfig,
        steps: int,
        predicted=None,
        predicted_std=None,
        of: Optional[str] = None,
        pool: Optional[str] = None,
    ) -> TrialStatus:
        t = TrialStatus(
            id=trial_id,
            kind=kind,
            of=of,
            pool=pool,
            config=records.config_diff(self.spec.baseline, config),  # type: ignore[arg-type]
            gpus=records.gpus_of(self.spec, config),
            steps=steps,
            predicted_seconds=None if predicted is None else round(float(predicted), 4),
            predicted_std=None if predicted_std is None else round(float(predicted_std), 4),
            state=TrialState.PENDING,
            created_at=now_iso(self.now),
        )
        self.status.trials.append(t)
        self.decisions.started.append(trial_id)
        changed = ", ".join(f"{k}={v}" for k, v in sorted(t.config.items())) or "the baseline configuration"
        pred = f", forecast {t.predicted_seconds:.1f}s/step" if t.predicted_seconds else ""
        self.info("TrialStarted", f"trial {trial_id} ({kind}, {t.gpus} GPUs, {steps} steps): {changed}{pred}", trial_id)
        self._tuner = None
        return t

    def finish(self, t: TrialStatus, state: TrialState, reason: str, cause: Optional[FailureCause] = None) -> None:
        t.state = state
        t.reason = reason[:300] if reason else t.reason
        t.cause = cause if cause is not None else t.cause
        t.finished_at = t.finished_at or now_iso(self.now)
        self.decisions.teardown.append(t.id)
        self.decisions.finished.append(state)
        self._tuner = None
        measured = f", {t.measured_seconds:.1f}s/step" if t.measured_seconds else ""
        msg = f"trial {t.id} {state}{measured}" + (f": {t.reason}" if t.reason else "")
        (self.info if state in (TrialState.SUCCEEDED, TrialState.STOPPED) else self.warn)(f"Trial{state}", msg, t.id)

    def start_baseline(self) -> None:
        self.report_coverage()
        if not any(t.kind == "baseline" for t in self.status.trials):
            # its GPU counts explicit, as every other trial's: a trial runtime must not fall back on a
            # default of its own (the twin's is 8 GPUs, where the pods hold the whole budget)
            r = self.spec.resources
            base = explicit(self.spec.baseline, r.gpu_budget, r.gpus_per_node)
            self.add_trial("baseline", "baseline", base, records.baseline_steps(self.spec))
        self.status.baseline = self.status.baseline or BaselineStatus(
            state=TrialState.PENDING, gpus=records.gpus_of(self.spec, self.spec.baseline)
        )
        self.phase(Phase.PROFILING, "profiling the baseline")

    def advance(self, t: TrialStatus, obs: Observation) -> None:
        if obs.refused is not None:
            self.refused(t, obs.refused)
            return
        budget = self.spec.budget
        if obs.preempted and t.state in (TrialState.PENDING, TrialState.RUNNING):
            self.preempted(t, obs.preempted)
            return
        if t.state == TrialState.PENDING:
            if obs.gated and not obs.placed:  # waiting for Kueue's admission: no schedule timeout
                if t.queue != obs.gated:
                    t.queue, t.reason = obs.gated, f"waiting for Kueue admission in queue {obs.gated}"
                    self.info("Queued", f"trial {t.id} {t.reason}", t.id)
                return
            if t.queue and not t.admitted_at:
                t.admitted_at, t.reason = now_iso(self.now), None
            created = parse_iso(t.admitted_at or t.created_at) or self.now
            if obs.placed:
                t.state, t.started_at = TrialState.RUNNING, now_iso(self.now)
            elif self.now - created > budget.schedule_timeout_seconds:
                n = f"not all {obs.pods} pods scheduled within {budget.schedule_timeout_seconds}s"
                self.finish(
                    t,
                    TrialState.UNSCHEDULABLE,
                    n + (f": {obs.pending_reason}" if obs.pending_reason else ""),
                    FailureCause.UNSCHEDULABLE,
                )
                return
            else:
                return
        if t.state == TrialState.RUNNING:
            started = parse_iso(t.started_at) or self.now
            if obs.failure:
                self.failed(t, obs)
                return
            if obs.done:
                t.state, t.finished_at = TrialState.SCORING, now_iso(self.now)
            elif self.now - started > budget.trial_timeout_seconds:
                self.finish(
                    t,
                    TrialState.TIMED_OUT,
                    f"ran longer than budget.trialTimeoutSeconds={budget.trial_timeout_seconds}",
                    FailureCause.TIMED_OUT,
                )
                return
            else:
                if t.kind == "search":
                    self.maybe_early_stop(t, obs)
                elif t.kind == "confirm":
                    self.confirmed_at_interim(t, obs.steps or [])
                return
        if t.state == TrialState.SCORING:
            self.score(t, obs)

    def failed(self, t: TrialStatus, obs: Observation) -> None:
        """A pod or process failed. The trial's own exported reason beats the exit code; it may
        take a moment to become visible, so the first sighting waits REASON_GRACE_SECONDS for it."""
        first_seen = parse_iso(t.finished_at)
        if obs.exported_reason is None and (first_seen is None or self.now - first_seen < REASON_GRACE_SECONDS):
            t.finished_at = t.finished_at or now_iso(self.now)
            return
        why = f"{obs.exported_reason} ({obs.failure})" if obs.exported_reason else obs.failure
        cause = records.failure_cause(why, obs.exit_code)
        if cause == FailureCause.OUT_OF_MEMORY and "out of memory" not in why:
            why += ": out of memory"
        self.finish(t, TrialState.FAILED, why, cause)

    def preempted(self, t: TrialStatus, why: str) -> None:
        """Kueue evicted the trial (or the cluster preempted its pods): no verdict on the configuration.
        The first time it runs again as `<id>-retry` with the same configuration; a retry that is
        preempted too stays Preempted (not a failure; a baseline's ends the profiling)."""
        self.finish(t, TrialState.PREEMPTED, why, FailureCause.PREEMPTED)
        if t.retry_of is not None or self.status.phase.is_terminal:
            return
        cfg = self.config_of(t)
        r = self.add_trial(
            f"{t.id}-retry", t.kind, cfg, t.steps, t.predicted_seconds, t.predicted_std, of=t.of, pool=t.pool
        )
        r.retry_of = t.id

    def refused(self, t: TrialStatus, r: Refusal) -> None:
        """The driver could not start `t`. No node can hold it: the trial is Unschedulable (the
        baseline's fails the job). The API server refuses its pods: the spec is at fault, the job fails."""
        if r.cause == FailureCause.NO_MATCHING_NODES:
            self.finish(t, TrialState.UNSCHEDULABLE, r.message, r.cause)
            if t.kind == "baseline":
                if self.status.baseline is not None:
                    self.status.baseline.state, self.status.baseline.reason = TrialState.UNSCHEDULABLE, r.message[:300]
                set_condition(self.status, "PodsSchedulable", "False", "NoMatchingNodes", r.message, self.gen, self.now)
                self.phase(
                    Phase.FAILED, f"no node can run the baseline: {r.message}", failure=("NoMatchingNodes", r.message)
                )
            return
        self.finish(t, TrialState.FAILED, r.message, r.cause)
        for other in self.active():
            self.finish(other, TrialState.STOPPED, "the job's pods are refused by the API server")
        set_condition(self.status, "SpecValid", "False", r.cause, r.message, self.gen, self.now)
        self.phase(Phase.FAILED, r.message, failure=(r.cause, r.message))

    def maybe_early_stop(self, t: TrialStatus, obs: Observation) -> None:
        steps = obs.steps
        if not steps or not [s for s in steps if not s.warmup]:
            return
        if self.tuner().early_stop(steps, gpus=t.gpus):
            from .summary import summarize

            summary = summarize(steps)
            t.summary = records.flatten_summary(summary, keep_rewards=False)
            t.measured_seconds = round(summary.step_time, 4) if summary.steps else None
            t.objective = records.objective_of(self.spec, summary.step_time, t.gpus) if summary.steps else None
            self.finish(t, TrialState.STOPPED, f"early-stopped after {len(steps)} steps: cannot beat the best so far")

    def confirmed_at_interim(self, t: TrialStatus, steps: list[StepRecord]) -> bool:
        """The confirmation's interim look (gates.confirmation_looks): once its first steps are in, a
        winner that passes every gate at the look's level and beats the baseline on the objective is
        confirmed (True) and its pods stop; otherwise it runs to its full length, judged there. Also
        taken when scoring a run whose interim was never seen running, so the verdict does not depend
        on when the steps were observed."""
        from .summary import summarize

        interim = self.looks_of(t)[0]
        if interim.final or len(steps) < interim.steps:
            return False
        judged = self.judge_confirmation(t, summarize(steps[: interim.steps]), interim)
        if not (judged.state == TrialState.SUCCEEDED and self.beats_baseline(judged.objective)):
            return False
        records.apply_judgement(t, judged, keep_rewards=False)
        self.finish(
            t,
            TrialState.SUCCEEDED,
            f"confirmed at the interim look after {interim.steps} of {t.steps} steps "
            f"(reward test at alpha {interim.alpha:g}): {t.reason or ''}",
        )
        return True

    def beats_baseline(self, objective: Optional[float]) -> bool:
        """Better than the baseline on the job's objective, the one the search ranked by (with
        gpuSecondsPerStep or costPerStep a layout on fewer GPUs may be slower per step and still better)."""
        base = records.baseline_trial(self.status.trials).objective
        return objective is not None and base is not None and objective < base

    def looks_of(self, t: TrialStatus) -> tuple[gates.Look, ...]:
        """The looks at confirmation `t`, by the steps it was started with (a later budget edit does
        not move them)."""
        return gates.confirmation_looks(
            self.spec.budget.model_copy(update={"confirm_steps": t.steps}), self.spec.constraints
        )

    def judge_confirmation(self, t: TrialStatus, summary: TrialSummary, look: gates.Look) -> TrialRecord:
        """The tuner's verdict on a confirmation run at one of its looks."""
        return self.judge_of(t).judge(
            records.to_record(self.spec, t),
            summary,
            confirmation=self.spec.constraints.reward_gate == "nonInferiority",
            alpha=look.alpha,
        )

    def judge_of(self, t: TrialStatus):
        """The Tuner that judges `t`: the job's, or (a trial in another pool) one for the pool's spec."""
        spec = records.spec_of_trial(self.spec, t)
        if spec is self.spec:
            return self.tuner()
        return records.make_tuner(spec, [x for x in self.status.trials if x.kind == "baseline"])

    def score(self, t: TrialStatus, obs: Observation) -> None:
        """Score a finished trial once all its steps are visible; never on guesses."""
        from .summary import summarize

        budget = self.spec.budget
        steps = obs.steps or []
        if len(steps) < t.steps:
            finished = parse_iso(t.finished_at) or self.now
            if self.now - finished > budget.metrics_timeout_seconds:
                self.finish(
                    t,
                    TrialState.METRICS_UNAVAILABLE,
                    f"{len(steps)} of {t.steps} steps reported within {budget.metrics_timeout_seconds}s"
                    + (f" ({obs.metrics_error})" if obs.metrics_error else ""),
                    FailureCause.METRICS_UNAVAILABLE,
                )
            return
        if t.kind == "confirm" and self.confirmed_at_interim(t, steps):
            return
        summary = summarize(steps)
        if t.kind == "baseline":
            t.summary = records.flatten_summary(summary, keep_rewards=True)
            t.measured_seconds = round(summary.step_time, 4) if summary.steps else None
            t.objective = records.objective_of(self.spec, summary.step_time, t.gpus) if summary.steps else None
            if summary.failed or not summary.steps:
                self.finish(
                    t, TrialState.FAILED, "the baseline reported no steady-state step", FailureCause.NO_STEADY_STATE
                )
            else:
                self.finish(t, TrialState.SUCCEEDED, "")
            return
        spec = records.spec_of_trial(self.spec, t)
        if t.kind == "confirm":
            judged = self.judge_confirmation(t, summary, self.looks_of(t)[-1])
        else:
            judged = self.judge_of(t).judge(records.to_record(self.spec, t), summary)
        records.apply_judgement(t, judged, keep_rewards=False)
        if t.objective is None and summary.steps:
            t.objective = records.objective_of(spec, summary.step_time, t.gpus)
        self.finish(t, t.state, t.reason or "", FailureCause.NO_STEADY_STATE if t.state == TrialState.FAILED else None)

    # ---------------------------------------------------------------- the phases

    def decide(self) -> None:
        st = self.status
        if st.phase == Phase.PROFILING:
            self.after_profiling()
        if st.phase == Phase.SEARCHING:
            self.search()
        if st.phase == Phase.CONFIRMING:
            if any(t.kind == "pool" for t in st.trials):
                self.after_pool()
            else:
                self.after_confirming()
        if st.phase not in (Phase.PENDING, Phase.PROFILING) and any(t.kind == "search" for t in st.trials):
            fe = self.tuner().forecast_error()
            if fe is not None and fe == fe:
                st.forecast_error = round(float(fe), 4)

    def teardown_all(self) -> None:
        for t in self.active():
            self.finish(t, TrialState.STOPPED, f"job {self.status.phase.lower()}")

    def after_profiling(self) -> None:
        base = records.baseline_trial(self.status.trials)
        if base.state.is_active:
            return
        bs = self.status.baseline or BaselineStatus()
        bs.state, bs.gpus, bs.reason = base.state, base.gpus, base.reason
        self.status.baseline = bs
        if base.state != TrialState.SUCCEEDED:
            if self.status.phase != Phase.FAILED:
                self.phase(
                    Phase.FAILED,
                    f"the baseline failed: {base.reason}",
                    failure=("BaselineFailed", f"baseline trial {base.state}: {base.reason}"),
                )
            return
        from .profile import profile

        summary = records.unflatten_summary(base.summary)
        prof = profile(self.spec, summary)
        bs.step_seconds = round(summary.step_time, 4)
        bs.gpu_seconds_per_step = round(summary.step_time * base.gpus, 2)
        bs.breakdown = {k: round(v, 4) for k, v in summary.phases.items()}
        bs.bottleneck = prof.bottleneck
        bs.evidence = [e.strip()[:200] for e in prof.evidence.split(";") if e.strip()][:16] or None
        self.report_reward_power(summary.rewards)
        self.info(
            "Profiled",
            f"baseline {bs.step_seconds:.1f}s/step on {base.gpus} GPUs, "
            f"bottleneck {bs.bottleneck}: {'; '.join(bs.evidence or [])}"[:1000],
        )
        self.phase(Phase.SEARCHING, f"baseline {bs.step_seconds:.1f}s/step, bottleneck {bs.bottleneck}: searching")

    def report_reward_power(self, base_rewards: list[float]) -> None:
        """Condition RewardGatePowered: does the winner's reward gate hold the tolerance (a drop at it
        caught >= 95%, a healthy winner failed <= 5% at the baseline's measured reward noise)? Said
        up front so that a job whose gate cannot is not read as quality-checked at its tolerance."""

        b, c = self.spec.budget, self.spec.constraints
        tol, cond = c.reward_tolerance, "RewardGatePowered"
        screen = (
            f"trials are only screened for drops shown beyond the {tol:.1%} tolerance (short trials catch drops of "
            "about 2-3x it)"
        )
        if b.confirm_steps == 0:
            msg = f"budget.confirmSteps is 0: {screen}; set confirmSteps and constraints.rewardGate nonInferiority"
            set_condition(self.status, cond, "False", "NoConfirmation", msg, self.gen, self.now)
            return
        scored = b.confirm_steps - b.warmup_steps
        # the full run's look: a healthy winner that fails it has failed the interim look too
        final = gates.confirmation_looks(b, c.model_copy(update={"reward_gate": "nonInferiority"}))[-1]
        p = gates.reward_power(base_rewards, scored, tol, final.alpha)

        def need(p: gates.RewardPower) -> str:
            return (
                f"confirmSteps >= {p.needed + b.warmup_steps}"
                if p.needed is not None
                else f"more than {gates.MAX_SCORED} steps"
            )

        if c.reward_gate == "screen":
            msg = f"constraints.rewardGate is screen: {screen}, the confirmation included; " + (
                f"nonInferiority would hold the winner to it with {need(p)} at the baseline's reward noise "
                f"({p.noise:.1%} of its mean per step)"
                if p is not None
                else "nonInferiority would hold the winner to it"
            )
            set_condition(self.status, cond, "False", "ScreeningOnly", msg, self.gen, self.now)
            return
        if p is None:
            msg = "fewer than 3 baseline rewards: the reward noise, and so the confirmation's power, is unknown"
            set_condition(self.status, cond, "Unknown", "NoNoiseEstimate", msg, self.gen, self.now)
            return
        ok = p.false_alarm <= gates.FALSE_ALARM_GOAL
        msg = (
            f"baseline reward noise {p.noise:.1%} of its mean per step; the confirmation's {scored} scored steps "
            f"fail a healthy winner (not shown within the {tol:.1%} tolerance) at most ~{p.false_alarm:.1%} of the time"
            + (
                f" (<= {gates.FALSE_ALARM_GOAL:.0%} from {need(p)})"
                if ok
                else f"; <= {gates.FALSE_ALARM_GOAL:.0%} needs {need(p)}, or a larger constraints.rewardTolerance"
            )
        )
        set_condition(
            self.status, cond, "True" if ok else "False", "Resolved" if ok else "Underpowered", msg, self.gen, self.now
        )
        if not ok:
            self.warn("RewardGateUnderpowered", msg)

    def search(self) -> None:
        st, budget = self.status, self.spec.budget
        search = [t for t in st.trials if t.kind == "search" and not t.superseded]
        failed = sum(1 for t in search if t.state.is_failure)
        if failed >= budget.max_failed_trials:
            self.teardown_all()
            self.phase(
                Phase.FAILED,
                f"{failed} trials failed (budget.maxFailedTrials={budget.max_failed_trials})",
                failure=("TooManyFailedTrials", f"{failed} failed trials; last: {search[-1].reason}"),
            )
            return
        active = self.active("search")
        done = len(search) - len(active)
        left = budget.max_trials - done - len(active)
        tuner_done, why = self.tuner().done() if left > 0 else (False, "")
        if left > 0 and not tuner_done:
            slots = min(budget.parallel_trials - len(active), left)
            gpus_free = self.spec.resources.gpu_budget - sum(t.gpus for t in self.active())
            if slots > 0 and gpus_free > 0:
                proposals = self.tuner().propose(slots, gpus_free)
                for p in proposals:
                    g = records.gpus_of(self.spec, p.config)
                    if g > gpus_free:
                        continue
                    gpus_free -= g
                    self.add_trial(
                        f"t{st.next_trial}", "search", p.config, budget.steps_per_trial, p.predicted, p.predicted_std
                    )
                    st.next_trial += 1
                if not proposals and not self.active() and not self.tuner().truncated:
                    tuner_done, why = True, "the search space is exhausted"
        if self.active("search"):
            return
        if left > 0 and not tuner_done:
            return
        self.conclude(why or f"{done} of {budget.max_trials} trials done")

    def conclude(self, why: str) -> None:
        st = self.status
        tuner = self.tuner()
        best, fastest = tuner.best_estimate(), tuner.best()
        if best is not None and fastest is not None and best.id != fastest.id:
            est = tuner.shrunk_objectives([best, fastest])
            self.info(
                "WinnersCurse",
                f"picked {best.id} over {fastest.id}, which measured {best.objective / fastest.objective - 1:.1%} "
                f"faster: weighed against what the other trials forecast for each, {fastest.id} is "
                f"{est[fastest.id] / est[best.id] - 1:.1%} slower (one trial measures to "
                f"+-{tuner.measurement_sd():.1%} here)",
            )
        # the baseline itself is never a winner to confirm: the Tuner rebuilds it from the stored summary,
        # rounded a hair away from the objective measured, so comparing objectives alone is not enough
        base_id = records.baseline_trial(st.trials).id
        if best is None or best.id == base_id or not self.beats_baseline(best.objective):
            msg = f"nothing beats the baseline ({why}); keep the current configuration"
            st.best, st.speedup = None, "1.00x"
            self.record_tuning_cost()
            self.info("NoImprovement", msg)
            self.phase(Phase.SUCCEEDED, msg, complete=("NoImprovement", msg))
            return
        bt = next(t for t in st.trials if t.id == best.id)
        if self.spec.budget.confirm_steps > 0:
            # a refused confirmation re-enters here with the same reason: say it again only when
            # search trials ran since the last confirmation, i.e. when the search ended anew
            last = max((i for i, t in enumerate(st.trials) if t.kind == "confirm"), default=-1)
            ended_anew = last < 0 or any(t.kind == "search" for t in st.trials[last + 1 :])
            cid = f"c{st.next_trial}"
            st.next_trial += 1
            self.add_trial(
                cid,
                "confirm",
                self.config_of(bt),
                self.spec.budget.confirm_steps,
                bt.predicted_seconds,
                bt.predicted_std,
                of=bt.id,
            )
            # the confirmation's own message replaces this one at the end: say why the search ended now
            if ended_anew:
                self.info("SearchEnded", why)
            self.phase(
                Phase.CONFIRMING,
                f"confirming {bt.id} with {self.spec.budget.confirm_steps} steps; the search ended: {why}",
            )
            return
        self.set_best(bt, confirmed=False)
        self.succeed(why)

    def report_coverage(self) -> None:
        """A framework job: which adapter runs it, and the knobs it cannot express (never searched)."""
        from ..adapters.registry import adapter_for, coverage

        if adapter_for(self.spec.workload.framework) is None:
            return
        cov = coverage(self.spec)
        self.status.framework = f"{cov.framework} {cov.version} ({cov.backend})"
        dropped = [DroppedKnob(knob=d.knob, reason=d.why) for d in cov.dropped]
        if dropped and self.status.dropped_knobs != dropped:
            self.info(
                "KnobsDropped",
                f"{cov.framework} cannot express {len(dropped)} knob(s), kept at the baseline: "
                + ", ".join(d.knob for d in dropped),
            )
        self.status.dropped_knobs = dropped or None

    def set_best(self, t: TrialStatus, confirmed: bool, of: Optional[TrialStatus] = None) -> None:
        from ..adapters.registry import framework_command
        from ..adapters.render import render_overrides

        base = self.status.baseline
        src = of or t
        step_s = t.measured_seconds or 0.0
        speed = (base.step_seconds / step_s) if base and base.step_seconds and step_s else 1.0
        self.status.best = BestStatus(
            trial=src.id,
            config=dict(src.config),
            step_seconds=round(step_s, 3),
            speedup=round(speed, 3),
            gpus=t.gpus,
            gpu_seconds_per_step=round(step_s * t.gpus, 2),
            confirmed=confirmed,
            overrides=render_overrides(self.spec.workload.framework, src.config),
        )
        winner = framework_command(self.spec, self.config_of(src))
        if winner is not None:
            ours = framework_command(self.spec, self.spec.baseline)
            before = set(ours.overrides) if ours else set()
            self.status.best.overrides = [o for o in winner.overrides if o not in before]
            self.status.best.command, self.status.best.mode = winner.argv, winner.mode
        self.status.speedup = f"{speed:.2f}x"

    def succeed(self, why: str) -> None:
        if not self.offer_pool():
            self.succeeded(why)

    def offer_pool(self) -> bool:
        """spec.resources.pools: weigh the cheapest other pool against the winner's measured cost here;
        start its trial when the forecast saving over budget.plannedSteps pays for it (True: the job
        stays Confirming until it ends), else record the forecast verdict."""
        from .pools import offers

        st, b = self.status, self.status.best
        if not self.spec.resources.pools or b is None or any(t.kind == "pool" for t in st.trials):
            return False
        found = offers(self.spec, self.tuner().forecaster, b.step_seconds, b.gpus, self.deadline)
        if not found:
            st.pool_offer = None
            self.info("PoolOffer", "no other pool is forecast to run the job")
            return False
        o = found[0]
        st.pool_offer = PoolOfferStatus(
            pool=o.pool.name,
            gpu_type=o.pool.gpu_type,
            config=records.config_diff(self.spec.baseline, o.config),
            gpus=o.gpus,
            forecast_seconds=round(o.step_seconds, 3),
            forecast_cost_per_step=round(o.cost_per_step, 6),
            home_cost_per_step=round(o.home_cost_per_step, 6),
        )
        verdict = (
            f"pool {o.pool.name} ({o.gpus}x {o.pool.gpu_type}): forecast {o.step_seconds:.1f}s/step, "
            f"{_cheaper(o.saving)} than the winner here (p={o.p_cheaper:.2f} that it is cheaper)"
        )
        if not o.worth_a_trial:
            st.pool_offer.message = f"{verdict}: not worth a trial (expected saving below its cost)"
            self.info("PoolOffer", st.pool_offer.message)
            return False
        tid = f"p{st.next_trial}"
        st.next_trial += 1
        self.add_trial(
            tid, "pool", o.config, self.spec.budget.steps_per_trial, o.step_seconds, o.step_std, pool=o.pool.name
        )
        st.pool_offer.trial = tid
        st.pool_offer.message = f"{verdict}: measuring it with trial {tid}"
        self.phase(Phase.CONFIRMING, st.pool_offer.message)
        return True

    def after_pool(self) -> None:
        """The pool trial ended: its measurement decides the recommendation, then the job succeeds."""
        from .pools import cost_per_step

        t = [x for x in self.status.trials if x.kind == "pool"][-1]
        if t.state.is_active:
            return
        po = self.status.pool_offer
        if po is None or self.status.best is None:
            self.phase(Phase.SEARCHING, "pool offer lost; concluding again")
            return
        pool = self.spec.resources.pool(t.pool)
        if t.state == TrialState.SUCCEEDED and t.measured_seconds and pool is not None:
            cost = cost_per_step(pool.price_per_gpu_hour, t.gpus, t.measured_seconds)
            po.measured_seconds, po.measured_cost_per_step = round(t.measured_seconds, 3), round(cost, 6)
            po.saving = round(1.0 - cost / po.home_cost_per_step, 4)
            po.cost_to_planned_steps = round(cost * self.spec.budget.planned_steps, 2)
            po.recommended = po.saving > 0
            po.message = (
                f"pool {po.pool} measured {t.measured_seconds:.1f}s/step on {t.gpus}x {po.gpu_type}: "
                f"{_cheaper(po.saving)} than the winner here"
                + (": moving is recommended" if po.recommended else ": stay")
            )
        else:
            po.recommended = False
            po.message = f"pool {po.pool}: trial {t.id} {t.state}" + (f": {t.reason}" if t.reason else "")
        self.info("PoolOffer", po.message, t.id)
        self.succeeded("confirmed" if self.status.best.confirmed else "search done")

    def record_tuning_cost(self) -> None:
        """status.tuningCost: every trial's step GPU-hours (the baseline's profile aside) against
        what the winner saves over budget.plannedSteps (none: nothing beat the baseline). A trial in
        another pool ran on other GPUs at another price: it counts at its price, in this pool's
        GPU-hours, and its own GPU-hours are reported apart."""
        st = self.status
        res = self.spec.resources

        def gpu_seconds(t: TrialStatus) -> float:
            return records.unflatten_summary(t.summary).seconds_spent * t.gpus

        def at_home_price(t: TrialStatus) -> float:
            pool = res.pool(t.pool) if t.kind == "pool" else None
            return pool.price_per_gpu_hour / res.price_per_gpu_hour if pool and res.price_per_gpu_hour else 1.0

        ran = [t for t in st.trials if t.kind != "baseline" and t.summary]
        spent = sum(gpu_seconds(t) * at_home_price(t) for t in ran)
        pool_spent = sum(gpu_seconds(t) for t in ran if t.kind == "pool")
        base = st.baseline
        base_gs = (base.step_seconds or 0.0) * (base.gpus or 0) if base else 0.0
        pick_gs = st.best.gpu_seconds_per_step if st.best else base_gs
        c = tuning_cost(spent, base_gs, pick_gs, self.spec.budget.planned_steps)
        st.tuning_cost = TuningCostStatus(
            trial_gpu_hours=round(c.trial_gpu_hours, 3),
            pool_trial_gpu_hours=round(pool_spent / 3600.0, 3) if pool_spent else None,
            saved_gpu_hours=round(c.saved_gpu_hours, 3),
            planned_steps=c.planned_steps,
            share=round(c.share, 4) if c.share is not None else None,
            payback_steps=round(c.payback_steps, 1) if c.payback_steps is not None else None,
        )

    def succeeded(self, why: str) -> None:
        self.record_tuning_cost()
        b, c = self.status.best, self.status.tuning_cost
        msg = (
            f"best {b.trial}: {b.step_seconds:.1f}s/step, {self.status.speedup} faster than the baseline on "
            f"{b.gpus} GPUs ({why})"
        )
        if c is not None and c.payback_steps is not None:
            msg += f"; the trials' {c.trial_gpu_hours:.1f} GPU-h are paid back after {c.payback_steps:.0f} steps"
        self.info("Succeeded", msg)
        self.phase(Phase.SUCCEEDED, msg, complete=("Improved", msg))

    def after_confirming(self) -> None:
        conf = [t for t in self.status.trials if t.kind == "confirm"]
        c = conf[-1] if conf else None
        if c is None:
            self.phase(Phase.SEARCHING, "no confirmation run found")
            return
        if c.state.is_active:
            return
        orig = next(t for t in self.status.trials if t.id == c.of)
        if c.state == TrialState.SUCCEEDED and self.beats_baseline(c.objective):
            self.set_best(c, confirmed=True, of=orig)
            ran = records.unflatten_summary(c.summary).total_steps if c.summary else c.steps  # fewer: the interim look
            self.succeed(f"confirmed over {ran} steps")
            return
        orig.state = TrialState.REJECTED
        orig.reason = (
            f"confirmation run {c.id} {c.state}: {c.reason or 'not better than the baseline on the objective'}"[:300]
        )
        self._tuner = None
        self.warn("ConfirmationFailed", orig.reason)
        self.phase(Phase.SEARCHING, f"{orig.id} did not confirm; picking the next best")
        self.search()
