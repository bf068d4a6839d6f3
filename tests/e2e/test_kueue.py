"""Kueue on the test bed (hack/bed/kueue.py runs Kueue v0.17.0's manager as a local process, its
webhooks on loopback): admission of pod groups against a ClusterQueue's nvidia.com/gpu quota on the
kwok B300 pool, and the operator tuning a twin job through a LocalQueue (resources.queueName) whose
quota admits one trial at a time while budget.parallelTrials is 2.

Each test makes its own ResourceFlavor, ClusterQueue (namespaceSelector: its namespace only) and
LocalQueue, and deletes them afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml

import bed as bedlib
from hack.bed import kuberay, kueue, processes

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "twin-demo.yaml"
GATE = "kueue.x-k8s.io/admission"
KUEUE_API = kueue.API

pytestmark = pytest.mark.bed


@pytest.fixture(scope="module", autouse=True)
def kueue_running(bed):
    if not kueue.enabled() or not processes.running_pid(kueue.NAME):
        pytest.skip("Kueue is off on this bed (hack/testbed.py kueue on)")


def kubectl(bed, *args, input=None, check=True):
    r = subprocess.run(["kubectl", *args], env=bed.env(), capture_output=True, text=True, input=input, timeout=120)
    if check:
        assert r.returncode == 0, f"kubectl {' '.join(args)}: {r.stderr}"
    return r


@pytest.fixture
def queue(bed, namespace, request):
    """LocalQueue `lq` in the test's namespace over a 16-GPU ClusterQueue (indirect param: its
    `preemption`)."""
    docs = kueue.queue_objects(namespace, 16, getattr(request, "param", None))
    kubectl(bed, "apply", "-f", "-", input="\n---\n".join(json.dumps(d) for d in docs))

    def active() -> bool:
        r = kubectl(bed, "get", "clusterqueue", f"cq-{namespace}", "-o", "json", check=False)
        conds = (json.loads(r.stdout).get("status") or {}).get("conditions") or [] if r.returncode == 0 else []
        return any(c["type"] == "Active" and c["status"] == "True" for c in conds)

    bedlib.wait_for(active, 60, what=f"ClusterQueue cq-{namespace} active")
    yield "lq"
    kubectl(bed, "delete", "pods", "--all", "-n", namespace, "--wait=true", "--timeout=60s", check=False)
    for kind, name, ns in (
        ("localqueue", "lq", namespace),
        ("clusterqueue", f"cq-{namespace}", None),
        ("resourceflavor", f"rf-{namespace}", None),
    ):
        args = ["delete", kind, name, "--ignore-not-found", "--wait=true", "--timeout=60s"]
        kubectl(bed, *args, *(["-n", ns] if ns else []), check=False)


def group_pod(name: str, group: str, total: int, queue: str, seconds: float) -> dict:
    """A pod of a Kueue pod group on the B300 pool: 8 GPUs, runs `seconds` (the pod runner)."""
    p = bedlib.gpu_pod(name, 8, image=bedlib.TRIAL_IMAGE)
    p["spec"]["containers"][0]["command"] = ["python", "-c", f"import time; time.sleep({seconds})"]
    p["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": queue, "kueue.x-k8s.io/pod-group-name": group}
    p["metadata"]["annotations"] = {
        "kueue.x-k8s.io/pod-group-total-count": str(total),
        "kueue.x-k8s.io/retriable-in-group": "false",  # as rltune's trial pods: finished once all ended
    }
    return p


def gated(p) -> bool:
    return any(g.name == GATE for g in (p.spec.scheduling_gates or []))


def test_pod_groups_are_admitted_within_the_gpu_quota(bed, namespace, core, queue):
    t0 = time.time()
    for i in range(2):
        core.create_namespaced_pod(namespace, group_pod(f"a-{i}", "group-a", 2, queue, 8))

    def placed(prefix):
        pods = [p for p in core.list_namespaced_pod(namespace).items if p.metadata.name.startswith(prefix)]
        return pods if len(pods) == 2 and all(p.spec.node_name and not gated(p) for p in pods) else None

    first = bedlib.wait_for(lambda: placed("a-"), 60, what="group a admitted and scheduled")
    t_admit = time.time() - t0
    assert all(p.metadata.labels["kueue.x-k8s.io/queue-name"] == "lq" for p in first)
    # a second group of 16 GPUs exceeds the quota while group a holds it: it stays gated, unscheduled
    for i in range(2):
        core.create_namespaced_pod(namespace, group_pod(f"b-{i}", "group-b", 2, queue, 1))
    t1 = time.time()
    while time.time() - t1 < 5:
        b = [p for p in core.list_namespaced_pod(namespace).items if p.metadata.name.startswith("b-")]
        a_running = [p for p in core.list_namespaced_pod(namespace).items if p.metadata.name.startswith("a-")]
        if all(p.status.phase == "Succeeded" for p in a_running):
            break  # group a finished early (a slow machine): the gate check below would be moot
        assert len(b) == 2 and all(gated(p) and not p.spec.node_name for p in b), [
            (p.metadata.name, p.spec.scheduling_gates, p.spec.node_name) for p in b
        ]
        time.sleep(0.5)
    # Kueue says why: the workload of group b has no quota reserved
    wl = json.loads(kubectl(bed, "get", "workloads.kueue.x-k8s.io", "-n", namespace, "-o", "json").stdout)["items"]
    by_group = {w["metadata"]["name"]: w for w in wl}
    assert len(by_group) == 2, list(by_group)
    # group a finishes (its pods exit 0): group b is admitted and runs
    bedlib.wait_for(lambda: placed("b-"), 90, what="group b admitted once group a finished")
    t_second = time.time() - t1
    a = [p for p in core.list_namespaced_pod(namespace).items if p.metadata.name.startswith("a-")]
    assert all(p.status.phase == "Succeeded" for p in a), [(p.metadata.name, p.status.phase) for p in a]
    print(f"\ngroup a admitted+scheduled in {t_admit:.1f}s; group b admitted {t_second:.1f}s after its creation")


@pytest.fixture
def priorities(bed, namespace):
    """WorkloadPriorityClasses low-<ns> (10) and high-<ns> (1000)."""
    names = {f"low-{namespace}": 10, f"high-{namespace}": 1000}
    docs = [
        {"apiVersion": KUEUE_API, "kind": "WorkloadPriorityClass", "metadata": {"name": n}, "value": v}
        for n, v in names.items()
    ]
    kubectl(bed, "apply", "-f", "-", input="\n---\n".join(json.dumps(d) for d in docs))
    yield tuple(names)
    kubectl(bed, "delete", "workloadpriorityclass", *names, "--ignore-not-found", check=False)


@pytest.mark.parametrize("queue", [{"withinClusterQueue": "LowerPriority"}], indirect=True)
def test_kueue_eviction_is_what_the_operator_reads_as_preemption(bed, namespace, core, queue, priorities):
    """A higher-priority group preempts a running one: Kueue marks the evicted pods with the
    TerminationTarget condition (reason WorkloadEvictedDueToPreempted) before deleting them - what
    controller/kueue.py's `evicted` reads as the trial outcome Preempted."""
    from rltune.controller.kueue import PRIORITY_LABEL, evicted

    low, high = priorities
    for i in range(2):
        p = group_pod(f"low-{i}", "group-low", 2, queue, 600)
        p["metadata"]["labels"].update({PRIORITY_LABEL: low, "rltune.io/job": "x"})  # TrialPodWatch's selector
        core.create_namespaced_pod(namespace, p)

    def group(name):
        return core.list_namespaced_pod(namespace, label_selector=f"kueue.x-k8s.io/pod-group-name={name}").items

    bedlib.wait_for(
        lambda: all(p.spec.node_name and p.status.phase == "Running" for p in group("group-low")),
        60,
        what="the low-priority group running",
    )
    seen: dict[str, str] = {}
    api = bed.api_client()

    class Evictions(bedlib.TrialPodWatch):
        def on_event(self, kind, p):
            if p.metadata.name.startswith("low-") and not seen.get(p.metadata.name):
                seen[p.metadata.name] = evicted([api.sanitize_for_serialization(p)])

    watch = Evictions(bed, namespace)
    for i in range(2):
        p = group_pod(f"high-{i}", "group-high", 2, queue, 600)
        p["metadata"]["labels"][PRIORITY_LABEL] = high
        core.create_namespaced_pod(namespace, p)
    bedlib.wait_for(
        lambda: (lambda ps: len(ps) == 2 and all(p.spec.node_name and not gated(p) for p in ps))(group("group-high")),
        90,
        what="the high-priority group admitted",
    )
    bedlib.wait_for(lambda: len([v for v in seen.values() if v]) == 2, 30, what="both low pods marked evicted")
    watch.stop()
    print(f"\n{seen}")
    assert all("WorkloadEvicted" in why and "Preempted" in why for why in seen.values()), seen


