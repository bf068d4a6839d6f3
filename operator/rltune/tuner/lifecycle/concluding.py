"""The end of the search: the winner picked (Tuner.best_estimate) and sent to confirmation, or the
baseline kept."""

from __future__ import annotations

from ...api.status import Phase
from .. import records
from . import outcome, pooling, trials
from .context import StepContext


def conclude(ctx: StepContext, why: str) -> None:
    st = ctx.status
    tuner = ctx.tuner()
    best, fastest = tuner.picker.best_estimate(), tuner.picker.best()
    if best is not None and fastest is not None and best.id != fastest.id:
        est = tuner.picker.shrunk_objectives([best, fastest])
        ctx.info(
            "WinnersCurse",
            f"picked {best.id} over {fastest.id}, which measured {best.objective / fastest.objective - 1:.1%} "
            f"faster: weighed against what the other trials forecast for each, {fastest.id} is "
            f"{est[fastest.id] / est[best.id] - 1:.1%} slower (one trial measures to "
            f"+-{tuner.measurement_sd():.1%} here)",
        )
    # the baseline itself is never a winner to confirm: the Tuner rebuilds it from the stored summary,
    # rounded a hair away from the objective measured, so comparing objectives alone is not enough
    base_id = records.baseline_trial(st.trials).id
    if best is None or best.id == base_id or not trials.beats_baseline(ctx, best.objective):
        msg = f"nothing beats the baseline ({why}); keep the current configuration"
        st.best, st.speedup = None, "1.00x"
        outcome.record_tuning_cost(ctx)
        ctx.info("NoImprovement", msg)
        ctx.phase(Phase.SUCCEEDED, msg, complete=("NoImprovement", msg))
        return
    bt = next(t for t in st.trials if t.id == best.id)
    if ctx.spec.budget.confirm_steps > 0:
        # a refused confirmation re-enters here with the same reason: say it again only when
        # search trials ran since the last confirmation, i.e. when the search ended anew
        last = max((i for i, t in enumerate(st.trials) if t.kind == "confirm"), default=-1)
        ended_anew = last < 0 or any(t.kind == "search" for t in st.trials[last + 1 :])
        cid = f"c{st.next_trial}"
        st.next_trial += 1
        trials.add_trial(
            ctx,
            cid,
            "confirm",
            ctx.config_of(bt),
            ctx.spec.budget.confirm_steps,
            bt.predicted_seconds,
            bt.predicted_std,
            of=bt.id,
        )
        # the confirmation's own message replaces this one at the end: say why the search ended now
        if ended_anew:
            ctx.info("SearchEnded", why)
        ctx.phase(
            Phase.CONFIRMING,
            f"confirming {bt.id} with {ctx.spec.budget.confirm_steps} steps; the search ended: {why}",
        )
        return
    outcome.set_best(ctx, bt, confirmed=False)
    succeed(ctx, why)


def succeed(ctx: StepContext, why: str) -> None:
    if not pooling.offer_pool(ctx):
        outcome.succeeded(ctx, why)
