"""What a job must be before anything runs for it: the one admission check that the operator's
reconciler and `rltune plan` (and `rltune tune`) both apply, so that a job the operator refuses is
never ranked by the CLI, and the message a user reads is the same in both.

`parse` is pydantic plus the adapter reading the user's command as the baseline; `problems` is
the spec checked against itself (tuner.validation.check_spec, the twin's scenario). The operator
adds only what depends on the cluster admin's policy (allowed endpoints, pod security), which a
CLI without a cluster cannot know.
"""

from __future__ import annotations

from pydantic import ValidationError

from .api.models import RLTuningJobSpec
from .tuner import records


class Refused(ValueError):
    """A spec rltune will not run; `reason` is the SpecValid condition's reason."""

    def __init__(self, message: str, reason: str = "InvalidSpec"):
        super().__init__(message)
        self.reason = reason


def parse(raw: dict) -> RLTuningJobSpec:
    """pydantic validation plus the cross-field rules the CRD checks with CEL; the message names the field."""
    try:
        spec = RLTuningJobSpec.model_validate(raw or {})
    except ValidationError as e:
        errs = []
        for err in e.errors()[:3]:
            loc = ".".join(str(x) for x in err["loc"])
            msg = err["msg"].removeprefix("Value error, ")
            errs.append(f"spec.{loc}: {msg}" if loc else f"spec: {msg}")
        raise Refused("; ".join(errs)) from None
    from .adapters.registry import resolve

    try:
        spec = resolve(spec)  # a framework job's baseline is the command it runs today
    except ValueError as e:
        raise Refused(str(e), "InvalidCommand") from None
    b = spec.baseline
    if b.placement == "disaggregated" and b.trainer_gpus is not None and b.trainer_gpus >= records.gpus_of(spec, b):
        raise Refused("spec.baseline.trainerGpus must be fewer than baseline.gpus when placement is disaggregated")
    return spec


def problems(spec: RLTuningJobSpec) -> list[str]:
    """The spec against itself: layouts, the model, the search space, a twin scenario's shape."""
    from .tuner.validation import check_spec

    out = [str(p) for p in check_spec(spec)]
    if spec.workload.framework == "twin":
        from .twin.efficiency import check_scenario

        out += check_scenario(spec.workload.scenario)
    return out


def admit(raw: dict) -> RLTuningJobSpec:
    """`parse` then `problems`: the spec, or Refused with the first problems joined."""
    spec = parse(raw)
    found = problems(spec)
    if found:
        raise Refused("; ".join(found[:4]))
    return spec
