"""Generate the RLTuningJob CRD from the pydantic models (`python -m rltune.api.crdgen`, `make crd`).

pydantic's JSON schema is turned into a *structural* OpenAPI v3 schema, as the API server needs it:
$refs inlined, `anyOf: [X, null]` collapsed to `X` with `nullable: true`, `const` -> one-value enum,
JSON-Schema-2020 exclusive bounds -> OpenAPI 3.0 booleans, titles dropped, free-form maps and
`Any` values marked `x-kubernetes-preserve-unknown-fields` (only: workload.scenario,
resources.podTemplate, resources.tolerations items, searchSpace.knobs values, trial configs).
Cross-field rules the schema cannot express are CEL `x-kubernetes-validations` (CRD-only metadata,
kept here next to the generator; the same rules are enforced in pydantic / the operator, since a CRD
older than the operator may lack them). Every string, list and map of the spec is bounded
(`unbounded()`), so an oversized spec is refused by the schema and the CEL cost estimates stay small.

Not expressible here, so checked by the operator only (rltune.tuner.validation.check_spec): anything
about searchSpace.knobs values. They are free-form (numbers, strings, booleans), and CEL cannot see
an untyped field at all, so even "every GPU count <= gpuBudget" cannot be written as a rule.

The checked-in crds/rltuningjobs.yaml must equal this module's output (tests/unit/test_crd.py).
"""

from __future__ import annotations

import copy
import sys
from typing import Any

import yaml

from . import models
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

_DROP = {
    "title",
    "additionalProperties",
    "$defs",
    "default",
    "anyOf",
    "const",
    "$ref",
    "exclusiveMinimum",
    "exclusiveMaximum",
}


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
    for k in (
        "minimum",
        "maximum",
        "minLength",
        "maxLength",
        "minItems",
        "maxItems",
        "minProperties",
        "maxProperties",
        "pattern",
        "format",
    ):
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


def _arch(field: str, fallback: str) -> str:
    """CEL (on workload.model): an architecture field as given, else its preset's value (presets define
    every field the rules read, 0 where absent), else `fallback`; so the rules also catch an override
    that contradicts its preset. `preset` is an enum, so the table lookup cannot miss."""
    table = {p: v.get(field, 0) for p, v in sorted(PRESETS.items())}
    lit = "{" + ", ".join(f"'{p}': {v}" for p, v in table.items()) + "}"
    return f"(has(self.{field}) ? self.{field} : has(self.preset) ? {lit}[self.preset] : {fallback})"


def _model_rules() -> list[dict]:
    """The architecture's contradictions (models.architecture_problems says the same in pydantic)."""
    assert all("heads" in v and "kvHeads" in v and "layers" in v for v in PRESETS.values())
    heads = _arch("heads", "1")
    kv = _arch("kvHeads", heads)
    layers, dense = _arch("layers", "1"), _arch("denseLayers", "0")
    experts, active, effn = _arch("experts", "0"), _arch("activeExperts", "0"), _arch("expertFfn", "0")
    return [
        _rule(
            f"{kv} <= {heads} && {heads} % {kv} == 0",
            "spec.workload.model.kvHeads must not exceed spec.workload.model.heads and must divide it "
            "(each KV head serves heads/kvHeads query heads): fix kvHeads or heads",
            ".kvHeads",
        ),
        _rule(
            f"{dense} < {layers} || ({dense} == {layers} && {experts} == 0)",
            "spec.workload.model.denseLayers must be fewer than spec.workload.model.layers "
            "(an MoE model needs at least one MoE layer): lower denseLayers",
            ".denseLayers",
        ),
        _rule(
            f"{active} <= {experts}",
            "spec.workload.model.activeExperts must not exceed spec.workload.model.experts: lower activeExperts "
            "(top-k), or set it to 0 for a dense model",
            ".activeExperts",
        ),
        _rule(
            f"{experts} == 0 || ({active} >= 1 && {effn} >= 1)",
            "an MoE model (spec.workload.model.experts > 0) needs spec.workload.model.activeExperts >= 1 and "
            "spec.workload.model.expertFfn >= 1: give them, or set experts to 0 for a dense model",
            ".experts",
        ),
    ]


def _cel_str(s: str) -> str:
    """A CEL string literal (single-quoted; the patterns here hold no quote)."""
    assert "'" not in s
    return "'" + s.replace("\\", "\\\\") + "'"


