"""Generate the RLTuningJob CRD from the pydantic models (`python -m rltune.api.crdgen`, `make crd`).

pydantic's JSON schema is turned into a *structural* OpenAPI v3 schema, as the API server needs it:
$refs inlined, `anyOf: [X, null]` collapsed to `X` with `nullable: true`, `const` -> one-value enum,
JSON-Schema-2020 exclusive bounds -> OpenAPI 3.0 booleans, titles dropped, free-form maps and
`Any` values marked `x-kubernetes-preserve-unknown-fields` (only: workload.scenario,
resources.podTemplate, resources.tolerations items, searchSpace.knobs values, trial configs).
Cross-field rules the schema cannot express are CEL `x-kubernetes-validations` (CRD-only metadata,
kept here next to the generator; the same rules are enforced in pydantic / the operator).

The checked-in crds/rltuningjobs.yaml must equal this module's output (tests/unit/test_crd.py).
"""

from __future__ import annotations

import copy
import sys
from typing import Any

import yaml

from .models import RLTuningJobSpec, knob_paths
from .presets import PRESETS
from .status import RLTuningJobStatus

GROUP = "rltune.io"
VERSION = "v1alpha1"
KIND = "RLTuningJob"
PLURAL = "rltuningjobs"
SINGULAR = "rltuningjob"
SHORT_NAMES = ["rltj"]
CATEGORIES = ["rltune"]

_DROP = {"title", "additionalProperties", "$defs", "default", "anyOf", "const", "$ref",
         "exclusiveMinimum", "exclusiveMaximum"}


class SchemaError(ValueError):
    pass


def _resolve(node: dict, defs: dict) -> dict:
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].split("/")[-1]])
        extra = {k: v for k, v in node.items() if k != "$ref"}
        target.update(extra)  # the field's own description wins over the class docstring
        return target
    if "allOf" in node and len(node["allOf"]) == 1:
        target = _resolve(node["allOf"][0], defs)
        target.update({k: v for k, v in node.items() if k != "allOf"})
        return target
    return node


def _convert(node: dict, defs: dict, path: str) -> dict:
    """pydantic JSON schema node -> structural OpenAPI v3 node."""
    node = _resolve(dict(node), defs)
    out: dict[str, Any] = {}
    nullable = False
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        nullable = len(options) < len(node["anyOf"])
        if len(options) != 1:
            raise SchemaError(f"{path}: unions other than Optional[X] are not structural")
        inner = _resolve(dict(options[0]), defs)
        merged = {**inner, **{k: v for k, v in node.items() if k not in ("anyOf",)}}
        node = merged
    if "description" in node:
        out["description"] = " ".join(str(node["description"]).split())
    if "const" in node:
        out["type"] = "string" if isinstance(node["const"], str) else "integer"
        out["enum"] = [node["const"]]
    t = node.get("type")
    if t == "object" or "properties" in node:
        out["type"] = "object"
        props = node.get("properties") or {}
        if props:
            out["properties"] = {k: _convert(v, defs, f"{path}.{k}") for k, v in props.items()}
            if node.get("required"):
                out["required"] = list(node["required"])
        addl = node.get("additionalProperties")
        if not props:
            if isinstance(addl, dict) and addl:
                out["additionalProperties"] = _convert(addl, defs, f"{path}.*")
            else:  # dict[str, Any]: a free-form object
                out["x-kubernetes-preserve-unknown-fields"] = True
    elif t == "array":
        out["type"] = "array"
        items = node.get("items") or {}
        out["items"] = _convert(items, defs, f"{path}[]") if items else {"x-kubernetes-preserve-unknown-fields": True}
    elif t in ("string", "integer", "number", "boolean"):
        out["type"] = t
    elif t is None and "enum" not in node and "const" not in node:
        # Any: a free-form value (number, string, bool, list or map)
        out["x-kubernetes-preserve-unknown-fields"] = True
    if "enum" in node:
        out["enum"] = list(node["enum"])
        out.setdefault("type", "string" if all(isinstance(e, str) for e in node["enum"]) else "integer")
    for k in ("minimum", "maximum", "minLength", "maxLength", "minItems", "maxItems", "pattern", "format"):
        if k in node:
            out[k] = node[k]
    if "exclusiveMinimum" in node:
        out["minimum"] = node["exclusiveMinimum"]
        out["exclusiveMinimum"] = True
    if "exclusiveMaximum" in node:
        out["maximum"] = node["exclusiveMaximum"]
        out["exclusiveMaximum"] = True
    if "default" in node and node["default"] is not None and node["default"] != {} and out.get("type") != "object":
        out["default"] = node["default"]
    if nullable:
        out["nullable"] = True
    _teach(out)
    return out


