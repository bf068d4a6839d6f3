"""The chart's ValidatingAdmissionPolicy on a real API server (the bed's kube-apiserver 1.34): with
the chart installed, the API server itself refuses a pod that is not restricted or asks for more
than the podSecurity values allow, when the operator's ServiceAccount creates it (kubectl
impersonating system:serviceaccount:NS:SA, which is how the API server sees the operator), so a bug
in rltune's own check (controller/podsecurity.py) could not create it either. The operator's own
trial pods, Ray pods and RayJobs pass it; the same privileged pod created by another user is not
the policy's business; relaxing a podSecurity value relaxes the policy too.

The watched namespace carries no Pod Security label on purpose: what refuses here is the policy,
not the API server's PodSecurity admission."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path

import pytest
import yaml

import bed as bedlib
from hack import demo
from hack.bed import kuberay
from rltune.adapters import registry
from rltune.api.models import RLTuningJobSpec
from rltune.controller import pods as pod_manifests
from rltune.controller import rayjob as trial_rayjobs
from rltune.settings import OperatorSettings

ROOT = Path(__file__).resolve().parents[2]
DENIED = "rltune admission policy: "
IMAGE = "registry.k8s.io/pause:3.10"

pytestmark = [pytest.mark.bed, pytest.mark.slow]


def restricted_pod(name: str) -> dict:
    """A pod that meets the restricted profile and asks for nothing the chart's defaults refuse."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "main",
                    "image": IMAGE,
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                }
            ],
        },
    }


