"""Picking: which measured configuration the job deploys (Optuna's best_trial, with the winner's
curse weighed): the fastest that passed, or the one whose measurement, weighed against what the
other trials forecast for it, is lowest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from ..api.status import TrialState
from .forecast import Forecaster
from .values import TrialRecord

if TYPE_CHECKING:  # the Tuner owns its Picker; only the annotation names it
    from .core import Tuner


class Picker:
    """The Tuner's picks among the baseline and the trials that passed."""

    def __init__(self, tuner: "Tuner"):
        self.tuner = tuner

    def _succeeded(self) -> list[TrialRecord]:
        """The records a pick chooses from: the baseline and every trial that passed, with an objective."""
        recs = [self.tuner.baseline] + self.tuner.history
        return [r for r in recs if r.state == TrialState.SUCCEEDED and r.objective is not None]

    def best(self) -> Optional[TrialRecord]:
        """The succeeded record with the lowest objective (the baseline if nothing beat it)."""
        ok = self._succeeded()
        return min(ok, key=lambda r: r.objective) if ok else None

    def best_estimate(self) -> Optional[TrialRecord]:
        """The succeeded record with the lowest *estimated* objective (shrunk_objectives): among
        near-tied layouts the lowest of several noisy measurements is biased low (the winner's
        curse), so each measurement is weighed against what the other trials forecast for it."""
        ok = self._succeeded()
        if len(ok) < 2:
            return ok[0] if ok else None
        est = self.shrunk_objectives(ok)
        return min(ok, key=lambda r: est[r.id])

    def shrunk_objectives(self, recs: list[TrialRecord]) -> dict[str, float]:
        """Record id -> the precision-weighted mean of its measured objective (relative sd
        measurement_sd()) and the forecast for its configuration calibrated on every *other*
        measurement (sd as the search states it, x uncertainty_scale()): the posterior mean of a
        normal prior and a normal measurement. A record the others cannot forecast keeps its measurement."""
        sd_m, scale = self.tuner.measurement_sd(), self.tuner.uncertainty_scale()
        out = {}
        for r in recs:
            others = [(o.config, o.summary) for o in self.tuner._obs if o.id != r.id]
            fc = Forecaster(self.tuner.spec, others, self.tuner._ooms)
            p = fc.predict(r.config)
            if not fc.calibrated or not p.feasible or not p.std > 0:
                out[r.id] = r.objective
                continue
            f = self.tuner.objective_of(p.step, r.gpus)
            var_f = (self.tuner.objective_of(p.std, r.gpus) * scale) ** 2
            var_m = (sd_m * r.objective) ** 2
            out[r.id] = (r.objective * var_f + f * var_m) / (var_f + var_m)
        return out
