#!/usr/bin/env python3
"""rltune local test bed: a real Kubernetes control plane with kwok-simulated GPU nodes.

    python hack/testbed.py up [--no-wait]   start everything (no-op when it is up)
    python hack/testbed.py down             stop everything it started, wipe cluster data
    python hack/testbed.py status           which processes are alive
    python hack/testbed.py kubeconfig       print the admin kubeconfig path
    python hack/testbed.py env              print KUBECONFIG=..., PROMETHEUS_URL=... lines
    python hack/testbed.py kuberay on|off   install / remove KubeRay (operator + CRDs) on a running bed
    python hack/testbed.py kueue on|off     install / remove Kueue (manager, CRDs, webhooks) on a running bed

Processes (all on 127.0.0.1, pid files + logs under .state/bed/):
    etcd :12379, kube-apiserver :16443, kube-controller-manager :20257, kube-scheduler :20259,
    kwok :20247, prometheus :19090, pushgateway :19091, the pod runner (hack/podrunner.py),
    the KubeRay operator (metrics :20280, health :20281; RLTUNE_BED_KUBERAY=0 at `up`: without it),
    Kueue (webhooks :20290, health :20291; RLTUNE_BED_KUEUE=0 at `up`: without it).
See docs/testbed.md. Binaries come from hack/binaries.sh (built once per machine).
"""

from __future__ import annotations

import argparse
import base64
import functools
import hashlib
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HACK = REPO / "hack"
STATE = Path(os.environ.get("RLTUNE_BED_STATE", str(REPO / ".state" / "bed")))
PKI = STATE / "pki"
LOGS = STATE / "logs"
PIDS = STATE / "pids"
KUBECONFIG = STATE / "kubeconfig"
AUDIT_LOG = STATE / "audit.log"

# RLTUNE_BED_PORT_OFFSET shifts every port (and the pod IP range) so a second bed, with its own
# RLTUNE_BED_STATE, can run beside the default one (e.g. CI while a developer's bed is up).
PORT_OFFSET = int(os.environ.get("RLTUNE_BED_PORT_OFFSET", "0"))
PORTS = {
    "etcd": 12379,
    "etcd-peer": 12380,
    "kube-apiserver": 16443,
    "kube-controller-manager": 20257,
    "kube-scheduler": 20259,
    "kwok": 20247,
    "prometheus": 19090,
    "pushgateway": 19091,
    "operator-metrics": 18080,  # scraped by Prometheus when an operator runs locally
    "kuberay-metrics": 20280,
    "kuberay-health": 20281,
    "kueue-webhook": 20290,
    "kueue-health": 20291,
}
PORTS = {k: v + PORT_OFFSET for k, v in PORTS.items()}
HOST = "127.0.0.1"
APISERVER_URL = f"https://{HOST}:{PORTS['kube-apiserver']}"
PROMETHEUS_URL = f"http://{HOST}:{PORTS['prometheus']}"
PUSHGATEWAY_URL = f"http://{HOST}:{PORTS['pushgateway']}"
# kwok hands out pod IPs from a loopback range: each "pod" process can bind its own 127.x address
# (Linux routes all of 127/8 to lo), so many trials can use the same port, and Prometheus can
# scrape <podIP>:<port> exactly like on a real cluster.
POD_CIDR = f"127.{128 + (PORT_OFFSET // 1000) % 120}.0.0/16"
SERVICE_CIDR = "10.96.0.0/16"
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"

# GPU Feature Discovery labels per GPU type, as recorded from public dumps of real GFD output
# (hack/gfd/labels.yaml names the source of every value).
GFD_FIXTURE = HACK / "gfd" / "labels.yaml"


@functools.cache
def gpu_types() -> dict[str, dict]:
    """{type: entry}: entry["labels"] are the node labels, entry["taint"] the GPU taint."""
    import yaml

    doc = yaml.safe_load(GFD_FIXTURE.read_text())
    return {name: dict(entry, taint=dict(doc["taint"])) for name, entry in doc["types"].items()}


ORDER = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
    "pushgateway",
    "prometheus",
    "podrunner",
    "kuberay-operator",
    "kueue",
]

# KubeRay (ray-operator, hack/binaries.sh) runs by default; RLTUNE_BED_KUBERAY=0 at `up` starts the
# bed without it (no operator, no ray.io CRDs), to try what rltune does where KubeRay is missing.
# The choice is kept in .state/bed/kuberay so a later plain `up` (the tests' fixture) keeps it;
# `testbed.py kuberay on|off` changes it on a running bed.
KUBERAY = "kuberay-operator"
KUBERAY_NAMESPACE = "kuberay-system"
KUBERAY_CRDS = ("rayclusters.ray.io", "rayjobs.ray.io", "rayservices.ray.io")

# Kueue (sigs.k8s.io/kueue, hack/binaries.sh) runs by default too, like KubeRay: RLTUNE_BED_KUEUE=0 at
# `up` starts the bed without it; the choice is kept in .state/bed/kueue; `testbed.py kueue on|off`.
KUEUE = "kueue"
KUEUE_NAMESPACE = "kueue-system"
KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_API = f"{KUEUE_GROUP}/v1beta2"
KUEUE_WEBHOOKS = ("rltune-bed-kueue-mutating", "rltune-bed-kueue-validating")


