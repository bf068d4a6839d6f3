"""Trials are fenced: the operator (a subprocess, as in test_operator.py) creates one NetworkPolicy per
trial together with its pods and deletes it at the trial's teardown.

The bed runs no network plugin (no CNI: the pod runner runs trial pods as local processes), so no
NetworkPolicy is enforced here; this test checks the objects the API server holds: while a trial's
pods run, its policy exists, selects exactly the trial's pods (rltune.io/job + rltune.io/trial), is
owned by the job, and admits ingress only from the trial's own pods, the KubeRay operator's and
Prometheus' pods (the chart's defaults); once the trial ended, it is gone, while the job still exists
(the teardown deleted it, not the garbage collector).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from test_operator import env_for, job, kubectl, wait  # tests/e2e/test_operator.py

import bed as bedlib
from hack import demo
from hack.bed import pki

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "twin-demo.yaml"

pytestmark = [pytest.mark.bed, pytest.mark.slow]


class Sampler:
    """Every 0.2 s: the trial pods that run and the NetworkPolicies that exist, as the API server has them."""

    def __init__(self, api, ns: str):
        self.core, self.net, self.ns = client.CoreV1Api(api), client.NetworkingV1Api(api), ns
        self.running: dict[str, set[str]] = {}  # trial -> policy names that existed while its pods ran
        self.policies: dict[str, dict] = {}  # name -> the last copy seen
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                pods = self.core.list_namespaced_pod(self.ns, label_selector="rltune.io/job").items
                pols = self.net.list_namespaced_network_policy(self.ns).items
            except Exception:  # noqa: BLE001 - sample again
                time.sleep(0.2)
                continue
            names = set()
            for p in pols:
                d = self.net.api_client.sanitize_for_serialization(p)
                self.policies[p.metadata.name] = d
                names.add(p.metadata.name)
            for p in pods:
                if p.status.phase == "Running":
                    self.running.setdefault(p.metadata.labels["rltune.io/trial"], set()).update(names)
            time.sleep(0.2)

    def stop(self):
        self._stop.set()
        self._t.join(5)


@pytest.fixture
def operator(bed, namespace):
    env = env_for(bed)
    demo.apply_crd(env)
    log = Path(bed.state_dir).parent / "e2e" / f"operator-{namespace}.log"
    # as rltune-operator: the bed's audit log records every request of that user (docs/testbed.md)
    op_env = dict(env, KUBECONFIG=str(pki.operator_kubeconfig()))
    p = demo.start_operator(op_env, log, namespaces=(namespace,), metrics_port=0)
    yield env, p, log
    if p.poll() is None:
        kubectl(env, "delete", "rltuningjobs", "--all", "-n", namespace, "--wait=true", "--timeout=60s", check=False)
        demo.stop_operator(p)


def test_each_trial_has_a_network_policy_while_it_runs(bed, namespace, operator):
    env, op, log = operator
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"]["name"] = "fence"
    doc["spec"]["budget"].update(maxTrials=2, parallelTrials=1)
    # each step takes 1 s of wall time, so the trial's pods run long enough to be sampled
    doc["spec"]["workload"]["env"] = [{"name": "RLTUNE_TWIN_SECONDS_PER_STEP", "value": "1"}]
    sampler = Sampler(bed.api_client(), namespace)
    try:
        kubectl(env, "apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(doc))

        def finished():
            assert op.poll() is None, f"operator exited: {log.read_text()[-3000:]}"
            st = (job(env, namespace, "fence") or {}).get("status") or {}
            return st if st.get("phase") in ("Succeeded", "Failed") else None

        st = wait(finished, 600, "the job to finish", interval=1)
        # the last trial's teardown: nothing active is left, so no policy may remain
        wait(
            lambda: not client.NetworkingV1Api(bed.api_client()).list_namespaced_network_policy(namespace).items,
            60,
            "every trial's NetworkPolicy to be deleted",
        )
    finally:
        sampler.stop()
    uid = job(env, namespace, "fence")["metadata"]["uid"]
    ran = [t["id"] for t in st["trials"] if t.get("startedAt")]
    assert "baseline" in ran and sampler.running, (st["trials"], sampler.running)
    print(f"\njob {st['phase']}; trials seen running, each with its NetworkPolicy: {sorted(sampler.running)}")
    for trial, seen in sampler.running.items():
        name = f"fence-{trial}"
        assert name in seen, f"trial {trial}'s pods ran without their NetworkPolicy {name} (saw {seen})"
        pol = sampler.policies[name]
        md, spec = pol["metadata"], pol["spec"]
        mine = {"rltune.io/job": "fence", "rltune.io/trial": trial}
        assert md["labels"].items() >= mine.items()
        assert [(o["kind"], o["name"], o["uid"], o.get("controller")) for o in md["ownerReferences"]] == [
            ("RLTuningJob", "fence", uid, True)
        ]
        assert spec["podSelector"] == {"matchLabels": mine}
        assert spec["policyTypes"] == ["Ingress"]
        peers = [peer for rule in spec["ingress"] for peer in rule["from"]]
        assert all("ports" not in rule for rule in spec["ingress"])
        assert peers == [
            {"podSelector": {"matchLabels": mine}},  # the trial's own pods only: the same namespace
            {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "kuberay-operator"}}},
            {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}},
        ], peers
        assert "ipBlock" not in str(spec)
    assert job(env, namespace, "fence") is not None  # deleted by the teardown, not by garbage collection
    # the API server's audit log (the operator's own user is logged): each trial's policy was created
    # before any of its pods, and deleted by the operator
    first: dict[tuple[str, str], str] = {}
    deleted = set()
    for ev, ref in bedlib.audit_events(bed, namespace):
        ok = (ev.get("responseStatus") or {}).get("code") in (200, 201) and "dryRun=" not in ev.get("requestURI", "")
        if not ok or ref.get("subresource") or ev["user"]["username"] != pki.OPERATOR_USER:
            continue
        if ev["verb"] == "create" and ref.get("resource") in ("pods", "networkpolicies"):
            trial = ref["name"].removeprefix("fence-").rsplit("-", 1)[0] if ref["resource"] == "pods" else None
            trial = trial or ref["name"].removeprefix("fence-")
            first.setdefault((ref["resource"], trial), ev["requestReceivedTimestamp"])
        if ev["verb"] == "delete" and ref.get("resource") == "networkpolicies":
            deleted.add(ref["name"].removeprefix("fence-"))
    trials = {t for kind, t in first if kind == "pods"}
    assert trials >= set(sampler.running), (trials, sampler.running)
    for t in trials:
        assert first[("networkpolicies", t)] <= first[("pods", t)], (t, first)
    assert deleted == trials, (deleted, trials)
