"""Pruning: stopping a running trial that cannot beat the incumbent (Optuna's pruner role).

A stopped trial costs only the steps it ran, and its steps still calibrate the forecaster.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Optional

from ..api.metrics import StepRecord
from .forecast import NOISE_SD
from .summary import summarize

if TYPE_CHECKING:  # the Tuner owns its Pruner; only the annotation names it
    from .core import Tuner

# A running trial is stopped once its measured steps put it this many standard deviations of step
# noise (at least NOISE_SD per step) beyond the incumbent: after one step, ~16% slower.
EARLY_STOP_Z = 2.0


class Pruner:
    """The Tuner's early stop of a running trial."""

    def __init__(self, tuner: "Tuner"):
        self.tuner = tuner

    def early_stop(self, partial_steps: list[StepRecord], gpus: Optional[int] = None) -> bool:
        """True when a running trial cannot plausibly beat the incumbent: even EARLY_STOP_Z sd of
        step noise below its measured mean it is slower. Its steps still calibrate the forecaster."""
        inc = self.tuner.incumbent()
        if inc is None:
            return False
        s = summarize(partial_steps)
        if s.failed or s.steps < 1:
            return False
        g = gpus or self.tuner.budget
        rel = max(NOISE_SD, s.step_time_std / s.step_time_mean if s.steps >= 2 and s.step_time_mean > 0 else 0.0)
        lo = s.step_time * (1.0 - EARLY_STOP_Z * rel / math.sqrt(s.steps))
        return self.tuner.objective_of(lo, g) > inc
