"""Event-driven reconciling, the parts that need no cluster: when a job needs a tick without events
(next_tick), a tick fed from the watches (body, pods, RayJobs given) that makes no API request when
nothing changed, a stale watch body after the reconciler's own status write, and what the indexes keep.

The operator itself (kopf daemons, indexes, deletion) runs on the bed in tests/e2e/test_events.py."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from rltune.controller.handlers import job_key, snapshot
from rltune.controller.reconcile import Reconciler, is_terminating, next_tick
from rltune.settings import OperatorSettings

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "twin-demo.yaml"


class RecordingCluster:
    """A cluster that records every call; reads the watches should have made fail the test."""

    def __init__(self):
        self.calls: list[str] = []
        self.rv = 10

    def get_job(self, namespace, name):
        raise AssertionError("get_job: the body was given")

    def list_trial_pods(self, namespace, job):
        raise AssertionError("list_trial_pods: the pods were given")

    def list_rayjobs(self, namespace, job):
        raise AssertionError("list_rayjobs: the RayJobs were given")

    def write_status(self, job, status):
        self.calls.append("write_status")
        self.rv += 1
        out = copy.deepcopy(job)
        out["status"] = status
        out["metadata"]["resourceVersion"] = str(self.rv)
        return out

    def create(self, manifest):
        self.calls.append(f"create {manifest['kind']}")
        return True

    def list_nodes(self):
        self.calls.append("list_nodes")
        return []  # no node has the job's GPUs: its baseline is refused, the job fails

    def refusal(self, manifest):
        self.calls.append("refusal")
        return None

    def delete_trial(self, namespace, job, trial, uid):
        assert uid == "u-1", uid  # the job's UID: teardown deletes only what it owns
        self.calls.append(f"delete_trial {trial}")

    def serves(self, kind):
        self.calls.append(f"serves {kind}")
        return False


def job_body() -> dict:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"].update(namespace="ns", uid="u-1", generation=1, resourceVersion="10")
    return doc


def settings() -> OperatorSettings:
    return OperatorSettings(pushgateway_url="http://pgw:9091")


def test_next_tick():
    body = job_body()
    assert next_tick(body, 2.0, 60.0) == 60.0  # new: no status yet (its creation is an event anyway)
    body["status"] = {"phase": "Profiling", "trials": [{"id": "baseline", "state": "Running"}]}
    assert next_tick(body, 2.0, 60.0) == 2.0  # Prometheus and timeouts are no watch
    body["status"] = {"phase": "Succeeded", "observedGeneration": 1, "trials": [{"id": "t1", "state": "Succeeded"}]}
    assert next_tick(body, 2.0, 60.0) is None  # finished: events only
    body["metadata"]["generation"] = 2  # edited after it finished (e.g. a larger maxTrials): not finished
    assert next_tick(body, 2.0, 60.0) == 60.0


def test_tick_from_watches_makes_no_request_once_settled():
    cluster = RecordingCluster()
    r = Reconciler(cluster, settings=settings(), clock=lambda: 1_000_000.0)
    body = job_body()
    assert r.reconcile("ns", "twin-demo", body=body, pods=[], rayjobs=[]) == "Failed"
    assert "get_job" not in cluster.calls and cluster.calls.count("write_status") == 1
    written = r._written[("ns", "twin-demo")]["10"]
    assert next_tick(written, 2.0, 60.0) is None

    # the watch delivers the write: nothing to do, no request
    cluster.calls.clear()
    assert r.reconcile("ns", "twin-demo", body=copy.deepcopy(written), pods=[], rayjobs=[]) == "Failed"
    assert cluster.calls == []


def test_stale_watch_body_is_replaced_by_the_own_write():
    """An event (a pod) wakes the job before the watch delivered the reconciler's status write: the
    tick works on the written job, not the stale one, so it neither repeats the write nor acts on the
    old status."""
    cluster = RecordingCluster()
    r = Reconciler(cluster, settings=settings(), clock=lambda: 1_000_000.0)
    stale = job_body()
    r.reconcile("ns", "twin-demo", body=copy.deepcopy(stale), pods=[], rayjobs=[])
    cluster.calls.clear()
    assert r.reconcile("ns", "twin-demo", body=copy.deepcopy(stale), pods=[], rayjobs=[]) == "Failed"
    assert cluster.calls == []
    # someone else changed the job since: its body is used (and the remembered write forgotten)
    newer = copy.deepcopy(stale)
    newer["metadata"]["resourceVersion"] = "99"
    r.reconcile("ns", "twin-demo", body=newer, pods=[], rayjobs=[])
    assert list(r._written.get(("ns", "twin-demo"), {})) in ([], ["99"])


def test_chain_of_own_writes():
    """Two writes before the watch delivered either: a tick on the first basis, and one on the first
    write's result, both work on the second write's result."""
    r = Reconciler(RecordingCluster(), settings=settings())
    b10, b11, b12 = ({"metadata": {"namespace": "ns", "name": "j", "resourceVersion": v}} for v in ("10", "11", "12"))
    r._written[("ns", "j")] = {"10": b11, "11": b12}
    assert r._fresher(copy.deepcopy(b10)) is b12
    assert r._fresher(copy.deepcopy(b11)) is b12
    assert r._fresher(copy.deepcopy(b12))["metadata"]["resourceVersion"] == "12"
    assert ("ns", "j") not in r._written


def test_pods_of_ended_trials_torn_down_once():
    """Pods of a trial that is not active are deleted; once they are all terminating, not again."""
    cluster = RecordingCluster()
    r = Reconciler(cluster, settings=settings(), clock=lambda: 1_000_000.0)
    r.reconcile("ns", "twin-demo", body=job_body(), pods=[], rayjobs=[])
    written = copy.deepcopy(r._written[("ns", "twin-demo")]["10"])
    pod = {"metadata": {"name": "twin-demo-old-0", "labels": {"rltune.io/job": "twin-demo", "rltune.io/trial": "old"}}}
    cluster.calls.clear()
    r.reconcile("ns", "twin-demo", body=written, pods=[pod], rayjobs=[])
    assert cluster.calls == ["delete_trial old"]
    cluster.calls.clear()
    pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    r.reconcile("ns", "twin-demo", body=written, pods=[pod], rayjobs=[])
    assert cluster.calls == []
    assert is_terminating(None) and is_terminating(pod) and not is_terminating({"metadata": {}})


def test_index_values():
    pod = {
        "metadata": {"name": "p", "managedFields": [{"manager": "x"}], "labels": {"rltune.io/job": "j"}},
        "status": {"phase": "Running"},
    }
    snap = snapshot(pod)
    assert "managedFields" not in snap["metadata"] and "managedFields" in pod["metadata"]
    assert snap["status"] == {"phase": "Running"}
    assert job_key("ns", {"rltune.io/job": "j"}) == ("ns", "j")
    assert job_key("ns", {}) is None and job_key(None, {"rltune.io/job": "j"}) is None


def test_a_finished_trials_pods_go_before_the_new_trials_pods_come():
    """The GPUs a new trial is given are a finished trial's: its pods are deleted before the new ones are
    created, or for a moment both hold them (over gpuBudget; the bed's budget test saw 24 of 16 GPUs)."""
    from rltune.api.status import Phase, RLTuningJobStatus
    from rltune.tuner import lifecycle

    cluster = RecordingCluster()
    r = Reconciler(cluster, settings=settings())
    body = job_body()
    before = RLTuningJobStatus()
    d = lifecycle.Decisions(status=before.model_copy(update={"phase": Phase.SEARCHING}), teardown=["t1"])
    r._commit(body, before, d, [{"kind": "Pod", "metadata": {"name": "t2-0"}}], None)
    assert cluster.calls.index("delete_trial t1") < cluster.calls.index("create Pod"), cluster.calls


def test_each_tick_runs_the_lifecycle_within_the_tick_budget(monkeypatch):
    """The operator's tickBudgetSeconds reaches the pure lifecycle as a plain number; a second step in
    the same tick (after a refused trial) gets what is left of it, not a budget of its own."""
    from rltune.controller import reconcile
    from rltune.tuner import lifecycle

    budgets, real = [], lifecycle.step

    def step(spec, status, observations, now, generation=1, budget_seconds=None, **k):
        budgets.append(budget_seconds)
        return real(spec, status, observations, now, generation, budget_seconds, **k)

    monkeypatch.setattr(reconcile.lifecycle, "step", step)
    s = settings().model_copy(update={"tick_budget_seconds": 3.0})
    r = Reconciler(RecordingCluster(), settings=s, clock=lambda: 1_000_000.0)
    assert r.reconcile("ns", "twin-demo", body=job_body(), pods=[], rayjobs=[]) == "Failed"  # no node: refused
    assert budgets[0] == 3.0 and len(budgets) == 2 and 0.0 <= budgets[1] <= 3.0
