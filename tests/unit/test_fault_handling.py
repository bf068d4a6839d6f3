"""Faults the operator meets, as plain data (the bed versions: tests/e2e/test_faults.py): a pod the
cluster disrupted (node lost, evicted) is a preemption, not a failed configuration; Prometheus that
cannot be read turns the job's MetricsAvailable condition False and nothing is scored meanwhile."""

from __future__ import annotations

from test_lifecycle import drive, ok
from test_tuner_fixtures import job

from rltune.api.status import Phase, RLTuningJobStatus, TrialState
from rltune.controller.reconcile import disruption
from rltune.trial.main import injected_fault
from rltune.tuner import lifecycle


def pod(name="j-t1-0", conditions=()):
    return {"metadata": {"name": name}, "status": {"phase": "Failed", "conditions": list(conditions)}}


def test_disruption_from_the_pods_condition_or_a_lost_rank0():
    evicted = pod(
        conditions=[
            {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": "DeletionByTaintManager",
                "message": "Taint manager: deleting due to NoExecute taint",
            }
        ]
    )
    assert "DeletionByTaintManager" in disruption([pod(), evicted])
    assert disruption([pod(conditions=[{"type": "DisruptionTarget", "status": "False"}])]) == ""
    assert disruption([pod()]) == ""
    assert "deleted while it ran" in disruption([], lost=True)
    assert disruption([], lost=False) == ""


def test_a_node_lost_mid_trial_reruns_it_once_not_as_a_failure():
    spec = job(budget={"maxTrials": 3, "parallelTrials": 1, "stepsPerTrial": 4, "confirmSteps": 0})
    hit = set()

    def outcome(t, cfg):
        if t.id == "t1" and "t1" not in hit:
            hit.add("t1")
            return lifecycle.Observation(placed=True, preempted="pod j-t1-0 disrupted: DeletionByTaintManager")
        return ok(t, cfg)

    status, events = drive(spec, outcome)
    by = {t.id: t for t in status.trials}
    assert by["t1"].state == TrialState.PREEMPTED and "DeletionByTaintManager" in by["t1"].reason
    assert by["t1-retry"].config == by["t1"].config and by["t1-retry"].retry_of == "t1"
    assert by["t1-retry"].state in (TrialState.SUCCEEDED, TrialState.REJECTED, TrialState.STOPPED)
    assert status.trials_failed == 0 and status.trials_done == "3/3"
    assert status.phase == Phase.SUCCEEDED


def test_prometheus_unreadable_sets_metrics_unavailable_and_scores_nothing():
    spec = job(
        budget={
            "maxTrials": 2,
            "parallelTrials": 2,
            "stepsPerTrial": 4,
            "confirmSteps": 0,
            "metricsTimeoutSeconds": 600,
        }
    )
    down = {"ticks": 0}

    def outcome(t, cfg):
        if down["ticks"] < 20:  # Prometheus unreachable for the first 20 ticks (200 s)
            down["ticks"] += 1
            return lifecycle.Observation(
                placed=True,
                done=True,
                steps=[],
                metrics_error="Prometheus at http://p unreachable: "
                "<urllib3.connection.HTTPConnection object at 0x7f00aa>: refused",
            )
        return ok(t, cfg)

    status, events = drive(spec, outcome)
    conds = {c.type: c for c in status.conditions}
    assert status.phase == Phase.SUCCEEDED
    assert conds["MetricsAvailable"].status == "True"
    warned = [e for e in events if e.reason == "MetricsUnavailable"]
    assert len(warned) == 1 and "0x" not in warned[0].message  # once, and the same message every tick
    assert status.trials[0].state == TrialState.SUCCEEDED  # the baseline waited, then was scored


def test_metrics_condition_is_false_while_unreadable():
    spec = job()
    d = lifecycle.step(spec, RLTuningJobStatus(), {}, 1_000_000.0)
    status = d.status
    obs = {"baseline": lifecycle.Observation(placed=True, done=True, steps=[], metrics_error="Prometheus down")}
    d = lifecycle.step(spec, status, obs, 1_000_010.0)
    d = lifecycle.step(spec, d.status, obs, 1_000_020.0)
    conds = {c.type: c for c in d.status.conditions}
    assert conds["MetricsAvailable"].status == "False" and conds["MetricsAvailable"].reason == "MetricsUnavailable"
    assert d.status.phase == Phase.PROFILING and d.status.trials[0].state == TrialState.SCORING


def test_injected_faults_are_test_only_and_per_trial(monkeypatch):
    class S:  # the hook reads only .mode and .trial of a TrialSpec
        mode, trial = "twin", "t1"

    monkeypatch.delenv("RLTUNE_TWIN_FAULTS", raising=False)
    assert injected_fault(S) == ""
    monkeypatch.setenv("RLTUNE_TWIN_FAULTS", "t0=crash, t1=oom,t2=bogus")
    assert injected_fault(S) == "oom"
    S.trial = "t2"
    assert injected_fault(S) == ""
    S.mode = "real"
    S.trial = "t0"
    assert injected_fault(S) == ""


def test_a_nan_trial_is_rejected_and_the_search_goes_on():
    """A trial that reports NaN step times is rejected by the nan gate; its summary (NaN stored as -1)
    must not reach the forecaster's fit (math.log of a negative step time stopped every later tick)."""
    spec = job(budget={"maxTrials": 3, "parallelTrials": 1, "stepsPerTrial": 4, "confirmSteps": 0})

    def outcome(t, cfg):
        o = ok(t, cfg)
        if t.id == "t1":
            nan = float("nan")
            o = lifecycle.Observation(
                placed=True,
                done=True,
                steps=[s if s.warmup else type(s)(**{**s.__dict__, "duration": nan, "reward": nan}) for s in o.steps],
            )
        return o

    status, _ = drive(spec, outcome)
    by = {t.id: t for t in status.trials}
    assert by["t1"].state == TrialState.REJECTED and "nan" in by["t1"].reason.lower()
    assert {"t2", "t3"} <= set(by) and status.phase == Phase.SUCCEEDED
    assert by["t1"].measured_seconds is None and by["t1"].objective is None  # no NaN in the status JSON
    import json

    json.dumps(status.dump(), allow_nan=False)