def log(msg: str) -> None:
    print(f"[bed {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- binaries
def bin_dir(build: bool = True) -> Path:
    script = HACK / "binaries.sh"
    r = subprocess.run([str(script), "--check"], capture_output=True, text=True)
    if r.returncode == 0:
        return Path(r.stdout.strip())
    if not build:
        raise SystemExit(f"control-plane binaries missing: {r.stderr.strip()} (run hack/binaries.sh)")
    log("control-plane binaries missing; building them (once per machine, ~30+ min cold)")
    r = subprocess.run([str(script)], stdout=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise SystemExit("hack/binaries.sh failed")
    return Path(r.stdout.strip().splitlines()[-1])


def system_bin(name: str) -> str:
    p = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None)
    if not p:
        raise SystemExit(f"{name} not found: apt-get install prometheus prometheus-pushgateway")
    return p


# ----------------------------------------------------------------------------- processes
def _pid_file(name: str) -> Path:
    return PIDS / f"{name}.pid"


def _proc_cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


_POPENS: dict[str, subprocess.Popen] = {}  # processes this python process started


def _alive(name: str) -> bool:
    """Liveness for waiting right after a start: our own child's poll() is exact, whereas
    /proc/<pid>/cmdline can still show the pre-exec image for a moment after Popen returns."""
    p = _POPENS.get(name)
    if p is not None:
        return p.poll() is None
    return running_pid(name) is not None


def running_pid(name: str) -> int | None:
    """pid of the bed's process `name` if alive (and really ours: marker in its cmdline)."""
    f = _pid_file(name)
    if not f.exists():
        return None
    try:
        data = json.loads(f.read_text())
    except ValueError:
        return None
    pid = int(data["pid"])
    cmd = _proc_cmdline(pid)
    if not cmd or _proc_state(pid) in ("Z", "X", ""):
        return None
    if cmd[0] == "":
        return pid  # between fork and exec: the cmdline is empty for a moment
    if data.get("exe") and Path(cmd[0]).name != Path(data["exe"]).name and data["exe"] not in cmd:
        return None
    return pid


def start_process(name: str, argv: list[str], env: dict | None = None, exe: str | None = None) -> int:
    """Start `argv` as bed process `name` (own session, log under LOGS); `exe` is the program it
    ends up running when argv[0] is a wrapper that execs it (liveness checks look for it)."""
    pid = running_pid(name)
    if pid:
        return pid
    LOGS.mkdir(parents=True, exist_ok=True)
    PIDS.mkdir(parents=True, exist_ok=True)
    logf = open(LOGS / f"{name}.log", "ab")
    logf.write(f"\n==== {time.strftime('%Y-%m-%dT%H:%M:%S')} start: {' '.join(argv)}\n".encode())
    logf.flush()
    full_env = dict(os.environ)
    full_env.update(env or {})
    p = subprocess.Popen(
        argv,
        stdout=logf,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=full_env,
        cwd=str(REPO),
        start_new_session=True,
        close_fds=True,
    )
    logf.close()
    _POPENS[name] = p
    _pid_file(name).write_text(json.dumps({"pid": p.pid, "exe": exe or argv[0], "argv": argv}))
    log(f"started {name} (pid {p.pid}), log {LOGS / (name + '.log')}")
    return p.pid


def stop_process(name: str, timeout: float | None = None) -> None:
    if timeout is None:  # an apiserver with open watches takes its time; etcd must flush
        timeout = {"etcd": 15.0, "podrunner": 10.0}.get(name, 5.0)
    pid = running_pid(name)
    if pid:
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.time() + timeout
        while time.time() < deadline and _proc_state(pid) not in ("", "Z", "X"):
            time.sleep(0.1)
        if _proc_state(pid) not in ("", "Z", "X"):
            log(f"{name} did not stop in {timeout}s: SIGKILL")
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            time.sleep(0.2)
        log(f"stopped {name} (pid {pid})")
    _pid_file(name).unlink(missing_ok=True)


def wait_for(what: str, check, timeout: float = 120.0, name: str | None = None) -> None:
    t0 = time.time()
    last = None
    while time.time() - t0 < timeout:
        try:
            if check():
                log(f"{what} ready in {time.time() - t0:.1f}s")
                return
        except Exception as e:  # noqa: BLE001 - keep polling
            last = e
        if name and not _alive(name):
            tail = ""
            lf = LOGS / f"{name}.log"
            if lf.exists():
                tail = "\n".join(lf.read_text(errors="replace").splitlines()[-25:])
            raise SystemExit(f"{name} exited while waiting for {what}:\n{tail}")
        time.sleep(0.25)
    raise SystemExit(f"timed out after {timeout}s waiting for {what}: {last}")


# ----------------------------------------------------------------------------- PKI
def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def ensure_pki() -> None:
    if (PKI / "admin.crt").exists() and (PKI / "sa.pub").exists():
        return
    PKI.mkdir(parents=True, exist_ok=True)
    log("generating CA, serving cert, admin client cert, service-account key (openssl)")
    d = str(PKI)
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        f"{d}/ca.key",
        "-out",
        f"{d}/ca.crt",
        "-days",
        "3650",
        "-subj",
        "/CN=rltune-testbed-ca",
    )
    sans = (
        "subjectAltName=DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
        "DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,"
        "IP:127.0.0.1,IP:10.96.0.1"
    )
    for name, subj, ext in [
        ("apiserver", "/CN=kube-apiserver", f"{sans}\nextendedKeyUsage=serverAuth,clientAuth\n"),
        ("admin", "/O=system:masters/CN=rltune-admin", "extendedKeyUsage=clientAuth\n"),
    ]:
        (PKI / f"{name}.ext").write_text("keyUsage=critical,digitalSignature,keyEncipherment\n" + ext)
        _openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            f"{d}/{name}.key",
            "-out",
            f"{d}/{name}.csr",
            "-subj",
            subj,
        )
        _openssl(
            "x509",
            "-req",
            "-in",
            f"{d}/{name}.csr",
            "-CA",
            f"{d}/ca.crt",
            "-CAkey",
            f"{d}/ca.key",
            "-CAcreateserial",
            "-out",
            f"{d}/{name}.crt",
            "-days",
            "3650",
            "-extfile",
            f"{d}/{name}.ext",
        )
    _openssl("genrsa", "-out", f"{d}/sa.key", "2048")
    _openssl("rsa", "-in", f"{d}/sa.key", "-pubout", "-out", f"{d}/sa.pub")
    for f in PKI.iterdir():
        if f.suffix == ".key":
            f.chmod(0o600)


def write_kubeconfig() -> None:
    def b64(name: str) -> str:
        return base64.b64encode((PKI / name).read_bytes()).decode()

    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "preferences": {},
        "clusters": [
            {"name": "rltune-bed", "cluster": {"server": APISERVER_URL, "certificate-authority-data": b64("ca.crt")}}
        ],
        "users": [
            {
                "name": "rltune-admin",
                "user": {"client-certificate-data": b64("admin.crt"), "client-key-data": b64("admin.key")},
            }
        ],
        "contexts": [
            {"name": "rltune-bed", "context": {"cluster": "rltune-bed", "user": "rltune-admin", "namespace": "default"}}
        ],
        "current-context": "rltune-bed",
    }
    tmp = KUBECONFIG.with_suffix(".tmp")
    tmp.write_text(json.dumps(cfg, indent=1))  # JSON is YAML
    tmp.chmod(0o600)
    tmp.replace(KUBECONFIG)


OPERATOR_USER = "rltune-operator"
OPERATOR_KUBECONFIG = STATE / "operator.kubeconfig"


