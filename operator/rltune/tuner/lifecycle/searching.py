"""Phase Searching: proposals within the budget (trials, failures, GPUs), until the Tuner is done."""

from __future__ import annotations

from ...api.status import Phase
from .. import records
from . import concluding, trials
from .context import StepContext


def search(ctx: StepContext) -> None:
    st, budget = ctx.status, ctx.spec.budget
    search = [t for t in st.trials if t.kind == "search" and not t.superseded]
    failed = sum(1 for t in search if t.state.is_failure)
    if failed >= budget.max_failed_trials:
        trials.teardown_all(ctx)
        ctx.phase(
            Phase.FAILED,
            f"{failed} trials failed (budget.maxFailedTrials={budget.max_failed_trials})",
            failure=("TooManyFailedTrials", f"{failed} failed trials; last: {search[-1].reason}"),
        )
        return
    active = ctx.active("search")
    done = len(search) - len(active)
    left = budget.max_trials - done - len(active)
    tuner_done, why = ctx.tuner().done() if left > 0 else (False, "")
    if left > 0 and not tuner_done:
        slots = min(budget.parallel_trials - len(active), left)
        gpus_free = ctx.spec.resources.gpu_budget - sum(t.gpus for t in ctx.active())
        if slots > 0 and gpus_free > 0:
            proposals = ctx.tuner().propose(slots, gpus_free)
            for p in proposals:
                g = records.gpus_of(ctx.spec, p.config)
                if g > gpus_free:
                    continue
                gpus_free -= g
                trials.add_trial(
                    ctx, f"t{st.next_trial}", "search", p.config, budget.steps_per_trial, p.predicted, p.predicted_std
                )
                st.next_trial += 1
            if not proposals and not ctx.active() and not ctx.tuner().truncated:
                tuner_done, why = True, "the search space is exhausted"
    if ctx.active("search"):
        return
    if left > 0 and not tuner_done:
        return
    concluding.conclude(ctx, why or f"{done} of {budget.max_trials} trials done")
