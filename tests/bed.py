"""Helpers for tests that use the local test bed (the package hack.bed). See docs/testbed.md.

Fixtures (tests/conftest.py):
    bed        session: the running bed (started once if needed) -> Bed
    namespace  function: a fresh namespace name, its pods removed and it deleted afterwards
    core       function: kubernetes CoreV1Api bound to the bed
"""

from __future__ import annotations

import json
import os
import time
import urllib.parse
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from hack.bed import binaries, lifecycle, network, paths, pools  # installed with the project (pyproject.toml)

REPO = Path(__file__).resolve().parent.parent

create_pool = pools.create  # create_pool(api, name, gpu_type, nodes, gpus_per_node, ...)
delete_pool = pools.delete  # delete_pool(api, name)
GPU_TYPES = pools.gpu_types()

TRIAL_IMAGE = "rltune/trial:dev"  # mapped: the pod runner executes it locally
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"  # unmapped: kwok's default behaviour
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


class TrialPodWatch:
    """A background watch on a namespace's trial pods (label rltune.io/job), started from the
    resourceVersion of a list made at construction, so no later event is missed. Subclasses set
    their state, then call this __init__; on_event(type, pod) runs for every event under a lock."""

    def __init__(self, bed, ns: str, timeout_s: int = 1800):
        import threading

        from kubernetes import client, watch

        self._w = watch.Watch()
        self._lock = threading.Lock()
        core = client.CoreV1Api(bed.api_client())
        sel = "rltune.io/job"
        rv = core.list_namespaced_pod(ns, label_selector=sel).metadata.resource_version

        def run():
            try:
                for ev in self._w.stream(
                    core.list_namespaced_pod, ns, label_selector=sel, resource_version=rv, timeout_seconds=timeout_s
                ):
                    with self._lock:
                        self.on_event(ev["type"], ev["object"])
            except Exception:  # noqa: BLE001 - the watch ends with the test
                pass

        self._t = threading.Thread(target=run, daemon=True)
        self._t.start()

    def on_event(self, kind: str, pod) -> None:
        raise NotImplementedError

    def stop(self):
        self._w.stop()


@dataclass
class Bed:
    repo: Path
    kubeconfig: Path
    prometheus_url: str
    pushgateway_url: str
    state_dir: Path
    audit_log: Path
    pod_logs: Path
    ports: dict = field(default_factory=dict)

    def api_client(self):
        from kubernetes import config

        return config.new_client_from_config(str(self.kubeconfig))

    def core(self):
        from kubernetes import client

        return client.CoreV1Api(self.api_client())

    def env(self) -> dict[str, str]:
        """Environment for a subprocess (kubectl, helm, the operator) that targets the bed."""
        e = dict(os.environ)
        e.update(
            {
                "KUBECONFIG": str(self.kubeconfig),
                "PROMETHEUS_URL": self.prometheus_url,
                "PUSHGATEWAY_URL": self.pushgateway_url,
            }
        )
        e["PATH"] = f"{self.bin_dir}{os.pathsep}{e.get('PATH', '')}"
        return e

    @property
    def bin_dir(self) -> Path:
        """Where kubectl, helm, kwok, ... live."""
        return binaries.bin_dir(build=False)

    def pod_log(self, namespace: str, name: str) -> str:
        f = self.pod_logs / f"{namespace}_{name}.log"
        return f.read_text(errors="replace") if f.exists() else ""


def current() -> Bed:
    return Bed(
        repo=REPO,
        kubeconfig=paths.KUBECONFIG,
        prometheus_url=network.PROMETHEUS_URL,
        pushgateway_url=network.PUSHGATEWAY_URL,
        state_dir=paths.STATE,
        audit_log=paths.AUDIT_LOG,
        pod_logs=paths.STATE / "pods",
        ports=dict(network.PORTS),
    )


def ensure_bed() -> Bed:
    """Bring the bed up (no-op when it already is) and describe it."""
    if not lifecycle.is_up():
        lifecycle.up(wait=True)
    return current()


# ----------------------------------------------------------------------------- waiting
def chart_env(bed: "Bed") -> dict[str, str]:
    """The environment for installing the chart on the bed (hack/demo.py's helm helpers), with the
    CRD applied: the release's Prometheus and Pushgateway are the bed's."""
    from hack import demo

    env = demo.bed_env()
    env.update(bed.env())
    env["RLTUNE_PROMETHEUS_URL"], env["RLTUNE_PUSHGATEWAY_URL"] = bed.prometheus_url, bed.pushgateway_url
    demo.apply_crd(env)
    return env


def wait_for(cond, timeout: float = 30.0, interval: float = 0.2, what: str = "condition"):
    """Poll cond() until it returns a truthy value; return that value."""
    deadline = time.time() + timeout
    last = None
    while True:
        try:
            v = cond()
            if v:
                return v
        except Exception as e:  # noqa: BLE001 - keep polling, report the last error
            last = e
        if time.time() > deadline:
            raise TimeoutError(
                f"timed out after {timeout}s waiting for {what}" + (f" (last error: {last!r})" if last else "")
            )
        time.sleep(interval)


