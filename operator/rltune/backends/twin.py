"""In-process twin trial backend on a virtual clock: the tuning loop at simulation speed.

`tuner.loop.run` drives trials through a `TrialBackend` and waits between observations. Here a
trial is the twin's `simulate_trial` computed at launch, and its steps become visible as the
virtual clock passes their end times, so the lifecycle sees them one by one (early stopping,
parallel trials and confirmation behave as on a cluster) while nothing sleeps: `wait()` moves
the clock to the next step that ends. The benchmark runs rltune through this backend, so its
figures are figures of the loop the operator and `rltune tune --local` run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from .. import twin
from ..api.metrics import StepRecord
from ..api.models import TrialSpec
from ..tuner.backend import TrialObservation

EPOCH = 1_800_000_000.0  # the virtual clock's start (a fixed date, so runs are reproducible)
IDLE_S = 1.0  # how far wait() moves the clock when no trial has a step left to end


@dataclass
class VirtualClock:
    """Seconds since the epoch, advanced only by the backend."""

    now: float = EPOCH

    def __call__(self) -> float:
        return self.now


@dataclass
class _Trial:
    spec: TrialSpec
    started: float
    steps: list[StepRecord] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)  # virtual end time of each step
    refusal: str = ""  # the twin's reason the configuration cannot run
    cancelled_at: Optional[float] = None

    def seen(self, now: float) -> list[StepRecord]:
        until = now if self.cancelled_at is None else min(now, self.cancelled_at)
        return [s for s, end in zip(self.steps, self.ends) if end <= until]

    @property
    def live(self) -> bool:
        return self.cancelled_at is None and not self.refusal


class TwinBackend:
    """TrialBackend whose trials are twin simulations, timed by a VirtualClock.

    `seed_of(trial_id, spec)` picks a trial's noise seed (default: the spec's own), so a harness can
    give trials the draws it gives other methods (common random numbers)."""

    def __init__(
        self,
        clock: Optional[VirtualClock] = None,
        seed_of: Optional[Callable[[str, TrialSpec], int]] = None,
    ):
        self.clock = clock or VirtualClock()
        self.seed_of = seed_of
        self.trials: dict[str, _Trial] = {}

    def launch(self, trial_id: str, spec: TrialSpec) -> None:
        if self.seed_of is not None:
            spec = spec.model_copy(update={"seed": self.seed_of(trial_id, spec)})
        t = _Trial(spec, self.clock.now)
        try:
            t.steps = twin.simulate_trial(spec)
        except twin.Infeasible as e:
            t.refusal = str(e)
        end = t.started
        for s in t.steps:
            end += s.duration
            t.ends.append(end)
        self.trials[trial_id] = t

    def poll(self, trial_id: str) -> TrialObservation:
        t = self.trials[trial_id]
        if t.refusal:
            return TrialObservation("failed", [], t.refusal, 1)
        seen = t.seen(self.clock.now)
        if t.cancelled_at is not None:
            return TrialObservation("failed", seen, "cancelled")
        if len(seen) == len(t.steps):
            return TrialObservation("succeeded", seen, "", 0)
        return TrialObservation("running", seen)

    def cancel(self, trial_id: str) -> None:
        t = self.trials.get(trial_id)
        if t is not None and t.cancelled_at is None:
            t.cancelled_at = self.clock.now

    def wait(self) -> None:
        """Move the clock to the end of the next step of any trial still running."""
        pending = [end for t in self.trials.values() if t.live for end in t.ends if end > self.clock.now]
        self.clock.now = min(pending) if pending else self.clock.now + IDLE_S
