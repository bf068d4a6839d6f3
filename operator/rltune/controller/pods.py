"""Trial pods: deterministic names, manifests, and how to read their outcome.

One pod per trial when the configuration fits on one node (gpus <= gpusPerNode); otherwise one pod
per node (ranks 0..n-1) plus a headless Service for rendezvous (MASTER_ADDR = rank 0's DNS name).
Only rank 0 pushes metrics (env RLTUNE_RANK tells the process its rank). For the twin, rank 0
simulates the whole multi-node trial and pods of ranks > 0 run a no-op that exits 0 at once (they
still hold their node's GPUs in the scheduler, which is what placement needs). Names are
deterministic (`<job>-<trial>-<rank>`,
DNS-safe, truncated with a hash), so a restarted operator that re-creates a pod gets
409 AlreadyExists instead of a duplicate.

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
- With a Kueue queue (`resources.queueName` or the chart's `kueue.defaultQueue`) the trial's pods
  are one Kueue pod group named `<job>-<trial>` (controller/kueue.py), admitted all-or-nothing.
- Every pod and container runs with the Pod Security Standards "restricted" settings (non-root
  user 10001 as in images/trial/Dockerfile, no privilege escalation, all capabilities dropped,
  seccomp RuntimeDefault): https://kubernetes.io/docs/concepts/security/pod-security-standards/
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
import json
import re
from typing import Any, Iterator, Optional

from ..api.hardware import gpu as gpu_info
from ..api.metrics import KEY_ENV
from ..api.models import RLConfig, RLTuningJobSpec, trial_spec_for
from ..settings import OperatorSettings
from ..settings import current as current_settings
from . import kueue

LABEL_JOB = "rltune.io/job"
LABEL_TRIAL = "rltune.io/trial"
LABEL_RANK = "rltune.io/rank"
ANNOTATION_GPUS = "rltune.io/gpus"
GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
MASTER_PORT = 29500
DEFAULT_COMMAND = ["python", "-m", "rltune.trial"]
TRIAL_UID = 10001  # the `rltune` user of images/trial/Dockerfile
TEMPLATE_FIELD = "spec.resources.podTemplate"
CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")  # a PodSpec's container lists

RESTRICTED_POD_SECURITY: dict[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": TRIAL_UID,
    "runAsGroup": TRIAL_UID,
    "fsGroup": TRIAL_UID,
    "seccompProfile": {"type": "RuntimeDefault"},
}
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


def pod_name(job: str, trial: str, rank: int) -> str:
    return dns_name(job, trial, str(rank))


def service_name(job: str, trial: str) -> str:
    return dns_name(job, trial)


def uses_gpu_resource(spec: RLTuningJobSpec) -> bool:
    """The reference workload runs on this machine's CPUs: its pods request no GPUs."""
    return spec.workload.framework != "reference" and spec.resources.gpu_type != "CPU"


def seed_for(trial: str) -> int:
    return int(hashlib.sha1(trial.encode()).hexdigest()[:6], 16)


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
    out: list[dict] = []
    for t in list(settings.gpu_pool.tolerations) + list(spec.resources.tolerations or []):
        if t not in out:
            out.append(copy.deepcopy(t))
    return out


def container_resources(spec: RLTuningJobSpec, settings: OperatorSettings, gpus: int) -> dict:
    d = settings.trial_defaults
    requests: dict[str, str] = {"cpu": str(d.cpu), "memory": str(d.memory)}
    limits: dict[str, str] = dict(requests) if d.guaranteed else {}
    if uses_gpu_resource(spec):
        requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = str(gpus)
    out: dict[str, dict] = {"requests": requests}
    if limits:
        out["limits"] = limits
    return out


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


# --------------------------------------------------------------------------- manifests