def operator_kubeconfig() -> Path:
    """A kubeconfig for an operator run on the bed as its own user (CN=rltune-operator, group
    system:masters: the same rights as the admin kubeconfig), whose every request the audit log
    records (audit_policy). Made on first use; the apiserver accepts any cert its CA signed."""
    if OPERATOR_KUBECONFIG.exists():
        return OPERATOR_KUBECONFIG
    d = str(PKI)
    (PKI / "operator.ext").write_text(
        "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n"
    )
    key, csr, crt = f"{d}/operator.key", f"{d}/operator.csr", f"{d}/operator.crt"
    subj = f"/O=system:masters/CN={OPERATOR_USER}"
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj", subj)
    ca = ["-CA", f"{d}/ca.crt", "-CAkey", f"{d}/ca.key", "-CAcreateserial"]
    _openssl("x509", "-req", "-in", csr, *ca, "-out", crt, "-days", "3650", "-extfile", f"{d}/operator.ext")
    (PKI / "operator.key").chmod(0o600)
    cfg = json.loads(KUBECONFIG.read_text())
    cfg["users"] = [
        {
            "name": OPERATOR_USER,
            "user": {
                "client-certificate-data": base64.b64encode((PKI / "operator.crt").read_bytes()).decode(),
                "client-key-data": base64.b64encode((PKI / "operator.key").read_bytes()).decode(),
            },
        }
    ]
    cfg["contexts"][0]["context"]["user"] = OPERATOR_USER
    tmp = OPERATOR_KUBECONFIG.with_suffix(".tmp")
    tmp.write_text(json.dumps(cfg, indent=1))
    tmp.chmod(0o600)
    tmp.replace(OPERATOR_KUBECONFIG)
    return OPERATOR_KUBECONFIG


def _ssl_ctx() -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(PKI / "ca.crt"))
    ctx.load_cert_chain(str(PKI / "admin.crt"), str(PKI / "admin.key"))
    return ctx


def api_get(path: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(APISERVER_URL + path, context=_ssl_ctx(), timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return 200 <= r.status < 300
    except (urllib.error.URLError, OSError):
        return False


# ----------------------------------------------------------------------------- configs
def load_images() -> list[dict]:
    import yaml

    return yaml.safe_load((HACK / "images.yaml").read_text())["images"]


def glob_to_regex(glob: str) -> str:
    """Translate an image glob (`*` any run, `?` one char) to a regex that Python's `re` and
    Go's `regexp` (kwok's jq `test`) read alike (fnmatch.translate emits atomic groups Go lacks)."""
    out = []
    for ch in glob:
        out.append(".*" if ch == "*" else "." if ch == "?" else re.escape(ch))
    return "".join(out)


def image_regex(images: list[dict] | None = None) -> str:
    """One anchored regex matching every mapped image glob."""
    pats = [glob_to_regex(g) for e in (images or load_images()) for g in e["match"]]
    return "^(?:" + "|".join(pats) + ")$"


KWOK_STAGES = HACK / "kwok"  # kwok Stage objects, one file each, in the order kwok reads them
MAPPED_IMAGES = "@MAPPED_IMAGES@"  # placeholder: the selector of pods the pod runner executes


def kwok_config() -> str:
    """kwok configuration: our own Stages (data in hack/kwok/). Pods whose image the pod runner owns
    are made Running (pod IP assigned) but never completed or deleted by kwok: the runner reports
    their exit and finalizes their deletion. Other pods get kwok's usual lifecycle."""
    rx = image_regex().replace("\\", "\\\\").replace('"', '\\"')
    mapped = f'[.spec.containers.[].image | test("{rx}")] | any'
    docs = [f.read_text().replace(MAPPED_IMAGES, mapped) for f in sorted(KWOK_STAGES.glob("*.yaml"))]
    return "---\n".join(d[d.index("apiVersion:") :] for d in docs)


def kwok_logs_crd() -> dict:
    """CRD of kwok's `Logs` (kwok.x-k8s.io/v1alpha1): the pod runner creates one per pod it runs,
    naming the CRI-format log file kwok serves to `kubectl logs`."""
    open_obj = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "logs.kwok.x-k8s.io"},
        "spec": {
            "group": "kwok.x-k8s.io",
            "scope": "Namespaced",
            "names": {"kind": "Logs", "listKind": "LogsList", "plural": "logs", "singular": "logs"},
            "versions": [
                {
                    "name": "v1alpha1",
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {
                        "openAPIV3Schema": {"type": "object", "properties": {"spec": open_obj, "status": open_obj}}
                    },
                }
            ],
        },
    }


def ensure_crds() -> None:
    req = urllib.request.Request(
        APISERVER_URL + "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        data=json.dumps(kwok_logs_crd()).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        urllib.request.urlopen(req, context=_ssl_ctx(), timeout=10).close()
    except urllib.error.HTTPError as e:
        if e.code != 409:
            raise

    def established() -> bool:
        code, body = api_get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/logs.kwok.x-k8s.io")
        conds = json.loads(body).get("status", {}).get("conditions", []) if code == 200 else []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conds)

    wait_for("kwok Logs CRD", established, 30)


def audit_policy() -> str:
    return """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
# every request of the operator's own user (operator.kubeconfig): its API request rate is measured
# from here (bench/api_rate.py, tests/e2e/test_events.py)
- level: Metadata
  users: ["rltune-operator"]
# pod creations/deletions (not subresources like pods/binding): counted by restart tests
- level: Metadata
  verbs: ["create", "delete", "deletecollection"]
  resources:
  - group: ""
    resources: ["pods", "services"]
# service-account tokens the pod runner requests for pods (TokenRequest), as a kubelet does
- level: Metadata
  verbs: ["create"]
  resources:
  - group: ""
    resources: ["serviceaccounts/token"]
# writes to rltune's own resources
- level: Metadata
  verbs: ["create", "update", "patch", "delete"]
  resources:
  - group: "rltune.io"
- level: None
"""


def prometheus_config() -> str:
    targets = STATE / "prometheus" / "targets"
    return f"""# generated by hack/testbed.py
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
- job_name: pushgateway
  honor_labels: true
  static_configs:
  - targets: ["{HOST}:{PORTS["pushgateway"]}"]
- job_name: rltune-operator
  static_configs:
  - targets: ["{HOST}:{PORTS["operator-metrics"]}"]
# trial pods that expose metrics: the pod runner writes one file per pod annotated
# prometheus.io/scrape: "true" (+ prometheus.io/port, prometheus.io/path)
- job_name: rltune-pods
  honor_labels: false
  file_sd_configs:
  - files: ["{targets}/*.json"]
    refresh_interval: 1s
  relabel_configs:
  - source_labels: [__metrics_path__]
    regex: (.+)
    target_label: __metrics_path__
- job_name: prometheus
  static_configs:
  - targets: ["{HOST}:{PORTS["prometheus"]}"]
"""


# ----------------------------------------------------------------------------- pools
def load_pools() -> list[dict]:
    import yaml

    path = Path(os.environ.get("RLTUNE_POOLS_FILE", str(HACK / "pools.yaml")))
    pools = yaml.safe_load(path.read_text())["pools"]
    gpu = next((p for p in pools if p.get("gpuType")), None)
    if gpu is not None:
        if os.environ.get("RLTUNE_GPU_TYPE"):
            gpu["gpuType"] = os.environ["RLTUNE_GPU_TYPE"]
            gpu["name"] = os.environ["RLTUNE_GPU_TYPE"].lower()
        if os.environ.get("RLTUNE_GPU_NODES"):
            gpu["nodes"] = int(os.environ["RLTUNE_GPU_NODES"])
        if os.environ.get("RLTUNE_GPUS_PER_NODE"):
            gpu["gpusPerNode"] = int(os.environ["RLTUNE_GPUS_PER_NODE"])
    return pools


