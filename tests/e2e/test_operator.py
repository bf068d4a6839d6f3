"""End to end on the test bed: the operator (a subprocess) tunes examples/twin-demo.yaml with trial
pods scheduled by kube-scheduler on the kwok B300 pool and run by the pod runner, scored from
Prometheus; the job succeeds with a >= 1.3x speed-up, `kubectl get rltuningjobs` shows it, and
deleting the job removes every trial pod. The restart test kills the operator with SIGKILL during
profiling and again during the search and checks (apiserver audit log) that no pod name was ever
created twice."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import requests
import yaml

import bed as bedlib
from hack import demo

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "twin-demo.yaml"

pytestmark = [pytest.mark.bed, pytest.mark.slow]


def env_for(bed) -> dict:
    e = bed.env()
    e["RLTUNE_PROMETHEUS_URL"] = bed.prometheus_url
    e["RLTUNE_PUSHGATEWAY_URL"] = bed.pushgateway_url
    e["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "operator"), e.get("PYTHONPATH", "")]))
    return e


def kubectl(env, *args, check=True, input=None):
    r = subprocess.run(["kubectl", *args], env=env, capture_output=True, text=True, input=input, timeout=60)
    if check:
        assert r.returncode == 0, f"kubectl {' '.join(args)}: {r.stderr}"
    return r


def job(env, ns, name="twin-demo"):
    r = kubectl(env, "get", "rltuningjob", name, "-n", ns, "-o", "json", check=False)
    return json.loads(r.stdout) if r.returncode == 0 else None


def wait(cond, timeout, what, interval=1.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


def _ts(s: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def apply_to_first_pod(bed, ns) -> float | None:
    """Seconds from the RLTuningJob's create to the first trial pod's create (apiserver audit log)."""
    job_t = pod_t = None
    for ev, ref in bedlib.audit_events(bed, ns):
        if ev.get("verb") != "create" or ref.get("subresource"):
            continue
        t = _ts(ev["requestReceivedTimestamp"])
        if ref.get("resource") == "rltuningjobs" and job_t is None:
            job_t = t
        elif ref.get("resource") == "pods" and pod_t is None:
            pod_t = t
    return pod_t - job_t if job_t is not None and pod_t is not None else None


pod_creations = bedlib.pod_creations


class PodWatch(bedlib.TrialPodWatch):
    """Records every trial pod's node (to check placement on the B300 pool) from a background watch."""

    def __init__(self, bed, ns):
        self.nodes: dict[str, str] = {}
        self.names: set[str] = set()
        super().__init__(bed, ns)

    def on_event(self, kind: str, p) -> None:
        self.names.add(p.metadata.name)
        if p.spec.node_name:
            self.nodes[p.metadata.name] = p.spec.node_name


@pytest.fixture
def operator(bed, namespace):
    env = env_for(bed)
    demo.apply_crd(env)
    log = Path(bed.state_dir).parent / "e2e" / f"operator-{namespace}.log"
    procs = []

    def start():
        p = demo.start_operator(env, log, namespaces=(namespace,), metrics_port=0)
        procs.append(p)
        return p

    yield env, start, log
    # Delete the jobs while an operator still runs, so kopf takes its finalizer off them and the
    # namespace fixture's deletion does not hang in Terminating.
    if any(p.poll() is None for p in procs):
        kubectl(env, "delete", "rltuningjobs", "--all", "-n", namespace, "--wait=true", "--timeout=60s", check=False)
    for p in procs:
        if p.poll() is None:
            demo.stop_operator(p)