def _teach(out: dict) -> None:
    """Append default, bounds and allowed values to a scalar's description, so `kubectl explain`
    (which prints descriptions only) shows them too."""
    if out.get("type") not in ("string", "integer", "number", "boolean") or "description" not in out:
        return
    extra = []
    if "enum" in out and len(out["enum"]) > 1:
        extra.append("One of: " + ", ".join(str(e) for e in out["enum"]) + ".")
    lo, hi = out.get("minimum"), out.get("maximum")
    if lo is not None or hi is not None:
        lo_s = "" if lo is None else (f"> {lo}" if out.get("exclusiveMinimum") else f">= {lo}")
        hi_s = "" if hi is None else (f"< {hi}" if out.get("exclusiveMaximum") else f"<= {hi}")
        extra.append("Range: " + ", ".join(x for x in (lo_s, hi_s) if x) + ".")
    if "default" in out:
        d = out["default"]
        extra.append(f"Default: {str(d).lower() if isinstance(d, bool) else d}.")
    if extra:
        out["description"] = out["description"].rstrip() + " " + " ".join(extra)


def _walk(schema: dict, path: str = ""):
    yield path, schema
    for k, v in (schema.get("properties") or {}).items():
        yield from _walk(v, f"{path}.{k}")
    if isinstance(schema.get("items"), dict):
        yield from _walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _walk(schema["additionalProperties"], f"{path}.*")


def _at(schema: dict, dotted: str) -> dict:
    node = schema
    for part in dotted.split("."):
        node = node["properties"][part]
    return node


def _rule(rule: str, message: str, field_path: str | None = None, reason: str | None = None) -> dict:
    r = {"rule": rule, "message": message}
    if field_path:
        r["fieldPath"] = field_path
    if reason:
        r["reason"] = reason
    return r


def spec_schema() -> dict:
    raw = RLTuningJobSpec.model_json_schema(by_alias=True, mode="validation")
    s = _convert(raw, raw.get("$defs", {}), "spec")
    s["description"] = "What to tune: the RL workload, the GPU budget, the baseline and the search's limits."
    # CRD-only metadata: enum of presets (the pydantic model checks the same in a validator).
    _at(s, "workload.model.preset")["enum"] = sorted(PRESETS)
    model = _at(s, "workload.model")
    model["x-kubernetes-validations"] = [
        _rule("has(self.preset) || (has(self.layers) && has(self.hidden) && has(self.heads) && has(self.vocab))",
              "workload.model needs a preset or the architecture fields layers, hidden, heads and vocab"),
        _rule("self == oldSelf", "workload.model is immutable: create a new RLTuningJob to tune another model"),
    ]
    _at(s, "workload.task")["x-kubernetes-validations"] = [
        _rule("self == oldSelf", "workload.task is immutable: the tuner never changes the experiment"),
    ]
    _at(s, "resources.gpuType")["x-kubernetes-validations"] = [
        _rule("self == oldSelf", "resources.gpuType is immutable"),
    ]
    # Knob paths: an enum on frozen's items. The knobs map's values are free-form (numbers, strings,
    # booleans), which CEL cannot type, so its keys are checked by pydantic and the operator
    # (an InvalidSpec condition naming the unknown knob).
    frozen = _at(s, "searchSpace.frozen")
    frozen["items"]["enum"] = knob_paths()
    frozen["maxItems"] = len(knob_paths())
    d = RLTuningJobSpec.model_fields["budget"].default_factory()  # type: ignore[misc]
    _at(s, "budget")["x-kubernetes-validations"] = [
        _rule(f"(has(self.warmupSteps) ? self.warmupSteps : {d.warmup_steps}) < "
              f"(has(self.stepsPerTrial) ? self.stepsPerTrial : {d.steps_per_trial})",
              "budget.warmupSteps must be fewer than budget.stepsPerTrial", ".warmupSteps"),
        _rule(f"(has(self.parallelTrials) ? self.parallelTrials : {d.parallel_trials}) <= "
              f"(has(self.maxTrials) ? self.maxTrials : {d.max_trials})",
              "budget.parallelTrials must not exceed budget.maxTrials", ".parallelTrials"),
    ]
    s["x-kubernetes-validations"] = [
        _rule("!has(self.baseline) || !has(self.baseline.gpus) || self.baseline.gpus <= self.resources.gpuBudget",
              "baseline.gpus must not exceed resources.gpuBudget", ".baseline.gpus"),
        _rule("!has(self.baseline) || !has(self.baseline.trainerGpus) || "
              "!has(self.baseline.placement) || self.baseline.placement != 'disaggregated' || "
              "self.baseline.trainerGpus < (has(self.baseline.gpus) ? self.baseline.gpus : self.resources.gpuBudget)",
              "baseline.trainerGpus must be fewer than baseline.gpus when placement is disaggregated "
              "(the rest of the GPUs serve rollouts)", ".baseline.trainerGpus"),
        _rule("!has(self.searchSpace) || !has(self.searchSpace.minGpus) || "
              "self.searchSpace.minGpus <= self.resources.gpuBudget",
              "searchSpace.minGpus must not exceed resources.gpuBudget", ".searchSpace.minGpus"),
    ]
    return s


