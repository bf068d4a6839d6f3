"""A trial's NetworkPolicy (controller/netpol.py): its shape (name, labels, owner, the trial's pods as
its podSelector, Ingress only), what it admits, judged by the NetworkPolicy ingress rules of
https://kubernetes.io/docs/concepts/services-networking/network-policies/ (peers ORed, a podSelector
without namespaceSelector = the policy's own namespace, an empty selector = everything) over the pods
rltune itself makes (trial ranks, Ray head/workers, KubeRay's submitter) and others; the settings
that shape it; and the reconciler creating it before the trial's pods, dry-run with them, never the
pods without it.

Enforcing it is the network plugin's business (the bed has none: tests/e2e/test_netpol.py checks the
objects on the API server)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from rltune.api.models import RLTuningJobSpec
from rltune.api.status import RLTuningJobStatus, TrialStatus
from rltune.controller import netpol, podspec, rayjob
from rltune.controller import pods as pod_manifests
from rltune.controller.reconcile import Reconciler
from rltune.settings import NetworkPeer, NetworkPolicySettings, OperatorSettings

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "twin-demo.yaml"
OWNER = {
    "apiVersion": "rltune.io/v1alpha1",
    "kind": "RLTuningJob",
    "name": "web",
    "uid": "u-1",
    "controller": True,
    "blockOwnerDeletion": True,
}
KUBERAY_NS = {"kubernetes.io/metadata.name": "kuberay-system"}
KUBERAY_POD = {"app.kubernetes.io/name": "kuberay-operator", "app.kubernetes.io/instance": "kuberay"}
PROM_NS = {"kubernetes.io/metadata.name": "monitoring"}
PROM_POD = {"app.kubernetes.io/name": "prometheus", "prometheus": "kps"}


def _selects(selector: dict, labels: dict) -> bool:
    """A LabelSelector (matchLabels; matchExpressions are not used by rltune) against labels."""
    assert set(selector) <= {"matchLabels"}, selector
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def admits(policy: dict, src_ns: str, src_ns_labels: dict, src_pod: dict, dst_ns: str, dst_pod: dict) -> bool:
    """Whether `policy` (in dst_ns) lets src_pod (in src_ns) connect to dst_pod, by its ingress rules
    alone (a pod no policy selects is not isolated: True)."""
    spec = policy["spec"]
    if policy["metadata"]["namespace"] != dst_ns or not _selects(spec["podSelector"], dst_pod):
        return True
    assert "Ingress" in spec["policyTypes"]
    for rule in spec.get("ingress") or []:
        assert "ports" not in rule  # every port of an admitted peer
        for peer in rule.get("from") or []:
            assert "ipBlock" not in peer
            if "namespaceSelector" in peer:
                ns_ok = _selects(peer["namespaceSelector"], src_ns_labels)
            else:
                ns_ok = src_ns == dst_ns
            if ns_ok and _selects(peer.get("podSelector") or {}, src_pod):
                return True
    return False


def twin_spec(**budget) -> RLTuningJobSpec:
    raw = yaml.safe_load(EXAMPLE.read_text())["spec"]
    raw["budget"].update(budget)
    return RLTuningJobSpec.model_validate(raw)


def trial_pods(trial: str, gpus: int = 16) -> list[dict]:
    spec = twin_spec()
    pods, svc = pod_manifests.trial_manifests(
        "team-a", "web", OWNER, spec, trial, spec.baseline.with_knobs({"gpus": gpus}), 4, 1, None, OperatorSettings()
    )
    assert svc is not None  # 16 GPUs on 8-GPU nodes: two ranks and their rendezvous Service
    return [p["metadata"]["labels"] for p in pods]


def ray_pods(trial: str) -> list[dict]:
    """The labels of the pods of a verl trial's RayJob: head, worker and KubeRay's submitter."""
    from rltune.adapters import registry

    raw = yaml.safe_load((ROOT / "examples" / "verl-dapo-b300.yaml").read_text())["spec"]
    spec = registry.resolve(RLTuningJobSpec.model_validate(raw))
    m = rayjob.rayjob_manifest(
        "team-a", "web", OWNER, spec, trial, spec.baseline, 5, "http://pgw:9091", OperatorSettings()
    )
    submitter = m["spec"]["submitterPodTemplate"]["metadata"]["labels"]
    return [p["metadata"]["labels"] for p in rayjob.pods_of(m)] + [submitter]


def test_the_policy_of_a_trial():
    pol = netpol.trial_policy("team-a", "web", "baseline", OWNER, NetworkPolicySettings())
    assert (pol["apiVersion"], pol["kind"]) == ("networking.k8s.io/v1", "NetworkPolicy")
    md = pol["metadata"]
    # the trial's deterministic name (a re-create after a crash is 409, as for its pods and Service)
    assert (
        md["name"]
        == "web-baseline"
        == pod_manifests.service_name("web", "baseline")
        == netpol.policy_name("web", "baseline")
    )
    assert md["namespace"] == "team-a"
    assert md["labels"][podspec.LABEL_JOB] == "web" and md["labels"][podspec.LABEL_TRIAL] == "baseline"
    assert md["ownerReferences"] == [OWNER]  # the garbage collector takes it with the job
    assert pol["spec"]["podSelector"] == {"matchLabels": {podspec.LABEL_JOB: "web", podspec.LABEL_TRIAL: "baseline"}}
    assert pol["spec"]["policyTypes"] == ["Ingress"]
    long = netpol.trial_policy("team-a", "w" * 70, "c12-retry", None, NetworkPolicySettings())
    assert len(long["metadata"]["name"]) <= 63 and long["metadata"]["ownerReferences"] == []
    assert netpol.trial_policy("team-a", "web", "t1", OWNER, NetworkPolicySettings(enabled=False)) is None


def test_it_selects_every_pod_of_the_trial_and_no_other():
    pol = netpol.trial_policy("team-a", "web", "t2", OWNER, NetworkPolicySettings())
    sel = pol["spec"]["podSelector"]
    mine = trial_pods("t2") + ray_pods("t2")
    assert {p.get(podspec.LABEL_RANK) for p in mine} == {"0", "1", "worker", "submitter"}
    assert all(_selects(sel, p) for p in mine)
    assert not any(_selects(sel, p) for p in trial_pods("t3") + ray_pods("baseline"))
    assert not _selects(sel, {podspec.LABEL_JOB: "web2", podspec.LABEL_TRIAL: "t2"})


def test_it_admits_the_trials_own_pods_kuberay_and_prometheus_and_nobody_else():
    pol = netpol.trial_policy("team-a", "web", "t2", OWNER, NetworkPolicySettings())
    head = ray_pods("t2")[0]
    ns_a = {"kubernetes.io/metadata.name": "team-a"}

    def ok(src_ns: str, ns_labels: dict, src: dict, dst: dict = head) -> bool:
        return admits(pol, src_ns, ns_labels, src, "team-a", dst)

    # the trial's own pods: ranks to each other (rendezvous), Ray workers and the submitter to the head
    for src in trial_pods("t2") + ray_pods("t2"):
        assert ok("team-a", ns_a, src)
    assert ok("team-a", ns_a, trial_pods("t2")[1], trial_pods("t2")[0])
    # the KubeRay operator (it polls the dashboard) and Prometheus, wherever they run
    assert ok("kuberay-system", KUBERAY_NS, KUBERAY_POD)
    assert ok("monitoring", PROM_NS, PROM_POD)
    # everybody else: another trial of the same job, another job's trials, any other pod of the
    # namespace, and a pod with the trial's very labels in another namespace (another tenant's)
    for src in trial_pods("t3") + ray_pods("baseline"):
        assert not ok("team-a", ns_a, src)
    assert not ok("team-a", ns_a, {podspec.LABEL_JOB: "other", podspec.LABEL_TRIAL: "t2"})
    assert not ok("team-a", ns_a, {"app": "web"})
    assert not ok("team-b", {"kubernetes.io/metadata.name": "team-b"}, dict(head))
    assert not ok("team-b", {"kubernetes.io/metadata.name": "team-b"}, {"app.kubernetes.io/name": "kuberay"})
    # a pod no trial policy selects is none of its business
    assert admits(pol, "team-b", {}, {"app": "x"}, "team-a", {"app": "web"})


def test_the_chart_narrows_the_peers_to_their_namespaces():
    s = NetworkPolicySettings(
        kuberay=NetworkPeer(namespace_selector=KUBERAY_NS, pod_selector={"app.kubernetes.io/name": "kuberay-operator"}),
        prometheus=NetworkPeer(namespace_selector=PROM_NS),  # any pod of the monitoring namespace
    )
    pol = netpol.trial_policy("team-a", "web", "t2", OWNER, s)
    head = ray_pods("t2")[0]
    assert admits(pol, "kuberay-system", KUBERAY_NS, KUBERAY_POD, "team-a", head)
    assert admits(pol, "monitoring", PROM_NS, {"app": "anything"}, "team-a", head)
    # a tenant's pod dressed as the KubeRay operator, in its own namespace
    team_b = {"kubernetes.io/metadata.name": "team-b"}
    assert not admits(pol, "team-b", team_b, KUBERAY_POD, "team-a", head)
    assert not admits(pol, "team-b", team_b, PROM_POD, "team-a", head)
    # both selectors empty would admit every pod of the cluster: refused
    with pytest.raises(ValidationError, match="both empty admit every pod"):
        NetworkPeer(namespace_selector={}, pod_selector={})
    loaded = OperatorSettings.model_validate(
        {"networkPolicy": {"enabled": False, "kuberay": {"podSelector": {"app": "kr"}}}}
    ).network_policy
    assert loaded.enabled is False and loaded.kuberay.pod_selector == {"app": "kr"}
    assert loaded.prometheus.pod_selector == {"app.kubernetes.io/name": "prometheus"}


# ----------------------------------------------------------------------------- the reconciler


class Cluster:
    """Records creates and dry runs; `fail` names the objects ("Kind name") whose create raises."""

    def __init__(self, fail: tuple[str, ...] = ()):
        self.calls: list[str] = []
        self.fail = fail

    def refusal(self, manifest):
        self.calls.append(f"dry-run {manifest['kind']}")
        return None

    def list_nodes(self):
        from hack.bed import pools

        return [pools.node_manifest("gpu", i, "B300", 8, "224", "4Ti") for i in range(2)]

    def create(self, manifest):
        self.calls.append(f"create {manifest['kind']} {manifest['metadata']['name']}")
        if f"{manifest['kind']} {manifest['metadata']['name']}" in self.fail:
            raise RuntimeError("the API server is busy")
        return True

    def delete_trial(self, namespace, job, trial, uid):
        self.calls.append(f"delete_trial {trial} {uid}")

    def write_status(self, job, status):
        return job


def body() -> dict:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"] = {"name": "web", "namespace": "team-a", "uid": "u-1", "generation": 1, "resourceVersion": "1"}
    return doc


def test_the_policy_comes_first_with_the_trial_and_is_dry_run_with_it():
    r = Reconciler(Cluster(), settings=OperatorSettings(pushgateway_url="http://pgw:9091"))
    t = TrialStatus(id="baseline", kind="baseline", gpus=16, steps=4)
    manifests = r._manifests(body(), twin_spec(), t)
    assert [m["kind"] for m in manifests] == ["NetworkPolicy", "Service", "Pod", "Pod"]
    pol = manifests[0]
    assert pol["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert pol["metadata"]["ownerReferences"] == manifests[2]["metadata"]["ownerReferences"]
    assert all(_selects(pol["spec"]["podSelector"], m["metadata"]["labels"]) for m in manifests[2:])
    assert r._refusal(manifests, 8) is None
    assert r.cluster.calls == ["dry-run NetworkPolicy", "dry-run Service", "dry-run Pod", "dry-run Pod"]
    off = Reconciler(Cluster(), settings=OperatorSettings(networkPolicy={"enabled": False}))
    assert [m["kind"] for m in off._manifests(body(), twin_spec(), t)] == ["Service", "Pod", "Pod"]


def test_no_pods_without_their_policy():
    """A policy whose create fails (the server busy): that trial's pods wait for the next tick (they
    are still missing then, so the whole trial is created again); another trial's are created."""
    from rltune.tuner import lifecycle

    cluster = Cluster(fail=("NetworkPolicy web-t1",))
    r = Reconciler(cluster, settings=OperatorSettings(pushgateway_url="http://pgw:9091"))
    t1, t2 = (TrialStatus(id=i, gpus=16, steps=4) for i in ("t1", "t2"))
    create = r._manifests(body(), twin_spec(), t1) + r._manifests(body(), twin_spec(), t2)
    before = RLTuningJobStatus()
    r._commit(body(), before, lifecycle.Decisions(status=copy.deepcopy(before), teardown=["t0"]), create, None)
    assert cluster.calls[0] == "delete_trial t0 u-1"  # the teardown names the job's UID
    t2_objects = [
        f"create {m['kind']} {m['metadata']['name']}" for m in create if m["metadata"]["name"].startswith("web-t2")
    ]
    # t1's policy failed: its Service and pods are not created; t2's are, its policy first
    assert [c for c in cluster.calls if c.startswith("create")] == ["create NetworkPolicy web-t1"] + t2_objects
    assert t2_objects[0] == "create NetworkPolicy web-t2" and len(t2_objects) == 4
    cluster.fail = ()
    cluster.calls.clear()
    r._commit(body(), before, lifecycle.Decisions(status=copy.deepcopy(before)), create, None)
    assert cluster.calls == [f"create {m['kind']} {m['metadata']['name']}" for m in create]
