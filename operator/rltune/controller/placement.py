"""Checks the reconciler makes before it creates any trial pod (pure; no API calls).

`check_pool` answers "can any node of this cluster ever host this pod?" from the node objects and
the pod's scheduling constraints: nodeSelector, required node affinity, tolerations against the
NoSchedule/NoExecute taints, and allocatable `nvidia.com/gpu` / cpu / memory against the pod's
requests (node capacity, not what is free now: a busy pool only means waiting). Transient state
is ignored: cordoned nodes and the node lifecycle controller's `node.kubernetes.io/*` condition
taints (not-ready, unreachable, pressure) do not make a pool wrong. When no node fits, the message
names what the job asked for (its nodeSelector, the GPU type's product affinity, GPUs per node, its
tolerations) and how many of the cluster's nodes pass each of those checks, so a wrong selector
becomes a condition on the job instead of trials that wait for their timeout. It never names a
label value, taint or size of any node: the condition is read by every tenant who may read the job,
and the cluster's layout is not theirs to read.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any, Optional

from .podspec import GPU_RESOURCE

FIX = (
    "set spec.resources.nodeSelector or the chart's gpuPool.nodeSelector to labels your GPU nodes carry, "
    "spec.resources.gpuType to the GPU they have (or spec.resources.gpuProductAffinity: false where GPU nodes "
    "carry no nvidia.com/gpu.product label), and spec.resources.tolerations or the chart's gpuPool.tolerations "
    "for their taints"
)

_SUFFIX = {
    "": 1,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
_QTY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")


def quantity(v: Any) -> float:
    """A Kubernetes resource quantity ("500m", "8Gi", "2", 4) as a number; unparsable -> 0."""
    m = _QTY.match(str(v).strip())
    if not m:
        return 0.0
    return float(m.group(1)) * _SUFFIX[m.group(2) or ""]


def _labels(node: dict) -> dict[str, str]:
    return (node.get("metadata") or {}).get("labels") or {}


def _allocatable(node: dict) -> dict[str, Any]:
    return (node.get("status") or {}).get("allocatable") or {}


def _match_expression(expr: dict, values_of: dict[str, str]) -> bool:
    key, op, vals = expr.get("key"), expr.get("operator"), [str(v) for v in expr.get("values") or []]
    have = key in values_of
    v = values_of.get(key)
    if op == "In":
        return have and v in vals
    if op == "NotIn":
        return not have or v not in vals
    if op == "Exists":
        return have
    if op == "DoesNotExist":
        return not have
    if op in ("Gt", "Lt") and have and vals:
        try:
            a, b = int(v), int(vals[0])
        except (TypeError, ValueError):
            return False
        return a > b if op == "Gt" else a < b
    return False


def _required_terms(pod_spec: dict) -> list[dict]:
    req = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    return req.get("nodeSelectorTerms") or []


def _affinity_ok(node: dict, terms: list[dict]) -> bool:
    if not terms:
        return True
    labels = _labels(node)
    fields = {"metadata.name": (node.get("metadata") or {}).get("name", "")}
    for term in terms:  # terms are ORed; expressions within a term are ANDed
        exprs, fexprs = term.get("matchExpressions") or [], term.get("matchFields") or []
        if not exprs and not fexprs:
            continue  # an empty term matches no objects
        if all(_match_expression(e, labels) for e in exprs) and all(_match_expression(e, fields) for e in fexprs):
            return True
    return False


def _tolerates(tol: dict, taint: dict) -> bool:
    if tol.get("effect") and tol.get("effect") != taint.get("effect"):
        return False
    if tol.get("operator") == "Exists":
        return not tol.get("key") or tol.get("key") == taint.get("key")
    return tol.get("key") == taint.get("key") and (tol.get("value") or "") == (taint.get("value") or "")


def _untolerated(node: dict, tolerations: list[dict]) -> list[dict]:
    out = []
    for t in (node.get("spec") or {}).get("taints") or []:
        transient = str(t.get("key", "")).startswith("node.kubernetes.io/")
        if t.get("effect") not in ("NoSchedule", "NoExecute") or transient:
            continue
        if not any(_tolerates(tol, t) for tol in tolerations):
            out.append(t)
    return out


def pod_requests(pod_spec: dict) -> dict[str, float]:
    """Effective requests: max(sum over containers, any init container); limits stand in for missing requests."""

    def of(c: dict) -> dict[str, float]:
        r = c.get("resources") or {}
        merged = dict(r.get("limits") or {}) | dict(r.get("requests") or {})
        return {k: quantity(v) for k, v in merged.items()}

    total: Counter = Counter()
    for c in pod_spec.get("containers") or []:
        total.update(of(c))
    out = dict(total)
    for c in pod_spec.get("initContainers") or []:
        for k, v in of(c).items():
            out[k] = max(out.get(k, 0.0), v)
    return out


def _fmt_qty(v: float) -> str:
    return f"{v:g}"


def why_not(node: dict, pod_spec: dict, requests: Optional[dict[str, float]] = None) -> Optional[str]:
    """None when the node can host the pod; else the first reason it cannot."""
    labels = _labels(node)
    sel = pod_spec.get("nodeSelector") or {}
    wrong = [k for k, v in sel.items() if labels.get(k) != str(v)]
    if wrong:
        return "nodeSelector"
    if not _affinity_ok(node, _required_terms(pod_spec)):
        return "affinity"
    if _untolerated(node, pod_spec.get("tolerations") or []):
        return "taint"
    alloc = _allocatable(node)
    for res, want in (requests if requests is not None else pod_requests(pod_spec)).items():
        if want > 0 and quantity(alloc.get(res, 0)) < want:
            return f"resource:{res}"
    return None


def _describe_constraints(pod_spec: dict, requests: dict[str, float]) -> str:
    parts = []
    sel = pod_spec.get("nodeSelector") or {}
    if sel:
        parts.append("nodeSelector {" + ", ".join(f"{k}: {v}" for k, v in sel.items()) + "}")
    for term in _required_terms(pod_spec):
        for e in term.get("matchExpressions") or []:
            vals = e.get("values") or []
            parts.append(
                f"{e.get('key')} {str(e.get('operator')).lower()}" + (f" [{', '.join(map(str, vals))}]" if vals else "")
            )
    if requests.get(GPU_RESOURCE):
        parts.append(f"{_fmt_qty(requests[GPU_RESOURCE])} allocatable {GPU_RESOURCE}")
    return " + ".join(parts) or "no constraints"


def _fmt_toleration(t: dict) -> str:
    if t.get("operator") == "Exists" and not t.get("key"):
        return "every taint" + (f" with effect {t['effect']}" if t.get("effect") else "")
    value = f"={t['value']}" if t.get("operator") != "Exists" and t.get("value") else ""
    return f"{t.get('key')}{value}{':' + t['effect'] if t.get('effect') else ''}"


def _nodes(n: int) -> str:
    return f"{n} node{'s' if n != 1 else ''}"


def check_pool(nodes: list[dict], pod_spec: dict) -> Optional[str]:
    """None when at least one node can host a pod with this spec; else a message for the job's
    condition: the pod's constraints and, for each in the order the scheduler's filters apply them,
    how many nodes are left (counts only: no node's labels, taints or sizes)."""
    requests = pod_requests(pod_spec)
    reasons: Counter = Counter()
    for node in nodes:
        why = why_not(node, pod_spec, requests)
        if why is None:
            return None
        reasons[why] += 1
    what = _describe_constraints(pod_spec, requests)
    if not nodes:
        return f"no node can host trial pods ({what}): the cluster has no nodes"
    left = len(nodes)
    head = f"of the cluster's {_nodes(left)}"
    if requests.get(GPU_RESOURCE):
        with_gpus = sum(1 for n in nodes if quantity(_allocatable(n).get(GPU_RESOURCE, 0)) > 0)
        head += f", {with_gpus} have allocatable {GPU_RESOURCE}"
    funnel = []  # the nodes left after each check, in why_not's order
    sel = pod_spec.get("nodeSelector") or {}
    if sel:
        left -= reasons.get("nodeSelector", 0)
        funnel.append(f"{left} match nodeSelector {{" + ", ".join(f"{k}: {v}" for k, v in sel.items()) + "}")
    if _required_terms(pod_spec) and left:
        left -= reasons.get("affinity", 0)
        funnel.append(f"{left}{' of those' if funnel else ''} match the required node affinity")
    if reasons.get("taint") and left:
        tols = pod_spec.get("tolerations") or []
        left -= reasons["taint"]
        funnel.append(
            f"{left}{' of those' if funnel else ''} carry no NoSchedule/NoExecute taint the pod does not tolerate "
            "(its tolerations: " + (", ".join(_fmt_toleration(t) for t in tols) if tols else "none") + ")"
        )
    for key, n in sorted(reasons.items()):
        if key.startswith("resource:") and left:
            res = key.split(":", 1)[1]
            funnel.append(
                f"{n}{' of those' if funnel else ''} have less allocatable {res} than the pod requests "
                f"({_fmt_qty(requests[res])})"
            )
    msg = f"no node can host trial pods ({what}): {head}" + ("; " + ", ".join(funnel) if funnel else "")
    return (msg + ". Fix: " + FIX)[:1000]


def check_gpus_per_node(nodes: list[dict], pod_spec: dict, gpus_per_node: int) -> Optional[str]:
    """None when some node the pod may land on has `gpus_per_node` allocatable GPUs; else a message
    naming spec.resources.gpusPerNode and what the matching nodes have. The job's layout (how many
    pods a configuration needs, what one node's NVLink domain holds) rests on that number: on nodes
    of another size trials would be placed, and forecast, on a machine the cluster does not have."""
    if not pod_requests(pod_spec).get(GPU_RESOURCE):
        return None
    placeable = [n for n in nodes if why_not(n, pod_spec, {}) is None]
    sizes = Counter(int(quantity(_allocatable(n).get(GPU_RESOURCE, 0))) for n in placeable)
    if not sizes or gpus_per_node in sizes:
        return None
    more = sum(c for g, c in sizes.items() if g > gpus_per_node)
    return (
        f"spec.resources.gpusPerNode: {gpus_per_node} GPUs per node, but none of the {_nodes(len(placeable))} "
        f"trial pods can use has {gpus_per_node} allocatable {GPU_RESOURCE} ({more} with more, "
        f"{len(placeable) - more} with fewer). Fix: set spec.resources.gpusPerNode to the GPU count of the nodes it "
        f"will run on, or select a pool of {gpus_per_node}-GPU nodes with spec.resources.nodeSelector"
    )