def test_pods_without_a_queue_are_not_managed(bed, namespace, core):
    p = bedlib.gpu_pod("plain", 8)
    core.create_namespaced_pod(namespace, p)
    got = bedlib.wait_for(
        lambda: (lambda x: x if x.spec.node_name else None)(core.read_namespaced_pod("plain", namespace)), 30
    )
    assert not gated(got) and not (got.metadata.finalizers or [])


# ----------------------------------------------------------------------------- the operator


class GpuLedger(bedlib.TrialPodWatch):
    """GPUs held by scheduled, not yet finished trial pods, from a watch started before the job."""

    def __init__(self, bed, ns: str):
        self.live: dict[str, int] = {}
        self.peak = 0
        self.peak_trials = 0
        self.gated_seen: set[str] = set()
        self.waited_behind: set[tuple[str, str]] = set()  # (gated trial, trial running meanwhile)
        self.trial_of: dict[str, str] = {}
        self.gated_now: set[str] = set()  # pods still held by Kueue's scheduling gate
        super().__init__(bed, ns, timeout_s=900)

    def on_event(self, kind: str, p) -> None:
        name = p.metadata.name
        self.trial_of[name] = (p.metadata.labels or {}).get("rltune.io/trial", "")
        if gated(p) and kind != "DELETED":
            self.gated_seen.add(name)
            self.gated_now.add(name)
        else:
            self.gated_now.discard(name)
        gpus = sum(
            int(((c.resources and c.resources.requests) or {}).get("nvidia.com/gpu", 0)) for c in p.spec.containers
        )
        if kind != "DELETED" and p.spec.node_name and p.status.phase in (None, "Pending", "Running"):
            self.live[name] = gpus
        else:
            self.live.pop(name, None)
        # a pod is gated from its creation until admission: it waited behind another trial if that
        # one held scheduled pods at any event of its gated time (whichever pod's event came first)
        running = {self.trial_of[n] for n in self.live}
        for g in self.gated_now:
            for other in running - {self.trial_of[g]}:
                self.waited_behind.add((self.trial_of[g], other))
        self.peak = max(self.peak, sum(self.live.values()))
        self.peak_trials = max(self.peak_trials, len({self.trial_of[n] for n in self.live}))


