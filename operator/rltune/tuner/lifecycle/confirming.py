"""Phase Confirming: the winner's confirmation judged; on a rejection the next best is confirmed."""

from __future__ import annotations

from ...api.status import Phase, TrialState
from .. import records
from . import concluding, outcome, searching, trials
from .context import StepContext


def after_confirming(ctx: StepContext) -> None:
    conf = [t for t in ctx.status.trials if t.kind == "confirm"]
    c = conf[-1] if conf else None
    if c is None:
        ctx.phase(Phase.SEARCHING, "no confirmation run found")
        return
    if c.state.is_active:
        return
    orig = next(t for t in ctx.status.trials if t.id == c.of)
    if c.state == TrialState.SUCCEEDED and trials.beats_baseline(ctx, c.objective):
        outcome.set_best(ctx, c, confirmed=True, of=orig)
        ran = records.unflatten_summary(c.summary).total_steps if c.summary else c.steps  # fewer: the interim look
        concluding.succeed(ctx, f"confirmed over {ran} steps")
        return
    orig.state = TrialState.REJECTED
    orig.reason = f"confirmation run {c.id} {c.state}: {c.reason or 'not better than the baseline on the objective'}"[
        :300
    ]
    ctx.forget_tuner()
    ctx.warn("ConfirmationFailed", orig.reason)
    ctx.phase(Phase.SEARCHING, f"{orig.id} did not confirm; picking the next best")
    searching.search(ctx)