def node_manifest(pool: str, index: int, gpu_type: str | None, gpus_per_node: int, cpu: str, memory: str) -> dict:
    name = f"{pool}-{index}"
    labels = {
        "type": "kwok",
        "rltune.io/pool": pool,
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/exclude-from-external-load-balancers": "true",
    }
    capacity = {"cpu": str(cpu), "memory": str(memory), "pods": "110", "ephemeral-storage": "7Ti"}
    taints = []
    if gpu_type:
        info = gpu_types().get(gpu_type.upper())
        if info is None:
            raise ValueError(f"unknown GPU type {gpu_type!r}; known: {sorted(gpu_types())}")
        # exactly the recorded GFD labels (hack/gfd/labels.yaml); gpu.count is what GFD counts
        labels.update({k: str(v) for k, v in info["labels"].items()})
        labels["nvidia.com/gpu.count"] = str(gpus_per_node)
        capacity["nvidia.com/gpu"] = str(gpus_per_node)
        taints.append(dict(info["taint"]))
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {KWOK_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"taints": taints},
        "status": {"capacity": capacity, "allocatable": dict(capacity), "phase": "Pending"},
    }


def create_pool(
    api,
    name: str,
    gpu_type: str | None = "B300",
    nodes: int = 8,
    gpus_per_node: int = 8,
    cpu: str = "224",
    memory: str = "4Ti",
    wait_ready: bool = True,
    timeout: float = 60.0,
) -> list[str]:
    """Create (idempotently) `nodes` kwok nodes named <name>-<i>. `api` is a
    kubernetes.client.CoreV1Api. Returns the node names; waits until kwok marks them Ready."""
    from kubernetes.client.rest import ApiException

    names = []
    for i in range(nodes):
        body = node_manifest(name, i, gpu_type, gpus_per_node, cpu, memory)
        names.append(body["metadata"]["name"])
        try:
            api.create_node(body)
        except ApiException as e:
            if e.status != 409:
                raise
    if wait_ready:
        deadline = time.time() + timeout
        while True:
            ready = 0
            for n in api.list_node(label_selector=f"rltune.io/pool={name}").items:
                conds = {c.type: c.status for c in (n.status.conditions or [])}
                taints = [t.key for t in (n.spec.taints or [])]
                if conds.get("Ready") == "True" and "node.kubernetes.io/not-ready" not in taints:
                    ready += 1
            if ready >= nodes:
                break
            if time.time() > deadline:
                raise TimeoutError(f"pool {name}: {ready}/{nodes} nodes Ready after {timeout}s")
            time.sleep(0.25)
    return names


def delete_pool(api, name: str) -> None:
    api.delete_collection_node(label_selector=f"rltune.io/pool={name}")


def core_api():
    from kubernetes import client, config

    return client.CoreV1Api(config.new_client_from_config(str(KUBECONFIG)))


# ----------------------------------------------------------------------------- up / down
def component_argv(bins: Path) -> dict[str, list[str]]:
    s = str(STATE)
    kc = str(KUBECONFIG)
    return {
        "etcd": [
            str(bins / "etcd"),
            "--name=bed",
            f"--data-dir={s}/etcd",
            f"--listen-client-urls=http://{HOST}:{PORTS['etcd']}",
            f"--advertise-client-urls=http://{HOST}:{PORTS['etcd']}",
            f"--listen-peer-urls=http://{HOST}:{PORTS['etcd-peer']}",
            f"--initial-advertise-peer-urls=http://{HOST}:{PORTS['etcd-peer']}",
            f"--initial-cluster=bed=http://{HOST}:{PORTS['etcd-peer']}",
            "--listen-metrics-urls=",
            "--unsafe-no-fsync=true",
            "--quota-backend-bytes=4294967296",
            "--log-level=warn",
        ],
        "kube-apiserver": [
            str(bins / "kube-apiserver"),
            f"--etcd-servers=http://{HOST}:{PORTS['etcd']}",
            f"--bind-address={HOST}",
            f"--advertise-address={HOST}",
            f"--secure-port={PORTS['kube-apiserver']}",
            f"--tls-cert-file={s}/pki/apiserver.crt",
            f"--tls-private-key-file={s}/pki/apiserver.key",
            f"--client-ca-file={s}/pki/ca.crt",
            f"--service-account-key-file={s}/pki/sa.pub",
            f"--service-account-signing-key-file={s}/pki/sa.key",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC",
            "--allow-privileged=true",
            "--enable-admission-plugins=NamespaceLifecycle,ServiceAccount,DefaultTolerationSeconds,"
            "ResourceQuota,LimitRanger,Priority,DefaultStorageClass,"
            "MutatingAdmissionWebhook,ValidatingAdmissionWebhook,ValidatingAdmissionPolicy",
            f"--audit-policy-file={s}/audit-policy.yaml",
            f"--audit-log-path={AUDIT_LOG}",
            "--audit-log-format=json",
            "--audit-log-maxsize=200",
            "--audit-log-maxbackup=2",
            "--audit-log-mode=blocking",
            f"--kubelet-client-certificate={s}/pki/apiserver.crt",
            f"--kubelet-client-key={s}/pki/apiserver.key",
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            "--endpoint-reconciler-type=none",
            # front-proxy / requestheader auth (aggregated APIs; keeps components' logs quiet)
            f"--requestheader-client-ca-file={s}/pki/ca.crt",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={s}/pki/apiserver.crt",
            f"--proxy-client-key-file={s}/pki/apiserver.key",
            "--profiling=false",
            "--v=1",
        ],
        "kube-controller-manager": [
            str(bins / "kube-controller-manager"),
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            f"--bind-address={HOST}",
            f"--secure-port={PORTS['kube-controller-manager']}",
            "--leader-elect=false",
            "--controllers=*",
            f"--root-ca-file={s}/pki/ca.crt",
            f"--service-account-private-key-file={s}/pki/sa.key",
            "--use-service-account-credentials=false",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--node-monitor-grace-period=3m",
            "--node-monitor-period=10s",
            "--concurrent-gc-syncs=20",
            "--kube-api-qps=500",
            "--kube-api-burst=1000",
            "--profiling=false",
            "--v=1",
        ],
        "kube-scheduler": [
            str(bins / "kube-scheduler"),
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            f"--bind-address={HOST}",
            f"--secure-port={PORTS['kube-scheduler']}",
            "--leader-elect=false",
            "--kube-api-qps=500",
            "--kube-api-burst=1000",
            "--profiling=false",
            "--v=1",
        ],
        "kwok": [
            str(bins / "kwok"),
            f"--kubeconfig={kc}",
            f"--config={s}/kwok.yaml",
            f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
            f"--cidr={POD_CIDR}",
            f"--node-ip={HOST}",
            f"--node-port={PORTS['kwok']}",
            f"--server-address={HOST}:{PORTS['kwok']}",
            f"--tls-cert-file={s}/pki/apiserver.crt",
            f"--tls-private-key-file={s}/pki/apiserver.key",
            "--node-lease-duration-seconds=40",
            "--enable-crds=Logs",
            "--v=WARN",
        ],
        "pushgateway": [
            system_bin("prometheus-pushgateway"),
            f"--web.listen-address={HOST}:{PORTS['pushgateway']}",
            f"--persistence.file={s}/pushgateway.db",
            "--persistence.interval=5s",
            "--web.enable-admin-api",
            "--log.level=warn",
        ],
        "prometheus": [
            system_bin("prometheus"),
            f"--config.file={s}/prometheus/prometheus.yml",
            f"--storage.tsdb.path={s}/prometheus/data",
            f"--web.listen-address={HOST}:{PORTS['prometheus']}",
            "--web.enable-lifecycle",
            "--web.enable-admin-api",
            "--storage.tsdb.retention.time=7d",
            "--log.level=warn",
        ],
        "podrunner": [
            sys.executable,
            str(HACK / "podrunner.py"),
            f"--kubeconfig={kc}",
            f"--state={s}",
        ],
        # like a pod of the operator: its own ServiceAccount (kubeconfig with its token), and the
        # bed-wide hosts file (Service names the pod runner keeps current) as /etc/hosts, so it
        # reaches a RayCluster's dashboard at <head-svc>.<ns>.svc.cluster.local:8265
        # Kueue wants its metrics certificate at /etc/kueue/metrics/certs even with metrics off:
        # the bed's certificate is bind-mounted there in a private mount namespace
        KUEUE: [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "/bin/sh",
            "-c",
            'mkdir -p /etc/kueue/metrics/certs && mount --bind "$0" /etc/kueue/metrics/certs && exec "$@"',
            f"{s}/kueue.d/certs",
            str(bins / KUEUE),
            f"--config={s}/kueue.d/config.yaml",
            "--feature-gates=VisibilityOnDemand=false",
            "--zap-log-level=info",
        ],
        KUBERAY: [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "/bin/sh",
            "-c",
            'mount --bind "$0" /etc/hosts && exec "$@"',
            f"{s}/hosts",
            str(bins / KUBERAY),
            f"--metrics-addr={HOST}:{PORTS['kuberay-metrics']}",
            f"--health-probe-bind-address={HOST}:{PORTS['kuberay-health']}",
            "--enable-leader-election=false",
            "--log-stdout-encoder=console",
            "--reconcile-concurrency=4",
        ],
    }