def test_twin_demo_end_to_end(bed, namespace, operator):
    env, start, log = operator
    watch = PodWatch(bed, namespace)
    op = start()
    time.sleep(3)  # let kopf start its watches: the latency below is the operator's, not its start-up
    t0 = time.time()
    kubectl(env, "apply", "-n", namespace, "-f", str(EXAMPLE))
    wait(lambda: watch.names, 60, "the first trial pod", interval=0.2)
    t_first = time.time() - t0
    peak_rss = 0.0

    def finished():
        nonlocal peak_rss
        assert op.poll() is None, f"operator exited: {log.read_text()[-3000:]}"
        peak_rss = max(peak_rss, demo.rss_mib(op.pid) or 0)
        st = (job(env, namespace) or {}).get("status") or {}
        return st if st.get("phase") in ("Succeeded", "Failed") else None

    st = wait(finished, 900, "the job to finish", interval=2)
    wall = time.time() - t0
    watch.stop()
    audit = apply_to_first_pod(bed, namespace)
    print(
        f"\nfirst trial pod {t_first:.1f}s after apply (audit log: {audit}s); job {st['phase']} after {wall:.0f}s; "
        f"operator peak RSS {peak_rss:.0f} MiB; {len(watch.names)} trial pods"
    )
    assert st["phase"] == "Succeeded", json.dumps(st, indent=1)[:4000]
    best = st["best"]
    assert best["speedup"] >= 1.3, best
    assert best["confirmed"]
    assert st["baseline"]["bottleneck"]
    # what tuning cost against what the winner saves survives the API server's structural schema
    cost = st["tuningCost"]
    assert cost["trialGpuHours"] > 0 and cost["savedGpuHours"] > 0 and cost["paybackSteps"] > 0, cost
    assert cost["plannedSteps"] > 0 and abs(cost["share"] - cost["trialGpuHours"] / cost["savedGpuHours"]) < 1e-3
    # every trial pod ran on the B300 pool
    from kubernetes import client

    core = client.CoreV1Api(bed.api_client())
    products = {n.metadata.name: n.metadata.labels.get("nvidia.com/gpu.product") for n in core.list_node().items}
    assert watch.nodes and all(products.get(n) == "NVIDIA-B300-SXM6-AC" for n in watch.nodes.values())
    # the real printer columns
    out = kubectl(env, "get", "rltuningjobs", "-n", namespace).stdout
    print(out)
    header, row = out.splitlines()[0], out.splitlines()[1]
    assert re.split(r"\s{2,}", header.strip())[:7] == [
        "NAME",
        "PHASE",
        "BOTTLENECK",
        "TRIALS",
        "SPEEDUP",
        "BEST STEP",
        "GPUS",
    ]
    assert "Succeeded" in row and st["trialsDone"] in row and st["speedup"] in row
    # events for trial starts and results
    ev = kubectl(
        env, "get", "events", "-n", namespace, "--field-selector", "involvedObject.kind=RLTuningJob", "-o", "json"
    ).stdout
    reasons = {e["reason"] for e in json.loads(ev)["items"]}
    assert "TrialStarted" in reasons and ({"TrialSucceeded", "TrialRejected"} & reasons)
    # raising maxTrials on the finished job resumes the search (generation > observedGeneration)
    kubectl(
        env,
        "patch",
        "rltuningjob",
        "twin-demo",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"budget": {"maxTrials": 10}}}),
    )
    st2 = wait(
        lambda: (lambda s: s if s.get("observedGeneration") == 2 and s.get("phase") == "Succeeded" else None)(
            (job(env, namespace) or {}).get("status") or {}
        ),
        300,
        "the resumed search to finish",
        interval=2,
    )
    search = [t for t in st2["trials"] if t["kind"] == "search"]
    assert st2["trialsDone"].endswith("/10")
    if len(search) < 10:
        # the search may end before the raised budget; then it says why (the confirmation's message
        # replaces the phase message, so the reason is in a SearchEnded event)
        ev2 = kubectl(
            env, "get", "events", "-n", namespace, "--field-selector", "involvedObject.kind=RLTuningJob", "-o", "json"
        ).stdout
        ended = [e["message"] for e in json.loads(ev2)["items"] if e["reason"] == "SearchEnded"]
        assert any("pays for itself" in m or "exhausted" in m for m in ended), (len(search), ended, st2["message"])
    # no pod name was ever created twice
    dups = [n for n, k in pod_creations(bed, namespace).items() if k > 1]
    assert not dups, dups
    # deleting the job removes every trial pod (garbage collection via owner references) and its
    # Pushgateway groups (the operator's delete handler)
    groups = lambda: [
        g
        for g in requests.get(f"{bed.pushgateway_url}/api/v1/metrics", timeout=5).json()["data"]
        if g["labels"].get("namespace") == namespace
    ]
    assert groups()
    kubectl(env, "delete", "rltuningjob", "twin-demo", "-n", namespace, "--wait=true", "--timeout=60s")
    wait(
        lambda: (
            not kubectl(
                env, "get", "pods", "-n", namespace, "-l", "rltune.io/job=twin-demo", "-o", "name"
            ).stdout.strip()
        ),
        60,
        "trial pods to be gone",
    )
    wait(lambda: not groups(), 30, "the job's Pushgateway groups to be deleted")


