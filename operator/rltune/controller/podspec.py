"""The pod spec every trial pod gets, whether rltune (pods.py) or KubeRay (rayjob.py) creates it.

pods.py and rayjob.py build only their own manifests around it; podsecurity.py checks what a
podTemplate may change of it. Keeping it in one place keeps a trial pod and a Ray pod of the same
job on the same nodes with the same restrictions.

Where trial pods land (so they schedule on real GPU clusters, not only on the test bed):
- The GPU type is selected by required node affinity `nvidia.com/gpu.product In [...]` over every
  product string GPU Feature Discovery is known to publish for that type (api/hardware.py), never
  by one guessed string: the string is the driver's SKU name and differs between clouds.
- A node-pool selector (the job's `resources.nodeSelector`, else the chart's `gpuPool.nodeSelector`)
  becomes the pod's nodeSelector. A cloud's node-pool label is authoritative about which nodes
  are the pool; the product affinity is kept on top of it (so a pool of the wrong GPU type is
  reported, not used) unless the job sets `resources.gpuProductAffinity: false` -- for clusters
  whose GPU nodes carry no GFD labels (e.g. a cloud device plugin without the GPU Operator).
- Tolerations: the chart's `gpuPool.tolerations` plus the job's `resources.tolerations`, deduplicated.
- CPU and memory requests come from the chart's `trialDefaults`; with `trialDefaults.guaranteed`
  the limits equal the requests (Guaranteed QoS). GPU limits always equal GPU requests.
- Every pod and container runs with the Pod Security Standards "restricted" settings (non-root
  user, no privilege escalation, all capabilities dropped, seccomp RuntimeDefault), no API token
  and no service links: https://kubernetes.io/docs/concepts/security/pod-security-standards/
  rltune's trial image runs as user 10001 (images/trial/Dockerfile); a framework image (Ray) as its own.
- The job's `resources.podTemplate` (a PodSpec fragment) is merged the way Kubernetes' strategic
  merge patch merges a PodSpec: lists with a patchMergeKey in k8s.io/api core/v1 types.go are
  merged item by item on that key (containers/initContainers/ephemeralContainers/volumes/
  imagePullSecrets/schedulingGates/resourceClaims by name, hostAliases by ip,
  topologySpreadConstraints by topologyKey; in a container env by name, ports by containerPort,
  volumeMounts by mountPath, volumeDevices by devicePath); every other list (command, args,
  tolerations, envFrom, capabilities.drop, ...) is replaced; maps merge key by key and a null
  value deletes the key; volumes use retainKeys (a volume named in the patch keeps only the keys
  the patch gives it). Strategic-merge directives (`$patch`, `$retainKeys`, `$setElementOrder/...`,
  ...) are refused, not honoured: `{name: trial, $patch: delete}` would remove the restricted
  container. After the merge every container, init container and ephemeral container of the pod,
  the template's own included, starts from the restricted container settings (`apply_template`):
  a restricted key the container does not set is filled in; what it sets (a relaxation
  podsecurity.py allowed) stays. podsecurity.py decides what of the template is allowed at all, on
  the template and on the merged pod.
"""

from __future__ import annotations

import copy
import hashlib
import re
from typing import Any, Iterator, Optional

from ..api.hardware import gpu as gpu_info
from ..api.models import RLTuningJobSpec
from ..settings import OperatorSettings

LABEL_JOB = "rltune.io/job"
LABEL_TRIAL = "rltune.io/trial"
LABEL_RANK = "rltune.io/rank"
ANNOTATION_GPUS = "rltune.io/gpus"
GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
TRIAL_UID = 10001  # the `rltune` user of images/trial/Dockerfile
TEMPLATE_FIELD = "spec.resources.podTemplate"
CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")  # a PodSpec's container lists

RESTRICTED_CONTAINER_SECURITY: dict[str, Any] = {
    "runAsNonRoot": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}

DIRECTIVE_REFUSED = (
    "strategic-merge patch directives are not allowed in a podTemplate (they could delete the operator's "
    "restricted settings or its trial container); remove it and give the fields to merge instead"
)


class PodTemplateError(ValueError):
    """A podTemplate that cannot be merged (the message names the field)."""


def dns_name(*parts: str, limit: int = 63) -> str:
    """A DNS-1123 label from parts; over the limit it is truncated and suffixed with a stable hash."""
    raw = "-".join(parts).lower()
    name = re.sub(r"[^a-z0-9-]+", "-", raw).strip("-")
    if len(name) > limit or name != raw:
        h = hashlib.sha1(raw.encode()).hexdigest()[:8]
        name = name[: limit - 9].rstrip("-") + "-" + h
    return name