def status_schema() -> dict:
    raw = RLTuningJobStatus.model_json_schema(by_alias=True, mode="validation")
    s = _convert(raw, raw.get("$defs", {}), "status")
    s["description"] = "What the operator measured and decided (written by the operator only)."
    cond = s["properties"]["conditions"]
    cond["x-kubernetes-list-type"] = "map"
    cond["x-kubernetes-list-map-keys"] = ["type"]
    return s


def missing_descriptions(schema: dict, root: str) -> list[str]:
    out = []
    for path, node in _walk(schema, root):
        if path.endswith("[]") or path.endswith(".*"):
            continue
        if not node.get("description"):
            out.append(path)
    return out


def crd() -> dict:
    spec, status = spec_schema(), status_schema()
    missing = missing_descriptions(spec, "spec") + missing_descriptions(status, "status")
    if missing:
        raise SchemaError("fields without a description: " + ", ".join(missing))
    columns = [
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase", "description": "Tuning phase."},
        {"name": "Bottleneck", "type": "string", "jsonPath": ".status.baseline.bottleneck",
         "description": "What limits the baseline's step."},
        {"name": "Trials", "type": "string", "jsonPath": ".status.trialsDone",
         "description": "Finished search trials / budget."},
        {"name": "Speedup", "type": "string", "jsonPath": ".status.speedup",
         "description": "Best speed-up over the baseline."},
        {"name": "Best Step", "type": "number", "jsonPath": ".status.best.stepSeconds",
         "description": "Best measured seconds per RL step."},
        {"name": "GPUs", "type": "integer", "jsonPath": ".status.best.gpus",
         "description": "GPUs of the best configuration."},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}", "labels": {"app.kubernetes.io/part-of": "rltune"}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"kind": KIND, "listKind": f"{KIND}List", "plural": PLURAL, "singular": SINGULAR,
                      "shortNames": SHORT_NAMES, "categories": CATEGORIES},
            "versions": [{
                "name": VERSION,
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": columns,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "description": "RLTuningJob tunes the performance knobs of an RL post-training job of an LLM "
                                   "for speed: it profiles the baseline, runs short trials on the GPU pool, "
                                   "scores them from Prometheus and reports the fastest configuration that "
                                   "passes the quality gates.",
                    "required": ["spec"],
                    "properties": {
                        "apiVersion": {"type": "string", "description": "APIVersion of the object (rltune.io/v1alpha1)."},
                        "kind": {"type": "string", "description": "Kind of the object (RLTuningJob)."},
                        "metadata": {"type": "object"},
                        "spec": spec,
                        "status": status,
                    },
                }},
            }],
        },
    }


HEADER = "# Generated by `python -m rltune.api.crdgen` (make crd) from operator/rltune/api/. Do not edit.\n"


def render() -> str:
    return HEADER + yaml.safe_dump(crd(), sort_keys=False, width=120)


def main() -> None:
    sys.stdout.write(render())


if __name__ == "__main__":
    main()