def privileged_pod(name: str) -> dict:
    pod = restricted_pod(name)
    pod["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    return pod


def with_volume(name: str, volume: dict) -> dict:
    pod = restricted_pod(name)
    pod["spec"]["volumes"] = [{"name": "v", **volume}]
    return pod


NFS = {"nfs": {"server": "10.0.0.5", "path": "/exports"}}
CSI = {"csi": {"driver": "inline.csi.example.com"}}


def create(env: dict, ns: str, obj: dict, user: str | None, dry_run: bool) -> subprocess.CompletedProcess:
    args = ["kubectl", "create", "-n", ns, "-f", "-", "-o", "name"]
    if dry_run:
        args.append("--dry-run=server")
    if user:
        args.append(f"--as={user}")
    return subprocess.run(args, env=env, input=json.dumps(obj), capture_output=True, text=True, timeout=60)


def run_kubectl(env: dict, *args: str) -> str:
    r = subprocess.run(["kubectl", *args, "-o", "json"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def refused(r: subprocess.CompletedProcess, message: str) -> bool:
    return r.returncode != 0 and DENIED in r.stderr and message in r.stderr


@pytest.fixture
def release(bed, core, namespace):
    """The chart installed into its own namespace, watching only `namespace`; (env, release, sys_ns, user)."""
    env = bedlib.chart_env(bed)
    sys_ns = bedlib.unique("rltune-vap")
    name = "rl" + sys_ns[-6:]
    demo.helm_install(env, name, sys_ns, watch=(namespace,))
    pod = bedlib.wait_for(lambda: demo.operator_pod(env, name, sys_ns), 60, what="the operator pod")
    user = f"system:serviceaccount:{sys_ns}:{pod['spec']['serviceAccountName']}"
    # the policy takes effect once the API server's policy informer has it: wait for a refusal
    bedlib.wait_for(
        lambda: refused(create(env, namespace, privileged_pod("probe"), user, True), "privileged"),
        30,
        interval=0.5,
        what="the admission policy to refuse a privileged pod",
    )
    yield env, name, sys_ns, user
    subprocess.run(["helm", "uninstall", name, "-n", sys_ns, "--wait"], env=env, capture_output=True, timeout=120)
    subprocess.run(["kubectl", "delete", "namespace", sys_ns, "--wait=false"], env=env, capture_output=True)


def twin_spec(**resources) -> RLTuningJobSpec:
    raw = yaml.safe_load((ROOT / "examples" / "twin-demo.yaml").read_text())["spec"]
    raw["resources"].update(resources)
    return RLTuningJobSpec.model_validate(raw)


TEMPLATE = {  # what a tenant may ask for: a sidecar, a scratch volume and a mount (all restricted after the merge)
    "volumes": [{"name": "scratch", "emptyDir": {}}],
    "containers": [
        {"name": "trial", "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]},
        {"name": "sidecar", "image": IMAGE},
    ],
}


def test_the_api_server_refuses_what_the_operators_service_account_may_not_create(bed, core, namespace, release):
    env, name, sys_ns, user = release
    cases = [
        (privileged_pod("vap-privileged"), "spec.containers[*].securityContext.privileged must not be true"),
        (with_volume("vap-nfs", NFS), "spec.volumes[*] may use only the restricted Pod Security Standard's"),
        (with_volume("vap-csi", CSI), "spec.volumes[*].csi (inline CSI volumes) is not allowed"),
        (
            with_volume("vap-token", {"projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}),
            "spec.volumes[*].projected.sources may be only",
        ),
    ]
    prio = restricted_pod("vap-priority")
    prio["spec"]["priorityClassName"] = "system-cluster-critical"  # the API server's own class: it exists
    cases.append((prio, "spec.priorityClassName"))
    token = restricted_pod("vap-automount")  # the ServiceAccount admission plugin then adds a projected token
    del token["spec"]["automountServiceAccountToken"]
    cases.append((token, "podSecurity.allowServiceAccount"))
    for pod, message in cases:
        r = create(env, namespace, pod, user, dry_run=False)  # for real: refused, nothing is created
        assert refused(r, message), (pod["metadata"]["name"], r.stdout, r.stderr)
        assert "ValidatingAdmissionPolicy" in r.stderr and "podSecurity." in r.stderr, r.stderr
        assert "Forbidden" in r.stderr, r.stderr
        # the policy is about the operator's identity only: the bed's admin may (the namespace enforces nothing)
        r = create(env, namespace, pod, None, dry_run=True)
        assert r.returncode == 0, (pod["metadata"]["name"], r.stderr)
    assert core.list_namespaced_pod(namespace).items == []

    # the API server type-checked every expression against the Pod and RayJob schemas: no warnings
    def checked(policy: str) -> dict | None:
        p = json.loads(run_kubectl(env, "get", "validatingadmissionpolicy", policy))
        return p if (p.get("status") or {}).get("observedGeneration") else None

    for kind in ("pods", "rayjobs"):
        pol = bedlib.wait_for(lambda kind=kind: checked(f"{name}-rltune-{sys_ns}-{kind}"), 30, what="a type check")
        assert not (pol["status"].get("typeChecking") or {}).get("expressionWarnings"), pol["status"]

    # what the operator really creates passes: a restricted pod, its trial pods with a tenant's
    # template merged in, and a verl trial's Ray pods as the operator dry-runs them
    r = create(env, namespace, restricted_pod("vap-restricted"), user, dry_run=True)
    assert r.returncode == 0, r.stderr
    settings = OperatorSettings()
    spec = twin_spec(podTemplate=copy.deepcopy(TEMPLATE))
    pods, _ = pod_manifests.trial_manifests(
        namespace, "vap", None, spec, "t1", spec.baseline, 3, 1, bed.pushgateway_url, settings
    )
    raw = yaml.safe_load((ROOT / "examples" / "verl-dapo-b300.yaml").read_text())["spec"]
    raw["resources"]["podTemplate"] = copy.deepcopy(TEMPLATE)
    verl = registry.resolve(RLTuningJobSpec.model_validate(raw))
    rayjob = trial_rayjobs.rayjob_manifest(
        namespace, "vap", None, verl, "t1", verl.baseline, 3, bed.pushgateway_url, settings
    )
    for pod in pods + trial_rayjobs.pods_of(rayjob):
        assert {"trial", "sidecar"} <= {c["name"] for c in pod["spec"]["containers"]}
        r = create(env, namespace, pod, user, dry_run=True)
        assert r.returncode == 0, (pod["metadata"]["name"], r.stderr)


def test_rayjobs_of_the_operator_are_checked_on_their_pod_templates(bed, namespace, release):
    if not kuberay.enabled():
        pytest.skip("the bed runs without KubeRay (no ray.io RayJob kind)")
    env, name, sys_ns, user = release
    settings = OperatorSettings()
    raw = yaml.safe_load((ROOT / "examples" / "verl-dapo-b300.yaml").read_text())["spec"]
    spec = registry.resolve(RLTuningJobSpec.model_validate(raw))
    rayjob = trial_rayjobs.rayjob_manifest(
        namespace, "vap", None, spec, "t1", spec.baseline, 3, bed.pushgateway_url, settings
    )
    r = create(env, namespace, rayjob, user, dry_run=True)
    assert r.returncode == 0, r.stderr
    # a worker template with an NFS volume, a head container that is privileged: each refused
    bad_worker = copy.deepcopy(rayjob)
    bad_worker["metadata"]["name"] = "vap-worker"
    worker = bad_worker["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]
    worker["volumes"] = [{"name": "v", **NFS}]
    bad_head = copy.deepcopy(rayjob)
    bad_head["metadata"]["name"] = "vap-head"
    bad_head["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["securityContext"] = {
        "privileged": True
    }
    for obj, message in ((bad_worker, "spec.volumes[*] may use only"), (bad_head, "privileged must not be true")):
        r = create(env, namespace, obj, user, dry_run=True)
        assert refused(r, message), (obj["metadata"]["name"], r.stderr)
        assert create(env, namespace, obj, None, dry_run=True).returncode == 0  # another user: not matched


def test_a_relaxed_podsecurity_value_relaxes_the_policy_too(bed, namespace, release):
    env, name, sys_ns, user = release
    pod = with_volume("vap-csi", CSI)
    assert refused(create(env, namespace, pod, user, dry_run=True), "inline CSI volumes")
    demo.helm_install(env, name, sys_ns, watch=(namespace,), extra=("--set", "podSecurity.allowCsiVolumes=true"))
    bedlib.wait_for(
        lambda: create(env, namespace, pod, user, dry_run=True).returncode == 0,
        30,
        interval=0.5,
        what="the relaxed policy to accept an inline CSI volume",
    )
    # only that: an NFS volume is still refused
    assert refused(create(env, namespace, with_volume("vap-nfs", NFS), user, dry_run=True), "may use only")
