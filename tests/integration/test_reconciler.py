"""The reconciler on the real test bed: no fake cluster, no fake Prometheus, no fake tuner.

Each test creates an RLTuningJob in its own namespace on the real kube-apiserver and drives the real
`Reconciler` (with `KubeCluster`, the real `rltune.tuner` and PromQL scoring) by calling
`reconcile()` in a loop, the way the operator's kopf timer does, but deterministically and without
kopf. Trial pods are placed by kube-scheduler on kwok nodes and run as local processes by the pod
runner (the digital twin, milliseconds per trial); they push to the real Pushgateway and are scored
from the real Prometheus. Every fault is produced for real:

- a restarted operator: a brand-new Reconciler (and API client) at every tick, and a second one
  racing it, with pod creations counted in the apiserver's audit log;
- the GPU budget: a watch on the trial pods sums their nvidia.com/gpu requests;
- failed trials: configurations the forecaster believes fit but that run out of memory in the twin
  (trainer TP 1, no/selective recompute on 8 GPUs: exit 137, "CUDA out of memory");
- missing metrics: a workload that exits 0 without pushing, or pushes fewer steps than asked;
- unschedulable trials: a private one-node pool (tainted so nothing else lands there) for a
  2-pod trial;
- an invalid spec: a private copy of the CRD without its CEL rules (a CRD older than the operator),
  since the real CRD rejects every spec pydantic rejects (tests/integration/test_crd.py).

Raising budget.maxTrials on a finished job (resume) is covered on the bed by
tests/e2e/test_operator.py::test_twin_demo_end_to_end and not repeated here; so is the plain
lifecycle to Succeeded, which the restart test below also walks through.
"""

from __future__ import annotations

import copy
import json
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Callable, Optional

import pytest
import requests
import yaml

import bed as bedlib
from hack.bed import pools
from hack.demo import wait_crd_established
from rltune.api.crdgen import GROUP, PLURAL, VERSION
from rltune.api.layout import nodes_for
from rltune.controller import pods as pod_manifests
from rltune.controller import podspec, prom
from rltune.controller.kube import KubeCluster
from rltune.controller.reconcile import Reconciler
from rltune.tuner.records import unflatten_summary

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "twin-demo.yaml"
CRD = ROOT / "crds" / "rltuningjobs.yaml"
TERMINAL = ("Succeeded", "Failed")

pytestmark = pytest.mark.bed

# pinning every knob the catalog would move (an empty list pins a knob to the baseline value)
ALL_KNOBS = [
    "placement",
    "trainer.tp",
    "trainer.pp",
    "trainer.cp",
    "trainer.ep",
    "trainer.etp",
    "trainer.microBatchTokens",
    "trainer.recompute",
    "trainer.offload",
    "rollout.tp",
    "rollout.expertParallel",
    "rollout.gpuMemoryUtilization",
    "rollout.maxNumSeqs",
    "rollout.maxNumBatchedTokens",
    "rollout.cudaGraphs",
    "rollout.fp8",
    "async.staleness",
    "async.partialRollout",
    "weightSync",
]


def only_knobs(**moving: list) -> dict:
    """searchSpace.knobs that pins every knob except the given ones (dots written as __)."""
    moving = {k.replace("__", "."): v for k, v in moving.items()}
    return {k: list(moving.get(k, [])) for k in ALL_KNOBS} | {k: v for k, v in moving.items() if k not in ALL_KNOBS}


# ------------------------------------------------------------------------------------ fixtures


def _kubectl(bed, *args, input=None):
    import subprocess

    r = subprocess.run(
        [str(bed.bin_dir / "kubectl"), *args], env=bed.env(), capture_output=True, text=True, input=input, timeout=60
    )
    assert r.returncode == 0, f"kubectl {' '.join(args)}: {r.stderr}"
    return r.stdout


