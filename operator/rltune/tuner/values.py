"""The tuner's values: a trial as the tuner remembers it (TrialRecord, what status.trials[] restores)
and a configuration as it proposes one (Proposal)."""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from ..api.models import RLConfig
from ..api.status import FailureCause, TrialState
from . import gates as quality_gates
from .summary import TrialSummary, TunerModel

TERMINAL = tuple(s for s in TrialState if s.is_terminal)


class TrialRecord(TunerModel):
    """One trial (or the baseline) as the tuner remembers it. JSON-serialisable (status.trials[])."""

    id: str
    config: RLConfig
    gpus: int = Field(0, description="GPUs the configuration uses.")
    predicted: Optional[float] = Field(None, description="Forecast seconds per step when proposed.")
    predicted_std: Optional[float] = Field(None, description="Forecast standard deviation, seconds.")
    summary: Optional[TrialSummary] = None
    objective: Optional[float] = Field(None, description="Measured objective (seconds or GPU-seconds per step).")
    state: TrialState = TrialState.PENDING
    reason: str = ""
    gates: dict[str, quality_gates.GateResult] = Field(default_factory=dict, description="Quality gate -> verdict.")
    cause: Optional[FailureCause] = Field(None, description="Why a failed trial failed.")
    bottleneck: Optional[str] = Field(None, description="Bottleneck the proposal addressed.")
    rationale: Optional[str] = None

    @property
    def step_time(self) -> Optional[float]:
        return self.summary.step_time if self.summary and not self.summary.failed else None


class Proposal(TunerModel):
    config: RLConfig
    gpus: int
    predicted: float = Field(description="Forecast seconds per step.")
    std: float = Field(description="Forecast standard deviation, seconds.")
    predicted_objective: float
    changes: dict[str, list] = Field(default_factory=dict, description="Knob path -> [baseline, proposed].")
    bottleneck: str = Field(description="Bottleneck this configuration addresses.")
    rationale: str = ""
    acquisition: float = 0.0
    fit_probability: float = Field(1.0, description="Probability that it fits in memory (memfit).")
    extrapolation: str = Field("", description="What the forecast rests on that no trial has measured.")

    @property
    def predicted_std(self) -> float:
        return self.std
