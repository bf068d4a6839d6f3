"""The one small interface every framework adapter implements.

An adapter translates between rltune's canonical configuration (`RLConfig`, framework-neutral knob
paths such as `rollout.maxNumSeqs`) and one framework's own command line: which entry point a
configuration needs (a different placement or async mode can mean a different main), which
framework keys each knob writes, which knobs the framework cannot express (refused: the search is
narrowed and the job's status says so), which values it can run, and the constraints a
configuration must meet before the framework would start.

The user's command (`spec.workload.command` + `spec.workload.args`, the command they run today) is
the baseline: `read` recovers the canonical knobs it sets, `command` rewrites it for another
configuration. Pure: no Kubernetes, no framework import (the round-trip tests use the frameworks'
own config loaders to check this module's output).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Optional, Protocol, Sequence

from ..api.models import RLConfig, RLTuningJobSpec


class Treatment(str, Enum):
    """How a canonical knob reaches a framework."""

    MAPPED = "mapped"  # one framework key, the same value
    TRANSFORMED = "transformed"  # other keys, another value, or the entry point changes
    REFUSED = "refused"  # no counterpart: pinned to the baseline and reported in the status

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class KnobRule:
    """What one canonical knob becomes in one framework (for one trainer backend)."""

    knob: str  # canonical path, e.g. "rollout.maxNumSeqs"
    treatment: Treatment
    keys: tuple[str, ...] = ()  # the framework keys or options it writes (none when refused)
    note: str = ""  # the transformation, or why it is refused


@dataclass(frozen=True)
class KeyMap:
    """One canonical knob as one framework key, declared once: an adapter's rule, its read of a
    command and its write of a configuration all derive from it. `to_key` / `from_key` convert the
    knob's value to the key's and back (None: the value as it is, Treatment.MAPPED; otherwise
    Treatment.TRANSFORMED, with `note` saying how)."""

    knob: str  # canonical path, e.g. "rollout.maxNumSeqs"
    key: str  # the framework's key, e.g. "actor_rollout_ref.rollout.max_num_seqs"
    note: str = ""
    to_key: Optional[Callable[[Any], Any]] = None
    from_key: Optional[Callable[[Any], Any]] = None

    @property
    def rule(self) -> KnobRule:
        plain = self.to_key is None and self.from_key is None
        return KnobRule(self.knob, Treatment.MAPPED if plain else Treatment.TRANSFORMED, (self.key,), self.note)

    def read(self, get: Callable[[str], Any]) -> Any:
        """The knob's value from a command's `get(key)`."""
        v = get(self.key)
        return v if self.from_key is None else self.from_key(v)

    def value(self, knobs: dict[str, Any]) -> Any:
        """The key's value for a configuration's flat knobs (RLConfig.flat())."""
        v = knobs[self.knob]
        return v if self.to_key is None else self.to_key(v)


@dataclass(frozen=True)
class FrameworkCommand:
    """A complete command for one configuration: the entry point its mode needs and the overrides."""

    mode: str  # e.g. "hybrid-engine", "fully-async" (docs/frameworks.md)
    entry: tuple[str, ...]  # argv of the entry point, e.g. ("python3", "-m", "verl.trainer.main_ppo")
    overrides: tuple[str, ...]  # framework options / Hydra overrides, in order

    @property
    def argv(self) -> list[str]:
        return [*self.entry, *self.overrides]


class Adapter(Protocol):
    framework: str  # the value of spec.workload.framework
    version: str  # the framework version the mapping (and its round-trip tests) were checked against
    backends: tuple[str, ...]  # the trainer backends the mapping covers

    def entry_problem(self, command: Sequence[str]) -> Optional[str]:
        """Why the user's command is not this framework's entry point (None when it is)."""
        ...

    def read_task(self, command: Sequence[str]) -> dict[str, int]:
        """The task shape the command sets, as TaskSpec fields (promptsPerStep, samplesPerPrompt,
        maxPromptTokens, maxResponseTokens): it must agree with spec.workload.task, which the
        forecast reads."""
        ...

    def backend(self, command: Sequence[str]) -> str:
        """The trainer backend the user's command selects (e.g. "fsdp", "megatron", "deepspeed")."""
        ...

    def rules(self, backend: str) -> dict[str, KnobRule]:
        """Every canonical knob (RLConfig.flat() paths) -> its treatment under this backend."""
        ...

    def read(self, command: Sequence[str]) -> dict[str, Any]:
        """The canonical knob values the user's command sets (its baseline), by knob path."""
        ...

    def values(self, knob: str, spec: RLTuningJobSpec) -> Optional[list]:
        """The values of `knob` this framework can run for the job (None: no restriction)."""
        ...

    def problems(self, spec: RLTuningJobSpec, config: RLConfig, command: Sequence[str]) -> list[str]:
        """Framework constraints `config` violates with this command; each names the keys and the fix."""
        ...

    def command(self, spec: RLTuningJobSpec, config: RLConfig, command: Sequence[str]) -> FrameworkCommand:
        """The user's command rewritten for `config`: the mode's entry point, the user's own overrides
        with every mapped knob replaced, nothing added that a production run would not want."""
        ...

    def trial_command(
        self, spec: RLTuningJobSpec, config: RLConfig, command: Sequence[str], steps: int
    ) -> FrameworkCommand:
        """`command(...)` plus what a short trial needs: `steps` training steps, no checkpoints, no
        validation, console logging (what the metrics bridge parses)."""
        ...
