"""Event-driven reconciling on the test bed: the operator (a subprocess, as its own audited user
rltune-operator: hack.bed.pki.operator_kubeconfig) with reconcileInterval 30 s, so that anything
faster than that is the work of a watch event, not of the timer.

- an idle (finished) job makes no API request in 20 s (the apiserver's audit log);
- a trial pod that finishes is reflected in the job's status within ~2 s;
- deleting a job whose trial runs leaves no trial pod within 10 s.

The API request rate with many jobs, before and after: bench/api_rate.py (`make bench-api-rate`)."""

from __future__ import annotations

import json
import os
import time
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from test_operator import job as get_job
from test_operator import kubectl, wait

import bed as bedlib
from hack import demo
from hack.bed import pki

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "twin-demo.yaml"
INTERVAL = 30  # reconcileInterval of the operator under test

pytestmark = [pytest.mark.bed, pytest.mark.slow]


@pytest.fixture
def operator(bed, namespace):
    """(env, log): the operator runs as rltune-operator, watching the test's namespace."""
    env = bed.env()
    env.update(RLTUNE_PROMETHEUS_URL=bed.prometheus_url, RLTUNE_PUSHGATEWAY_URL=bed.pushgateway_url)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "operator"), env.get("PYTHONPATH", "")]))
    demo.apply_crd(env)
    op_env = dict(env, KUBECONFIG=str(pki.operator_kubeconfig()), RLTUNE_RECONCILE_INTERVAL=str(INTERVAL))
    log = Path(bed.state_dir).parent / "e2e" / f"operator-{namespace}.log"
    p = demo.start_operator(op_env, log, namespaces=(namespace,), metrics_port=0)
    time.sleep(3)  # kopf's watches start
    yield env, log
    if p.poll() is None:
        kubectl(env, "delete", "rltuningjobs", "--all", "-n", namespace, "--wait=true", "--timeout=60s", check=False)
        demo.stop_operator(p)


def job_doc(ns, name, **changes) -> dict:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"].update(name=name, namespace=ns)
    s = doc["spec"]
    s["baseline"]["gpus"] = 8  # one pod
    s["budget"].update(maxTrials=2, parallelTrials=1)
    for k, v in changes.items():
        s["workload" if k == "env" else "resources"][k] = v
    return doc


def operator_requests(bed, offset: int, t0: float, t1: float) -> list[dict]:
    out = {}
    with open(bed.audit_log, errors="replace") as f:
        f.seek(offset)
        for line in f:
            if pki.OPERATOR_USER not in line:
                continue
            ev = json.loads(line)
            if (ev.get("user") or {}).get("username") != pki.OPERATOR_USER:
                continue
            if t0 <= datetime.fromisoformat(ev["requestReceivedTimestamp"]).timestamp() < t1:
                out[ev["auditID"]] = ev
    return list(out.values())


def test_idle_job_makes_no_requests(bed, namespace, operator):
    env, log = operator
    kubectl(env, "apply", "-f", "-", input=yaml.safe_dump(job_doc(namespace, "idle", gpuType="H100")))
    wait(
        lambda: ((get_job(env, namespace, "idle") or {}).get("status") or {}).get("phase") == "Failed",
        60,
        "Failed",
        interval=0.5,
    )
    time.sleep(3)  # kopf's own last patches, the watch delivering the last write
    offset = Path(bed.audit_log).stat().st_size
    t0 = time.time()
    time.sleep(20)
    t1 = time.time()
    time.sleep(1)
    reqs = operator_requests(bed, offset, t0, t1)
    print(
        f"\noperator requests in {t1 - t0:.0f} s with one finished job: {[(e['verb'], e['requestURI']) for e in reqs]}"
    )
    assert [e for e in reqs if e["verb"] != "watch"] == [], "an idle job made API requests"


class PodTimes(bedlib.TrialPodWatch):
    """When each trial pod was first seen Running / Succeeded / being deleted / gone."""

    def __init__(self, bed, ns):
        self.seen: dict[tuple[str, str], float] = {}
        super().__init__(bed, ns)

    def on_event(self, kind, p):
        now = time.time()
        marks = [p.status.phase or ""] + (["Deleting"] if p.metadata.deletion_timestamp else [])
        marks += ["Gone"] if kind == "DELETED" else []
        for m in marks:
            self.seen.setdefault((p.metadata.name, m), now)


def test_pod_change_wakes_its_job(bed, namespace, operator):
    """The baseline's pod ends; the job's status shows the trial past Running within ~2 s, though
    the operator's timer would tick only every 30 s."""
    env, log = operator
    watch = PodTimes(bed, namespace)
    doc = job_doc(namespace, "wake", env=[{"name": "RLTUNE_TWIN_SECONDS_PER_STEP", "value": "1"}])
    kubectl(env, "apply", "-f", "-", input=yaml.safe_dump(doc))
    pod = "wake-baseline-0"

    def baseline_state():
        trials = ((get_job(env, namespace, "wake") or {}).get("status") or {}).get("trials") or []
        return next((t["state"] for t in trials if t["id"] == "baseline"), None)

    wait(lambda: baseline_state() == "Running", 60, "the baseline Running", interval=0.2)
    wait(lambda: baseline_state() not in (None, "Pending", "Running"), 120, "the baseline past Running", interval=0.1)
    t_status = time.time()
    t_pod = watch.seen.get((pod, "Succeeded")) or watch.seen.get((pod, "Failed"))
    watch.stop()
    assert t_pod, f"pod {pod} never ended: {sorted(watch.seen)}"
    lag = t_status - t_pod
    print(f"\npod {pod} ended -> status {baseline_state()} after {lag:.2f} s (reconcileInterval {INTERVAL} s)")
    assert lag < 3.0, f"the job saw its pod end {lag:.1f} s late"


def test_delete_active_job_removes_pods_at_once(bed, namespace, operator):
    env, log = operator
    watch = PodTimes(bed, namespace)
    doc = job_doc(namespace, "busy", env=[{"name": "RLTUNE_TWIN_SECONDS_PER_STEP", "value": "60"}])
    kubectl(env, "apply", "-f", "-", input=yaml.safe_dump(doc))
    core = bed.core()
    wait(lambda: watch.seen.get(("busy-baseline-0", "Running")), 60, "the baseline pod Running", interval=0.5)
    time.sleep(1)
    t0 = time.time()
    kubectl(env, "delete", "rltuningjob", "busy", "-n", namespace, "--wait=false")
    wait(
        lambda: not core.list_namespaced_pod(namespace, label_selector="rltune.io/job=busy").items,
        30,
        "no trial pod of the deleted job",
        interval=0.1,
    )
    took = time.time() - t0
    watch.stop()
    print(f"\nkubectl delete rltuningjob (trial running) -> no trial pod left after {took:.1f} s")
    assert took < 10.0
    wait(lambda: get_job(env, namespace, "busy") is None, 30, "the job gone", interval=0.5)
