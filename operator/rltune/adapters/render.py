"""Render a winning configuration of rltune's own workloads (twin, reference) as `path=value`.

verl and OpenRLHF winners are rendered by their adapters (`registry.framework_command`): the full
command, with the mode's entry point and the framework's own keys.
"""

from __future__ import annotations

import json
from typing import Any


def _v(v: Any) -> str:
    if v is None:  # the knob is unset in the winner (its default: e.g. trainer.etp = the dense TP)
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (dict, list)):
        return json.dumps(v, separators=(",", ":"))
    return str(v)


def render_overrides(framework: str, changes: dict[str, Any]) -> list[str]:
    """The changed canonical knobs as sorted `path=value` strings, values as the job's YAML writes
    them (`null` unsets a knob): what to change in `spec.baseline` to run the winner."""
    return [f"{k}={_v(changes[k])}" for k in sorted(changes)]
