"""Trial pods: deterministic names, manifests, and how to read their outcome.

One pod per trial when the configuration fits on one node (gpus <= gpusPerNode); otherwise one pod
per node (ranks 0..n-1) plus a headless Service for rendezvous (MASTER_ADDR = rank 0's DNS name).
Only rank 0 pushes metrics (env RLTUNE_RANK tells the process its rank). For the twin, rank 0
simulates the whole multi-node trial and pods of ranks > 0 run a no-op that exits 0 at once (they
still hold their node's GPUs in the scheduler, which is what placement needs). Names are
deterministic (`<job>-<trial>-<rank>`,
DNS-safe, truncated with a hash), so a restarted operator that re-creates a pod gets
409 AlreadyExists instead of a duplicate.

What every trial pod shares with a Ray pod (rayjob.py) is podspec.py's: where it lands (product
affinity, pool selector, tolerations), its requests, the restricted security context (here as the
trial image's user 10001, images/trial/Dockerfile) and the job's podTemplate merged into it.
With a Kueue queue (`resources.queueName` or the chart's `kueue.defaultQueue`) the trial's pods
are one Kueue pod group named `<job>-<trial>` (controller/kueue.py), admitted all-or-nothing.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any, Optional

from ..api.metrics import KEY_ENV
from ..api.models import RLConfig, RLTuningJobSpec, trial_spec_for
from ..settings import OperatorSettings
from ..settings import current as current_settings
from . import kueue, podspec

MASTER_PORT = 29500
DEFAULT_COMMAND = ["python", "-m", "rltune.trial"]


def pod_name(job: str, trial: str, rank: int) -> str:
    return podspec.dns_name(job, trial, str(rank))


def service_name(job: str, trial: str) -> str:
    return podspec.dns_name(job, trial)


def seed_for(trial: str) -> int:
    return int(hashlib.sha1(trial.encode()).hexdigest()[:6], 16)


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
    labels = podspec.trial_labels(job, trial)
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
                "selector": podspec.trial_selector(job, trial),
                "ports": [{"name": "rendezvous", "port": MASTER_PORT}],
                "publishNotReadyAddresses": True,
            },
        }
    wl = spec.workload
    pods = []
    for rank in range(n):
        name = pod_name(job, trial, rank)
        env = podspec.workload_env(spec) + [
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
            "resources": podspec.container_resources(spec, settings, min(gpus - rank * per_node, per_node)),
            "securityContext": copy.deepcopy(podspec.RESTRICTED_CONTAINER_SECURITY),
        }
        if wl.args:
            container["args"] = list(wl.args)
        if rank > 0 and spec.workload.framework == "twin":
            # the twin simulates the whole multi-node trial in rank 0; other ranks only hold their node
            container["command"] = ["python", "-c", "print('rltune twin: rank > 0 idles; rank 0 simulates the trial')"]
            container.pop("args", None)
        pod_spec = {"restartPolicy": "Never", **podspec.base_pod_spec(spec, settings, container, podspec.TRIAL_UID)}
        if n > 1:
            pod_spec["hostname"] = name
            pod_spec["subdomain"] = service_name(job, trial)
        pod_spec = podspec.apply_template(pod_spec, spec.resources.pod_template)
        pods.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "labels": labels | {podspec.LABEL_RANK: str(rank)},
                    "annotations": podspec.trial_annotations(gpus),
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