def trial_manifests(
    namespace: str,
    job: str,
    owner: Optional[dict],
    spec: RLTuningJobSpec,
    trial: str,
    config: RLConfig,
    steps: int,
    warmup: int,
    pushgateway_url: Optional[str],
    settings: Optional[OperatorSettings] = None,
    metrics_key: str = "",
) -> tuple[list[dict], Optional[dict]]:
    """(pods, headless service or None) of one trial. `owner` is an ownerReference to the job;
    `metrics_key`: the trial's signing key (env RLTUNE_METRICS_KEY, api/metrics.py 'Signed')."""
    settings = settings or current_settings()
    lay = spec.layout(config)
    gpus, n, per_node = lay.gpus, lay.nodes, spec.resources.gpus_per_node
    tspec = trial_spec_for(
        namespace, job, trial, spec, config, steps, warmup, seed=seed_for(trial), pushgateway_url=pushgateway_url
    )
    labels = {
        LABEL_JOB: job,
        LABEL_TRIAL: trial,
        "app.kubernetes.io/name": "rltune-trial",
        "app.kubernetes.io/managed-by": "rltune",
    }
    owners = [owner] if owner else []
    svc = None
    if n > 1:
        svc = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": service_name(job, trial),
                "namespace": namespace,
                "labels": dict(labels),
                "ownerReferences": copy.deepcopy(owners),
            },
            "spec": {
                "clusterIP": "None",
                "selector": {LABEL_JOB: job, LABEL_TRIAL: trial},
                "ports": [{"name": "rendezvous", "port": MASTER_PORT}],
                "publishNotReadyAddresses": True,
            },
        }
    node_selector = pool_selector(spec, settings)
    affinity = (
        product_affinity(spec.resources.gpu_type)
        if uses_gpu_resource(spec) and spec.resources.gpu_product_affinity
        else None
    )
    tolerations = tolerations_for(spec, settings)
    wl = spec.workload
    pods = []
    for rank in range(n):
        name = pod_name(job, trial, rank)
        env = [{"name": e.name, "value": e.value} for e in (wl.env or [])]
        env += [
            {"name": "RLTUNE_TRIAL_SPEC", "value": json.dumps(tspec.dump(), separators=(",", ":"))},
            {"name": "RLTUNE_RANK", "value": str(rank)},
            {"name": "RLTUNE_JOB", "value": job},
            {"name": "RLTUNE_TRIAL", "value": trial},
            {"name": "RANK", "value": str(rank)},
            {"name": "NODE_RANK", "value": str(rank)},
            {"name": "WORLD_SIZE", "value": str(n)},
            {
                "name": "MASTER_ADDR",
                "value": (
                    f"{pod_name(job, trial, 0)}.{service_name(job, trial)}.{namespace}.svc" if n > 1 else "127.0.0.1"
                ),
            },
            {"name": "MASTER_PORT", "value": str(MASTER_PORT)},
        ]
        if pushgateway_url:
            env.append({"name": "RLTUNE_PUSHGATEWAY_URL", "value": pushgateway_url})
        if metrics_key:
            env.append({"name": KEY_ENV, "value": metrics_key})
        container: dict[str, Any] = {
            "name": "trial",
            "image": wl.image,
            "command": list(wl.command or DEFAULT_COMMAND),
            "env": env,
            "terminationMessagePolicy": "FallbackToLogsOnError",
            "resources": container_resources(spec, settings, min(gpus - rank * per_node, per_node)),
            "securityContext": copy.deepcopy(RESTRICTED_CONTAINER_SECURITY),
        }
        if wl.args:
            container["args"] = list(wl.args)
        if rank > 0 and spec.workload.framework == "twin":
            # the twin simulates the whole multi-node trial in rank 0; other ranks only hold their node
            container["command"] = ["python", "-c", "print('rltune twin: rank > 0 idles; rank 0 simulates the trial')"]
            container.pop("args", None)
        pod_spec: dict[str, Any] = {
            "restartPolicy": "Never",
            "containers": [container],
            "tolerations": copy.deepcopy(tolerations),
            "enableServiceLinks": False,
            "automountServiceAccountToken": False,  # trials never call the API server
            "securityContext": copy.deepcopy(RESTRICTED_POD_SECURITY),
        }
        if node_selector:
            pod_spec["nodeSelector"] = dict(node_selector)
        if affinity:
            pod_spec["affinity"] = copy.deepcopy(affinity)
        if n > 1:
            pod_spec["hostname"] = name
            pod_spec["subdomain"] = service_name(job, trial)
        pod_spec = apply_template(pod_spec, spec.resources.pod_template)
        pods.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "labels": labels | {LABEL_RANK: str(rank)},
                    "annotations": {ANNOTATION_GPUS: str(gpus)},
                    "ownerReferences": copy.deepcopy(owners),
                },
                "spec": pod_spec,
            }
        )
    queue = kueue.queue_for(spec, settings)
    if queue:  # one Kueue workload: the trial's pods are admitted all-or-nothing (controller/kueue.py)
        kueue.pod_group(pods, queue, service_name(job, trial), spec.resources.priority_class_name)
    return pods, svc


# --------------------------------------------------------------------------- reading pod outcome


def is_scheduled(pod: dict) -> bool:
    if (pod.get("spec") or {}).get("nodeName"):
        return True
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "True":
            return True
    return False


def pod_phase(pod: dict) -> str:
    return (pod.get("status") or {}).get("phase") or "Pending"


def _terminated(pod: dict) -> Optional[dict]:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get("terminated")
        if term:
            return term
    return None


def exit_code(pod: dict) -> Optional[int]:
    """The exit code of the pod's terminated container (137: killed for memory), if any."""
    term = _terminated(pod)
    return None if term is None else term.get("exitCode")


def failure_reason(pod: dict) -> str:
    """One line on why a pod failed: the container's termination message, reason and exit code."""
    st = pod.get("status") or {}
    term = _terminated(pod)
    if term:
        code = term.get("exitCode")
        msg = (term.get("message") or "").strip().splitlines()
        msg = msg[-1] if msg else ""
        reason = term.get("reason") or ""
        if code == 137 and not reason:
            reason = "OOMKilled"
        parts = [p for p in (reason, f"exit code {code}" if code is not None else "", msg) if p]
        return ": ".join(parts)[:300]
    return (st.get("message") or st.get("reason") or "pod failed")[:300]


def unschedulable_message(pod: dict) -> str:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return (c.get("message") or c.get("reason") or "")[:200]
    return ""
