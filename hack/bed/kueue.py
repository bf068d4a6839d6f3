"""Kueue (sigs.k8s.io/kueue, built by hack/binaries.sh) on the bed: its CRDs, RBAC, webhooks, serving
certificate and Configuration, and its manager as a bed process; plus the queue objects tests and
benches use (`queue_objects`).

It runs by default, like KubeRay: RLTUNE_BED_KUEUE=0 at `up` starts the bed without it; the choice is
kept in .state/bed/kueue; `testbed.py kueue on|off` changes it on a running bed (`switch`).
"""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

from hack.bed import binaries, clients, kuberay, network, paths, pki, processes, serviceaccounts

NAME = "kueue"  # its bed process and binary
NAMESPACE = "kueue-system"
GROUP = "kueue.x-k8s.io"
API = f"{GROUP}/v1beta2"
WEBHOOKS = ("rltune-bed-kueue-mutating", "rltune-bed-kueue-validating")


def enabled() -> bool:
    """RLTUNE_BED_KUEUE (0/false/no/off: without) when set, else the choice of the last `up`."""
    return paths.optional_on("kueue", "RLTUNE_BED_KUEUE")


def command(bins: Path) -> list[str]:
    """Kueue wants its metrics certificate at /etc/kueue/metrics/certs even with metrics off: the
    bed's certificate is bind-mounted there in a private mount namespace."""
    s = str(paths.STATE)
    return processes.in_private_mounts(
        'mkdir -p /etc/kueue/metrics/certs && mount --bind "$0" /etc/kueue/metrics/certs && exec "$@"',
        f"{s}/kueue.d/certs",
        str(bins / NAME),
        f"--config={s}/kueue.d/config.yaml",
        "--feature-gates=VisibilityOnDemand=false",
        "--zap-log-level=info",
    )


def state_dir() -> Path:
    """Kueue's files (config.yaml, certs/); the file .state/bed/kueue holds the on/off choice."""
    return paths.STATE / "kueue.d"


def ensure_cert() -> None:
    """The webhook server's certificate (IP 127.0.0.1), signed by the bed's CA, as Kueue's certDir
    wants it (tls.crt, tls.key); the API server trusts it through the webhooks' caBundle."""
    certs = state_dir() / "certs"
    if (certs / "tls.crt").exists() and (certs / "tls.key").exists():
        return
    certs.mkdir(parents=True, exist_ok=True)
    d = str(paths.PKI)
    (paths.PKI / "kueue-webhook.ext").write_text(
        "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
    )
    pki.openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{d}/kueue-webhook.key",
             "-out", f"{d}/kueue-webhook.csr", "-subj", "/CN=kueue-webhook")  # fmt: skip
    pki.openssl("x509", "-req", "-in", f"{d}/kueue-webhook.csr", "-CA", f"{d}/ca.crt", "-CAkey", f"{d}/ca.key",
             "-CAcreateserial", "-out", f"{d}/kueue-webhook.crt", "-days", "3650",
             "-extfile", f"{d}/kueue-webhook.ext")  # fmt: skip
    (paths.PKI / "kueue-webhook.key").chmod(0o600)
    shutil.copyfile(paths.PKI / "kueue-webhook.crt", certs / "tls.crt")
    shutil.copyfile(paths.PKI / "kueue-webhook.key", certs / "tls.key")
    (certs / "tls.key").chmod(0o600)


def config() -> str:
    """Kueue's Configuration: plain pods (pod groups) and, with KubeRay, RayJobs; only objects that
    name a queue are managed; webhooks on loopback with the bed's certificate (no internal cert
    management, no leader election, no metrics server, no visibility API server)."""
    frameworks = ["pod"] + (["ray.io/rayjob"] if kuberay.enabled() else [])
    cfg = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"{network.HOST}:{network.PORTS['kueue-health']}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {
            "port": network.PORTS["kueue-webhook"],
            "host": network.HOST,
            "certDir": str(state_dir() / "certs"),
        },
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "clientConnection": {"qps": 100, "burst": 200},
        "integrations": {"frameworks": frameworks},
    }
    return json.dumps(cfg, indent=1)  # JSON is YAML


def webhooks(bins: Path) -> list[dict]:
    """Kueue's own webhook configurations (config/components/webhook/manifests.yaml of the module),
    cut down to Kueue's API group, pods and (with KubeRay) RayJobs, each pointing at the loopback
    webhook server. Pods and RayJobs only when they name a queue (objectSelector): with Kueue down,
    nothing else is ever blocked."""
    import yaml

    ca = base64.b64encode((paths.PKI / "ca.crt").read_bytes()).decode()
    keep_kinds = {"pods"} | ({"rayjobs"} if kuberay.enabled() else set())
    out = []
    docs = [d for d in yaml.safe_load_all((bins / "kueue.d" / "webhook" / "manifests.yaml").read_text()) if d]
    for doc, name in zip(sorted(docs, key=lambda d: d["kind"] != "MutatingWebhookConfiguration"), WEBHOOKS):
        hooks = []
        for h in doc["webhooks"]:
            groups = {g for r in h["rules"] for g in r["apiGroups"]}
            kinds = {k for r in h["rules"] for k in r["resources"]}
            if GROUP not in groups and not kinds & keep_kinds:
                continue
            path = h["clientConfig"]["service"]["path"]
            h["clientConfig"] = {
                "url": f"https://{network.HOST}:{network.PORTS['kueue-webhook']}{path}",
                "caBundle": ca,
            }
            h["timeoutSeconds"] = 10
            if GROUP not in groups:
                h["objectSelector"] = {"matchExpressions": [{"key": "kueue.x-k8s.io/queue-name", "operator": "Exists"}]}
                h["namespaceSelector"] = {
                    "matchExpressions": [
                        {
                            "key": "kubernetes.io/metadata.name",
                            "operator": "NotIn",
                            "values": ["kube-system", NAMESPACE],
                        }
                    ]
                }
            hooks.append(h)
        meta = {"name": name}
        out.append({"apiVersion": doc["apiVersion"], "kind": doc["kind"], "metadata": meta, "webhooks": hooks})
    return out


