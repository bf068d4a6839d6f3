"""The job's result: the best configuration, its tuning cost, and the job Succeeded."""

from __future__ import annotations

from typing import Optional

from ...api.status import BestStatus, Phase, TrialStatus, TuningCostStatus
from .. import records
from ..payback import tuning_cost
from .context import StepContext


def record_tuning_cost(ctx: StepContext) -> None:
    """status.tuningCost: every trial's step GPU-hours (the baseline's profile aside) against
    what the winner saves over budget.plannedSteps (none: nothing beat the baseline). A trial in
    another pool ran on other GPUs at another price: it counts at its price, in this pool's
    GPU-hours, and its own GPU-hours are reported apart."""
    st = ctx.status
    res = ctx.spec.resources

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
    c = tuning_cost(spent, base_gs, pick_gs, ctx.spec.budget.planned_steps)
    st.tuning_cost = TuningCostStatus(
        trial_gpu_hours=round(c.trial_gpu_hours, 3),
        pool_trial_gpu_hours=round(pool_spent / 3600.0, 3) if pool_spent else None,
        saved_gpu_hours=round(c.saved_gpu_hours, 3),
        planned_steps=c.planned_steps,
        share=round(c.share, 4) if c.share is not None else None,
        payback_steps=round(c.payback_steps, 1) if c.payback_steps is not None else None,
    )


def succeeded(ctx: StepContext, why: str) -> None:
    record_tuning_cost(ctx)
    b, c = ctx.status.best, ctx.status.tuning_cost
    msg = (
        f"best {b.trial}: {b.step_seconds:.1f}s/step, {ctx.status.speedup} faster than the baseline on "
        f"{b.gpus} GPUs ({why})"
    )
    if c is not None and c.payback_steps is not None:
        msg += f"; the trials' {c.trial_gpu_hours:.1f} GPU-h are paid back after {c.payback_steps:.0f} steps"
    ctx.info("Succeeded", msg)
    ctx.phase(Phase.SUCCEEDED, msg, complete=("Improved", msg))


def set_best(ctx: StepContext, t: TrialStatus, confirmed: bool, of: Optional[TrialStatus] = None) -> None:
    from ...adapters.registry import framework_command
    from ...adapters.render import render_overrides

    base = ctx.status.baseline
    src = of or t
    step_s = t.measured_seconds or 0.0
    speed = (base.step_seconds / step_s) if base and base.step_seconds and step_s else 1.0
    ctx.status.best = BestStatus(
        trial=src.id,
        config=dict(src.config),
        step_seconds=round(step_s, 3),
        speedup=round(speed, 3),
        gpus=t.gpus,
        gpu_seconds_per_step=round(step_s * t.gpus, 2),
        confirmed=confirmed,
        overrides=render_overrides(ctx.spec.workload.framework, src.config),
    )
    winner = framework_command(ctx.spec, ctx.config_of(src))
    if winner is not None:
        ours = framework_command(ctx.spec, ctx.spec.baseline)
        before = set(ours.overrides) if ours else set()
        ctx.status.best.overrides = [o for o in winner.overrides if o not in before]
        ctx.status.best.command, ctx.status.best.mode = winner.argv, winner.mode
    ctx.status.speedup = f"{speed:.2f}x"
