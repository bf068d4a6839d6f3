"""The state of one step, which every phase reads and changes: the spec, the status being written,
the time, the decisions so far, and the Tuner rebuilt from the trials once per step."""

from __future__ import annotations

from typing import Optional

from ...api.models import RLConfig, RLTuningJobSpec
from ...api.status import Phase, RLTuningJobStatus, TrialStatus
from .. import records, restore
from ..search import Deadline
from .conditions import set_phase
from .types import Decisions, Event


class StepContext:
    """One step of the lifecycle: what the phase functions (trials, scoring, profiling, searching,
    confirming, concluding, pooling, outcome) work on."""

    def __init__(
        self,
        spec: RLTuningJobSpec,
        status: RLTuningJobStatus,
        now: float,
        gen: int,
        deadline: Optional[Deadline] = None,
    ):
        self.spec, self.status, self.now, self.gen = spec, status, now, gen
        self.deadline = deadline
        self.decisions = Decisions(status)
        self._tuner = None

    def info(self, reason: str, message: str, trial: Optional[str] = None) -> None:
        self.decisions.events.append(Event("Normal", reason, message, trial))

    def warn(self, reason: str, message: str, trial: Optional[str] = None) -> None:
        self.decisions.events.append(Event("Warning", reason, message, trial))

    def phase(self, phase: Phase, message: str, **kw) -> None:
        set_phase(self.status, phase, message, self.gen, self.now, **kw)

    def tuner(self):
        if self._tuner is None:
            self._tuner = restore.make_tuner(self.spec, self.status.trials, self.deadline)
        return self._tuner

    def active(self, kind: Optional[str] = None) -> list[TrialStatus]:
        return [t for t in self.status.trials if t.state.is_active and (kind is None or t.kind == kind)]

    def config_of(self, t: TrialStatus) -> RLConfig:
        return records.config_from_diff(self.spec.baseline, t.config)

    def forget_tuner(self) -> None:
        """The trials changed: the Tuner is rebuilt from them when next asked for."""
        self._tuner = None