def test_unschedulable_baseline_fails_job(bed, namespace, operator):
    """No H100 nodes in the pool: the baseline could never schedule, so the job fails at once with a
    condition naming what the pods select and how many nodes match, not what the nodes carry (the
    cluster's layout is no tenant's to read) - no pod is ever created."""
    env, start, log = operator
    start()
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["resources"]["gpuType"] = "H100"
    kubectl(env, "apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(doc))
    st = wait(
        lambda: (lambda s: s if s.get("phase") in ("Succeeded", "Failed") else None)(
            (job(env, namespace) or {}).get("status") or {}
        ),
        30,
        "the job to fail",
        interval=0.5,
    )
    assert st["phase"] == "Failed"
    assert st["trials"][0]["state"] == "Unschedulable"
    conds = {c["type"]: c for c in st["conditions"]}
    assert conds["Failed"]["reason"] == "NoMatchingNodes" and conds["PodsSchedulable"]["status"] == "False"
    msg = conds["PodsSchedulable"]["message"]
    assert "NVIDIA-H100-80GB-HBM3" in msg and "gpuType" in msg and "0 match the required node affinity" in msg
    assert "B300" not in msg, msg  # the bed's GPU nodes
    assert not pod_creations(bed, namespace), "a pod was created for a job no node can run"


def test_operator_restart_no_duplicates(bed, namespace, operator):
    env, start, log = operator
    op = start()
    kubectl(env, "apply", "-n", namespace, "-f", str(EXAMPLE))

    def phase_with_pods(phase):
        def check():
            st = (job(env, namespace) or {}).get("status") or {}
            if st.get("phase") != phase:
                return None
            pods = kubectl(env, "get", "pods", "-n", namespace, "-l", "rltune.io/job", "-o", "name").stdout.split()
            return pods or None

        return check

    wait(phase_with_pods("Profiling"), 120, "profiling with a baseline pod", interval=0.3)
    op.send_signal(signal.SIGKILL)
    op.wait()
    time.sleep(2)
    op = start()
    wait(phase_with_pods("Searching"), 300, "searching with trial pods", interval=0.3)
    op.send_signal(signal.SIGKILL)
    op.wait()
    time.sleep(2)
    op = start()
    st = wait(
        lambda: (
            ((job(env, namespace) or {}).get("status") or {}).get("phase") in ("Succeeded", "Failed")
            and job(env, namespace)["status"]
        ),
        900,
        "the job to finish",
        interval=2,
    )
    assert st["phase"] == "Succeeded", json.dumps(st, indent=1)[:4000]
    creations = pod_creations(bed, namespace)
    assert creations, "no pod creation found in the audit log"
    dups = {n: k for n, k in creations.items() if k > 1}
    assert not dups, f"pods created more than once: {dups}"
    ids = [t["id"] for t in st["trials"]]
    assert len(ids) == len(set(ids))
    assert (
        st["trialsDone"] == f"{st['trialsDone'].split('/')[1]}/{st['trialsDone'].split('/')[1]}"
        or st["best"] is not None
        or "nothing beats" in st["message"]
    )