def _tolerations(node: dict) -> None:
    """Type the known fields of a toleration (unknown ones stay preserved, and the operator refuses them
    naming the field), so the API server refuses an operator or effect that no pod could carry."""
    item = node["items"]
    item["properties"] = {
        "key": {
            "type": "string",
            "maxLength": models.LABEL_KEY_MAX,
            "description": "Taint key the toleration matches; empty with operator Exists matches all.",
        },
        "operator": {
            "type": "string",
            "enum": list(models.TOLERATION_OPERATORS),
            "description": "Exists or Equal (default Equal).",
        },
        "value": {
            "type": "string",
            "maxLength": models.LABEL_VALUE_MAX,
            "description": "Taint value (empty with operator Exists).",
        },
        "effect": {
            "type": "string",
            "enum": list(models.TOLERATION_EFFECTS) + [""],
            "description": "Taint effect matched; empty matches all.",
        },
        "tolerationSeconds": {"type": "integer", "description": "NoExecute only: how long the pod stays bound."},
    }
    item["x-kubernetes-validations"] = [
        _rule(
            "!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''",
            "spec.resources.tolerations[].value must be empty when operator is Exists",
            ".value",
        ),
        _rule(
            "(has(self.key) && self.key != '') || (has(self.operator) && self.operator == 'Exists')",
            "spec.resources.tolerations[]: an empty key needs operator Exists (it then tolerates every taint)",
            ".operator",
        ),
        _rule(
            "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
            "spec.resources.tolerations[].tolerationSeconds only applies to effect NoExecute",
            ".tolerationSeconds",
        ),
    ]


def unbounded(schema: dict, root: str) -> list[str]:
    """Typed strings without maxLength or enum, lists without maxItems and maps without maxProperties:
    each could carry an arbitrarily large value past the schema (and cost CEL rules an unbounded estimate)."""
    out = []
    for path, node in _walk(schema, root):
        t = node.get("type")
        if t == "string" and "maxLength" not in node and "enum" not in node:
            out.append(path)
        elif t == "array" and "maxItems" not in node:
            out.append(path)
        elif (
            t == "object"
            and ("additionalProperties" in node or node.get("x-kubernetes-preserve-unknown-fields"))
            and "maxProperties" not in node
            and not node.get("properties")
        ):
            out.append(path)
    return out


