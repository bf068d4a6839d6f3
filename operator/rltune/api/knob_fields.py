"""How RLConfig declares a knob, once: the pydantic field gives its path, type, default and bounds,
and a `KnobRole` in the field's annotation gives its group and layout role.

The pydantic model (and from it the CRD schema and validation's bounds) and the tuner's catalog
(tuner/knobs.py, which adds only what the search needs: candidate values, validity rule, feature
encoding, calibration prior) both read a knob from here, so none of them can disagree on it.
"""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel
from pydantic.alias_generators import to_camel

# placement: where the halves run (placement, trainer split); sync: how weights move; trainer and
# rollout: the two halves; async: what may overlap; cpu: the real-mode CPU split.
Group = Literal["placement", "sync", "trainer", "rollout", "async", "cpu"]
KnobType = Literal["int", "float", "bool", "enum"]


@dataclass(frozen=True)
class KnobRole:
    """What the tuner needs to know of a field besides its type: which half of a configuration it
    belongs to (the search composes rollout and trainer halves under an outer context), whether the
    validity rules read it as a parallel layout (it divides heads, GPUs or experts), and whether it
    applies to MoE models only."""

    group: Group
    layout: bool = False
    moe_only: bool = False


@dataclass(frozen=True)
class DeclaredKnob:
    path: str  # e.g. "rollout.maxNumSeqs"
    type: KnobType
    default: Any
    minimum: Optional[float]  # pydantic's ge, None where unbounded
    maximum: Optional[float]  # pydantic's le
    choices: tuple  # an enum's values, () otherwise
    role: KnobRole
    description: str


def _unwrap(annotation: Any) -> Any:
    """Optional[X] -> X."""
    if typing.get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _type_of(annotation: Any) -> tuple[KnobType, tuple]:
    t = _unwrap(annotation)
    if typing.get_origin(t) is Literal:
        return "enum", typing.get_args(t)
    for py, name in ((bool, "bool"), (int, "int"), (float, "float")):
        if t is py:
            return name, ()
    raise TypeError(f"a knob must be an int, float, bool or Literal, not {annotation!r}")


def declared_knobs(model: type[BaseModel], prefix: str = "") -> dict[str, DeclaredKnob]:
    """Every field of `model` (nested models walked, camelCase paths) that carries a KnobRole."""
    out: dict[str, DeclaredKnob] = {}
    for name, info in model.model_fields.items():
        path = prefix + (info.alias or to_camel(name))
        sub = _unwrap(info.annotation)
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            out |= declared_knobs(sub, path + ".")
            continue
        role = next((m for m in info.metadata if isinstance(m, KnobRole)), None)
        if role is None:
            continue
        kind, choices = _type_of(info.annotation)
        bounds = {k: getattr(m, k) for m in info.metadata for k in ("ge", "le") if hasattr(m, k)}
        default = info.get_default(call_default_factory=True)
        out[path] = DeclaredKnob(
            path, kind, default, bounds.get("ge"), bounds.get("le"), choices, role, info.description or ""
        )
    return out
