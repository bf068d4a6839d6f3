"""Running trials: advanced on what the driver observed, stopped early, scored and judged
(a confirmation at its looks, docs/tuner.md 'The reward gate on the winner')."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...api.metrics import StepRecord
from ...api.status import FailureCause, Phase, TrialState, TrialStatus
from .. import gates, records, restore
from . import trials
from .conditions import now_iso, parse_iso, set_condition
from .context import StepContext
from .types import REASON_GRACE_SECONDS, Observation, Refusal

if TYPE_CHECKING:
    from ..summary import TrialSummary
    from ..values import TrialRecord


def advance(ctx: StepContext, t: TrialStatus, obs: Observation) -> None:
    if obs.refused is not None:
        refused(ctx, t, obs.refused)
        return
    budget = ctx.spec.budget
    if obs.preempted and t.state in (TrialState.PENDING, TrialState.RUNNING):
        preempted(ctx, t, obs.preempted)
        return
    if t.state == TrialState.PENDING:
        if obs.gated and not obs.placed:  # waiting for Kueue's admission: no schedule timeout
            if t.queue != obs.gated:
                t.queue, t.reason = obs.gated, f"waiting for Kueue admission in queue {obs.gated}"
                ctx.info("Queued", f"trial {t.id} {t.reason}", t.id)
            return
        if t.queue and not t.admitted_at:
            t.admitted_at, t.reason = now_iso(ctx.now), None
        created = parse_iso(t.admitted_at or t.created_at) or ctx.now
        if obs.placed:
            t.state, t.started_at = TrialState.RUNNING, now_iso(ctx.now)
        elif ctx.now - created > budget.schedule_timeout_seconds:
            n = f"not all {obs.pods} pods scheduled within {budget.schedule_timeout_seconds}s"
            trials.finish(
                ctx,
                t,
                TrialState.UNSCHEDULABLE,
                n + (f": {obs.pending_reason}" if obs.pending_reason else ""),
                FailureCause.UNSCHEDULABLE,
            )
            return
        else:
            return
    if t.state == TrialState.RUNNING:
        started = parse_iso(t.started_at) or ctx.now
        if obs.failure:
            failed(ctx, t, obs)
            return
        if obs.done:
            t.state, t.finished_at = TrialState.SCORING, now_iso(ctx.now)
        elif ctx.now - started > budget.trial_timeout_seconds:
            trials.finish(
                ctx,
                t,
                TrialState.TIMED_OUT,
                f"ran longer than budget.trialTimeoutSeconds={budget.trial_timeout_seconds}",
                FailureCause.TIMED_OUT,
            )
            return
        else:
            if t.kind == "search":
                maybe_early_stop(ctx, t, obs)
            elif t.kind == "confirm":
                confirmed_at_interim(ctx, t, obs.steps or [])
            return
    if t.state == TrialState.SCORING:
        score(ctx, t, obs)


def failed(ctx: StepContext, t: TrialStatus, obs: Observation) -> None:
    """A pod or process failed. The trial's own exported reason beats the exit code; it may
    take a moment to become visible, so the first sighting waits REASON_GRACE_SECONDS for it."""
    first_seen = parse_iso(t.finished_at)
    if obs.exported_reason is None and (first_seen is None or ctx.now - first_seen < REASON_GRACE_SECONDS):
        t.finished_at = t.finished_at or now_iso(ctx.now)
        return
    why = f"{obs.exported_reason} ({obs.failure})" if obs.exported_reason else obs.failure
    cause = records.failure_cause(why, obs.exit_code)
    if cause == FailureCause.OUT_OF_MEMORY and "out of memory" not in why:
        why += ": out of memory"
    trials.finish(ctx, t, TrialState.FAILED, why, cause)


def preempted(ctx: StepContext, t: TrialStatus, why: str) -> None:
    """Kueue evicted the trial (or the cluster preempted its pods): no verdict on the configuration.
    The first time it runs again as `<id>-retry` with the same configuration; a retry that is
    preempted too stays Preempted (not a failure; a baseline's ends the profiling)."""
    trials.finish(ctx, t, TrialState.PREEMPTED, why, FailureCause.PREEMPTED)
    if t.retry_of is not None or ctx.status.phase.is_terminal:
        return
    cfg = ctx.config_of(t)
    r = trials.add_trial(
        ctx, f"{t.id}-retry", t.kind, cfg, t.steps, t.predicted_seconds, t.predicted_std, of=t.of, pool=t.pool
    )
    r.retry_of = t.id


def refused(ctx: StepContext, t: TrialStatus, r: Refusal) -> None:
    """The driver could not start `t`. No node can hold it: the trial is Unschedulable (the
    baseline's fails the job). The API server refuses its pods: the spec is at fault, the job fails."""
    if r.cause == FailureCause.NO_MATCHING_NODES:
        trials.finish(ctx, t, TrialState.UNSCHEDULABLE, r.message, r.cause)
        if t.kind == "baseline":
            if ctx.status.baseline is not None:
                ctx.status.baseline.state, ctx.status.baseline.reason = TrialState.UNSCHEDULABLE, r.message[:300]
            set_condition(ctx.status, "PodsSchedulable", "False", "NoMatchingNodes", r.message, ctx.gen, ctx.now)
            ctx.phase(
                Phase.FAILED, f"no node can run the baseline: {r.message}", failure=("NoMatchingNodes", r.message)
            )
        return
    trials.finish(ctx, t, TrialState.FAILED, r.message, r.cause)
    for other in ctx.active():
        trials.finish(ctx, other, TrialState.STOPPED, "the job's pods are refused by the API server")
    set_condition(ctx.status, "SpecValid", "False", r.cause, r.message, ctx.gen, ctx.now)
    ctx.phase(Phase.FAILED, r.message, failure=(r.cause, r.message))


def maybe_early_stop(ctx: StepContext, t: TrialStatus, obs: Observation) -> None:
    steps = obs.steps
    if not steps or not [s for s in steps if not s.warmup]:
        return
    if ctx.tuner().pruner.early_stop(steps, gpus=t.gpus):
        from ..summary import summarize

        summary = summarize(steps)
        t.summary = records.flatten_summary(summary, keep_rewards=False)
        t.measured_seconds = round(summary.step_time, 4) if summary.steps else None
        t.objective = records.objective_of(ctx.spec, summary.step_time, t.gpus) if summary.steps else None
        trials.finish(
            ctx, t, TrialState.STOPPED, f"early-stopped after {len(steps)} steps: cannot beat the best so far"
        )


def confirmed_at_interim(ctx: StepContext, t: TrialStatus, steps: list[StepRecord]) -> bool:
    """The confirmation's interim look (gates.confirmation_looks): once its first steps are in, a
    winner that passes every gate at the look's level and beats the baseline on the objective is
    confirmed (True) and its pods stop; otherwise it runs to its full length, judged there. Also
    taken when scoring a run whose interim was never seen running, so the verdict does not depend
    on when the steps were observed."""
    from ..summary import summarize

    interim = looks_of(ctx, t)[0]
    if interim.final or len(steps) < interim.steps:
        return False
    judged = judge_confirmation(ctx, t, summarize(steps[: interim.steps]), interim)
    if not (judged.state == TrialState.SUCCEEDED and trials.beats_baseline(ctx, judged.objective)):
        return False
    records.apply_judgement(t, judged, keep_rewards=False)
    trials.finish(
        ctx,
        t,
        TrialState.SUCCEEDED,
        f"confirmed at the interim look after {interim.steps} of {t.steps} steps "
        f"(reward test at alpha {interim.alpha:g}): {t.reason or ''}",
    )
    return True


def looks_of(ctx: StepContext, t: TrialStatus) -> tuple[gates.Look, ...]:
    """The looks at confirmation `t`, by the steps it was started with (a later budget edit does
    not move them)."""
    return gates.confirmation_looks(ctx.spec.budget.model_copy(update={"confirm_steps": t.steps}), ctx.spec.constraints)


def judge_confirmation(ctx: StepContext, t: TrialStatus, summary: TrialSummary, look: gates.Look) -> TrialRecord:
    """The tuner's verdict on a confirmation run at one of its looks."""
    return judge_of(ctx, t).judge(
        restore.to_record(ctx.spec, t),
        summary,
        confirmation=ctx.spec.constraints.reward_gate == "nonInferiority",
        alpha=look.alpha,
    )


def judge_of(ctx: StepContext, t: TrialStatus):
    """The Tuner that judges `t`: the job's, or (a trial in another pool) one for the pool's spec."""
    spec = records.spec_of_trial(ctx.spec, t)
    if spec is ctx.spec:
        return ctx.tuner()
    return restore.make_tuner(spec, [x for x in ctx.status.trials if x.kind == "baseline"])


def score(ctx: StepContext, t: TrialStatus, obs: Observation) -> None:
    """Score a finished trial once all its steps are visible; never on guesses."""
    from ..summary import summarize

    budget = ctx.spec.budget
    steps = obs.steps or []
    if len(steps) < t.steps:
        finished = parse_iso(t.finished_at) or ctx.now
        if ctx.now - finished > budget.metrics_timeout_seconds:
            trials.finish(
                ctx,
                t,
                TrialState.METRICS_UNAVAILABLE,
                f"{len(steps)} of {t.steps} steps reported within {budget.metrics_timeout_seconds}s"
                + (f" ({obs.metrics_error})" if obs.metrics_error else ""),
                FailureCause.METRICS_UNAVAILABLE,
            )
        return
    if t.kind == "confirm" and confirmed_at_interim(ctx, t, steps):
        return
    summary = summarize(steps)
    if t.kind == "baseline":
        t.summary = records.flatten_summary(summary, keep_rewards=True)
        t.measured_seconds = round(summary.step_time, 4) if summary.steps else None
        t.objective = records.objective_of(ctx.spec, summary.step_time, t.gpus) if summary.steps else None
        if summary.failed or not summary.steps:
            trials.finish(
                ctx, t, TrialState.FAILED, "the baseline reported no steady-state step", FailureCause.NO_STEADY_STATE
            )
        else:
            trials.finish(ctx, t, TrialState.SUCCEEDED, "")
        return
    spec = records.spec_of_trial(ctx.spec, t)
    if t.kind == "confirm":
        judged = judge_confirmation(ctx, t, summary, looks_of(ctx, t)[-1])
    else:
        judged = judge_of(ctx, t).judge(restore.to_record(ctx.spec, t), summary)
    records.apply_judgement(t, judged, keep_rewards=False)
    if t.objective is None and summary.steps:
        t.objective = records.objective_of(spec, summary.step_time, t.gpus)
    trials.finish(
        ctx, t, t.state, t.reason or "", FailureCause.NO_STEADY_STATE if t.state == TrialState.FAILED else None
    )
