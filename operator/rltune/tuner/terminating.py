"""Terminating: when the search is over (Optuna's terminator role), and the one place that counts
the trial budget (budget.maxTrials) and the failures (budget.maxFailedTrials).

The lifecycle's search asks here how many trials are left and whether failures end the job; the
stop rule weighs the best remaining candidate's expected saving against its own trial's cost.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..api.status import TrialState
from .values import TERMINAL, TrialRecord

if TYPE_CHECKING:  # the Tuner owns its Terminator; only the annotation names it
    from .core import Tuner

MIN_TRIALS_BEFORE_GAIN_STOP = 3


class Terminator:
    """The Tuner's budget and stop rule."""

    def __init__(self, tuner: "Tuner"):
        self.tuner = tuner

    def trials(self) -> list[TrialRecord]:
        """The search trials the budget counts: every one proposed, running or finished."""
        return [r for r in self.tuner.history if r.id != self.tuner.baseline.id]

    def failures(self) -> int:
        return sum(1 for r in self.trials() if r.state.is_failure)

    def too_many_failures(self) -> bool:
        return self.failures() >= self.tuner.spec.budget.max_failed_trials

    def trials_left(self) -> int:
        """Trials budget.maxTrials still allows, running ones counted as spent."""
        return self.tuner.spec.budget.max_trials - len(self.trials())

    def done(self) -> tuple[bool, str]:
        """Whether the search is over, and why: the baseline failed, too many trials failed, the
        trial budget is spent, the space is exhausted, or no trial left pays for itself."""
        tuner = self.tuner
        budget = tuner.spec.budget
        trials = self.trials()
        finished = [r for r in trials if r.state in TERMINAL]
        if tuner.baseline.state in (TrialState.FAILED, TrialState.UNSCHEDULABLE, TrialState.REJECTED):
            return True, f"baseline {tuner.baseline.state}: {tuner.baseline.reason}"
        if self.too_many_failures():
            return True, f"{self.failures()} trials failed (budget.maxFailedTrials {budget.max_failed_trials})"
        if self.trials_left() <= 0:
            return True, f"trial budget spent ({len(trials)}/{budget.max_trials})"
        running = [r for r in trials if r.state.is_active]
        if running:
            return False, f"{len(running)} trials running"
        cands = tuner.proposer.candidates(exclude=tuner.excluded)
        if tuner.proposer.truncated:  # only part of the space was weighed: it says nothing of the rest
            return False, f"search truncated: {tuner.proposer.truncated}"
        if not cands:
            return True, "search space exhausted"
        inc = tuner.incumbent()
        if inc is not None and len(finished) >= MIN_TRIALS_BEFORE_GAIN_STOP:
            val = tuner.proposer.expected_value(cands)
            i = int(np.argmax(val))
            if val[i] <= 0.0:
                b = tuner.spec.budget
                cost = cands[i].objective * tuner.trial_steps()
                return True, (
                    f"no trial pays for itself: the best expected saving over budget.plannedSteps "
                    f"{b.planned_steps} ({float(val[i]) + cost:.0f}) is below the cost of its own "
                    f"{b.steps_per_trial}-step trial ({cost:.0f}, objective units, its warm-up as measured); "
                    f"a trial measures to +-{tuner.measurement_sd():.1%} here, more steady steps per trial "
                    f"would measure finer"
                )
        return False, "searching"
