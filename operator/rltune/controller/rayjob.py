"""A verl/OpenRLHF trial as a KubeRay RayJob, the way users run these frameworks on Kubernetes.

One RayJob per trial (`<job>-<trial>`, deterministic: a re-create after a crash is 409, not a
second trial): a RayCluster of one head pod and `nodes - 1` worker pods, each holding one node's
GPUs on the GPU pool (podspec.py's pod spec, as any trial pod's: the same affinity, selector,
tolerations, requests and restricted security context, and the job's podTemplate merged into each by
`podspec.apply_template`, which restricts every container the template adds too), and KubeRay's submitter
(K8sJobMode) running the trial's command as the Ray job's entry point. KubeRay deletes the
RayCluster when the job finishes (`shutdownAfterJobFinishes`); the operator deletes the RayJob when
the trial ends, which removes everything it owns.

The entry point is the framework's own command (its mode's main, the user's overrides with the
configuration's knobs, a bounded number of steps) wrapped by rltune's metrics bridge
(`rltune.adapters.bridge`), which tees the log unchanged and pushes rltune's metrics to the
Pushgateway. The user's image need not contain rltune: an init container of the head pod copies
the bridge (stdlib only) from rltune's trial image into an emptyDir the head mounts at BRIDGE_DIR.

With a Kueue queue the RayJob carries the label kueue.x-k8s.io/queue-name: Kueue keeps it suspended
until the ClusterQueue admits it whole (controller/kueue.py).

Without the KubeRay operator (no ray.io/v1 RayJob kind) rltune does not launch Ray itself: the job
waits with the condition RayAvailable=False (reason KubeRayMissing).
"""

from __future__ import annotations

import copy
import json
import shlex
from typing import Any, Optional

from ..adapters.registry import framework_command
from ..api.hardware import gpu as gpu_lookup
from ..api.metrics import KEY_ENV
from ..api.models import RLConfig, RLTuningJobSpec
from ..settings import OperatorSettings
from ..settings import current as current_settings
from . import kueue, podspec

API_VERSION = "ray.io/v1"
KIND = "RayJob"
GROUP, VERSION, PLURAL = "ray.io", "v1", "rayjobs"
BRIDGE_DIR = "/opt/rltune"
BRIDGE_VOLUME = "rltune-bridge"
WORKER_GROUP = "gpu"
NAME_LIMIT = 40  # KubeRay derives RayCluster, head Service and submitter Job names from it
# Retries of the `ray job submit` pod (KubeRay's default is 2, 10 s + 20 s of Job back-off): where
# the head pod is Ready before its dashboard listens (KubeRay's probe injection off, or no probes
# run), early submitter pods fail to connect; 6 span ~5 min, within a trial's time limit
SUBMITTER_RETRIES = 6


def rayjob_name(job: str, trial: str) -> str:
    return podspec.dns_name(job, trial, limit=NAME_LIMIT)


def entrypoint(
    spec: RLTuningJobSpec, config: RLConfig, namespace: str, job: str, trial: str, steps: int, pushgateway: str
) -> str:
    """The Ray job's entry point: the bridge around the framework's trial command, as one shell line."""
    cmd = framework_command(spec, config, steps)
    assert cmd is not None, "a RayJob trial needs a framework adapter"
    bridge = [
        "python3",
        "-m",
        "rltune.adapters.bridge",
        "--framework",
        spec.workload.framework,
        "--pushgateway",
        pushgateway,
        "--namespace",
        namespace,
        "--job",
        job,
        "--trial",
        trial,
        "--warmup-steps",
        str(spec.budget.warmup_steps),
        "--gpus",
        str(spec.layout(config).gpus),
        "--gpu-memory-gib",  # nominal, if nvidia-smi does not answer: docs/frameworks.md "Mapping: verl"
        f"{gpu_lookup(spec.resources.gpu_type).hbm_bytes / 1e9:g}",
    ]
    if spec.metrics.names:  # the operator reads the job's metric names: the bridge must push them
        bridge += ["--names", json.dumps(spec.metrics.names, separators=(",", ":"), sort_keys=True)]
    bridge.append("--")
    return f'PYTHONPATH={BRIDGE_DIR}"${{PYTHONPATH:+:$PYTHONPATH}}" ' + shlex.join(bridge + cmd.argv)


