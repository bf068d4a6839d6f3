"""Other GPU pools: the winner's cheapest forecast on another pool, confirmed by one `pool` trial
(rltune.tuner.pools), and what its measurement says."""

from __future__ import annotations

from ...api.status import Phase, PoolOfferStatus, TrialState
from .. import records
from . import outcome, trials
from .conditions import cheaper
from .context import StepContext


def offer_pool(ctx: StepContext) -> bool:
    """spec.resources.pools: weigh the cheapest other pool against the winner's measured cost here;
    start its trial when the forecast saving over budget.plannedSteps pays for it (True: the job
    stays Confirming until it ends), else record the forecast verdict."""
    from ..pools import offers

    st, b = ctx.status, ctx.status.best
    if not ctx.spec.resources.pools or b is None or any(t.kind == "pool" for t in st.trials):
        return False
    found = offers(ctx.spec, ctx.tuner().forecaster, b.step_seconds, b.gpus, ctx.deadline)
    if not found:
        st.pool_offer = None
        ctx.info("PoolOffer", "no other pool is forecast to run the job")
        return False
    o = found[0]
    st.pool_offer = PoolOfferStatus(
        pool=o.pool.name,
        gpu_type=o.pool.gpu_type,
        config=records.config_diff(ctx.spec.baseline, o.config),
        gpus=o.gpus,
        forecast_seconds=round(o.step_seconds, 3),
        forecast_cost_per_step=round(o.cost_per_step, 6),
        home_cost_per_step=round(o.home_cost_per_step, 6),
    )
    verdict = (
        f"pool {o.pool.name} ({o.gpus}x {o.pool.gpu_type}): forecast {o.step_seconds:.1f}s/step, "
        f"{cheaper(o.saving)} than the winner here (p={o.p_cheaper:.2f} that it is cheaper)"
    )
    if not o.worth_a_trial:
        st.pool_offer.message = f"{verdict}: not worth a trial (expected saving below its cost)"
        ctx.info("PoolOffer", st.pool_offer.message)
        return False
    tid = f"p{st.next_trial}"
    st.next_trial += 1
    trials.add_trial(
        ctx, tid, "pool", o.config, ctx.spec.budget.steps_per_trial, o.step_seconds, o.step_std, pool=o.pool.name
    )
    st.pool_offer.trial = tid
    st.pool_offer.message = f"{verdict}: measuring it with trial {tid}"
    ctx.phase(Phase.CONFIRMING, st.pool_offer.message)
    return True


def after_pool(ctx: StepContext) -> None:
    """The pool trial ended: its measurement decides the recommendation, then the job succeeds."""
    from ..pools import cost_per_step

    t = [x for x in ctx.status.trials if x.kind == "pool"][-1]
    if t.state.is_active:
        return
    po = ctx.status.pool_offer
    if po is None or ctx.status.best is None:
        ctx.phase(Phase.SEARCHING, "pool offer lost; concluding again")
        return
    pool = ctx.spec.resources.pool(t.pool)
    if t.state == TrialState.SUCCEEDED and t.measured_seconds and pool is not None:
        cost = cost_per_step(pool.price_per_gpu_hour, t.gpus, t.measured_seconds)
        po.measured_seconds, po.measured_cost_per_step = round(t.measured_seconds, 3), round(cost, 6)
        po.saving = round(1.0 - cost / po.home_cost_per_step, 4)
        po.cost_to_planned_steps = round(cost * ctx.spec.budget.planned_steps, 2)
        po.recommended = po.saving > 0
        po.message = (
            f"pool {po.pool} measured {t.measured_seconds:.1f}s/step on {t.gpus}x {po.gpu_type}: "
            f"{cheaper(po.saving)} than the winner here" + (": moving is recommended" if po.recommended else ": stay")
        )
    else:
        po.recommended = False
        po.message = f"pool {po.pool}: trial {t.id} {t.state}" + (f": {t.reason}" if t.reason else "")
    ctx.info("PoolOffer", po.message, t.id)
    outcome.succeeded(ctx, "confirmed" if ctx.status.best.confirmed else "search done")
