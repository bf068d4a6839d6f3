"""What tuning cost against what its pick saves: trial GPU-hours, GPU-hours saved over the planned
run, their ratio and the step at which the savings have paid the trials back.

A team weighs a week of tuning against the run it speeds up; the speed-up alone does not say
whether the trials were worth their GPUs. Trials are costed by the step seconds they ran, warm-up
included (TrialSummary.seconds_spent), times their GPUs; pod start-up is not a step and is not
counted. Shared by the operator's status and the benchmark."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class TuningCost:
    trial_gpu_hours: float  # GPU-hours the trials' steps used
    saved_gpu_hours: float  # GPU-hours the pick saves over planned_steps (0 when it saves nothing)
    planned_steps: int

    @property
    def share(self) -> Optional[float]:
        """Trial GPU-hours per GPU-hour saved over the planned run (None: nothing saved)."""
        return self.trial_gpu_hours / self.saved_gpu_hours if self.saved_gpu_hours > 0 else None

    @property
    def payback_steps(self) -> Optional[float]:
        """Steps of the planned run after which the pick has saved what the trials cost."""
        if self.saved_gpu_hours <= 0:
            return None
        return self.trial_gpu_hours / (self.saved_gpu_hours / self.planned_steps)


def tuning_cost(
    trial_gpu_seconds: float, base_gpu_seconds_per_step: float, pick_gpu_seconds_per_step: float, planned_steps: int
) -> TuningCost:
    """Cost of trials that used `trial_gpu_seconds` against a pick that runs each step in
    `pick_gpu_seconds_per_step` GPU-seconds where the baseline needed `base_gpu_seconds_per_step`."""
    saved = max(0.0, base_gpu_seconds_per_step - pick_gpu_seconds_per_step)
    return TuningCost(trial_gpu_seconds / 3600.0, saved * planned_steps / 3600.0, planned_steps)
