"""Time stamps, conditions and phases of a status, and the two early answers of a step (a spec refused,
a dependency waited for)."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Optional

from ...api.status import Condition, Phase, RLTuningJobStatus
from .types import Decisions, Event


def cheaper(saving: float) -> str:
    """A saving in cost per step in words: '23% cheaper per step' / '12% dearer per step'."""
    return f"{abs(saving):.0%} {'cheaper' if saving >= 0 else 'dearer'} per step"


def now_iso(t: Optional[float] = None) -> str:
    return datetime.fromtimestamp(t if t is not None else time.time(), timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_iso(s: Optional[str]) -> Optional[float]:
    if not s:
        return None
    return datetime.strptime(s, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()


def set_condition(
    status: RLTuningJobStatus, type_: str, value: str, reason: str, message: str, gen: int, now: float
) -> None:
    for c in status.conditions:
        if c.type == type_:
            if c.status != value:
                c.last_transition_time = now_iso(now)
            c.status, c.reason, c.message, c.observed_generation = value, reason, message[:1000], gen  # type: ignore[assignment]
            return
    status.conditions.append(
        Condition(
            type=type_,
            status=value,
            reason=reason,
            message=message[:1000],  # type: ignore[arg-type]
            last_transition_time=now_iso(now),
            observed_generation=gen,
        )
    )


def set_phase(
    status: RLTuningJobStatus,
    phase: Phase,
    message: str,
    gen: int,
    now: float,
    failure: Optional[tuple[str, str]] = None,
    complete: Optional[tuple[str, str]] = None,
) -> None:
    """The phase and every condition that follows from it (kstatus Ready/Reconciling/Stalled too)."""
    status.phase = phase
    status.message = message[:500]
    set_condition(
        status,
        "Ready",
        "True" if phase == Phase.SUCCEEDED else "False",
        (complete or failure or (phase, ""))[0],
        message,
        gen,
        now,
    )
    set_condition(status, "Reconciling", "False" if phase.is_terminal else "True", phase, message, gen, now)
    set_condition(
        status, "Stalled", "True" if phase == Phase.FAILED else "False", (failure or (phase, ""))[0], message, gen, now
    )
    if phase.is_terminal:
        status.completed_at = status.completed_at or now_iso(now)
        set_condition(status, "Progressing", "False", phase, message, gen, now)
    else:
        set_condition(status, "Progressing", "True", phase, message, gen, now)
    if failure:
        set_condition(status, "Failed", "True", failure[0], failure[1], gen, now)
        set_condition(status, "Complete", "False", "Failed", failure[1], gen, now)
    elif complete:
        set_condition(status, "Complete", "True", complete[0], complete[1], gen, now)
        set_condition(status, "Failed", "False", "Succeeded", "", gen, now)
    elif not phase.is_terminal:
        set_condition(status, "Complete", "False", "InProgress", message, gen, now)
        set_condition(status, "Failed", "False", "InProgress", "", gen, now)


def refuse_spec(status: RLTuningJobStatus, reason: str, message: str, gen: int, now: float) -> Decisions:
    """The spec cannot run (invalid, unsupported, against policy): the job fails before any trial."""
    status = status.model_copy(deep=True)
    status.started_at = status.started_at or now_iso(now)
    events = (
        []
        if status.observed_generation == gen and status.phase == Phase.FAILED
        else [Event("Warning", reason, message)]
    )
    status.observed_generation = gen
    set_phase(status, Phase.FAILED, message, gen, now, failure=(reason, message))
    set_condition(status, "SpecValid", "False", reason, message, gen, now)
    return Decisions(status, events=events)


def wait_for(status: RLTuningJobStatus, condition: str, reason: str, message: str, gen: int, now: float) -> Decisions:
    """Something the cluster lacks (e.g. the KubeRay operator) keeps the job from starting: it waits,
    saying so in `condition`=False, and goes on by itself once the cluster has it."""
    status = status.model_copy(deep=True)
    status.started_at = status.started_at or now_iso(now)
    old = next((c for c in status.conditions if c.type == condition), None)
    events = (
        []
        if old is not None and old.status == "False" and old.reason == reason
        else [Event("Warning", reason, message)]
    )
    status.observed_generation = gen
    set_phase(status, Phase.PENDING, message, gen, now)
    set_condition(status, condition, "False", reason, message, gen, now)
    return Decisions(status, events=events)