def uses_gpu_resource(spec: RLTuningJobSpec) -> bool:
    """The reference workload runs on this machine's CPUs: its pods request no GPUs."""
    return spec.workload.framework != "reference" and spec.resources.gpu_type != "CPU"


# --------------------------------------------------------------------------- metadata


def trial_selector(job: str, trial: str) -> dict[str, str]:
    """The labels that pick out one trial's objects: its headless Service and NetworkPolicy select on them."""
    return {LABEL_JOB: job, LABEL_TRIAL: trial}


def trial_labels(job: str, trial: str) -> dict[str, str]:
    """The labels of everything a trial creates (pods add their rank): the operator watches by them."""
    return trial_selector(job, trial) | {
        "app.kubernetes.io/name": "rltune-trial",
        "app.kubernetes.io/managed-by": "rltune",
    }


def trial_annotations(gpus: int) -> dict[str, str]:
    """The trial's total GPU count, on its pods and RayJob (each pod holds only its node's share)."""
    return {ANNOTATION_GPUS: str(gpus)}


# --------------------------------------------------------------------------- scheduling


def product_affinity(gpu_type: str) -> dict:
    """Required node affinity: nvidia.com/gpu.product is one of the GPU type's known strings."""
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {
                                "key": GPU_PRODUCT_LABEL,
                                "operator": "In",
                                "values": list(gpu_info(gpu_type).gfd_products),
                            }
                        ]
                    }
                ]
            }
        }
    }


def pool_selector(spec: RLTuningJobSpec, settings: OperatorSettings) -> dict[str, str]:
    """The job's node-pool selector, else the chart's (both empty: the product affinity decides)."""
    return dict(spec.resources.node_selector or settings.gpu_pool.node_selector or {})


def tolerations_for(spec: RLTuningJobSpec, settings: OperatorSettings) -> list[dict]:
    """The chart's gpuPool tolerations, then the job's, each once (a job may repeat the pool's)."""
    out: list[dict] = []
    for t in list(settings.gpu_pool.tolerations) + list(spec.resources.tolerations or []):
        if t not in out:
            out.append(copy.deepcopy(t))
    return out


def container_resources(spec: RLTuningJobSpec, settings: OperatorSettings, gpus: int) -> dict:
    """Requests from the chart's trialDefaults (limits too when guaranteed) plus `gpus`, limit = request."""
    d = settings.trial_defaults
    requests: dict[str, str] = {"cpu": str(d.cpu), "memory": str(d.memory)}
    limits: dict[str, str] = dict(requests) if d.guaranteed else {}
    if uses_gpu_resource(spec):
        requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = str(gpus)
    out: dict[str, dict] = {"requests": requests}
    if limits:
        out["limits"] = limits
    return out


# --------------------------------------------------------------------------- the pod spec


def workload_env(spec: RLTuningJobSpec) -> list[dict]:
    """The job's `workload.env`, as a container's env (each builder appends its own after it)."""
    return [{"name": e.name, "value": e.value} for e in (spec.workload.env or [])]


def pod_security(uid: Optional[int]) -> dict[str, Any]:
    """The restricted pod securityContext. `uid`: the image's user (TRIAL_UID for rltune's trial image),
    or None where the image runs as its own non-root user (Ray images: uid 1000)."""
    ids = {"runAsUser": uid, "runAsGroup": uid, "fsGroup": uid} if uid is not None else {}
    return {"runAsNonRoot": True, **ids, "seccompProfile": {"type": "RuntimeDefault"}}


def base_pod_spec(
    spec: RLTuningJobSpec, settings: OperatorSettings, container: dict, uid: Optional[int], **fields: Any
) -> dict[str, Any]:
    """The PodSpec of a trial pod before the job's podTemplate (`apply_template`), the same for both builders:
    `container` with the pool's tolerations, selector and product affinity, no API token (trials never
    call the API server), no service links, the restricted pod security; `fields`: the builder's own."""
    pod: dict[str, Any] = {
        "containers": [container],
        "tolerations": tolerations_for(spec, settings),
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "securityContext": pod_security(uid),
        **fields,
    }
    selector = pool_selector(spec, settings)
    if selector:
        pod["nodeSelector"] = selector
    if uses_gpu_resource(spec) and spec.resources.gpu_product_affinity:
        pod["affinity"] = product_affinity(spec.resources.gpu_type)
    return pod


# --------------------------------------------------------------------------- strategic merge