def wait_pod(core, namespace: str, name: str, phases=("Succeeded", "Failed"), timeout=60.0):
    def check():
        p = core.read_namespaced_pod(name, namespace)
        return p if p.status.phase in phases else None

    return wait_for(check, timeout, what=f"pod {namespace}/{name} in {phases}")


def wait_pod_gone(core, namespace: str, name: str, timeout=30.0) -> None:
    from kubernetes.client.rest import ApiException

    def gone():
        try:
            core.read_namespaced_pod(name, namespace)
            return False
        except ApiException as e:
            return e.status == 404

    wait_for(gone, timeout, what=f"pod {namespace}/{name} deleted")


def pod_condition(pod, ctype: str):
    return next((c for c in (pod.status.conditions or []) if c.type == ctype), None)


# ----------------------------------------------------------------------------- manifests
def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def gpu_pod(
    name: str,
    gpus: int,
    product: str = GPU_TYPES["B300"]["labels"]["nvidia.com/gpu.product"],
    image: str = PAUSE_IMAGE,
    node_selector: dict | None = None,
    **spec,
) -> dict:
    sel = {"nvidia.com/gpu.product": product}
    sel.update(node_selector or {})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}, "requests": {"cpu": "1", "memory": "1Gi"}},
                }
            ],
            "nodeSelector": sel,
            "tolerations": [GPU_TOLERATION],
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
            **spec,
        },
    }


def python_pod(
    name: str,
    code: str,
    *,
    env: list | None = None,
    grace: int = 5,
    labels: dict | None = None,
    annotations: dict | None = None,
    owner: dict | None = None,
    restart_policy: str = "Never",
) -> dict:
    """A pod the runner executes locally: `python -c code` (python -> the repo's .venv)."""
    env = [  # downward API first, so later entries can use $(POD_NAME) etc.
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
    ] + list(env or [])
    md = {"name": name, "labels": labels or {}, "annotations": annotations or {}}
    if owner:
        md["ownerReferences"] = [owner]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": md,
        "spec": {
            "containers": [{"name": "trial", "image": TRIAL_IMAGE, "command": ["python", "-c", code], "env": env}],
            "restartPolicy": restart_policy,
            "terminationGracePeriodSeconds": grace,
        },
    }


def owner_ref(obj, kind: str, api_version: str = "v1", controller: bool = True) -> dict:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": obj.metadata.name,
        "uid": obj.metadata.uid,
        "controller": controller,
        "blockOwnerDeletion": True,
    }


# ----------------------------------------------------------------------------- processes
def pod_pids(uid: str) -> list[int]:
    """Live processes the runner started for the pod with this UID (marked in their environ)."""
    marker = f"RLTUNE_POD_UID={uid}".encode()
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            if marker in (p / "environ").read_bytes().split(b"\0"):
                state = (p / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state not in ("Z", "X"):
                    out.append(int(p.name))
        except OSError:
            continue
    return out


def pids_with_cmdline(marker: str) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == os.getpid():
            continue
        try:
            cmd = (p / "cmdline").read_bytes().decode(errors="replace")
            state = (p / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmd and state not in ("Z", "X"):
            out.append(int(p.name))
    return out


# ----------------------------------------------------------------------------- prometheus
def push_metric(pushgateway_url: str, job: str, text: str, **grouping: str) -> None:
    """Push Prometheus text format (`text`, newline-terminated) to the Pushgateway."""
    path = f"/metrics/job/{urllib.parse.quote(job, safe='')}"
    for k, v in grouping.items():
        path += f"/{k}/{urllib.parse.quote(v, safe='')}"
    req = urllib.request.Request(
        pushgateway_url + path, data=text.encode(), method="PUT", headers={"Content-Type": "text/plain; version=0.0.4"}
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status in (200, 202), r.status


def prom_query(prometheus_url: str, query: str) -> list[dict]:
    url = f"{prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(url, timeout=10) as r:
        data = json.loads(r.read())
    assert data["status"] == "success", data
    return data["data"]["result"]


def audit_events(bed: "Bed", namespace: str):
    """(event, objectRef) of every API-server audit event in a namespace (the bed logs pod
    creations and rltune.io writes at Metadata level: docs/testbed.md)."""
    if not Path(bed.audit_log).exists():
        return
    with open(bed.audit_log, errors="replace") as f:
        for line in f:
            if namespace not in line:
                continue
            ev = json.loads(line)
            ref = ev.get("objectRef") or {}
            if ref.get("namespace") == namespace:
                yield ev, ref


def pod_creations(bed: "Bed", namespace: str):
    """Successful pod creations (HTTP 201) per pod name: a name counted twice is a duplicate pod."""
    c: Counter = Counter()
    for ev, ref in audit_events(bed, namespace):
        if (
            ev.get("verb") == "create"
            and ref.get("resource") == "pods"
            and not ref.get("subresource")
            and (ev.get("responseStatus") or {}).get("code") == 201
            and "dryRun=" not in ev.get("requestURI", "")
        ):  # a server-side dry run persists nothing
            c[ref.get("name")] += 1
    return c