def _pod_template(
    spec: RLTuningJobSpec,
    settings: OperatorSettings,
    labels: dict[str, str],
    gpus: int,
    annotations: dict[str, str],
    head: bool,
) -> dict:
    wl = spec.workload
    container: dict[str, Any] = {
        "name": "trial",
        "image": wl.image,
        "env": podspec.workload_env(spec),
        "resources": podspec.container_resources(spec, settings, gpus),
        "securityContext": copy.deepcopy(podspec.RESTRICTED_CONTAINER_SECURITY),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    bridge: dict[str, Any] = {}
    if head:
        container["volumeMounts"] = [{"name": BRIDGE_VOLUME, "mountPath": BRIDGE_DIR}]
        bridge["volumes"] = [{"name": BRIDGE_VOLUME, "emptyDir": {}}]
        bridge["initContainers"] = [
            {
                "name": "rltune-bridge",
                "image": settings.bridge_image,
                "command": ["python", "-m", "rltune.adapters.bridge", "--install", BRIDGE_DIR],
                "volumeMounts": [{"name": BRIDGE_VOLUME, "mountPath": BRIDGE_DIR}],
                "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}},
                "securityContext": copy.deepcopy(podspec.RESTRICTED_CONTAINER_SECURITY),
            }
        ]
    # uid None: the framework image's own user (Ray images run as uid 1000)
    pod = podspec.base_pod_spec(spec, settings, container, None, **bridge)
    pod = podspec.apply_template(pod, spec.resources.pod_template)
    return {"metadata": {"labels": dict(labels), "annotations": dict(annotations)}, "spec": pod}


def rayjob_manifest(
    namespace: str,
    job: str,
    owner: Optional[dict],
    spec: RLTuningJobSpec,
    trial: str,
    config: RLConfig,
    steps: int,
    pushgateway: str,
    settings: Optional[OperatorSettings] = None,
    metrics_key: str = "",
) -> dict:
    """The RayJob of one trial. Pods carry the trial's labels (rank 0 = the head), so the operator
    reads them like any trial's pods. `metrics_key` (the trial's signing key) reaches the head's
    environment, which the Ray job's entry point (the bridge) inherits; it is never in the entry point."""
    settings = settings or current_settings()
    lay = spec.layout(config)
    gpus, nodes, per_node = lay.gpus, lay.nodes, spec.resources.gpus_per_node
    labels = podspec.trial_labels(job, trial)
    notes = podspec.trial_annotations(gpus)
    head = _pod_template(spec, settings, labels | {podspec.LABEL_RANK: "0"}, min(gpus, per_node), notes, head=True)
    if metrics_key:
        trial_container = next(c for c in head["spec"]["containers"] if c.get("name") == "trial")
        trial_container.setdefault("env", []).append({"name": KEY_ENV, "value": metrics_key})
    cluster: dict[str, Any] = {
        # 0.0.0.0: KubeRay's submitter pod submits to the dashboard across pods. It has no authentication
        # (Ray's token auth cannot work with KubeRay v1.5.0, controller/netpol.py says why): the trial's
        # NetworkPolicy admits only the trial's own pods, the KubeRay operator and Prometheus
        "headGroupSpec": {"rayStartParams": {"dashboard-host": "0.0.0.0"}, "template": head},
    }
    if nodes > 1:
        worker = _pod_template(spec, settings, labels | {podspec.LABEL_RANK: "worker"}, per_node, notes, head=False)
        cluster["workerGroupSpecs"] = [
            {
                "groupName": WORKER_GROUP,
                "replicas": nodes - 1,
                "minReplicas": nodes - 1,
                "maxReplicas": nodes - 1,
                "rayStartParams": {},
                "template": worker,
            }
        ]
    submitter = {
        "metadata": {"labels": labels | {podspec.LABEL_RANK: "submitter"}},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "securityContext": podspec.pod_security(None),
            "containers": [
                {
                    # no command: KubeRay fills in `ray job submit ... -- <entrypoint>` (K8sJobMode)
                    "name": "ray-job-submitter",
                    "image": spec.workload.image,
                    "resources": {"requests": {"cpu": "200m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
                    "securityContext": copy.deepcopy(podspec.RESTRICTED_CONTAINER_SECURITY),
                }
            ],
        },
    }
    manifest = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": rayjob_name(job, trial),
            "namespace": namespace,
            "labels": dict(labels),
            "annotations": dict(notes),
            "ownerReferences": [copy.deepcopy(owner)] if owner else [],
        },
        "spec": {
            "entrypoint": entrypoint(spec, config, namespace, job, trial, steps, pushgateway),
            "submissionMode": "K8sJobMode",
            "shutdownAfterJobFinishes": True,
            "activeDeadlineSeconds": spec.budget.trial_timeout_seconds,
            "backoffLimit": 0,
            "rayClusterSpec": cluster,
            # KubeRay's submitter retries are safe (it checks the submission id first); more than its
            # default 2 where the head reports Ready before its dashboard listens (no probes injected)
            "submitterConfig": {"backoffLimit": SUBMITTER_RETRIES},
            "submitterPodTemplate": submitter,
        },
    }
    queue = kueue.queue_for(spec, settings)
    if queue:  # Kueue's ray.io/rayjob integration admits the whole RayJob (controller/kueue.py)
        kueue.queued_rayjob(manifest, queue, spec.resources.priority_class_name)
    return manifest


# --------------------------------------------------------------------------- reading its outcome


def outcome(rayjob: Optional[dict]) -> tuple[bool, str]:
    """(finished successfully, failure reason or "") from a RayJob's status."""
    st = (rayjob or {}).get("status") or {}
    job_status = st.get("jobStatus") or ""
    deployment = st.get("jobDeploymentStatus") or ""
    if job_status == "SUCCEEDED" or (deployment == "Complete" and job_status in ("", "SUCCEEDED")):
        return True, ""
    if job_status in ("FAILED", "STOPPED") or deployment in ("Failed", "ValidationFailed"):
        why = st.get("message") or st.get("reason") or f"Ray job {job_status or deployment}"
        return False, f"RayJob {deployment or job_status}: {why}"[:300]
    return False, ""


def pods_of(manifest: dict) -> list[dict]:
    """The pods a RayJob manifest's RayCluster will have, one per group (named after the group), for
    the checks a trial's own pods get before creation (server-side dry run, nodes that fit)."""
    if manifest.get("kind") != KIND:
        return []
    md, cluster = manifest["metadata"], manifest["spec"]["rayClusterSpec"]
    groups = [("head", cluster["headGroupSpec"])] + [(g["groupName"], g) for g in cluster.get("workerGroupSpecs", [])]
    return [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": podspec.dns_name(md["name"], group),
                "namespace": md["namespace"],
                "labels": dict(g["template"]["metadata"].get("labels") or {}),
            },
            "spec": copy.deepcopy(g["template"]["spec"]),
        }
        for group, g in groups
    ]