def spec_schema() -> dict:
    raw = RLTuningJobSpec.model_json_schema(by_alias=True, mode="validation")
    s = _convert(raw, raw.get("$defs", {}), "spec")
    s["description"] = "What to tune: the RL workload, the GPU budget, the baseline and the search's limits."
    # CRD-only metadata: enum of presets (the pydantic model checks the same in a validator).
    _at(s, "workload.model.preset")["enum"] = sorted(PRESETS)
    model = _at(s, "workload.model")
    model["x-kubernetes-validations"] = [
        _rule(
            "has(self.preset) || (has(self.layers) && has(self.hidden) && has(self.heads) && has(self.vocab))",
            "spec.workload.model needs a preset or the architecture fields layers, hidden, heads and vocab: "
            "add a preset "
            "(e.g. qwen3-32b) or the missing fields",
        ),
        _rule("self == oldSelf", "workload.model is immutable: create a new RLTuningJob to tune another model"),
        *_model_rules(),
    ]
    max_resp = models.TaskSpec().max_response_tokens
    _at(s, "workload.task")["x-kubernetes-validations"] = [
        _rule("self == oldSelf", "workload.task is immutable: the tuner never changes the experiment"),
        _rule(
            f"!has(self.meanResponseTokens) || self.meanResponseTokens <= "
            f"(has(self.maxResponseTokens) ? self.maxResponseTokens : {max_resp})",
            "spec.workload.task.meanResponseTokens must not exceed spec.workload.task.maxResponseTokens: lower the "
            "mean or raise the maximum",
            ".meanResponseTokens",
        ),
    ]
    # A percent (80, or 1 for "all") gets the fix in words; the schema's own bound message prints an
    # integer value's bound as an integer ("less than or equal to 0").
    _at(s, "baseline.rollout.gpuMemoryUtilization")["x-kubernetes-validations"] = [
        _rule("self < 1.0", "spec.baseline." + models.FRACTION_MESSAGE),
    ]
    for f in ("prometheusUrl", "pushgatewayUrl"):
        _at(s, f"metrics.{f}")["x-kubernetes-validations"] = [
            _rule(
                f"self.matches({_cel_str(models.URL_PATTERN)})",
                f"spec.metrics.{f} {models.URL_SHAPE}",
            ),
        ]
    _at(s, "metrics.names")["x-kubernetes-validations"] = [
        _rule(
            "self.all(k, k in [" + ", ".join(f"'{c}'" for c in models.METRIC_CONTRACTS) + "])",
            "spec.metrics.names: keys are rltune's contract names: " + ", ".join(models.METRIC_CONTRACTS),
        ),
        _rule(
            f"self.all(k, self[k].matches({_cel_str(models.METRIC_NAME_PATTERN)}))",
            f"spec.metrics.names: a value {models.METRIC_NAME_RULE}",
        ),
    ]
    # Patterns as CEL rules rather than `pattern`: the API server then says what is wrong in words.
    _at(s, "resources.nodeSelector")["x-kubernetes-validations"] = [
        _rule(
            f"self.all(k, k.size() <= {models.LABEL_KEY_MAX} && k.matches({_cel_str(models.LABEL_KEY_PATTERN)}) && "
            f"(!k.contains('/') || k.indexOf('/') <= {models.LABEL_PREFIX_MAX}))",
            "spec.resources.nodeSelector keys must be label keys: [a DNS-subdomain prefix of at most 253 characters "
            "and '/'] then a name of at most 63 alphanumerics, '-', '_' or '.', beginning and ending alphanumeric "
            "(e.g. cloud.google.com/gke-nodepool)",
        ),
        _rule(
            f"self.all(k, self[k].matches({_cel_str(models.LABEL_VALUE_PATTERN)}))",
            "spec.resources.nodeSelector values must be label values: empty, or at most 63 alphanumerics, '-', '_' "
            "or '.', beginning and ending alphanumeric",
        ),
    ]
    _at(s, "workload.env")["items"]["x-kubernetes-validations"] = [
        _rule(
            f"self.name.matches({_cel_str(models.ENV_NAME_PATTERN)})",
            "spec.workload.env[].name must be printable ASCII characters other than '=' (the value goes in value)",
            ".name",
        ),
    ]
    _tolerations(_at(s, "resources.tolerations"))
    _at(s, "resources.gpuType")["x-kubernetes-validations"] = [
        _rule("self == oldSelf", "resources.gpuType is immutable"),
    ]
    # Knob paths: an enum on frozen's items. The knobs map's values are free-form (numbers, strings,
    # booleans), which CEL cannot type, so its keys are checked by pydantic and the operator
    # (an InvalidSpec condition naming the unknown knob).
    frozen = _at(s, "searchSpace.frozen")
    frozen["items"]["enum"] = knob_paths()
    frozen["maxItems"] = len(knob_paths())
    _at(s, "searchSpace.knobs")["maxProperties"] = len(knob_paths())
    d = RLTuningJobSpec.model_fields["budget"].default_factory()  # type: ignore[misc]
    _at(s, "budget")["x-kubernetes-validations"] = [
        _rule(
            f"(has(self.warmupSteps) ? self.warmupSteps : {d.warmup_steps}) < "
            f"(has(self.stepsPerTrial) ? self.stepsPerTrial : {d.steps_per_trial})",
            "spec.budget.warmupSteps must be fewer than spec.budget.stepsPerTrial: lower warmupSteps or raise "
            "stepsPerTrial",
            ".warmupSteps",
        ),
        _rule(
            f"(has(self.parallelTrials) ? self.parallelTrials : {d.parallel_trials}) <= "
            f"(has(self.maxTrials) ? self.maxTrials : {d.max_trials})",
            "spec.budget.parallelTrials must not exceed spec.budget.maxTrials: lower parallelTrials",
            ".parallelTrials",
        ),
        _rule(
            f"(has(self.confirmSteps) ? self.confirmSteps : {d.confirm_steps}) == 0 || "
            f"(has(self.confirmSteps) ? self.confirmSteps : {d.confirm_steps}) > "
            f"(has(self.warmupSteps) ? self.warmupSteps : {d.warmup_steps})",
            "spec.budget.confirmSteps must be 0 or more than spec.budget.warmupSteps: the confirmation run would "
            "measure no steady-state step; raise confirmSteps or set it to 0",
            ".confirmSteps",
        ),
    ]
    # other pools: one entry per name (a map-typed list: the API server refuses duplicates)
    pools = _at(s, "resources.pools")
    pools["x-kubernetes-list-type"] = "map"
    pools["x-kubernetes-list-map-keys"] = ["name"]
    s["x-kubernetes-validations"] = [
        _rule(
            "!has(self.resources.pools) || has(self.resources.pricePerGpuHour)",
            "spec.resources.pricePerGpuHour is required by resources.pools: set the price of one GPU-hour in this pool",
            ".resources.pricePerGpuHour",
        ),
        _rule(
            "!has(self.objective) || self.objective != 'costPerStep' || has(self.resources.pricePerGpuHour)",
            "spec.resources.pricePerGpuHour is required by objective costPerStep: set the price of one GPU-hour in "
            "this pool",
            ".resources.pricePerGpuHour",
        ),
        _rule(
            "!has(self.baseline) || !has(self.baseline.gpus) || self.baseline.gpus <= self.resources.gpuBudget",
            "spec.baseline.gpus must not exceed spec.resources.gpuBudget: raise the budget or lower baseline.gpus",
            ".baseline.gpus",
        ),
        _rule(
            "!has(self.baseline) || !has(self.baseline.trainerGpus) || "
            "!has(self.baseline.placement) || self.baseline.placement != 'disaggregated' || "
            "self.baseline.trainerGpus < (has(self.baseline.gpus) ? self.baseline.gpus : self.resources.gpuBudget)",
            "spec.baseline.trainerGpus must be fewer than spec.baseline.gpus when placement is disaggregated "
            "(the rest of the GPUs serve rollouts): lower trainerGpus",
            ".baseline.trainerGpus",
        ),
        _rule(
            "!has(self.searchSpace) || !has(self.searchSpace.minGpus) || "
            "self.searchSpace.minGpus <= self.resources.gpuBudget",
            "spec.searchSpace.minGpus must not exceed spec.resources.gpuBudget: lower minGpus or raise the budget",
            ".searchSpace.minGpus",
        ),
    ]
    loose = unbounded(s, "spec")
    if loose:
        raise SchemaError("spec fields without maxLength/maxItems/maxProperties: " + ", ".join(loose))
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
        {
            "name": "Bottleneck",
            "type": "string",
            "jsonPath": ".status.baseline.bottleneck",
            "description": "What limits the baseline's step.",
        },
        {
            "name": "Trials",
            "type": "string",
            "jsonPath": ".status.trialsDone",
            "description": "Finished search trials / budget.",
        },
        {
            "name": "Speedup",
            "type": "string",
            "jsonPath": ".status.speedup",
            "description": "Best speed-up over the baseline.",
        },
        {
            "name": "Best Step",
            "type": "number",
            "jsonPath": ".status.best.stepSeconds",
            "description": "Best measured seconds per RL step.",
        },
        {
            "name": "GPUs",
            "type": "integer",
            "jsonPath": ".status.best.gpus",
            "description": "GPUs of the best configuration.",
        },
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}", "labels": {"app.kubernetes.io/part-of": "rltune"}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": SHORT_NAMES,
                "categories": CATEGORIES,
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "RLTuningJob tunes the performance knobs of an RL post-training job "
                            "of an LLM "
                            "for speed: it profiles the baseline, runs short trials on the GPU pool, "
                            "scores them from Prometheus and reports the fastest configuration that "
                            "passes the quality gates.",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {
                                    "type": "string",
                                    "description": "APIVersion of the object (rltune.io/v1alpha1).",
                                },
                                "kind": {"type": "string", "description": "Kind of the object (RLTuningJob)."},
                                "metadata": {"type": "object"},
                                "spec": spec,
                                "status": status,
                            },
                        }
                    },
                }
            ],
        },
    }


HEADER = "# Generated by `python -m rltune.api.crdgen` (make crd) from operator/rltune/api/. Do not edit.\n"


def render() -> str:
    return HEADER + yaml.safe_dump(crd(), sort_keys=False, width=120)


def main() -> None:
    sys.stdout.write(render())


if __name__ == "__main__":
    main()