# patchMergeKey / patchStrategy of k8s.io/api core/v1 types.go (PodSpec and Container).
_CONTAINER_LISTS: dict[str, tuple[str, bool, Optional[dict]]] = {
    "env": ("name", False, None),
    "ports": ("containerPort", False, None),
    "volumeMounts": ("mountPath", False, None),
    "volumeDevices": ("devicePath", False, None),
}
POD_MERGE_KEYS: dict[str, tuple[str, bool, Optional[dict]]] = {
    "containers": ("name", False, _CONTAINER_LISTS),
    "initContainers": ("name", False, _CONTAINER_LISTS),
    "ephemeralContainers": ("name", False, _CONTAINER_LISTS),
    "volumes": ("name", True, None),  # patchStrategy "merge,retainKeys"
    "imagePullSecrets": ("name", False, None),
    "hostAliases": ("ip", False, None),
    "topologySpreadConstraints": ("topologyKey", False, None),
    "schedulingGates": ("name", False, None),
    "resourceClaims": ("name", True, None),
}


def _merge_map(base: dict, patch: dict, lists: dict, path: str) -> dict:
    if not isinstance(patch, dict):
        raise PodTemplateError(f"{path}: must be a mapping (got {type(patch).__name__})")
    out = copy.deepcopy(base)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        elif k in lists and isinstance(v, list):
            key, retain, sub = lists[k]
            out[k] = _merge_list(out.get(k) or [], v, key, retain, sub or {}, f"{path}.{k}")
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge_map(out[k], v, {}, f"{path}.{k}")
        else:
            out[k] = copy.deepcopy(v)
    return out


def _merge_list(base: list, patch: list, key: str, retain: bool, sub: dict, path: str) -> list:
    out = copy.deepcopy(base)
    for i, item in enumerate(patch):
        where = f"{path}[{i}]"
        if not isinstance(item, dict) or key not in item:
            raise PodTemplateError(f"{where}.{key}: required (Kubernetes merges {path.rsplit('.', 1)[-1]} by {key})")
        at = next((j for j, x in enumerate(out) if isinstance(x, dict) and x.get(key) == item[key]), None)
        if at is None:
            out.append(_merge_map({}, item, sub, where))
        else:
            merged = _merge_map(out[at], item, sub, where)
            if retain:
                merged = {k: v for k, v in merged.items() if k in item}
            out[at] = merged
    return out


def directive_paths(node: Any, path: str) -> Iterator[str]:
    """The path of every strategic-merge directive ($patch, $retainKeys, $setElementOrder/...) in a
    template, in document order (a directive's own value is not searched)."""
    if isinstance(node, dict):
        for k, v in node.items():
            if isinstance(k, str) and k.startswith("$"):
                yield f"{path}.{k}"
            else:
                yield from directive_paths(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from directive_paths(v, f"{path}[{i}]")


def merge_pod_spec(base: dict, template: dict, path: str = TEMPLATE_FIELD) -> dict:
    """`template` applied to the PodSpec `base` as a strategic merge patch (see module docstring);
    a strategic-merge directive anywhere in it is a PodTemplateError."""
    first = next(directive_paths(template, path), None)
    if first is not None:
        raise PodTemplateError(f"{first}: {DIRECTIVE_REFUSED}")
    return _merge_map(base, template, POD_MERGE_KEYS, path)


def restrict_containers(pod_spec: dict) -> dict:
    """Every container, init container and ephemeral container of the PodSpec starts from
    RESTRICTED_CONTAINER_SECURITY: each restricted key a container does not set (or sets to null) is
    filled in, and `capabilities.drop` defaults to ALL; a value it sets stays. In place; returns it."""
    for lst in CONTAINER_LISTS:
        for c in pod_spec.get(lst) or []:
            if not isinstance(c, dict):
                continue
            sc = c.get("securityContext")
            sc = sc if isinstance(sc, dict) else {}
            for k, v in RESTRICTED_CONTAINER_SECURITY.items():
                if sc.get(k) is None:
                    sc[k] = copy.deepcopy(v)
            if isinstance(sc["capabilities"], dict) and sc["capabilities"].get("drop") is None:
                sc["capabilities"]["drop"] = ["ALL"]
            c["securityContext"] = sc
    return pod_spec


def apply_template(pod_spec: dict, template: Optional[dict], path: str = TEMPLATE_FIELD) -> dict:
    """The PodSpec a trial pod gets (pods.py and rayjob.py): the job's podTemplate strategic-merged into
    the operator's `pod_spec`, then every container restricted (`restrict_containers`)."""
    return restrict_containers(merge_pod_spec(pod_spec, template, path) if template else pod_spec)