@pytest.fixture
def operator(bed, namespace):
    from hack import demo

    env = bed.env()
    env["RLTUNE_PROMETHEUS_URL"] = bed.prometheus_url
    env["RLTUNE_PUSHGATEWAY_URL"] = bed.pushgateway_url
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "operator"), env.get("PYTHONPATH", "")]))
    demo.apply_crd(env)
    log = Path(bed.state_dir).parent / "e2e" / f"operator-{namespace}.log"
    p = demo.start_operator(env, log, namespaces=(namespace,), metrics_port=0)
    yield env, p, log
    if p.poll() is None:
        kubectl(bed, "delete", "rltuningjobs", "--all", "-n", namespace, "--wait=true", "--timeout=60s", check=False)
        demo.stop_operator(p)


@pytest.mark.slow
def test_operator_tunes_through_a_queue_that_admits_one_trial_at_a_time(bed, namespace, queue, operator):
    env, op, log = operator
    doc = yaml.safe_load(EXAMPLE.read_text())
    # every trial uses the baseline's 16 GPUs (no allowFewerGpus); the job's own GPU budget would run
    # two at once, the ClusterQueue's quota (16) admits one
    doc["spec"]["resources"].update({"gpuBudget": 32, "queueName": queue})
    doc["spec"]["budget"].update({"parallelTrials": 2, "maxTrials": 4, "confirmSteps": 4})
    ledger = GpuLedger(bed, namespace)
    t0 = time.time()
    kubectl(bed, "apply", "-n", namespace, "-f", "-", input=json.dumps(doc))

    def finished():
        assert op.poll() is None, f"operator exited: {log.read_text()[-3000:]}"
        r = kubectl(bed, "get", "rltuningjob", "twin-demo", "-n", namespace, "-o", "json", check=False)
        st = (json.loads(r.stdout).get("status") or {}) if r.returncode == 0 else {}
        return st if st.get("phase") in ("Succeeded", "Failed") else None

    st = bedlib.wait_for(finished, 900, interval=2, what="the job to finish")
    wall = time.time() - t0
    ledger.stop()
    print(
        f"\njob {st['phase']} in {wall:.0f}s; peak GPUs held by scheduled trial pods {ledger.peak} "
        f"(quota 16), peak trials at once {ledger.peak_trials}; {len(ledger.gated_seen)} pods seen gated; "
        f"waited in the queue behind a running trial: {sorted(ledger.waited_behind)}"
    )
    assert st["phase"] == "Succeeded", json.dumps(st, indent=1)[:4000]
    conds = {c["type"]: c for c in st["conditions"]}
    assert conds["QueueAvailable"]["status"] == "True" and conds["QueueAvailable"]["reason"] == "Kueue"
    assert ledger.peak <= 16, ledger.peak
    assert ledger.gated_seen, "no trial pod ever waited for Kueue's admission"
    # parallelTrials 2 and the GPU budget started a second trial while one ran: Kueue held it back
    assert ledger.waited_behind, "no trial ever waited in the queue while another one ran"
    assert all(t["state"] not in ("Unschedulable", "Preempted") for t in st["trials"]), st["trials"]
    # while one trial ran, the other waited in the queue (it said so), and both were counted by the lifecycle
    search = [t for t in st["trials"] if t["kind"] == "search"]
    assert any(t.get("queue") == queue for t in st["trials"]), st["trials"]
    assert search and st["trialsDone"].endswith("/4")


@pytest.mark.slow
def test_a_rayjob_in_a_queue_is_admitted_and_runs(bed, namespace, queue):
    """Kueue's ray.io/rayjob integration on the bed: a RayJob naming the queue is suspended by
    Kueue's webhook, admitted as one workload, and runs to completion (KubeRay, real Ray)."""
    if not kuberay.enabled():
        pytest.skip("KubeRay is off on this bed")
    from test_kuberay import run_rayjob

    t0 = time.time()
    st = run_rayjob(bed, namespace, "queued", gpu_worker=True, queue=queue)
    assert st["jobStatus"] == "SUCCEEDED", st
    wl = json.loads(kubectl(bed, "get", "workloads.kueue.x-k8s.io", "-n", namespace, "-o", "json").stdout)["items"]
    assert len(wl) == 1 and wl[0]["status"].get("admission"), wl
    print(f"\nqueued RayJob admitted and Complete in {time.time() - t0:.0f}s")