# ----------------------------------------------------------------------------- KubeRay
def kuberay_enabled() -> bool:
    """RLTUNE_BED_KUBERAY (0/false/no/off: without) when set, else the choice of the last `up`."""
    v = os.environ.get("RLTUNE_BED_KUBERAY")
    f = STATE / "kuberay"
    if v is not None:
        return v.strip().lower() not in ("0", "false", "no", "off")
    return not (f.exists() and f.read_text().strip() == "off")


def components() -> list[str]:
    return [n for n in ORDER if (n != KUBERAY or kuberay_enabled()) and (n != KUEUE or kueue_enabled())]


def kubectl(bins: Path, *args: str, stdin: str | None = None, check: bool = True) -> str:
    r = subprocess.run(
        [str(bins / "kubectl"), f"--kubeconfig={KUBECONFIG}", *args],
        input=stdin,
        capture_output=True,
        text=True,
    )
    if check and r.returncode != 0:
        raise SystemExit(f"kubectl {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


def kuberay_rbac() -> str:
    """Namespace, ServiceAccount, a non-expiring token Secret and the binding of KubeRay's own
    ClusterRole (config/rbac/role.yaml of the module, copied by hack/binaries.sh)."""
    return sa_rbac(KUBERAY_NAMESPACE, KUBERAY, "kuberay-operator")


def sa_rbac(ns: str, sa: str, role: str) -> str:
    """Namespace, ServiceAccount, its non-expiring token Secret, and a binding to ClusterRole `role`."""
    return f"""apiVersion: v1
kind: Namespace
metadata: {{name: {ns}}}
---
apiVersion: v1
kind: ServiceAccount
metadata: {{name: {sa}, namespace: {ns}}}
---
apiVersion: v1
kind: Secret
type: kubernetes.io/service-account-token
metadata:
  name: {sa}-token
  namespace: {ns}
  annotations: {{kubernetes.io/service-account.name: {sa}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: {sa}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {role}}}
subjects: [{{kind: ServiceAccount, name: {sa}, namespace: {ns}}}]
"""


def ensure_kuberay(bins: Path) -> None:
    """KubeRay's CRDs (server-side apply: they are too big for the last-applied annotation), its
    RBAC, and a kubeconfig with its ServiceAccount's token (.state/bed/kuberay-operator.kubeconfig)."""
    kubectl(bins, "apply", "--server-side", "--force-conflicts", "-f", str(bins / "kuberay" / "crd"))
    kubectl(bins, "apply", "--server-side", "--force-conflicts", "-f", str(bins / "kuberay" / "rbac"))
    kubectl(bins, "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=kuberay_rbac())
    kubectl(bins, "wait", "--for=condition=Established", "--timeout=60s", *[f"crd/{c}" for c in KUBERAY_CRDS])
    sa_kubeconfig(bins, KUBERAY_NAMESPACE, KUBERAY, STATE / f"{KUBERAY}.kubeconfig")
    hosts = STATE / "hosts"  # the pod runner keeps it current; it must exist to be mounted
    if not hosts.exists():
        hosts.write_text("127.0.0.1\tlocalhost\n")


def start_kuberay(bins: Path, argv: list[str], wait: bool = True) -> None:
    ensure_kuberay(bins)
    start_process(KUBERAY, argv, env={"KUBECONFIG": str(STATE / f"{KUBERAY}.kubeconfig")}, exe=str(bins / KUBERAY))
    if wait:
        wait_for(KUBERAY, lambda: http_ok(f"http://{HOST}:{PORTS['kuberay-health']}/readyz"), 60, KUBERAY)


def kuberay_switch(on: bool) -> None:
    """Install (operator + CRDs) or remove KubeRay on a running bed; remembered for later `up`s."""
    bins = bin_dir(build=on)
    (STATE / "kuberay").write_text("on" if on else "off")
    if on:
        start_kuberay(bins, component_argv(bins)[KUBERAY])
        print("KubeRay is on")
        return
    stop_process(KUBERAY)
    kubectl(bins, "delete", "--ignore-not-found", "--wait=true", "--timeout=120s", *[f"crd/{c}" for c in KUBERAY_CRDS])
    print("KubeRay is off")


# ----------------------------------------------------------------------------- Kueue
def kueue_enabled() -> bool:
    """RLTUNE_BED_KUEUE (0/false/no/off: without) when set, else the choice of the last `up`."""
    v = os.environ.get("RLTUNE_BED_KUEUE")
    f = STATE / "kueue"
    if v is not None:
        return v.strip().lower() not in ("0", "false", "no", "off")
    return not (f.exists() and f.read_text().strip() == "off")


def kueue_dir() -> Path:
    """Kueue's files (config.yaml, certs/); the file STATE/kueue holds the on/off choice."""
    return STATE / "kueue.d"


def ensure_kueue_cert() -> None:
    """The webhook server's certificate (IP 127.0.0.1), signed by the bed's CA, as Kueue's certDir
    wants it (tls.crt, tls.key); the API server trusts it through the webhooks' caBundle."""
    certs = kueue_dir() / "certs"
    if (certs / "tls.crt").exists() and (certs / "tls.key").exists():
        return
    certs.mkdir(parents=True, exist_ok=True)
    d = str(PKI)
    (PKI / "kueue-webhook.ext").write_text(
        "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
    )
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{d}/kueue-webhook.key",
             "-out", f"{d}/kueue-webhook.csr", "-subj", "/CN=kueue-webhook")  # fmt: skip
    _openssl("x509", "-req", "-in", f"{d}/kueue-webhook.csr", "-CA", f"{d}/ca.crt", "-CAkey", f"{d}/ca.key",
             "-CAcreateserial", "-out", f"{d}/kueue-webhook.crt", "-days", "3650",
             "-extfile", f"{d}/kueue-webhook.ext")  # fmt: skip
    (PKI / "kueue-webhook.key").chmod(0o600)
    shutil.copyfile(PKI / "kueue-webhook.crt", certs / "tls.crt")
    shutil.copyfile(PKI / "kueue-webhook.key", certs / "tls.key")
    (certs / "tls.key").chmod(0o600)


def kueue_config() -> str:
    """Kueue's Configuration: plain pods (pod groups) and, with KubeRay, RayJobs; only objects that
    name a queue are managed; webhooks on loopback with the bed's certificate (no internal cert
    management, no leader election, no metrics server, no visibility API server)."""
    frameworks = ["pod"] + (["ray.io/rayjob"] if kuberay_enabled() else [])
    cfg = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE,
        "health": {"healthProbeBindAddress": f"{HOST}:{PORTS['kueue-health']}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"port": PORTS["kueue-webhook"], "host": HOST, "certDir": str(kueue_dir() / "certs")},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "clientConnection": {"qps": 100, "burst": 200},
        "integrations": {"frameworks": frameworks},
    }
    return json.dumps(cfg, indent=1)  # JSON is YAML


def kueue_webhooks(bins: Path) -> list[dict]:
    """Kueue's own webhook configurations (config/components/webhook/manifests.yaml of the module),
    cut down to Kueue's API group, pods and (with KubeRay) RayJobs, each pointing at the loopback
    webhook server. Pods and RayJobs only when they name a queue (objectSelector): with Kueue down,
    nothing else is ever blocked."""
    import yaml

    ca = base64.b64encode((PKI / "ca.crt").read_bytes()).decode()
    keep_kinds = {"pods"} | ({"rayjobs"} if kuberay_enabled() else set())
    out = []
    docs = [d for d in yaml.safe_load_all((bins / "kueue.d" / "webhook" / "manifests.yaml").read_text()) if d]
    for doc, name in zip(sorted(docs, key=lambda d: d["kind"] != "MutatingWebhookConfiguration"), KUEUE_WEBHOOKS):
        hooks = []
        for h in doc["webhooks"]:
            groups = {g for r in h["rules"] for g in r["apiGroups"]}
            kinds = {k for r in h["rules"] for k in r["resources"]}
            if KUEUE_GROUP not in groups and not kinds & keep_kinds:
                continue
            path = h["clientConfig"]["service"]["path"]
            h["clientConfig"] = {"url": f"https://{HOST}:{PORTS['kueue-webhook']}{path}", "caBundle": ca}
            h["timeoutSeconds"] = 10
            if KUEUE_GROUP not in groups:
                h["objectSelector"] = {"matchExpressions": [{"key": "kueue.x-k8s.io/queue-name", "operator": "Exists"}]}
                h["namespaceSelector"] = {
                    "matchExpressions": [
                        {
                            "key": "kubernetes.io/metadata.name",
                            "operator": "NotIn",
                            "values": ["kube-system", KUEUE_NAMESPACE],
                        }
                    ]
                }
            hooks.append(h)
        meta = {"name": name}
        out.append({"apiVersion": doc["apiVersion"], "kind": doc["kind"], "metadata": meta, "webhooks": hooks})
    return out


def sa_kubeconfig(bins: Path, namespace: str, sa: str, out: Path) -> None:
    """A kubeconfig with the ServiceAccount's token (its `<sa>-token` Secret), like a pod of it has."""

    def token() -> str:
        raw = kubectl(bins, "-n", namespace, "get", "secret", f"{sa}-token", "-o", "json")
        return base64.b64decode(json.loads(raw).get("data", {}).get("token", "")).decode()

    wait_for(f"{sa} ServiceAccount token", token, 30)
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "rltune-bed",
                "cluster": {
                    "server": APISERVER_URL,
                    "certificate-authority-data": base64.b64encode((PKI / "ca.crt").read_bytes()).decode(),
                },
            }
        ],
        "users": [{"name": sa, "user": {"token": token()}}],
        "contexts": [{"name": sa, "context": {"cluster": "rltune-bed", "user": sa, "namespace": namespace}}],
        "current-context": sa,
    }
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(cfg))
    tmp.chmod(0o600)
    tmp.replace(out)