@pytest.fixture(scope="module")
def crd(bed):
    """The CRD, and the in-process operator settings pointed at the bed's Prometheus and Pushgateway
    (the endpoints the jobs here name: the operator's own, so allowed)."""
    from rltune import settings

    _kubectl(bed, "apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    wait_crd_established(bed.env(), f"{PLURAL}.{GROUP}", kubectl_bin=str(bed.bin_dir / "kubectl"))
    before = settings._current
    settings.install(
        settings.OperatorSettings(prometheus={"url": bed.prometheus_url}, pushgatewayUrl=bed.pushgateway_url)
    )
    yield bed
    settings._current = before


@pytest.fixture
def ns(crd, namespace):
    """The test's namespace; its Pushgateway groups are deleted afterwards."""
    yield namespace
    try:
        groups = requests.get(f"{crd.pushgateway_url}/api/v1/metrics", timeout=5).json()["data"]
        for g in groups:
            lb = g["labels"]
            if lb.get("namespace") == namespace and lb.get("job") == "rltune-trial":
                prom.delete_group(crd.pushgateway_url, namespace, lb.get("rltune_job", ""), lb.get("trial", ""))
    except requests.RequestException:
        pass


def job_doc(bed, name: str = "tune", **budget) -> dict:
    """A small twin job (twin-demo's workload) scored from the bed's Prometheus."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"] = {"name": name}
    s = doc["spec"]
    s["metrics"] = {"prometheusUrl": bed.prometheus_url, "pushgatewayUrl": bed.pushgateway_url}
    s["budget"] = {
        "maxTrials": 2,
        "parallelTrials": 2,
        "stepsPerTrial": 3,
        "warmupSteps": 1,
        "confirmSteps": 0,
        "maxFailedTrials": 6,
        "trialTimeoutSeconds": 120,
        "scheduleTimeoutSeconds": 60,
        "metricsTimeoutSeconds": 30,
    } | budget
    return doc


def create_job(bed, ns: str, doc: dict, group: str = GROUP, plural: str = PLURAL) -> dict:
    from kubernetes import client

    custom = client.CustomObjectsApi(bed.api_client())
    doc = copy.deepcopy(doc)
    doc["apiVersion"] = f"{group}/{VERSION}"
    return custom.create_namespaced_custom_object(group, VERSION, ns, plural, doc)


def get_job(bed, ns: str, name: str, group: str = GROUP, plural: str = PLURAL) -> dict:
    from kubernetes import client

    return client.CustomObjectsApi(bed.api_client()).get_namespaced_custom_object(group, VERSION, ns, plural, name)


class Events(list):
    """What the reconciler asked to post as Kubernetes events (kopf posts them in the operator)."""

    def emit(self, body, type_, reason, message):
        self.append((reason, message))

    def reasons(self) -> Counter:
        return Counter(r for r, _ in self)


def drive(
    bed,
    ns: str,
    name: str,
    *,
    timeout: float = 120.0,
    interval: float = 0.25,
    fresh_each_tick: bool = False,
    racer: bool = False,
    on_tick: Optional[Callable[[Optional[str]], None]] = None,
    cluster: Callable[[], KubeCluster] | None = None,
    events: Optional[Events] = None,
) -> dict:
    """Tick the reconciler until the job is Succeeded/Failed; return its status.

    fresh_each_tick: a new Reconciler and API client at every tick (an operator restarted between any
    two ticks). racer: on every other tick a second reconciler runs the same tick concurrently (two
    operator replicas without peering) - the resourceVersion precondition must keep them apart."""
    events = events if events is not None else Events()
    make_cluster = cluster or (lambda: KubeCluster(bed.api_client()))

    def make() -> Reconciler:
        return Reconciler(make_cluster(), emit=events.emit)

    r = make()
    deadline = time.time() + timeout
    n = 0
    while True:
        if fresh_each_tick:
            r = make()
        if racer and n % 2:
            other, out = make(), []
            th = threading.Thread(target=lambda out=out, other=other: out.append(other.reconcile(ns, name)))
            th.start()
            phase = r.reconcile(ns, name)
            th.join()
        else:
            phase = r.reconcile(ns, name)
        n += 1
        if on_tick:
            on_tick(phase)
        if phase in TERMINAL or phase is None:
            break
        if time.time() > deadline:
            st = get_job(bed, ns, name, **_group_of(make_cluster()))["status"]
            raise TimeoutError(f"job {ns}/{name} still {phase} after {timeout}s: {json.dumps(st, indent=1)[:3000]}")
        time.sleep(interval)
    return get_job(bed, ns, name, **_group_of(make_cluster())).get("status") or {}


def _group_of(c: KubeCluster) -> dict:
    return {"group": c.group, "plural": c.plural}


def trial(st: dict, tid: str) -> dict:
    return next(t for t in st["trials"] if t["id"] == tid)


def conditions(st: dict) -> dict:
    return {c["type"]: c for c in st.get("conditions") or []}


pod_creations = bedlib.pod_creations


def audit_codes(bed, ns: str) -> dict[str, Counter]:
    """HTTP codes of pod creations and job status writes in the namespace (409 = lost a race)."""
    out: dict[str, Counter] = {"pods": Counter(), "rltuningjobs/status": Counter()}
    for ev, ref in bedlib.audit_events(bed, ns):
        code = (ev.get("responseStatus") or {}).get("code")
        if (
            ev.get("verb") == "create"
            and ref.get("resource") == "pods"
            and not ref.get("subresource")
            and "dryRun=" not in ev.get("requestURI", "")
        ):
            out["pods"][code] += 1
        elif (ref.get("resource"), ref.get("subresource"), ev.get("verb")) == ("rltuningjobs", "status", "update"):
            out["rltuningjobs/status"][code] += 1
    return out


def pod_gpus(pod) -> int:
    return sum(
        int(((c.resources and c.resources.requests) or {}).get(podspec.GPU_RESOURCE, 0)) for c in pod.spec.containers
    )


def holds_gpus(pod) -> bool:
    """A trial pod the reconciler counts against the budget: not terminated and not being deleted."""
    return pod.status.phase in (None, "Pending", "Running") and pod.metadata.deletion_timestamp is None


class PodLedger(bedlib.TrialPodWatch):
    """A watch on the namespace's trial pods, from before the job exists: every pod event updates the
    GPUs held by live trial pods; the peak is what the cluster actually saw."""

    def __init__(self, bed, ns: str):
        self.live: dict[str, int] = {}
        self.peak = 0
        self.peak_with_terminating = 0  # pods being deleted still hold their GPUs until their process exits
        self.peak_trials = 0  # most trials with live pods at once
        self.pods: dict[str, object] = {}
        self._alive_any: dict[str, int] = {}
        super().__init__(bed, ns, timeout_s=600)

    def on_event(self, kind: str, p) -> None:
        name = p.metadata.name
        self.pods[name] = p
        if kind != "DELETED" and holds_gpus(p):
            self.live[name] = pod_gpus(p)
        else:
            self.live.pop(name, None)
        if kind != "DELETED" and p.status.phase in (None, "Pending", "Running"):
            self._alive_any[name] = pod_gpus(p)
        else:
            self._alive_any.pop(name, None)
        self.peak = max(self.peak, sum(self.live.values()))
        self.peak_trials = max(
            self.peak_trials, len({self.pods[n].metadata.labels.get(podspec.LABEL_TRIAL) for n in self.live})
        )
        self.peak_with_terminating = max(self.peak_with_terminating, sum(self._alive_any.values()))


# ------------------------------------------------------------------------------------ tests


def test_restart_every_tick_never_duplicates_pods(bed, ns):
    """A new Reconciler and API client at every tick (an operator restarted between any two ticks),
    and on every other tick a second reconciler racing it: the job still goes Profiling -> Searching
    -> Confirming -> Succeeded, and the audit log shows no pod name created twice."""
    doc = job_doc(bed, maxTrials=3, parallelTrials=2, confirmSteps=2)
    create_job(bed, ns, doc)
    phases: list[str] = []
    events = Events()
    st = drive(
        bed,
        ns,
        "tune",
        fresh_each_tick=True,
        racer=True,
        events=events,
        timeout=150,
        on_tick=lambda ph: phases.append(ph) if ph and (not phases or phases[-1] != ph) else None,
    )

    assert st["phase"] == "Succeeded", json.dumps(st, indent=1)[:3000]
    assert phases[0] == "Profiling" and "Searching" in phases and phases[-1] == "Succeeded", phases
    ids = [t["id"] for t in st["trials"]]
    assert ids[0] == "baseline" and len(ids) == len(set(ids)), ids
    search = [t for t in st["trials"] if t["kind"] == "search"]
    assert search and st["trialsDone"].endswith("/3")
    assert all(t["state"] not in ("Pending", "Running", "Scoring") for t in st["trials"])
    cond = conditions(st)["Complete"]
    assert cond["status"] == "True" and cond["reason"] in ("Improved", "NoImprovement")
    if cond["reason"] == "Improved":  # the winner was re-run as a confirmation trial
        assert any(t["kind"] == "confirm" for t in st["trials"]) and st["best"]["confirmed"]
    assert st["baseline"]["stepSeconds"] > 0 and st["baseline"]["bottleneck"]
    # the default reward gate (nonInferiority) states its power through the real API server: a 3-step
    # baseline with 1 warm-up step leaves 2 rewards, too few to estimate the reward noise
    power = conditions(st)["RewardGatePowered"]
    assert (power["status"], power["reason"]) == ("Unknown", "NoNoiseEstimate"), power

    creations = pod_creations(bed, ns)
    assert creations, "no pod creation in the audit log"
    codes = audit_codes(bed, ns)
    print(
        f"\nphases {phases}; audit log: pod creates by HTTP code {dict(codes['pods'])}, "
        f"status writes by code {dict(codes['rltuningjobs/status'])}"
    )
    assert codes["rltuningjobs/status"][409] >= 1, "the two reconcilers never raced on a status write"
    dups = {n: k for n, k in creations.items() if k > 1}
    assert not dups, f"pods created more than once: {dups}"
    # every trial that ran had all its pods (16 GPUs on 8-GPU nodes: ranks 0 and 1), each created once
    for t in st["trials"]:
        if t.get("startedAt"):
            n = nodes_for(t["gpus"], 8)
            assert {pod_manifests.pod_name("tune", t["id"], r) for r in range(n)} <= set(creations), (
                t["id"],
                creations,
            )
    # each result reported once, although two reconcilers raced on half of the ticks
    finished = sum(k for r, k in events.reasons().items() if r.startswith("Trial") and r != "TrialStarted")
    assert finished == len(st["trials"]), events
    # the finished job is left alone: no status rewrite, every pod torn down
    rv = get_job(bed, ns, "tune")["metadata"]["resourceVersion"]
    for _ in range(2):
        assert Reconciler(KubeCluster(bed.api_client())).reconcile(ns, "tune") == "Succeeded"
    assert get_job(bed, ns, "tune")["metadata"]["resourceVersion"] == rv
    core = bed.core()
    bedlib.wait_for(
        lambda: not [p for p in core.list_namespaced_pod(ns).items if p.metadata.deletion_timestamp is None],
        30,
        what="trial pods torn down",
    )


def test_gpu_budget_respected_across_running_trials(bed, ns):
    """gpuBudget 16, trials of 8 or 16 GPUs (allowFewerGpus, minGpus 8), parallelTrials 3 (so only the
    budget can stop a third trial), each trial running a few seconds: the nvidia.com/gpu requests of
    live trial pods never add up to more than 16, checked at every tick and on every pod event of a watch."""
    doc = job_doc(bed, maxTrials=5, parallelTrials=3, stepsPerTrial=3)
    doc["spec"]["objective"] = "gpuSecondsPerStep"  # makes 8-GPU configurations attractive: two fit at once
    doc["spec"]["searchSpace"] = {"frozen": ["rollout.fp8"], "allowFewerGpus": True, "minGpus": 8}
    doc["spec"]["workload"]["env"] = [{"name": "RLTUNE_TWIN_SECONDS_PER_STEP", "value": "0.7"}]
    ledger = PodLedger(bed, ns)
    create_job(bed, ns, doc)
    core = bed.core()
    samples: list[int] = []

    def sample(_phase):
        live = [p for p in core.list_namespaced_pod(ns, label_selector=podspec.LABEL_JOB).items if holds_gpus(p)]
        samples.append(sum(pod_gpus(p) for p in live))
        assert samples[-1] <= 16, [(p.metadata.name, pod_gpus(p), p.status.phase) for p in live]

    st = drive(bed, ns, "tune", on_tick=sample, timeout=150)
    ledger.stop()
    assert st["phase"] == "Succeeded", json.dumps(st, indent=1)[:3000]
    assert ledger.peak <= 16, ledger.peak
    search = [t for t in st["trials"] if t["kind"] == "search"]
    spans = [(t["id"], t["createdAt"], t.get("finishedAt"), t["gpus"]) for t in search]
    print(
        f"\nGPU peak {ledger.peak} (incl. pods still terminating: {ledger.peak_with_terminating}), "
        f"most trials at once {ledger.peak_trials}; search trials (id, created, finished, gpus): {spans}"
    )
    assert max(samples) == 16  # the budget was actually used up, not trivially respected
    assert {t["gpus"] for t in search} <= {8, 16} and any(t["gpus"] == 8 for t in search), search
    # two trials did run at once (two 8-GPU ones fit), never three although parallelTrials allows it
    assert ledger.peak_trials == 2, spans


def _oom_job(bed, **budget) -> dict:
    """Trials that run out of memory for real, at the edge the forecaster may try: colocated on 8 GPUs
    of qwen3-30b-a3b, vLLM takes gpuMemoryUtilization 0.9 of each GPU while the trainer keeps its
    weights resident. The forecaster gives these layouts a 15-22% chance to fit (its colocated memory
    model is uncertain by a few percent of HBM) and a large gain if they do, so it tries them; the twin
    (the "cluster") does not fit them: the trial exits 137 with "CUDA out of memory: colocated rollout
    takes gpuMemoryUtilization 0.9 x 268 GiB while the trainer keeps ~28-30 GiB/GPU of weights"."""
    doc = job_doc(bed, **budget)
    doc["spec"]["objective"] = "gpuSecondsPerStep"
    doc["spec"]["searchSpace"] = {
        "knobs": only_knobs(
            gpus=[8],
            trainer__tp=[1, 2, 4],
            trainer__ep=[2],
            trainer__microBatchTokens=[4096],
            rollout__gpuMemoryUtilization=[0.9],
        )
    }
    return doc


def test_too_many_failed_trials_fail_the_job(bed, ns):
    create_job(bed, ns, _oom_job(bed, maxTrials=2, parallelTrials=2, maxFailedTrials=2))
    events = Events()
    st = drive(bed, ns, "tune", events=events, timeout=120)
    assert st["phase"] == "Failed", json.dumps(st, indent=1)[:3000]
    assert trial(st, "baseline")["state"] == "Succeeded"
    for tid in ("t1", "t2"):
        t = trial(st, tid)
        assert t["state"] == "Failed", t
        assert "CUDA out of memory" in t["reason"] and "exit code 137" in t["reason"], t["reason"]
        assert t.get("measuredSeconds") is None and t.get("objective") is None
    cond = conditions(st)["Failed"]
    assert cond["status"] == "True" and cond["reason"] == "TooManyFailedTrials", cond
    assert "maxFailedTrials=2" in st["message"] and st["trialsFailed"] == 2
    assert events.reasons()["TrialFailed"] == 2
    bedlib.wait_for(
        lambda: not [p for p in bed.core().list_namespaced_pod(ns).items if p.metadata.deletion_timestamp is None],
        30,
        what="trial pods torn down",
    )


def test_baseline_failure_fails_the_job(bed, ns):
    """The user's own baseline does not fit: trainer TP 1, EP 1, no recompute on 8 GPUs of qwen3-30b-a3b
    needs ~283 GiB/GPU in the twin (268 available)."""
    doc = job_doc(bed)
    doc["spec"]["baseline"]["gpus"] = 8
    doc["spec"]["baseline"]["trainer"].update({"tp": 1, "ep": 1, "microBatchTokens": 4096, "recompute": "none"})
    create_job(bed, ns, doc)
    st = drive(bed, ns, "tune", timeout=90)
    assert st["phase"] == "Failed", json.dumps(st, indent=1)[:3000]
    base = trial(st, "baseline")
    assert base["state"] == "Failed" and "CUDA out of memory" in base["reason"], base
    assert conditions(st)["Failed"]["reason"] == "BaselineFailed"
    assert st["baseline"]["state"] == "Failed" and not st["baseline"].get("stepSeconds")
    assert [t["id"] for t in st["trials"]] == ["baseline"]  # no search on a failed baseline


# a workload that reports 2 of the 3 steps it was asked for (a framework that loses its last pushes)
_SHORT_RUN = (
    "import json, os, runpy, sys; s = json.loads(os.environ['RLTUNE_TRIAL_SPEC']); s['steps'] = 2; "
    "os.environ['RLTUNE_TRIAL_SPEC'] = json.dumps(s); sys.argv = ['rltune.trial']; "
    "runpy.run_module('rltune.trial', run_name='__main__')"
)


@pytest.mark.parametrize("code,reported", [("pass", 0), (_SHORT_RUN, 2)], ids=["no-metrics", "fewer-steps"])
def test_metrics_unavailable_never_scored_on_guesses(bed, ns, code, reported):
    """The trial's pod exits 0 but Prometheus never gets all its steps: after metricsTimeoutSeconds the
    trial is MetricsUnavailable - never scored on what it did report or on wall-clock time."""
    doc = job_doc(bed, metricsTimeoutSeconds=5)
    doc["spec"]["workload"]["command"] = ["python", "-c", code]
    create_job(bed, ns, doc)
    st = drive(bed, ns, "tune", timeout=90)
    assert st["phase"] == "Failed", json.dumps(st, indent=1)[:3000]
    base = trial(st, "baseline")
    assert base["state"] == "MetricsUnavailable", base
    assert base["reason"].startswith(f"{reported} of 3 steps reported within 5s"), base["reason"]
    assert base.get("measuredSeconds") is None and base.get("objective") is None and not base.get("summary")
    assert conditions(st)["Failed"]["reason"] == "BaselineFailed"
    assert "MetricsUnavailable" in conditions(st)["Failed"]["message"]
    pods = bed.core().list_namespaced_pod(ns).items
    assert not [p for p in pods if p.metadata.deletion_timestamp is None]
    if reported:  # the partial trajectory really was in Prometheus when the verdict was made
        sel = f'namespace="{ns}",trial="baseline"'
        res = bedlib.prom_query(bed.prometheus_url, f"rltune_step_duration_seconds{{{sel}}}")
        assert len(res) == reported


@pytest.fixture
def tiny_pool(bed):
    """One 8-GPU B300 node in a pool of its own, tainted so that only this test's pods land on it."""
    core = bed.core()
    name = bedlib.unique("rlt-one")
    node = pools.node_manifest(name, 0, "B300", 8, "224", "4Ti")
    node["spec"]["taints"].append({"key": "rltune.io/test-pool", "value": name, "effect": "NoSchedule"})
    core.create_node(node)
    try:
        bedlib.create_pool(core, name, "B300", nodes=1, gpus_per_node=8)  # waits until kwok made it Ready
        yield name
    finally:
        bedlib.delete_pool(core, name)


def test_unschedulable_trial_all_or_nothing(bed, ns, tiny_pool, monkeypatch):
    """A 16-GPU trial needs 2 pods, the pool has one 8-GPU node: rank 0 is scheduled (and its process
    starts), rank 1 never is. After scheduleTimeoutSeconds the trial is Unschedulable and all its pods
    are deleted, the scheduled one included; it counts as a failed trial."""
    from rltune import settings

    s = settings.current()  # the admin lets jobs tolerate the test pool's taint (podSecurity.allowedTolerationKeys)
    keys = [*s.pod_security.allowed_toleration_keys, "rltune.io/test-pool"]
    bounds = s.pod_security.model_copy(update={"allowed_toleration_keys": keys})
    monkeypatch.setattr(settings, "_current", s.model_copy(update={"pod_security": bounds}))
    doc = job_doc(bed, maxTrials=2, parallelTrials=1, maxFailedTrials=1, scheduleTimeoutSeconds=5)
    s = doc["spec"]
    s["resources"]["nodeSelector"] = {"rltune.io/pool": tiny_pool}
    s["resources"]["tolerations"] = [
        {"key": "rltune.io/test-pool", "operator": "Equal", "value": tiny_pool, "effect": "NoSchedule"}
    ]
    s["baseline"]["gpus"] = 8  # the baseline fits the node
    s["searchSpace"] = {"knobs": only_knobs(gpus=[16], rollout__maxNumSeqs=[256])}
    s["workload"]["env"] = [{"name": "RLTUNE_TWIN_SECONDS_PER_STEP", "value": "2"}]  # rank 0 still runs at teardown
    ledger = PodLedger(bed, ns)
    create_job(bed, ns, doc)
    st = drive(bed, ns, "tune", timeout=120)
    ledger.stop()
    assert st["phase"] == "Failed", json.dumps(st, indent=1)[:3000]
    assert trial(st, "baseline")["state"] == "Succeeded"
    t1 = trial(st, "t1")
    assert t1["state"] == "Unschedulable" and t1["gpus"] == 16, t1
    assert "not all 2 pods scheduled within 5s" in t1["reason"], t1["reason"]
    assert "Insufficient nvidia.com/gpu" in t1["reason"] or "didn't match" in t1["reason"], t1["reason"]
    assert conditions(st)["Failed"]["reason"] == "TooManyFailedTrials"
    # what the cluster saw: rank 0 bound to the pool's node, rank 1 never bound
    r0, r1 = ledger.pods[pod_manifests.pod_name("tune", "t1", 0)], ledger.pods[pod_manifests.pod_name("tune", "t1", 1)]
    assert r0.spec.node_name == f"{tiny_pool}-0"
    assert not r1.spec.node_name
    # all or nothing: both pods and the trial's headless Service are gone
    core = bed.core()
    for rank in (0, 1):
        bedlib.wait_pod_gone(core, ns, pod_manifests.pod_name("tune", "t1", rank), timeout=30)
    from kubernetes.client.rest import ApiException

    with pytest.raises(ApiException) as e:
        core.read_namespaced_service(pod_manifests.service_name("tune", "t1"), ns)
    assert e.value.status == 404


# ------------------------------------------------------------------------------------ invalid spec


@pytest.fixture
def old_crd(bed):
    """A private copy of the RLTuningJob CRD (own API group) without the CEL rules: the situation of a
    CRD older than the operator. The real CRD rejects every spec that pydantic rejects, so this is the
    only way to get such a spec past a real API server."""
    from kubernetes import client

    group = f"t{uuid.uuid4().hex[:8]}.test.rltune.io"
    crd = yaml.safe_load(CRD.read_text())

    def strip(node):
        if isinstance(node, dict):
            node.pop("x-kubernetes-validations", None)
            for v in node.values():
                strip(v)
        elif isinstance(node, list):
            for v in node:
                strip(v)

    strip(crd["spec"]["versions"])
    crd["metadata"] = {"name": f"{PLURAL}.{group}"}
    crd["spec"]["group"] = group
    crd["spec"]["names"].pop("shortNames", None)
    crd["spec"]["names"].pop("categories", None)
    ext = client.ApiextensionsV1Api(bed.api_client())
    ext.create_custom_resource_definition(crd)
    try:
        wait_crd_established(bed.env(), f"{PLURAL}.{group}", kubectl_bin=str(bed.bin_dir / "kubectl"))
        yield group
    finally:
        ext.delete_custom_resource_definition(f"{PLURAL}.{group}")


@pytest.mark.parametrize(
    "change,field",
    [
        ({"baseline": {"placement": "disaggregated", "trainerGpus": 16}}, "spec.baseline.trainerGpus"),
        ({"budget": {"warmupSteps": 3, "stepsPerTrial": 3}}, "budget.warmupSteps"),
    ],
    ids=["trainerGpus-not-below-gpus", "warmup-not-below-steps"],
)
def test_invalid_spec_condition_names_field(bed, ns, old_crd, change, field):
    doc = job_doc(bed)
    for k, v in change.items():
        doc["spec"][k].update(v)
    create_job(bed, ns, doc, group=old_crd)  # accepted: this CRD has no CEL rules
    events = Events()
    st = drive(bed, ns, "tune", events=events, timeout=30, cluster=lambda: KubeCluster(bed.api_client(), group=old_crd))
    assert st["phase"] == "Failed"
    cond = conditions(st)["SpecValid"]
    assert cond["status"] == "False" and cond["reason"] == "InvalidSpec" and field in cond["message"], cond
    assert conditions(st)["Failed"]["reason"] == "InvalidSpec"
    assert cond["observedGeneration"] == 1 and st["observedGeneration"] == 1
    assert events.reasons() == Counter({"InvalidSpec": 1})
    assert not st.get("trials")
    # nothing created, also not on later ticks
    for _ in range(2):
        r = Reconciler(KubeCluster(bed.api_client(), group=old_crd), emit=events.emit)
        assert r.reconcile(ns, "tune") == "Failed"
    assert events.reasons() == Counter({"InvalidSpec": 1})
    assert not pod_creations(bed, ns)
    core = bed.core()
    assert not core.list_namespaced_pod(ns).items and not core.list_namespaced_service(ns).items


def test_unknown_search_knob_is_invalid_spec(bed, ns):
    """searchSpace.knobs values are free-form (CEL cannot type them), so the real CRD admits an
    unknown knob path: the operator must catch it before any pod, naming the knob."""
    doc = job_doc(bed)
    doc["spec"]["searchSpace"] = {"knobs": {"rollout.maxNumSeq": [256, 512]}}
    create_job(bed, ns, doc)
    events = Events()
    st = drive(bed, ns, "tune", events=events, timeout=30)
    assert st["phase"] == "Failed"
    cond = conditions(st)["SpecValid"]
    assert cond["status"] == "False" and cond["reason"] == "InvalidSpec", cond
    assert "searchSpace" in cond["message"] and "rollout.maxNumSeq" in cond["message"], cond
    assert events.reasons() == Counter({"InvalidSpec": 1})
    assert not pod_creations(bed, ns)


# ------------------------------------------------------------------------------------ scoring


def test_a_healthy_winner_is_confirmed_at_the_interim_look(bed, ns):
    """rewardGate nonInferiority with confirmSteps 12: the reconciler reads the running confirmation's
    steps from Prometheus, confirms the winner at its interim look after 6 steps (gates.confirmation_looks)
    and deletes its pods, which would have run 6 more steps (1 s each)."""
    doc = job_doc(bed, maxTrials=2, parallelTrials=2, confirmSteps=12, trialTimeoutSeconds=240)
    s = doc["spec"]
    # synchronous winners only (the plan's best is 1.8x): a one-step-off one learns a little slower and
    # is not always shown within the tolerance half-way (docs/tuner.md, the grey zone)
    s["searchSpace"]["frozen"] = ["rollout.fp8", "async.staleness", "async.partialRollout"]
    s["workload"]["env"] = [{"name": "RLTUNE_TWIN_SECONDS_PER_STEP", "value": "1"}]
    create_job(bed, ns, doc)
    st = drive(bed, ns, "tune", timeout=180)
    assert st["phase"] == "Succeeded", json.dumps(st, indent=1)[:3000]
    why = [(t["id"], t["state"], t.get("reason")) for t in st["trials"]]
    assert trial(st, "baseline")["steps"] == 12, why
    c = next(t for t in st["trials"] if t["kind"] == "confirm")
    assert c["state"] == "Succeeded" and "confirmed at the interim look after 6 of 12 steps" in c["reason"], c
    assert c["summary"]["steps"] == 5 and c["summary"]["total_steps"] == 6, c["summary"]  # scored at the look
    assert st["best"]["confirmed"] and conditions(st)["Complete"]["reason"] == "Improved"
    core = bed.core()
    for rank in range(nodes_for(c["gpus"], s["resources"]["gpusPerNode"])):
        bedlib.wait_pod_gone(core, ns, pod_manifests.pod_name("tune", c["id"], rank), timeout=30)


def test_promql_scoring_from_real_prometheus(bed, ns):
    """Samples pushed to the Pushgateway come back through Prometheus as StepRecords (warm-up flagged,
    phases), renamed metrics honoured, the exported failure reason read, and the group deleted."""
    from rltune.api.metrics import StepRecord, trial_key
    from rltune.trial.exporter import TrialExporter

    job, tid = "scoring", "t1"
    names = {"step_duration_seconds": "my_step_seconds"}  # spec.metrics.names: a framework's own name
    key = trial_key(b"operator-secret-of-this-test", ns, "uid-1", tid)
    # the trial workload's own exporter, pushing to the real Pushgateway, signing with the trial's key
    ex = TrialExporter(ns, job, tid, pushgateway_url=bed.pushgateway_url, names=names, signing_key=key)
    for step in range(3):
        ex.record(StepRecord(step=step, duration=10.5 + step, phases={"generation": 8.0}, warmup=step == 0))
    ex.finish(ok=False, reason="CUDA out of memory: trainer needs 295 GiB/GPU")

    def query(k=key, trial=tid):
        return prom.query_trial(bed.prometheus_url, ns, job, trial, k, names)

    got = bedlib.wait_for(lambda: (lambda r: r if len(r.steps) == 3 else None)(query()), 30, what="3 signed steps")
    steps = got.steps
    assert got.forged == 0
    assert [s.step for s in steps] == [0, 1, 2] and steps[0].warmup and not steps[1].warmup
    assert steps[1].duration == 11.5 and steps[1].phases["generation"] == 8.0
    assert query(trial="t2").steps == []  # other trials: nothing
    # the same series read with another trial's key (another job's UID): none verifies, none is scored
    other = query(k=trial_key(b"operator-secret-of-this-test", ns, "uid-2", tid))
    assert other.steps == [] and other.forged == 3
    reason = bedlib.wait_for(
        lambda: prom.trial_reason(bed.prometheus_url, ns, job, tid, key),
        30,
        what="the exported failure reason in Prometheus",
    )  # the last push, one scrape later
    assert reason == "CUDA out of memory: trainer needs 295 GiB/GPU"
    assert prom.trial_reason(bed.prometheus_url, ns, job, tid, "another key") is None
    assert prom.trial_reason(bed.prometheus_url, ns, job, "t2", key) is None
    # a Prometheus that is not there is a MetricsError (the reconciler keeps waiting), never zero steps
    with pytest.raises(prom.MetricsError):
        prom.query_trial("http://127.0.0.1:9", ns, job, tid, key, timeout=2)

    assert prom.delete_group(bed.pushgateway_url, ns, job, tid)
    groups = requests.get(f"{bed.pushgateway_url}/api/v1/metrics", timeout=5).json()["data"]
    assert not [g for g in groups if g["labels"].get("namespace") == ns]


@pytest.fixture
def h200_pool(bed):
    """Two 8-GPU H200 kwok nodes (GFD labels of an H200) beside the bed's B300 pool."""
    core = bed.core()
    name = bedlib.unique("rlt-h200")
    try:
        bedlib.create_pool(core, name, "H200", nodes=2, gpus_per_node=8)
        yield name
    finally:
        bedlib.delete_pool(core, name)


def test_a_cheaper_pool_is_measured_on_its_own_nodes(bed, ns, h200_pool):
    """spec.resources.pools: after the search the winner's cheapest forecast in the H200 pool runs as
    one trial there; its pods select the H200 product and the pool's nodeSelector and bind to its
    nodes, and status.poolOffer carries the measured cost per step against the winner here. The
    winner is confirmed first (the search's stop reason is a SearchEnded event), and
    status.tuningCost counts the pool trial at its price, its own GPU-hours reported apart."""
    doc = job_doc(bed, maxTrials=2, parallelTrials=1, confirmSteps=2)
    # a 2-step confirmation (1 scored step) cannot show non-inferiority: this test is about pools, so
    # its winner is confirmed by screening
    doc["spec"].setdefault("constraints", {})["rewardGate"] = "screen"
    res = doc["spec"]["resources"]
    res["pricePerGpuHour"] = 6.0
    res["pools"] = [
        {"name": "h200", "gpuType": "H200", "pricePerGpuHour": 0.5, "nodeSelector": {"rltune.io/pool": h200_pool}}
    ]
    ledger = PodLedger(bed, ns)
    events = Events()
    create_job(bed, ns, doc)
    st = drive(bed, ns, "tune", timeout=240, events=events)
    ledger.stop()
    assert st["phase"] == "Succeeded", json.dumps(st, indent=1)[:3000]
    assert events.reasons()["SearchEnded"] == 1, events
    assert [t["kind"] for t in st["trials"]].count("confirm") == 1 and st["best"]["confirmed"], st["trials"]
    pool = [t for t in st["trials"] if t["kind"] == "pool"]
    assert len(pool) == 1 and pool[0]["pool"] == "h200" and pool[0]["state"] == "Succeeded", pool
    po = st["poolOffer"]
    assert po["trial"] == pool[0]["id"] and po["gpuType"] == "H200" and po["measuredSeconds"] > 0, po
    assert po["measuredCostPerStep"] == pytest.approx(0.5 * pool[0]["gpus"] * po["measuredSeconds"] / 3600, rel=1e-3)

    def gpu_hours(t) -> float:
        return unflatten_summary(t["summary"]).seconds_spent * t["gpus"] / 3600

    here = sum(gpu_hours(t) for t in st["trials"] if t["kind"] not in ("baseline", "pool") and t.get("summary"))
    tc = st["tuningCost"]
    assert tc["poolTrialGpuHours"] == pytest.approx(gpu_hours(pool[0]), abs=1e-3) and tc["poolTrialGpuHours"] > 0
    # the H200 hours at 0.5 per GPU-hour count as 0.5/6 of as many hours here
    assert tc["trialGpuHours"] == pytest.approx(here + gpu_hours(pool[0]) * 0.5 / 6.0, abs=2e-3), tc
    pods = [p for n, p in ledger.pods.items() if n.startswith(pod_manifests.pod_name("tune", pool[0]["id"], 0)[:-1])]
    assert pods and all(p.spec.node_name and p.spec.node_name.startswith(h200_pool) for p in pods), [
        (p.metadata.name, p.spec.node_name) for p in pods
    ]
    assert all(p.spec.node_selector == {"rltune.io/pool": h200_pool} for p in pods)
    others = [p for n, p in ledger.pods.items() if p not in pods and p.spec.node_name]
    assert others and not any(p.spec.node_name.startswith(h200_pool) for p in others)