def ensure(bins: Path) -> None:
    """Kueue's CRDs, its ClusterRole (renamed kueue-manager-role) bound to a ServiceAccount whose
    token Kueue runs with, the webhook configurations, its certificate and Configuration file."""
    import yaml

    clients.kubectl(bins, "apply", "--server-side", "--force-conflicts", "-f", str(bins / "kueue.d" / "crd"))
    role = yaml.safe_load((bins / "kueue.d" / "rbac" / "role.yaml").read_text())
    role["metadata"] = {"name": "kueue-manager-role"}
    rbac = serviceaccounts.rbac(NAMESPACE, "kueue-controller-manager", "kueue-manager-role")
    # Kueue watches Secrets in its namespace even without internal cert management
    # (config/components/rbac/manager_secrets_role.yaml of the module)
    rbac += f"""---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: kueue-manager-secrets-role, namespace: {NAMESPACE}}}
rules: [{{apiGroups: [""], resources: [secrets], verbs: [get, list, watch, update]}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: kueue-manager-secrets-rolebinding, namespace: {NAMESPACE}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: kueue-manager-secrets-role}}
subjects: [{{kind: ServiceAccount, name: kueue-controller-manager, namespace: {NAMESPACE}}}]
"""
    clients.kubectl(
        bins, "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=json.dumps(role) + "\n---\n" + rbac
    )
    files = sorted((bins / "kueue.d" / "crd").glob("*.yaml"))
    crds = [f"crd/{yaml.safe_load(f.read_text())['metadata']['name']}" for f in files]
    clients.kubectl(bins, "wait", "--for=condition=Established", "--timeout=60s", *crds)
    ensure_cert()
    state_dir().mkdir(parents=True, exist_ok=True)
    (state_dir() / "config.yaml").write_text(config())
    hooks = "\n---\n".join(json.dumps(h) for h in webhooks(bins))
    clients.kubectl(bins, "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=hooks)
    serviceaccounts.kubeconfig(bins, NAMESPACE, "kueue-controller-manager", paths.STATE / "kueue.kubeconfig")


def start(bins: Path, argv: list[str], wait: bool = True) -> None:
    ensure(bins)
    processes.start(NAME, argv, env={"KUBECONFIG": str(paths.STATE / "kueue.kubeconfig")}, exe=str(bins / NAME))
    if wait:
        url = f"http://{network.HOST}:{network.PORTS['kueue-health']}/readyz"
        processes.wait_for(NAME, lambda: clients.http_ok(url), 120, NAME)


def strip_finalizers(bins: Path) -> None:
    """With Kueue stopped nothing removes its finalizers: drop them (its objects, and pods it
    manages) so that deleting the CRDs and pods does not hang."""
    import yaml

    files = sorted((bins / "kueue.d" / "crd").glob("*.yaml"))
    kinds = [yaml.safe_load(f.read_text())["spec"]["names"]["plural"] for f in files]
    for kind in [f"{k}.{GROUP}" for k in kinds] + ["pods"]:
        sel = ["-l", "kueue.x-k8s.io/managed=true"] if kind == "pods" else []
        raw = clients.kubectl(bins, "get", kind, "-A", *sel, "-o", "json", check=False)
        for item in json.loads(raw or '{"items": []}').get("items", []):
            md = item["metadata"]
            if not md.get("finalizers"):
                continue
            ns = ["-n", md["namespace"]] if md.get("namespace") else []
            patch = '{"metadata":{"finalizers":null}}'
            clients.kubectl(bins, *ns, "patch", kind, md["name"], "--type=merge", "-p", patch, check=False)


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
        {"apiVersion": API, "kind": "ResourceFlavor", "metadata": {"name": f"rf-{ns}"}},
        {"apiVersion": API, "kind": "ClusterQueue", "metadata": {"name": f"cq-{ns}"}, "spec": cluster_queue},
        {
            "apiVersion": API,
            "kind": "LocalQueue",
            "metadata": {"name": "lq", "namespace": ns},
            "spec": {"clusterQueue": f"cq-{ns}"},
        },
    ]


def switch(on: bool) -> None:
    """Install (manager, CRDs, webhooks) or remove Kueue on a running bed; remembered for later `up`s."""
    bins = binaries.bin_dir(build=on)
    paths.remember_choice("kueue", on)
    if on:
        start(bins, command(bins))
        print("Kueue is on")
        return
    processes.stop(NAME)
    clients.kubectl(bins, "delete", "--ignore-not-found", *[f"mutatingwebhookconfiguration/{WEBHOOKS[0]}",
            f"validatingwebhookconfiguration/{WEBHOOKS[1]}"])  # fmt: skip
    strip_finalizers(bins)
    clients.kubectl(
        bins, "delete", "--ignore-not-found", "--wait=true", "--timeout=120s", "-f", str(bins / "kueue.d" / "crd")
    )
    print("Kueue is off")
