"""Trial pods: deterministic names, manifests, and how to read their outcome.

One pod per trial when the configuration fits on one node (gpus <= gpusPerNode); otherwise one pod
per node (ranks 0..n-1) plus a headless Service for rendezvous (MASTER_ADDR = rank 0's DNS name).
Only rank 0 pushes metrics (env RLTUNE_RANK tells the process its rank). For the twin, rank 0
simulates the whole multi-node trial and pods of ranks > 0 run a no-op that exits 0 at once (they
still hold their node's GPUs in the scheduler, which is what placement needs). Names are deterministic (`<job>-<trial>-<rank>`,
DNS-safe, truncated with a hash), so a restarted operator that re-creates a pod gets
409 AlreadyExists instead of a duplicate.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from typing import Any, Optional

from ..api.hardware import gpu as gpu_info
from ..api.models import RLConfig, RLTuningJobSpec, trial_spec_for

LABEL_JOB = "rltune.io/job"
LABEL_TRIAL = "rltune.io/trial"
LABEL_RANK = "rltune.io/rank"
ANNOTATION_GPUS = "rltune.io/gpus"
GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
MASTER_PORT = 29500
DEFAULT_COMMAND = ["python", "-m", "rltune.trial"]


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


def ranks_for(gpus: int, gpus_per_node: int) -> int:
    return max(1, -(-gpus // gpus_per_node))


def uses_gpu_resource(spec: RLTuningJobSpec) -> bool:
    """The reference workload runs on this machine's CPUs: its pods request no GPUs."""
    return spec.workload.framework != "reference" and spec.resources.gpu_type != "CPU"


def seed_for(trial: str) -> int:
    return int(hashlib.sha1(trial.encode()).hexdigest()[:6], 16)


def _deep_merge(base: dict, extra: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        elif isinstance(v, list) and isinstance(out.get(k), list):
            out[k] = out[k] + copy.deepcopy(v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def trial_manifests(
    namespace: str, job: str, owner: Optional[dict], spec: RLTuningJobSpec, trial: str, config: RLConfig,
    steps: int, warmup: int, pushgateway_url: Optional[str],
) -> tuple[list[dict], Optional[dict]]:
    """(pods, headless service or None) of one trial. `owner` is an ownerReference to the job."""
    gpus = config.gpus or spec.resources.gpu_budget
    per_node = spec.resources.gpus_per_node
    n = ranks_for(gpus, per_node)
    tspec = trial_spec_for(namespace, job, trial, spec, config, steps, warmup, seed=seed_for(trial),
                           pushgateway_url=pushgateway_url)
    labels = {LABEL_JOB: job, LABEL_TRIAL: trial, "app.kubernetes.io/name": "rltune-trial",
              "app.kubernetes.io/managed-by": "rltune"}
    owners = [owner] if owner else []
    svc = None
    if n > 1:
        svc = {
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": service_name(job, trial), "namespace": namespace, "labels": dict(labels),
                         "ownerReferences": copy.deepcopy(owners)},
            "spec": {"clusterIP": "None", "selector": {LABEL_JOB: job, LABEL_TRIAL: trial},
                     "ports": [{"name": "rendezvous", "port": MASTER_PORT}], "publishNotReadyAddresses": True},
        }
    node_selector = dict(spec.resources.node_selector or {})
    if uses_gpu_resource(spec):
        node_selector.setdefault(GPU_PRODUCT_LABEL, gpu_info(spec.resources.gpu_type).gfd_product)
    tolerations = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    tolerations += copy.deepcopy(spec.resources.tolerations or [])
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
            {"name": "MASTER_ADDR", "value": (f"{pod_name(job, trial, 0)}.{service_name(job, trial)}"
                                              f".{namespace}.svc" if n > 1 else "127.0.0.1")},
            {"name": "MASTER_PORT", "value": str(MASTER_PORT)},
        ]
        if pushgateway_url:
            env.append({"name": "RLTUNE_PUSHGATEWAY_URL", "value": pushgateway_url})
        container: dict[str, Any] = {
            "name": "trial", "image": wl.image,
            "command": list(wl.command or DEFAULT_COMMAND),
            "env": env,
            "terminationMessagePolicy": "FallbackToLogsOnError",
        }
        if wl.args:
            container["args"] = list(wl.args)
        if rank > 0 and spec.workload.framework == "twin":
            # the twin simulates the whole multi-node trial in rank 0; other ranks only hold their node
            container["command"] = ["python", "-c", "print('rltune twin: rank > 0 idles; rank 0 simulates the trial')"]
            container.pop("args", None)
        if uses_gpu_resource(spec):
            g = str(min(gpus - rank * per_node, per_node))
            container["resources"] = {"requests": {GPU_RESOURCE: g}, "limits": {GPU_RESOURCE: g}}
        pod_spec: dict[str, Any] = {
            "restartPolicy": "Never",
            "containers": [container],
            "tolerations": tolerations,
            "enableServiceLinks": False,
        }
        if node_selector:
            pod_spec["nodeSelector"] = node_selector
        if n > 1:
            pod_spec["hostname"] = name
            pod_spec["subdomain"] = service_name(job, trial)
        if spec.resources.pod_template:
            pod_spec = _deep_merge(pod_spec, spec.resources.pod_template)
        pods.append({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": labels | {LABEL_RANK: str(rank)},
                         "annotations": {ANNOTATION_GPUS: str(gpus)},
                         "ownerReferences": copy.deepcopy(owners)},
            "spec": pod_spec,
        })
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


def failure_reason(pod: dict) -> str:
    """One line on why a pod failed: the container's termination message, reason and exit code."""
    st = pod.get("status") or {}
    for cs in st.get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get("terminated")
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
