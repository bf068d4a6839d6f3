"""Every fault the operator meets, each a test on the test bed (docs/operator.md, 'Failure semantics').

Each test runs a small twin job (examples/twin-demo.yaml with a few short trials) under the operator
(a subprocess), injects one fault and checks the three invariants besides the fault's own outcome:
nothing lost (every trial seen finished stays in the status with its measurement), no trial pod
duplicated (apiserver audit log: no pod name created twice) or orphaned (no trial pod left once the
job ended), and the right state/cause/condition.

Faults in the trial itself use the twin trial's test-only hook RLTUNE_TWIN_FAULTS
(operator/rltune/trial/main.py). Run on a bed of its own if others use the default one:
RLTUNE_BED_STATE=/tmp/bed-faults RLTUNE_BED_PORT_OFFSET=2000 RLTUNE_BED_KUBERAY=0 pytest -s tests/e2e/test_faults.py
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import urllib.request
from collections import Counter
from datetime import datetime
from pathlib import Path

import pytest
import yaml

import bed as bedlib
from hack import demo
from loopback import Loopback, Quiet

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "twin-demo.yaml"
NAME = "faulty"
TERMINAL = ("Succeeded", "Failed")

pytestmark = [pytest.mark.bed, pytest.mark.slow]


def twin_job(
    name: str = NAME,
    *,
    trials: int = 3,
    parallel: int = 2,
    steps: int = 3,
    confirm: int = 2,
    max_failed: int = 6,
    sec_per_step: float = 0.0,
    faults: str = "",
    prometheus_url: str | None = None,
    metrics_timeout: int = 30,
    schedule_timeout: int = 60,
) -> dict:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"] = {"name": name, "labels": {"team": "faults"}}
    doc["spec"]["budget"] = {
        "maxTrials": trials,
        "parallelTrials": parallel,
        "stepsPerTrial": steps,
        "warmupSteps": 1,
        "confirmSteps": confirm,
        "maxFailedTrials": max_failed,
        "trialTimeoutSeconds": 300,
        "scheduleTimeoutSeconds": schedule_timeout,
        "metricsTimeoutSeconds": metrics_timeout,
    }
    env = [{"name": "RLTUNE_TWIN_SECONDS_PER_STEP", "value": str(sec_per_step)}]
    if faults:
        env.append({"name": "RLTUNE_TWIN_FAULTS", "value": faults})
    doc["spec"]["workload"]["env"] = env
    if prometheus_url:
        doc["spec"]["metrics"] = {"prometheusUrl": prometheus_url}
    return doc


def _ts(s: str) -> float:
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


class Rig:
    """The operator (restartable), the job and the invariants' bookkeeping for one test."""

    def __init__(self, bed, ns: str):
        from kubernetes import client

        self.bed, self.ns = bed, ns
        e = bed.env()
        e["RLTUNE_PROMETHEUS_URL"] = bed.prometheus_url
        e["RLTUNE_PUSHGATEWAY_URL"] = bed.pushgateway_url
        e["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "operator"), e.get("PYTHONPATH", "")]))
        self.env = e
        self.api = client.CustomObjectsApi(bed.api_client())
        self.core = bed.core()
        self.log = Path(bed.state_dir).parent / "e2e" / f"operator-{ns}.log"
        self.procs: list[subprocess.Popen] = []
        self.finished: dict[tuple[str, str], dict] = {}  # (job, trial) -> the trial when first seen finished

    # ------------------------------------------------------------------ the operator
    @property
    def op(self):
        return self.procs[-1] if self.procs else None

    def start(self):
        self.procs.append(demo.start_operator(self.env, self.log, namespaces=(self.ns,), metrics_port=0))
        return self.op

    def kill(self):
        self.op.send_signal(signal.SIGKILL)
        self.op.wait()

    def restart(self, pause: float = 1.0):
        self.kill()
        time.sleep(pause)
        self.start()

    def kubectl(self, *args, check=True, input=None):
        r = subprocess.run(["kubectl", *args], env=self.env, capture_output=True, text=True, input=input, timeout=60)
        if check:
            assert r.returncode == 0, f"kubectl {' '.join(args)}: {r.stderr}"
        return r

    # ------------------------------------------------------------------ the job
    def apply(self, doc: dict):
        self.kubectl("apply", "-n", self.ns, "-f", "-", input=yaml.safe_dump(doc))

    def job(self, name: str = NAME) -> dict | None:
        from kubernetes.client.rest import ApiException

        try:
            obj = self.api.get_namespaced_custom_object("rltune.io", "v1alpha1", self.ns, "rltuningjobs", name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        for t in (obj.get("status") or {}).get("trials") or []:
            if t["state"] not in ("Pending", "Running", "Scoring"):
                self.finished.setdefault((name, t["id"]), t)
        return obj

    def status(self, name: str = NAME) -> dict:
        return (self.job(name) or {}).get("status") or {}

    def wait_status(self, cond, timeout: float, what: str, name: str = NAME, interval: float = 0.3) -> dict:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.op is not None:
                assert self.op.poll() is None, f"operator exited: {self.log.read_text()[-3000:]}"
            st = self.status(name)
            if cond(st):
                return st
            time.sleep(interval)
        raise TimeoutError(f"timed out after {timeout}s waiting for {what}: {json.dumps(self.status(name))[:3000]}")

    def wait_done(self, timeout: float = 300, name: str = NAME) -> dict:
        return self.wait_status(lambda st: st.get("phase") in TERMINAL, timeout, "the job to finish", name, 1.0)

    def trial(self, st: dict, tid: str) -> dict | None:
        return next((t for t in st.get("trials") or [] if t["id"] == tid), None)

    def pods(self, name: str = NAME, trial: str | None = None) -> list:
        sel = f"rltune.io/job={name}" + (f",rltune.io/trial={trial}" if trial else "")
        return self.core.list_namespaced_pod(self.ns, label_selector=sel).items

    def in_phase_with_pods(self, phase: str, name: str = NAME, scheduled: bool = False):
        def check(st):
            if st.get("phase") != phase:
                return False
            active = {t["id"] for t in st.get("trials") or [] if t["state"] in ("Pending", "Running")}
            pods = [p for p in self.pods(name) if p.metadata.labels.get("rltune.io/trial") in active]
            return bool(pods) and (not scheduled or all(p.spec.node_name for p in pods))

        return check

    # ------------------------------------------------------------------ the audit log
    def status_writes(self, name: str = NAME) -> list[float]:
        return [
            _ts(ev["requestReceivedTimestamp"])
            for ev, ref in bedlib.audit_events(self.bed, self.ns)
            if ref.get("resource") == "rltuningjobs"
            and ref.get("subresource") == "status"
            and ref.get("name") == name
            and ev.get("verb") in ("update", "patch")
        ]

    def kill_after_status_write(self, timeout: float = 120) -> float:
        """SIGKILL the operator the moment the audit log shows its next status write (the pods that
        write recorded are then created by nobody but the next operator). Returns the delay."""
        with open(self.bed.audit_log, errors="replace") as f:
            f.seek(0, 2)
            deadline = time.time() + timeout
            while time.time() < deadline:
                line = f.readline()
                if not line:
                    time.sleep(0.002)
                    continue
                if self.ns in line and '"subresource":"status"' in line and '"resource":"rltuningjobs"' in line:
                    ev = json.loads(line)
                    if ev.get("verb") == "update" and (ev.get("responseStatus") or {}).get("code") == 200:
                        self.kill()
                        return time.time() - _ts(ev["stageTimestamp"])
        raise TimeoutError("no status write seen")

    # ------------------------------------------------------------------ the invariants
    def check_invariants(self, st: dict, name: str = NAME) -> None:
        trials = {t["id"]: t for t in st.get("trials") or []}
        assert len(trials) == len(st.get("trials") or []), "a trial id appears twice"
        # nothing lost: every trial once seen finished is still there, with its measurement
        for (job, tid), seen in self.finished.items():
            if job != name:
                continue
            assert tid in trials, f"trial {tid} ({seen['state']}) vanished from the status"
            assert trials[tid].get("measuredSeconds") == seen.get("measuredSeconds"), (tid, seen, trials[tid])
            assert trials[tid]["state"] == seen["state"] or (
                seen["state"] == "Succeeded" and trials[tid]["state"] == "Rejected"  # did not confirm
            ), (tid, seen["state"], trials[tid]["state"])
        if st.get("phase") in TERMINAL:
            assert all(t["state"] not in ("Pending", "Running", "Scoring") for t in trials.values()), trials
        # no duplicate pod (apiserver audit log)
        creations = bedlib.pod_creations(self.bed, self.ns)
        dups = {n: k for n, k in creations.items() if k > 1}
        assert not dups, f"pods created more than once: {dups}"
        # no orphan: once the job ended, its trial pods go
        if st.get("phase") in TERMINAL:
            bedlib.wait_for(lambda: not self.pods(name), 60, 0.5, f"the trial pods of {name} to be deleted")

    def stop_all(self):
        if any(p.poll() is None for p in self.procs):
            self.kubectl("delete", "rltuningjobs", "--all", "-n", self.ns, "--wait=true", "--timeout=60s", check=False)
        for p in self.procs:
            if p.poll() is None:
                demo.stop_operator(p)


@pytest.fixture
def rig(bed, namespace):
    r = Rig(bed, namespace)
    demo.apply_crd(r.env)
    yield r
    r.stop_all()


def search_configs_distinct(st: dict) -> None:
    """The same configuration is never run twice as a search trial (the retry of a preempted trial aside)."""
    configs = Counter(
        json.dumps(t["config"], sort_keys=True) for t in st["trials"] if t["kind"] == "search" and not t.get("retryOf")
    )
    assert all(k == 1 for k in configs.values()), configs


def conditions(st: dict) -> dict:
    return {c["type"]: c for c in st.get("conditions") or []}


# ============================================================================ 1. operator killed


def test_operator_sigkilled_in_every_phase(rig):
    """SIGKILL in Profiling, Searching, right after a status write, and Confirming: the job still
    succeeds with every trial, no pod is created twice and none is left behind."""
    t0 = time.time()
    rig.start()
    rig.apply(twin_job(trials=4, parallel=2, steps=4, confirm=3, sec_per_step=1.0))
    kills = []
    for phase in ("Profiling", "Searching"):
        rig.wait_status(rig.in_phase_with_pods(phase), 240, f"{phase} with trial pods")
        rig.restart()
        kills.append(phase)
    delay = rig.kill_after_status_write()
    kills.append(f"{delay * 1000:.0f} ms after a status write ({rig.status().get('phase')})")
    time.sleep(1)
    rig.start()
    rig.wait_status(rig.in_phase_with_pods("Confirming"), 300, "Confirming with a trial pod")
    rig.restart()
    kills.append("Confirming")
    st = rig.wait_done(300)
    print(f"\nkilled: {kills}; job {st['phase']} after {time.time() - t0:.0f}s: {st.get('message')}")
    assert st["phase"] == "Succeeded", json.dumps(st, indent=1)[:4000]
    assert st["trialsDone"] == "4/4"
    assert any(t["kind"] == "confirm" for t in st["trials"])
    search_configs_distinct(st)
    rig.check_invariants(st)


# ============================================================================ 2. trials that fail


def test_failing_trials_each_with_their_cause(rig):
    """crash (exit 1), OOM (exit 137), no metrics, NaN: each ends with its state and cause, the search
    goes on with other configurations, and budget.maxFailedTrials ends the job (TooManyFailedTrials)."""
    t_start = time.time()
    rig.start()
    rig.apply(
        twin_job(
            trials=8,
            parallel=2,
            steps=3,
            confirm=2,
            max_failed=3,
            metrics_timeout=8,
            faults="t1=nan,t2=crash,t3=oom,t4=nometrics",
        )
    )
    st = rig.wait_done(300)
    print(f"\njob {st['phase']} after {time.time() - t_start:.0f}s: {st.get('message')}")
    for t in st["trials"]:
        print(f"  {t['id']}: {t['state']} {t.get('cause')}: {t.get('reason')}")
    by = {t["id"]: t for t in st["trials"]}
    assert (by["t2"]["state"], by["t2"].get("cause")) == ("Failed", "Crashed"), by["t2"]
    assert "injected fault: crash" in by["t2"]["reason"]
    assert (by["t3"]["state"], by["t3"].get("cause")) == ("Failed", "OutOfMemory"), by["t3"]
    assert "out of memory" in by["t3"]["reason"].lower()
    assert (by["t4"]["state"], by["t4"].get("cause")) == ("MetricsUnavailable", "MetricsUnavailable"), by["t4"]
    # NaN: measured, but the nan quality gate rejects it (not scored as a speed-up, not a failure)
    assert by["t1"]["state"] == "Rejected" and "nan" in by["t1"]["reason"].lower(), by["t1"]
    assert by["t1"].get("objective") is None or by["t1"]["objective"] == by["t1"]["objective"]
    assert st["phase"] == "Failed"
    c = conditions(st)
    assert c["Failed"]["status"] == "True" and c["Failed"]["reason"] == "TooManyFailedTrials", c["Failed"]
    assert c["Stalled"]["reason"] == "TooManyFailedTrials"
    assert st["trialsFailed"] == 3
    search_configs_distinct(st)
    rig.check_invariants(st)


def test_trial_pending_forever_is_unschedulable(rig):
    """Search trials that never get a node (every GPU node cordoned once the baseline runs) end
    Unschedulable after budget.scheduleTimeoutSeconds, their pods removed; the search goes on once
    nodes are back."""
    t1 = time.time()
    rig.start()
    rig.apply(twin_job(trials=3, parallel=2, steps=3, confirm=0, sec_per_step=1.0, schedule_timeout=6))
    try:
        rig.wait_status(rig.in_phase_with_pods("Profiling", scheduled=True), 120, "the baseline scheduled")
        rig.kubectl("cordon", "-l", "rltune.io/pool=b300")
        st = rig.wait_status(
            lambda st: all((rig.trial(st, t) or {}).get("state") == "Unschedulable" for t in ("t1", "t2")),
            120,
            "t1 and t2 Unschedulable",
        )
        assert not rig.pods(trial="t1") or bedlib.wait_for(lambda: not rig.pods(trial="t1"), 30)
    finally:
        rig.kubectl("uncordon", "-l", "rltune.io/pool=b300", check=False)
    st = rig.wait_done(240)
    print(f"\njob {st['phase']} after {time.time() - t1:.0f}s: {st.get('message')}")
    for tid in ("t1", "t2"):
        t = rig.trial(st, tid)
        assert (t["state"], t.get("cause")) == ("Unschedulable", "Unschedulable"), t
        assert "scheduled within 6s" in t["reason"], t
    assert st["phase"] == "Succeeded", st.get("message")
    assert rig.trial(st, "t3")["state"] in ("Succeeded", "Rejected", "Stopped")
    assert st["trialsFailed"] == 2
    search_configs_distinct(st)
    rig.check_invariants(st)


# ============================================================================ 3. node lost


def test_node_lost_mid_trial_is_retried_once_elsewhere(rig):
    """The node of a running trial goes away (a NoExecute taint: the taint manager evicts its pods
    with DisruptionTarget/DeletionByTaintManager): the trial ends Preempted (cause Preempted), is re-run
    once with the same configuration as `t1-retry` on another node, and is not counted as failed."""
    t1 = time.time()
    rig.start()
    rig.apply(twin_job(trials=2, parallel=1, steps=4, confirm=0, sec_per_step=2.5))
    taint = "rltune.io/test-node-lost=true:NoExecute"
    node = None
    try:
        st = rig.wait_status(
            lambda st: (
                (rig.trial(st, "t1") or {}).get("state") == "Running"
                and any(p.spec.node_name for p in rig.pods(trial="t1"))
            ),
            240,
            "t1 running",
        )
        node = next(p.spec.node_name for p in rig.pods(trial="t1") if p.metadata.labels["rltune.io/rank"] == "0")
        t_taint = time.time()
        rig.kubectl("taint", "node", node, taint)
        st = rig.wait_status(
            lambda st: (rig.trial(st, "t1") or {}).get("state") not in (None, "Pending", "Running", "Scoring"),
            90,
            "t1 to end after its node was lost",
        )
        t_react = time.time() - t_taint
        t0s = rig.trial(st, "t1")
        assert (t0s["state"], t0s.get("cause")) == ("Preempted", "Preempted"), t0s
        assert "DeletionByTaintManager" in t0s["reason"] or "deleted while it ran" in t0s["reason"], t0s
        retry = rig.trial(st, "t1-retry")
        assert retry and retry["config"] == t0s["config"] and retry.get("retryOf") == "t1", retry
        rig.wait_status(lambda st: any(p.spec.node_name for p in rig.pods(trial=retry["id"])), 60, "the retry placed")
        assert all(p.spec.node_name != node for p in rig.pods(trial=retry["id"]))
    finally:
        if node:
            rig.kubectl("taint", "node", node, taint + "-", check=False)
    st = rig.wait_done(240)
    print(f"\nnode {node} lost; t1 ended {t_react:.1f}s later; job {st['phase']} after {time.time() - t1:.0f}s")
    for t in st["trials"]:
        print(f"  {t['id']}: {t['state']} {t.get('cause')}: {t.get('reason')}")
    r = rig.trial(st, retry["id"])
    assert r["state"] in ("Succeeded", "Rejected", "Stopped"), r
    assert st["trialsFailed"] == 0 and st["trialsDone"] == "2/2"
    assert st["phase"] == "Succeeded"
    rig.check_invariants(st)


# ============================================================================ 4. Prometheus down / slow


class SlowProxy(Loopback):
    """An HTTP proxy in front of Prometheus that answers `delay` seconds late (the job's prometheusUrl)."""

    def __init__(self, target: str, delay: float):
        self.target, self.delay, self.requests = target, delay, 0
        outer = self

        class H(Quiet):
            def do_GET(self):  # noqa: N802
                outer.requests += 1
                time.sleep(outer.delay)
                try:
                    with urllib.request.urlopen(outer.target + self.path, timeout=10) as r:
                        code, body = r.status, r.read()
                except urllib.error.HTTPError as e:
                    code, body = e.code, e.read()
                except Exception as e:  # noqa: BLE001 - Prometheus down: a gateway error
                    code, body = 502, str(e).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        super().__init__(H)


def test_prometheus_down_for_a_minute_and_slow(rig, bed):
    """Prometheus behind a proxy that answers 2 s late, and stopped for a minute while the baseline
    is scored: nothing is scored meanwhile, the job says MetricsAvailable=False (MetricsUnavailable),
    and it goes on once Prometheus is back."""
    from hack.bed import binaries, clients, components, processes

    proxy = SlowProxy(bed.prometheus_url, delay=2.0)
    t0 = time.time()
    rig.env["RLTUNE_PROMETHEUS_ALLOWED_JOB_URLS"] = json.dumps([proxy.url])  # the admin lists the job's endpoint
    rig.start()
    rig.apply(
        twin_job(
            trials=2, parallel=2, steps=3, confirm=0, sec_per_step=1.0, prometheus_url=proxy.url, metrics_timeout=150
        )
    )
    stopped = False
    try:
        rig.wait_status(lambda st: (rig.trial(st, "baseline") or {}).get("state") == "Running", 120, "baseline running")
        processes.stop("prometheus")
        stopped, t_stop = True, time.time()
        st = rig.wait_status(
            lambda st: conditions(st).get("MetricsAvailable", {}).get("status") == "False",
            90,
            "MetricsAvailable=False",
        )
        t_cond = time.time() - t_stop
        assert conditions(st)["MetricsAvailable"]["reason"] == "MetricsUnavailable"
        while time.time() - t_stop < 60:
            st = rig.status()
            b = rig.trial(st, "baseline")
            assert b["state"] in ("Running", "Scoring"), f"scored without Prometheus: {b}"
            assert st["phase"] == "Profiling"
            time.sleep(2)
    finally:
        if stopped:
            processes.start("prometheus", components.commands(binaries.bin_dir(build=False))["prometheus"])
            processes.wait_for("prometheus", lambda: clients.http_ok(f"{bed.prometheus_url}/-/ready"), 60)
    t_back = time.time()
    st = rig.wait_status(lambda st: st.get("phase") != "Profiling", 120, "the baseline scored after the outage")
    t_resume = time.time() - t_back
    st = rig.wait_done(240)
    proxy.close()
    print(
        f"\nPrometheus stopped 60s: MetricsAvailable=False after {t_cond:.1f}s; baseline scored {t_resume:.1f}s after "
        f"it was back; job {st['phase']} after {time.time() - t0:.0f}s ({proxy.requests} slow queries)"
    )
    assert st["phase"] == "Succeeded", st.get("message")
    assert conditions(st)["MetricsAvailable"]["status"] == "True"
    assert rig.trial(st, "baseline")["state"] == "Succeeded"
    rig.check_invariants(st)


# ============================================================================ 5. user edits


def test_user_edits_while_operator_writes_status(rig):
    """A user patches labels and spec.budget in a loop while the job runs: their edits stay, the status
    keeps every trial, and the operator's status writes per second stay bounded (no hot loop)."""
    t0 = time.time()
    rig.start()
    rig.apply(twin_job(trials=4, parallel=2, steps=3, confirm=2, sec_per_step=0.5))
    rig.wait_status(lambda st: st.get("phase") == "Profiling", 60, "Profiling")
    stop = threading.Event()
    edits = {"n": 0}

    def edit():
        while not stop.is_set():
            n = edits["n"] = edits["n"] + 1
            patch = {"metadata": {"labels": {"edit": str(n)}}, "spec": {"budget": {"maxFailedTrials": 6 + n % 2}}}
            rig.kubectl(
                "patch", "rltuningjob", NAME, "-n", rig.ns, "--type=merge", "-p", json.dumps(patch), check=False
            )
            time.sleep(0.5)

    th = threading.Thread(target=edit, daemon=True)
    th.start()
    try:
        st = rig.wait_done(300)
    finally:
        stop.set()
        th.join()
    wall = time.time() - t0
    obj = rig.job()
    writes = rig.status_writes()
    per_s = Counter(int(w) for w in writes)
    span = max(writes) - min(writes) if len(writes) > 1 else 1.0
    print(
        f"\n{edits['n']} user edits; job {st['phase']} after {wall:.0f}s; {len(writes)} status writes over {span:.0f}s "
        f"({len(writes) / span:.2f}/s, at most {max(per_s.values())} in one second)"
    )
    assert st["phase"] == "Succeeded", st.get("message")
    assert obj["metadata"]["labels"]["edit"] == str(edits["n"])
    assert obj["spec"]["budget"]["maxFailedTrials"] == 6 + edits["n"] % 2
    assert st["observedGeneration"] == obj["metadata"]["generation"] or st["phase"] in TERMINAL
    # each spec edit is one more status write (observedGeneration); a hot loop would be tens per second
    assert len(writes) / span < 5 and max(per_s.values()) <= 10
    rig.check_invariants(st)


# ============================================================================ 6. job deleted


def test_job_deleted_in_each_phase(rig):
    """Deleting the job in Pending, Profiling, Searching and Confirming removes all its pods."""
    rig.start()
    times = {}
    for phase in ("Pending", "Profiling", "Searching", "Confirming"):
        name = f"del-{phase.lower()}"
        doc = twin_job(name, trials=3, parallel=2, steps=4, confirm=4, sec_per_step=1.0)
        rig.apply(doc)
        if phase != "Pending":  # Pending: deleted right after it was created, before or as the operator starts it
            rig.wait_status(rig.in_phase_with_pods(phase, name), 240, f"{name} in {phase} with pods", name)
        n = len(rig.pods(name))
        t = time.time()
        rig.kubectl("delete", "rltuningjob", name, "-n", rig.ns, "--wait=false")
        bedlib.wait_for(lambda n=name: not rig.pods(n) and rig.job(n) is None, 90, 0.2, f"{name}'s pods to go")
        times[phase] = (time.time() - t, n)
        dups = {k: v for k, v in bedlib.pod_creations(rig.bed, rig.ns).items() if v > 1}
        assert not dups, dups
    print(
        "\ndelete -> all pods and the job gone: " + ", ".join(f"{p} {s:.1f}s ({n} pods)" for p, (s, n) in times.items())
    )
    assert all(s < 90 for s, _ in times.values())


# ============================================================================ 7. API server restarted


def test_apiserver_restarted_under_the_operator(rig):
    """kube-apiserver restarts while trials run: the operator reconnects, the job finishes, no pod twice."""
    from hack.bed import lifecycle

    t0 = time.time()
    rig.start()
    rig.apply(twin_job(trials=3, parallel=2, steps=3, confirm=2, sec_per_step=1.0))
    rig.wait_status(rig.in_phase_with_pods("Searching"), 240, "Searching with trial pods")
    t = time.time()
    lifecycle.restart(["kube-apiserver"])
    t_restart = time.time() - t
    st = rig.wait_done(300)
    print(f"\nkube-apiserver restarted in {t_restart:.1f}s; job {st['phase']} after {time.time() - t0:.0f}s")
    assert st["phase"] == "Succeeded", st.get("message")
    assert st["trialsDone"] == "3/3"
    rig.check_invariants(st)
