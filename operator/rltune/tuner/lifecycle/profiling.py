"""Phase Profiling: the baseline trial, the adapter's coverage of the knobs, the profile and the
reward gate's power."""

from __future__ import annotations

from ...api.status import BaselineStatus, DroppedKnob, NarrowedKnob, Phase, TrialState
from .. import gates, records
from ..search import Space, explicit
from . import trials
from .conditions import set_condition
from .context import StepContext


def start_baseline(ctx: StepContext) -> None:
    report_coverage(ctx)
    report_narrowing(ctx)
    if not any(t.kind == "baseline" for t in ctx.status.trials):
        # its GPU counts explicit, as every other trial's: a trial runtime must not fall back on a
        # default of its own (the twin's is 8 GPUs, where the pods hold the whole budget)
        r = ctx.spec.resources
        base = explicit(ctx.spec.baseline, r.gpu_budget, r.gpus_per_node)
        trials.add_trial(ctx, "baseline", "baseline", base, records.baseline_steps(ctx.spec))
    ctx.status.baseline = ctx.status.baseline or BaselineStatus(
        state=TrialState.PENDING, gpus=records.gpus_of(ctx.spec, ctx.spec.baseline)
    )
    ctx.phase(Phase.PROFILING, "profiling the baseline")


def report_coverage(ctx: StepContext) -> None:
    """A framework job: which adapter runs it, and the knobs it cannot express (never searched)."""
    from ...adapters.registry import adapter_for, coverage

    if adapter_for(ctx.spec.workload.framework) is None:
        return
    cov = coverage(ctx.spec)
    ctx.status.framework = f"{cov.framework} {cov.version} ({cov.backend})"
    dropped = [DroppedKnob(knob=d.knob, reason=d.why) for d in cov.dropped]
    if dropped and ctx.status.dropped_knobs != dropped:
        ctx.info(
            "KnobsDropped",
            f"{cov.framework} cannot express {len(dropped)} knob(s), kept at the baseline: "
            + ", ".join(d.knob for d in dropped),
        )
    ctx.status.dropped_knobs = dropped or None


def report_narrowing(ctx: StepContext) -> None:
    """The default ranges the search thinned to stay within its bounds (search.Space._narrow)."""
    narrowed = [NarrowedKnob(knob=k, left_out=[_shown(v) for v in vs]) for k, vs in Space(ctx.spec).narrowed.items()]
    if narrowed and ctx.status.narrowed_knobs != narrowed:
        ctx.info(
            "SearchNarrowed",
            "the default search space is past the operator's bounds; left out: "
            + "; ".join(f"{n.knob} {', '.join(n.left_out)}" for n in narrowed)
            + " (list values in spec.searchSpace.knobs to search them)",
        )
    ctx.status.narrowed_knobs = narrowed or None


def _shown(v) -> str:
    return "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


def after_profiling(ctx: StepContext) -> None:
    base = records.baseline_trial(ctx.status.trials)
    if base.state.is_active:
        return
    bs = ctx.status.baseline or BaselineStatus()
    bs.state, bs.gpus, bs.reason = base.state, base.gpus, base.reason
    ctx.status.baseline = bs
    if base.state != TrialState.SUCCEEDED:
        if ctx.status.phase != Phase.FAILED:
            ctx.phase(
                Phase.FAILED,
                f"the baseline failed: {base.reason}",
                failure=("BaselineFailed", f"baseline trial {base.state}: {base.reason}"),
            )
        return
    from ..profile import profile

    summary = records.unflatten_summary(base.summary)
    prof = profile(ctx.spec, summary)
    bs.step_seconds = round(summary.step_time, 4)
    bs.gpu_seconds_per_step = round(summary.step_time * base.gpus, 2)
    bs.breakdown = {k: round(v, 4) for k, v in summary.phases.items()}
    bs.bottleneck = prof.bottleneck
    bs.evidence = [e.strip()[:200] for e in prof.evidence.split(";") if e.strip()][:16] or None
    report_reward_power(ctx, summary.rewards)
    ctx.info(
        "Profiled",
        f"baseline {bs.step_seconds:.1f}s/step on {base.gpus} GPUs, "
        f"bottleneck {bs.bottleneck}: {'; '.join(bs.evidence or [])}"[:1000],
    )
    ctx.phase(Phase.SEARCHING, f"baseline {bs.step_seconds:.1f}s/step, bottleneck {bs.bottleneck}: searching")


def report_reward_power(ctx: StepContext, base_rewards: list[float]) -> None:
    """Condition RewardGatePowered: does the winner's reward gate hold the tolerance (a drop at it
    caught >= 95%, a healthy winner failed <= 5% at the baseline's measured reward noise)? Said
    up front so that a job whose gate cannot is not read as quality-checked at its tolerance."""

    b, c = ctx.spec.budget, ctx.spec.constraints
    tol, cond = c.reward_tolerance, "RewardGatePowered"
    screen = (
        f"trials are only screened for drops shown beyond the {tol:.1%} tolerance (short trials catch drops of "
        "about 2-3x it)"
    )
    if b.confirm_steps == 0:
        msg = f"budget.confirmSteps is 0: {screen}; set confirmSteps and constraints.rewardGate nonInferiority"
        set_condition(ctx.status, cond, "False", "NoConfirmation", msg, ctx.gen, ctx.now)
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
        set_condition(ctx.status, cond, "False", "ScreeningOnly", msg, ctx.gen, ctx.now)
        return
    if p is None:
        msg = "fewer than 3 baseline rewards: the reward noise, and so the confirmation's power, is unknown"
        set_condition(ctx.status, cond, "Unknown", "NoNoiseEstimate", msg, ctx.gen, ctx.now)
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
        ctx.status, cond, "True" if ok else "False", "Resolved" if ok else "Underpowered", msg, ctx.gen, ctx.now
    )
    if not ok:
        ctx.warn("RewardGateUnderpowered", msg)
