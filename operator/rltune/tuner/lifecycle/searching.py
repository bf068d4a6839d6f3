"""Phase Searching: proposals within the budget (trials, failures, GPUs), until the Tuner is done."""

from __future__ import annotations

from ...api.status import Phase
from .. import records
from . import concluding, trials
from .context import StepContext


def search(ctx: StepContext) -> None:
    """The budget is the Tuner's terminator's to count (the search trials of the status, running ones
    included): too many failures fail the job, and no proposal goes past budget.maxTrials."""
    st, budget = ctx.status, ctx.spec.budget
    terminator = ctx.tuner().terminator
    if terminator.too_many_failures():
        failed = terminator.failures()
        last = [t for t in st.trials if t.kind == "search" and not t.superseded][-1]
        trials.teardown_all(ctx)
        ctx.phase(
            Phase.FAILED,
            f"{failed} trials failed (budget.maxFailedTrials={budget.max_failed_trials})",
            failure=("TooManyFailedTrials", f"{failed} failed trials; last: {last.reason}"),
        )
        return
    active = ctx.active("search")
    left = terminator.trials_left()
    done = len(terminator.trials()) - len(active)
    tuner_done, why = terminator.done() if left > 0 else (False, "")
    if left > 0 and not tuner_done:
        slots = min(budget.parallel_trials - len(active), left)
        gpus_free = ctx.spec.resources.gpu_budget - sum(t.gpus for t in ctx.active())
        if slots > 0 and gpus_free > 0:
            proposals = ctx.tuner().proposer.propose(slots, gpus_free)
            for p in proposals:
                g = records.gpus_of(ctx.spec, p.config)
                if g > gpus_free:
                    continue
                gpus_free -= g
                trials.add_trial(
                    ctx, f"t{st.next_trial}", "search", p.config, budget.steps_per_trial, p.predicted, p.predicted_std
                )
                st.next_trial += 1
            if not proposals and not ctx.active() and not ctx.tuner().proposer.truncated:
                tuner_done, why = True, "the search space is exhausted"
    if ctx.active("search"):
        return
    if left > 0 and not tuner_done:
        return
    concluding.conclude(ctx, why or f"{done} of {budget.max_trials} trials done")
