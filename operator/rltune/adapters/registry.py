"""Which adapter runs a job, and what it leaves of the job's search space.

The search, the validation and the lifecycle ask here, never a framework module directly:
- `coverage(spec)`: the knobs the job's framework cannot express (dropped from the search, pinned
  to the baseline, and listed in the job's status with the reason) and the values it can run;
- `resolve(spec)`: for verl/OpenRLHF the user's command is the baseline, so the canonical knobs it
  sets are read into `spec.baseline` (a contradicting explicit `spec.baseline` value is an error);
- `problems(spec, config)`: the framework's own constraints on one configuration;
- `framework_command(spec, config)`: the full command a configuration runs (the winner's, in the status).

The twin and the reference loop are rltune's own workloads: every knob is theirs except the ones
they do not model (listed in NATIVE_DROPPED). Pure: no Kubernetes.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Mapping, Optional

from ..api.models import RLConfig, RLTuningJobSpec, TaskSpec
from .base import Adapter, FrameworkCommand, Treatment

FRAMEWORKS = ("verl", "openrlhf")

# knobs rltune's own workloads cannot run, and why (the twin models verl's fractional bound as its
# pipeline's run-ahead: rltune/twin/pipeline.py)
NATIVE_DROPPED = {
    "reference": {
        "async.staleFraction": "the reference loop bounds staleness by policy versions only "
        "(async.staleness); a fractional bound is verl fully-async's",
    },
    "twin": {},
}


@lru_cache(maxsize=None)
def adapter_for(framework: str) -> Optional[Adapter]:
    """The adapter of a framework (None for the twin and the reference loop)."""
    if framework not in FRAMEWORKS:
        return None
    return getattr(importlib.import_module(f"{__package__}.{framework}"), framework)


def user_command(spec: RLTuningJobSpec) -> list[str]:
    """The command the user runs today: spec.workload.command + spec.workload.args."""
    return [*(spec.workload.command or []), *(spec.workload.args or [])]


@dataclass(frozen=True)
class Dropped:
    """A knob the job's framework cannot express: pinned to the baseline, reported in the status."""

    knob: str
    why: str


@dataclass(frozen=True)
class Coverage:
    framework: str
    backend: str  # the trainer backend the command selects ("" for rltune's own workloads)
    version: str  # the framework version the mapping was checked against
    dropped: tuple[Dropped, ...] = ()
    values: Mapping[str, list] = field(default_factory=dict)  # knob -> the values the framework can run
    # knob -> (low, high]: a continuous knob the framework runs at any value in the range (its `values`
    # are then only the default candidates), e.g. verl's staleness_threshold in (0, 1]
    ranges: Mapping[str, tuple[float, float]] = field(default_factory=dict)

    def is_dropped(self, knob: str) -> bool:
        return any(d.knob == knob for d in self.dropped)

    def runs(self, knob: str, value) -> bool:
        """Whether the framework can run `knob` at `value`."""
        if knob in self.ranges and value is not None and not isinstance(value, bool):
            low, high = self.ranges[knob]
            return low < value <= high
        runnable = self.values.get(knob)
        return runnable is None or value in runnable


def trainer_backend(spec: RLTuningJobSpec) -> str:
    """The trainer backend the user's command selects ("" for rltune's own workloads)."""
    ad = adapter_for(spec.workload.framework)
    return ad.backend(user_command(spec)) if ad is not None else ""


def coverage(spec: RLTuningJobSpec) -> Coverage:
    fw = spec.workload.framework
    ad = adapter_for(fw)
    if ad is None:
        return Coverage(fw, "", "", tuple(Dropped(k, why) for k, why in NATIVE_DROPPED.get(fw, {}).items()))
    cmd = user_command(spec)
    backend = ad.backend(cmd)
    rules = ad.rules(backend)
    dropped = tuple(
        Dropped(k, r.note or f"{fw} has no counterpart")
        for k, r in sorted(rules.items())
        if r.treatment == Treatment.REFUSED
    )
    values = {}
    for knob in rules:
        v = ad.values(knob, spec)
        if v is not None:
            values[knob] = list(v)
    return Coverage(fw, backend, ad.version, dropped, values, dict(getattr(ad, "ranges", {})))


def _explicit(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out |= _explicit(v, f"{prefix}{k}.")
        else:
            out[prefix + k] = v
    return out


def resolve(spec: RLTuningJobSpec) -> RLTuningJobSpec:
    """For a framework job: spec.baseline with the knobs the user's command sets. Raises ValueError
    (naming both places) when an explicit spec.baseline value contradicts the command."""
    ad = adapter_for(spec.workload.framework)
    if ad is None:
        return spec
    cmd = user_command(spec)
    if not cmd:
        raise ValueError(
            f"spec.workload.command: a {spec.workload.framework} job needs the command you run today (entry "
            "point and your overrides), e.g. [python3, -m, verl.trainer.main_ppo, ...]: it is the baseline"
        )
    why = ad.entry_problem(cmd)
    if why:
        raise ValueError(f"spec.workload.command: {why}")
    # the task shape the command runs: a field the spec leaves out is read from it, one the spec
    # states must agree with it
    stated = spec.workload.task.model_dump(by_alias=True, exclude_unset=True)
    ran = ad.read_task(cmd)
    for f, v in ran.items():
        if f in stated and stated[f] != v:
            raise ValueError(
                f"spec.workload.task.{f} ({stated[f]}) contradicts the command, which runs {v}: the forecast "
                f"reads the task, so set spec.workload.task.{f} to {v} or leave it out"
            )
    task = TaskSpec.model_validate(spec.workload.task.model_dump(by_alias=True, exclude_unset=True) | ran)
    spec = spec.model_copy(update={"workload": spec.workload.model_copy(update={"task": task})})
    read = ad.read(cmd)
    given = _explicit(spec.baseline.model_dump(by_alias=True, exclude_unset=True, mode="json"))
    clash = [k for k, v in read.items() if k in given and given[k] != v]
    if clash:
        k = clash[0]
        raise ValueError(
            f"spec.baseline.{k} ({given[k]!r}) contradicts the command, which sets {read[k]!r}: the command is "
            f"the baseline, so remove spec.baseline.{k} or change the command"
        )
    try:
        baseline = spec.baseline.with_knobs(read)
    except ValueError as e:
        raise ValueError(f"spec.workload.command: {e}") from None
    return spec.model_copy(update={"baseline": baseline})


def problems(spec: RLTuningJobSpec, config: RLConfig) -> list[str]:
    """The framework's constraints `config` violates (none for rltune's own workloads)."""
    ad = adapter_for(spec.workload.framework)
    return [] if ad is None else ad.problems(spec, config, user_command(spec))


def framework_command(
    spec: RLTuningJobSpec, config: RLConfig, steps: Optional[int] = None
) -> Optional[FrameworkCommand]:
    """The command `config` runs (a trial's when `steps` is given); None for rltune's own workloads."""
    ad = adapter_for(spec.workload.framework)
    if ad is None:
        return None
    cmd = user_command(spec)
    return ad.command(spec, config, cmd) if steps is None else ad.trial_command(spec, config, cmd, steps)