def ensure_kueue(bins: Path) -> None:
    """Kueue's CRDs, its ClusterRole (renamed kueue-manager-role) bound to a ServiceAccount whose
    token Kueue runs with, the webhook configurations, its certificate and Configuration file."""
    import yaml

    kubectl(bins, "apply", "--server-side", "--force-conflicts", "-f", str(bins / "kueue.d" / "crd"))
    role = yaml.safe_load((bins / "kueue.d" / "rbac" / "role.yaml").read_text())
    role["metadata"] = {"name": "kueue-manager-role"}
    rbac = sa_rbac(KUEUE_NAMESPACE, "kueue-controller-manager", "kueue-manager-role")
    # Kueue watches Secrets in its namespace even without internal cert management
    # (config/components/rbac/manager_secrets_role.yaml of the module)
    rbac += f"""---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: kueue-manager-secrets-role, namespace: {KUEUE_NAMESPACE}}}
rules: [{{apiGroups: [""], resources: [secrets], verbs: [get, list, watch, update]}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: kueue-manager-secrets-rolebinding, namespace: {KUEUE_NAMESPACE}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: kueue-manager-secrets-role}}
subjects: [{{kind: ServiceAccount, name: kueue-controller-manager, namespace: {KUEUE_NAMESPACE}}}]
"""
    kubectl(bins, "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=json.dumps(role) + "\n---\n" + rbac)
    files = sorted((bins / "kueue.d" / "crd").glob("*.yaml"))
    crds = [f"crd/{yaml.safe_load(f.read_text())['metadata']['name']}" for f in files]
    kubectl(bins, "wait", "--for=condition=Established", "--timeout=60s", *crds)
    ensure_kueue_cert()
    kueue_dir().mkdir(parents=True, exist_ok=True)
    (kueue_dir() / "config.yaml").write_text(kueue_config())
    hooks = "\n---\n".join(json.dumps(h) for h in kueue_webhooks(bins))
    kubectl(bins, "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=hooks)
    sa_kubeconfig(bins, KUEUE_NAMESPACE, "kueue-controller-manager", STATE / "kueue.kubeconfig")


def start_kueue(bins: Path, argv: list[str], wait: bool = True) -> None:
    ensure_kueue(bins)
    start_process(KUEUE, argv, env={"KUBECONFIG": str(STATE / "kueue.kubeconfig")}, exe=str(bins / KUEUE))
    if wait:
        wait_for(KUEUE, lambda: http_ok(f"http://{HOST}:{PORTS['kueue-health']}/readyz"), 120, KUEUE)


def kueue_strip_finalizers(bins: Path) -> None:
    """With Kueue stopped nothing removes its finalizers: drop them (its objects, and pods it
    manages) so that deleting the CRDs and pods does not hang."""
    import yaml

    files = sorted((bins / "kueue.d" / "crd").glob("*.yaml"))
    kinds = [yaml.safe_load(f.read_text())["spec"]["names"]["plural"] for f in files]
    for kind in [f"{k}.{KUEUE_GROUP}" for k in kinds] + ["pods"]:
        sel = ["-l", "kueue.x-k8s.io/managed=true"] if kind == "pods" else []
        raw = kubectl(bins, "get", kind, "-A", *sel, "-o", "json", check=False)
        for item in json.loads(raw or '{"items": []}').get("items", []):
            md = item["metadata"]
            if not md.get("finalizers"):
                continue
            ns = ["-n", md["namespace"]] if md.get("namespace") else []
            patch = '{"metadata":{"finalizers":null}}'
            kubectl(bins, *ns, "patch", kind, md["name"], "--type=merge", "-p", patch, check=False)


def queue_objects(ns: str, gpus: int, preemption: dict | None = None) -> list[dict]:
    """A ResourceFlavor, ClusterQueue cq-<ns> (namespace `ns` only; `gpus` nvidia.com/gpu, CPU and
    memory plenty: Kueue admits only what its ClusterQueue covers) and LocalQueue `lq` in `ns`, for
    the tests and benches that queue trials on the bed."""
    quota = [
        {"name": "cpu", "nominalQuota": "100000"},
        {"name": "memory", "nominalQuota": "10000Ti"},
        {"name": "nvidia.com/gpu", "nominalQuota": str(gpus)},
    ]
    cluster_queue: dict = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
        "resourceGroups": [
            {
                "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                "flavors": [{"name": f"rf-{ns}", "resources": quota}],
            }
        ],
    }
    if preemption:
        cluster_queue["preemption"] = preemption
    return [
        {"apiVersion": KUEUE_API, "kind": "ResourceFlavor", "metadata": {"name": f"rf-{ns}"}},
        {"apiVersion": KUEUE_API, "kind": "ClusterQueue", "metadata": {"name": f"cq-{ns}"}, "spec": cluster_queue},
        {
            "apiVersion": KUEUE_API,
            "kind": "LocalQueue",
            "metadata": {"name": "lq", "namespace": ns},
            "spec": {"clusterQueue": f"cq-{ns}"},
        },
    ]


def kueue_switch(on: bool) -> None:
    """Install (manager, CRDs, webhooks) or remove Kueue on a running bed; remembered for later `up`s."""
    bins = bin_dir(build=on)
    (STATE / "kueue").write_text("on" if on else "off")
    if on:
        start_kueue(bins, component_argv(bins)[KUEUE])
        print("Kueue is on")
        return
    stop_process(KUEUE)
    kubectl(bins, "delete", "--ignore-not-found", *[f"mutatingwebhookconfiguration/{KUEUE_WEBHOOKS[0]}",
            f"validatingwebhookconfiguration/{KUEUE_WEBHOOKS[1]}"])  # fmt: skip
    kueue_strip_finalizers(bins)
    kubectl(bins, "delete", "--ignore-not-found", "--wait=true", "--timeout=120s", "-f", str(bins / "kueue.d" / "crd"))
    print("Kueue is off")


def is_up() -> bool:
    if not all(running_pid(n) for n in components()):
        return False
    try:
        code, _ = api_get("/readyz", timeout=2)
        return code == 200
    except Exception:  # noqa: BLE001
        return False


def write_env_file() -> None:
    (STATE / "env").write_text(
        f"KUBECONFIG={KUBECONFIG}\nPROMETHEUS_URL={PROMETHEUS_URL}\n"
        f"PUSHGATEWAY_URL={PUSHGATEWAY_URL}\nRLTUNE_BED_STATE={STATE}\n"
        f"RLTUNE_AUDIT_LOG={AUDIT_LOG}\n"
    )


def up(wait: bool = True) -> None:
    t0 = time.time()
    if is_up():
        print(f"test bed is up (kubeconfig {KUBECONFIG})")
        return
    bins = bin_dir(build=True)
    STATE.mkdir(parents=True, exist_ok=True)
    for d in (LOGS, PIDS, STATE / "prometheus" / "targets", STATE / "pods", STATE / "runner"):
        d.mkdir(parents=True, exist_ok=True)
    ensure_pki()
    write_kubeconfig()
    (STATE / "audit-policy.yaml").write_text(audit_policy())
    (STATE / "kwok.yaml").write_text(kwok_config())
    (STATE / "prometheus" / "prometheus.yml").write_text(prometheus_config())
    argv = component_argv(bins)
    fresh = not (STATE / "etcd").exists()

    start_process("etcd", argv["etcd"])
    wait_for("etcd", lambda: http_ok(f"http://{HOST}:{PORTS['etcd']}/health"), 60, "etcd")
    start_process("kube-apiserver", argv["kube-apiserver"])
    wait_for("kube-apiserver", lambda: api_get("/readyz", 2)[0] == 200, 120, "kube-apiserver")
    ensure_crds()
    for name in ("kube-controller-manager", "kube-scheduler", "kwok", "pushgateway", "prometheus"):
        start_process(name, argv[name])
    wait_for("pushgateway", lambda: http_ok(f"{PUSHGATEWAY_URL}/-/ready"), 30, "pushgateway")
    wait_for("prometheus", lambda: http_ok(f"{PROMETHEUS_URL}/-/ready"), 60, "prometheus")

    api = core_api()
    existing = {n.metadata.labels.get("rltune.io/pool") for n in api.list_node().items}
    for p in load_pools():
        if p["name"] in existing:
            continue
        names = create_pool(
            api,
            p["name"],
            p.get("gpuType"),
            int(p.get("nodes", 1)),
            int(p.get("gpusPerNode", 8)),
            str(p.get("cpu", "32")),
            str(p.get("memory", "128Gi")),
            wait_ready=wait,
        )
        log(f"pool {p['name']}: {len(names)} nodes ({p.get('gpuType') or 'cpu'})")
    write_env_file()
    start_process("podrunner", argv["podrunner"])
    if kuberay_enabled():
        start_kuberay(bins, argv[KUBERAY], wait=wait)
    (STATE / "kuberay").write_text("on" if kuberay_enabled() else "off")
    if kueue_enabled():
        start_kueue(bins, argv[KUEUE], wait=wait)
    (STATE / "kueue").write_text("on" if kueue_enabled() else "off")
    if wait:

        def default_sa() -> bool:
            return any(sa.metadata.name == "default" for sa in api.list_namespaced_service_account("default").items)

        wait_for("ServiceAccount default/default", default_sa, 60, "kube-controller-manager")
        wait_for(
            "kube-scheduler",
            lambda: api_get("/api/v1/namespaces/default")[0] == 200 and _healthz(PORTS["kube-scheduler"]),
            60,
            "kube-scheduler",
        )
    log(f"test bed up in {time.time() - t0:.1f}s ({'fresh' if fresh else 'existing data'}); KUBECONFIG={KUBECONFIG}")
    print(f"test bed is up (kubeconfig {KUBECONFIG})")


def _healthz(port: int) -> bool:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(f"https://{HOST}:{port}/healthz", context=ctx, timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def down(keep_data: bool = False) -> None:
    for name in reversed(ORDER):
        stop_process(name)
    # the runner kills its pods' process groups on SIGTERM; sweep leftovers (marked by env)
    for pid in pod_process_pids():
        for kill in (lambda p=pid: os.killpg(p, signal.SIGKILL), lambda p=pid: os.kill(p, signal.SIGKILL)):
            try:
                kill()
            except (ProcessLookupError, PermissionError):
                pass
    if not keep_data:
        for d in ("etcd", "prometheus/data", "runner", "pods"):
            shutil.rmtree(STATE / d, ignore_errors=True)
        (STATE / "pushgateway.db").unlink(missing_ok=True)
        for f in (STATE / "prometheus" / "targets").glob("*.json"):
            f.unlink()
        # memory-backed emptyDirs of its pods (hack/podsandbox.py: PodSandboxes.shm_root)
        shm = "rltune-bed-" + hashlib.sha1(str(STATE.resolve()).encode()).hexdigest()[:8]
        shutil.rmtree(Path("/dev/shm") / shm, ignore_errors=True)
    print("test bed is down")


def pod_process_pids() -> list[int]:
    """pids of pod processes started by the runner for this state dir (marked in environ)."""
    marker = f"RLTUNE_BED_STATE={STATE}".encode()
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            env = (p / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker in env and any(e.startswith(b"RLTUNE_POD_UID=") for e in env):
            out.append(int(p.name))
    return out


def restart(names: list[str]) -> None:
    """Restart some processes of a running bed with the current code and flags (keeps data)."""
    argv = component_argv(bin_dir(build=False))
    (STATE / "audit-policy.yaml").write_text(audit_policy())
    (STATE / "kwok.yaml").write_text(kwok_config())
    (STATE / "prometheus" / "prometheus.yml").write_text(prometheus_config())
    for name in names:
        if name not in argv:
            raise SystemExit(f"unknown process {name}; one of {ORDER}")
        stop_process(name)
        if name == "kwok":
            ensure_crds()
        if name == KUBERAY:
            start_kuberay(bin_dir(build=False), argv[name])
            continue
        if name == KUEUE:
            start_kueue(bin_dir(build=False), argv[name])
            continue
        start_process(name, argv[name])
        if name == "kube-apiserver":
            wait_for("kube-apiserver", lambda: api_get("/readyz", 2)[0] == 200, 120, name)
            ensure_crds()


def status() -> int:
    rc = 0
    for name in ORDER:
        pid = running_pid(name)
        if not pid and name not in components():
            which = "KUEUE=0 / testbed.py kueue" if name == KUEUE else "KUBERAY=0 / testbed.py kuberay"
            print(f"{name:26s} off (RLTUNE_BED_{which} off)")
            continue
        print(f"{name:26s} {'up   pid ' + str(pid) if pid else 'down'}")
        rc |= 0 if pid else 1
    return rc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("up")
    u.add_argument("--no-wait", action="store_true")
    d = sub.add_parser("down")
    d.add_argument("--keep-data", action="store_true", help="keep etcd/prometheus data")
    sub.add_parser("status")
    r = sub.add_parser("restart", help="restart processes of a running bed (keeps data)")
    r.add_argument("names", nargs="+", choices=ORDER)
    sub.add_parser("kubeconfig")
    sub.add_parser("env")
    sub.add_parser("kwok-config")
    k = sub.add_parser("kuberay", help="install / remove KubeRay (operator + CRDs) on a running bed")
    k.add_argument("state", choices=["on", "off"])
    q = sub.add_parser("kueue", help="install / remove Kueue (manager, CRDs, webhooks) on a running bed")
    q.add_argument("state", choices=["on", "off"])
    a = ap.parse_args(argv)
    if a.cmd == "up":
        up(wait=not a.no_wait)
    elif a.cmd == "down":
        down(keep_data=a.keep_data)
    elif a.cmd == "restart":
        restart(a.names)
    elif a.cmd == "status":
        return status()
    elif a.cmd == "kubeconfig":
        print(KUBECONFIG)
    elif a.cmd == "env":
        print(
            f"KUBECONFIG={KUBECONFIG}\nPROMETHEUS_URL={PROMETHEUS_URL}\n"
            f"PUSHGATEWAY_URL={PUSHGATEWAY_URL}\nRLTUNE_BED_STATE={STATE}\nRLTUNE_AUDIT_LOG={AUDIT_LOG}"
        )
    elif a.cmd == "kwok-config":
        print(kwok_config())
    elif a.cmd == "kuberay":
        kuberay_switch(a.state == "on")
    elif a.cmd == "kueue":
        kueue_switch(a.state == "on")
    return 0


if __name__ == "__main__":
    sys.exit(main())
