"""The trial-backend protocol: how the tuning loop runs trials (locally or on a cluster)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from ..api.metrics import StepRecord
from ..api.models import TrialSpec

ObservedState = Literal["running", "succeeded", "failed", "unschedulable"]


@dataclass
class TrialObservation:
    state: ObservedState
    steps: list[StepRecord] = field(default_factory=list)
    reason: str = ""
    exit_code: int | None = None


@runtime_checkable
class TrialBackend(Protocol):
    def launch(self, trial_id: str, spec: TrialSpec) -> None:
        """Start the trial (non-blocking)."""

    def poll(self, trial_id: str) -> TrialObservation:
        """Current state and every step measured so far."""

    def cancel(self, trial_id: str) -> None:
        """Stop the trial and release its GPUs."""
