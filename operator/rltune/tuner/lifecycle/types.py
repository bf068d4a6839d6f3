"""What the pure step takes and returns: plain data, so that any driver (the operator, the local
loop, the benchmark) can feed it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from ...api.metrics import StepRecord
from ...api.status import FailureCause, RLTuningJobStatus, TrialState

REASON_GRACE_SECONDS = 5.0  # how long a failed trial's exported reason may take to reach the metrics store


@dataclass(frozen=True)
class Refusal:
    """The driver could not start a trial: no node can hold it, or the API server refuses its pods."""

    cause: FailureCause
    message: str


@dataclass(frozen=True)
class Observation:
    """What the driver saw of one active trial (plain data; defaults: nothing seen yet)."""

    placed: bool = False  # every pod is scheduled (locally: the process was launched)
    pods: int = 1  # how many pods the trial needs (one per node it spans)
    done: bool = False  # rank 0 finished with exit code 0
    failure: str = ""  # one line on why a pod or process failed ("" = none failed)
    exit_code: Optional[int] = None
    exported_reason: Optional[str] = None  # the trial's own exported failure reason (None: none visible yet)
    pending_reason: str = ""  # the scheduler's message while not placed
    steps: Optional[list[StepRecord]] = None  # steps measured so far (None: not read this time)
    metrics_error: str = ""
    refused: Optional[Refusal] = None
    gated: str = ""  # Kueue holds the trial's pods (scheduling gate / suspended): the LocalQueue's name
    preempted: str = ""  # Kueue evicted (or the cluster preempted) the trial's pods: why ("" = not)


@dataclass(frozen=True)
class Event:
    type: str  # Normal or Warning
    reason: str
    message: str
    trial: Optional[str] = None  # the trial it concerns, if any


@dataclass
class Decisions:
    status: RLTuningJobStatus
    started: list[str] = field(default_factory=list)  # trials recorded Pending this step
    teardown: list[str] = field(default_factory=list)  # trials whose pods/processes must go
    finished: list[TrialState] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)

    def then(self, later: "Decisions") -> "Decisions":
        """This step followed by a later one (the driver's second step after a refusal)."""
        return Decisions(
            later.status,
            self.started + later.started,
            self.teardown + later.teardown,
            self.finished + later.finished,
            self.events + later.events,
        )


def finite(x: Optional[float]) -> Optional[float]:
    """`x`, or None where it is NaN or infinite (no JSON number: the API server would refuse the write)."""
    return x if x is None or math.isfinite(x) else None
