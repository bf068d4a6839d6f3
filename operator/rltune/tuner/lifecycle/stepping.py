"""One pass of the lifecycle: observations applied to the active trials, then the phase's decision."""

from __future__ import annotations

import re
import time
from typing import Callable, Optional

from ...api.models import RLTuningJobSpec
from ...api.status import Phase, RLTuningJobStatus, TrialState
from ..search import Deadline
from . import confirming, pooling, profiling, scoring, searching
from .conditions import now_iso, set_condition
from .context import StepContext
from .types import Decisions, Observation, finite


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
    ctx = StepContext(spec, status.model_copy(deep=True), now, generation, deadline)
    run(ctx, observations)
    return ctx.decisions


def run(ctx: StepContext, observations: dict[str, Observation]) -> None:
    st = ctx.status
    st.started_at = st.started_at or now_iso(ctx.now)
    set_condition(st, "SpecValid", "True", "Valid", "the spec passed validation", ctx.gen, ctx.now)
    if st.phase.is_terminal:
        if st.observed_generation == ctx.gen:
            return
        spec_changed(ctx)
    st.observed_generation = ctx.gen
    if st.phase in (Phase.PENDING, Phase.VALIDATING):
        profiling.start_baseline(ctx)
    metrics_availability(ctx, observations)
    for t in list(st.trials):
        if t.state.is_active:
            scoring.advance(ctx, t, observations.get(t.id, Observation()))
    decide(ctx)
    report_truncation(ctx)
    # NaN/inf (a trial that reported NaN) is no JSON number: the API server would refuse the write
    for t in st.trials:
        t.measured_seconds, t.objective = finite(t.measured_seconds), finite(t.objective)
        t.predicted_seconds, t.predicted_std = finite(t.predicted_seconds), finite(t.predicted_std)
    search = [t for t in st.trials if t.kind == "search" and not t.superseded]
    st.trials_done = f"{sum(1 for t in search if t.state.is_terminal)}/{ctx.spec.budget.max_trials}"
    st.trials_failed = sum(1 for t in search if t.state.is_failure)


def metrics_availability(ctx: StepContext, observations: dict[str, Observation]) -> None:
    """Condition MetricsAvailable: False (reason MetricsUnavailable, event once) while trial metrics
    cannot be read (Prometheus down, failing or not configured), True again once a read works.
    Nothing is scored meanwhile: a finished trial waits in Scoring, up to budget.metricsTimeoutSeconds."""
    errors = sorted(o.metrics_error for o in observations.values() if o.metrics_error)
    old = next((c for c in ctx.status.conditions if c.type == "MetricsAvailable"), None)
    if errors:
        msg = "trial metrics cannot be read: " + re.sub(r" at 0x[0-9a-f]+", "", errors[0])
        if old is None or old.status != "False":
            ctx.warn("MetricsUnavailable", msg)
        set_condition(ctx.status, "MetricsAvailable", "False", "MetricsUnavailable", msg, ctx.gen, ctx.now)
    elif any(o.steps is not None for o in observations.values()):
        msg = "trial metrics are read from Prometheus"
        set_condition(ctx.status, "MetricsAvailable", "True", "MetricsAvailable", msg, ctx.gen, ctx.now)


def report_truncation(ctx: StepContext) -> None:
    """Condition SearchTruncated: True (reason TickBudget, a Warning event when it turns True) when the
    step's budget ran out before the search had weighed the whole space, False again (reason
    Complete) once an enumeration finishes in time. Absent for a job that was never truncated."""
    d = ctx.deadline
    if d is None:
        return
    old = next((c for c in ctx.status.conditions if c.type == "SearchTruncated"), None)
    if d.truncated:
        msg = (
            f"the search ran past its budget of {d.seconds:g}s for this tick (operator setting "
            f"tickBudgetSeconds): {'; '.join(d.truncated)}; it proposes from what it weighed and does not end "
            "the search on it: list fewer values in spec.searchSpace.knobs or freeze knobs"
        )
        if old is None or old.status != "True":
            ctx.warn("SearchTruncated", msg)
        set_condition(ctx.status, "SearchTruncated", "True", "TickBudget", msg, ctx.gen, ctx.now)
    elif old is not None and d.completed:
        msg = f"the search weighed the whole space within its budget of {d.seconds:g}s"
        set_condition(ctx.status, "SearchTruncated", "False", "Complete", msg, ctx.gen, ctx.now)


def spec_changed(ctx: StepContext) -> None:
    """A finished job whose spec changed: resume the search, or start over without a baseline."""
    st = ctx.status
    base = next((t for t in st.trials if t.kind == "baseline"), None)
    if base is not None and base.state == TrialState.SUCCEEDED:
        ctx.info("Resumed", f"spec changed (generation {ctx.gen}): searching again")
        st.completed_at = None
        st.best = None if st.best and not st.best.confirmed else st.best
        ctx.phase(Phase.SEARCHING, "resumed after a spec change")
    else:  # it ended before a baseline was measured (invalid spec, no node for it): start over
        ctx.info("Restarted", f"spec changed (generation {ctx.gen}): profiling the baseline again")
        st.trials = [t for t in st.trials if t.kind != "baseline"]
        st.baseline, st.completed_at = None, None
        ctx.phase(Phase.PENDING, "spec changed: starting over")


def decide(ctx: StepContext) -> None:
    st = ctx.status
    if st.phase == Phase.PROFILING:
        profiling.after_profiling(ctx)
    if st.phase == Phase.SEARCHING:
        searching.search(ctx)
    if st.phase == Phase.CONFIRMING:
        if any(t.kind == "pool" for t in st.trials):
            pooling.after_pool(ctx)
        else:
            confirming.after_confirming(ctx)
    if st.phase not in (Phase.PENDING, Phase.PROFILING) and any(t.kind == "search" for t in st.trials):
        fe = ctx.tuner().forecast_error()
        if fe is not None and fe == fe:
            st.forecast_error = round(float(fe), 4)
