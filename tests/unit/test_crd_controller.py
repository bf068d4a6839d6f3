"""The reconciler's lifecycle against a fake cluster, fake Prometheus and a fake tuner: profiling,
search in batches within the GPU budget, confirmation, Succeeded; a fresh reconciler (a restarted
operator) at every tick never creates a pod twice; invalid specs get a condition naming the field."""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any, Optional

import pytest
import yaml

import rltune.tuner as tuner_pkg
from rltune.api.metrics import StepRecord
from rltune.api.models import RLConfig
from rltune.api.status import RLTuningJobStatus
from rltune.controller import pods as P
from rltune.controller.reconcile import Conflict, Reconciler
from rltune.controller.render import render_overrides
from rltune.controller import tunerport as tp
from rltune.tuner.summary import TrialSummary


# ------------------------------------------------------------------ fakes


class FakeRecord(SimpleNamespace):
    def __init__(self, id, config, gpus, predicted=None, predicted_std=None, summary=None, objective=None,
                 state="running", reason=None, gates=None):
        super().__init__(id=id, config=config, gpus=gpus, predicted=predicted, predicted_std=predicted_std,
                         summary=summary, objective=objective, state=state, reason=reason, gates=gates)


class FakeTuner:
    values = [512, 1024, 128, 2048, 256, 4096, 32, 8192]

    def __init__(self, spec, baseline, history):
        self.spec, self.baseline, self.history = spec, baseline, history

    def propose(self, n, gpus_free):
        tried = {h.config.rollout.max_num_seqs for h in self.history}
        out = []
        for v in self.values:
            if v not in tried and len(out) < n:
                cfg = self.baseline.config.with_knobs({"rollout.maxNumSeqs": v})
                out.append(SimpleNamespace(config=cfg, predicted=100.0 / (v / 64), predicted_std=1.0))
        return out

    def judge(self, record, summary):
        record.summary = summary
        record.objective = summary.step_time_mean
        record.state = "succeeded" if record.config.rollout.max_num_seqs != 4096 else "rejected"
        record.gates = {"steps": "pass", "mismatch": "pass" if record.state == "succeeded" else "fail: too big"}
        return record

    def early_stop(self, steps, gpus=None):
        return False

    def done(self):
        return False, ""

    def best(self):
        ok = [h for h in self.history if h.state == "succeeded" and h.objective is not None]
        return min(ok, key=lambda h: h.objective) if ok else None

    def forecast_error(self):
        return 0.1


class FakeCluster:
    def __init__(self, job: dict):
        self.job = job
        self.pods: dict[str, dict] = {}
        self.created: list[str] = []
        self.deleted: list[str] = []
        self.rv = 1

    def get_job(self, ns, name):
        return copy.deepcopy(self.job)

    def write_status(self, job, status):
        if job["metadata"]["resourceVersion"] != self.job["metadata"]["resourceVersion"]:
            raise Conflict()
        self.job["status"] = copy.deepcopy(status)
        self.rv += 1
        self.job["metadata"]["resourceVersion"] = str(self.rv)
        return self.job

    def list_trial_pods(self, ns, job):
        return [copy.deepcopy(p) for p in self.pods.values()]

    def create(self, m):
        if m["kind"] != "Pod":
            return True
        name = m["metadata"]["name"]
        if name in self.pods:
            return False
        self.created.append(name)
        m = copy.deepcopy(m)
        m["status"] = {"phase": "Pending"}
        self.pods[name] = m
        return True

    def delete_trial(self, ns, job, trial):
        for name in [n for n, p in self.pods.items() if p["metadata"]["labels"][P.LABEL_TRIAL] == trial]:
            self.deleted.append(name)
            del self.pods[name]

    # the "kubelet": schedule, then run pods to completion
    def step_pods(self, fail_trial: Optional[str] = None):
        for p in self.pods.values():
            st = p["status"]
            if st["phase"] == "Pending":
                p["spec"]["nodeName"] = "node-1"
                st["phase"] = "Running"
            elif st["phase"] == "Running":
                trial = p["metadata"]["labels"][P.LABEL_TRIAL]
                if trial == fail_trial:
                    st["phase"] = "Failed"
                    st["containerStatuses"] = [{"state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]
                else:
                    st["phase"] = "Succeeded"


class FakeMetrics:
    """Step time = 100 s * 64 / maxNumSeqs (capped) for ran trials; baseline maxNumSeqs 64 -> 100 s."""

    def __init__(self, cluster: FakeCluster):
        self.cluster = cluster
        self.seen: dict[str, int] = {}

    def steps(self, prom_url, ns, job, trial, overrides):
        st = RLTuningJobStatus.model_validate(self.cluster.job.get("status") or {})
        t = next(t for t in st.trials if t.id == trial)
        cfg = tp.config_from_diff(RLConfig.model_validate(self.cluster.job["spec"]["baseline"]), t.config)
        d = 100.0 * 64 / min(cfg.rollout.max_num_seqs, 1024)
        return [StepRecord(step=i, duration=d, phases={"generation": d * 0.8, "training": d * 0.2},
                           reward=0.5, warmup=i < 1) for i in range(t.steps)]


@pytest.fixture
def fake_tuner(monkeypatch):
    monkeypatch.setattr(tuner_pkg, "Tuner", FakeTuner, raising=False)
    monkeypatch.setattr(tuner_pkg, "TrialRecord", FakeRecord, raising=False)
    monkeypatch.setattr(tuner_pkg, "baseline_record",
                        lambda spec, summary=None, id="baseline": FakeRecord(
                            id=id, config=spec.baseline, gpus=spec.baseline.gpus or spec.resources.gpu_budget,
                            summary=summary, objective=summary.step_time_mean if summary else None,
                            state="succeeded" if summary else "pending"), raising=False)


def make_job(**budget: Any) -> dict:
    doc = yaml.safe_load(open("examples/twin-demo.yaml"))
    doc["spec"]["baseline"]["rollout"]["maxNumSeqs"] = 64
    doc["spec"]["baseline"]["gpus"] = 8
    doc["spec"]["budget"].update(budget)
    doc["metadata"].update({"namespace": "ns", "uid": "uid-1", "generation": 1, "resourceVersion": "1"})
    return doc


def run(cluster, ticks=200, restart_every_tick=False, fail_trial=None, clock_step=1.0):
    now = [1000.0]
    metrics = FakeMetrics(cluster)
    r = Reconciler(cluster, metrics=metrics, clock=lambda: now[0])
    phase = None
    for _ in range(ticks):
        if restart_every_tick:
            r = Reconciler(cluster, metrics=metrics, clock=lambda: now[0])
        phase = r.reconcile("ns", "twin-demo")
        cluster.step_pods(fail_trial)
        now[0] += clock_step
        if phase in ("Succeeded", "Failed"):
            break
    return phase


# ------------------------------------------------------------------ tests


def test_lifecycle_to_succeeded(fake_tuner):
    c = FakeCluster(make_job(maxTrials=6, parallelTrials=2))
    assert run(c) == "Succeeded"
    st = RLTuningJobStatus.model_validate(c.job["status"])
    assert st.baseline.step_seconds == pytest.approx(100.0)
    assert st.trials_done == "6/6"
    assert st.best and st.best.confirmed and st.best.speedup == pytest.approx(16.0)
    assert st.best.config == {"rollout.maxNumSeqs": 1024} or st.best.config == {"rollout.maxNumSeqs": 2048}
    assert st.speedup == "16.00x"
    assert any(o.startswith("rollout.maxNumSeqs=") for o in st.best.overrides)
    assert [t.id for t in st.trials][:3] == ["baseline", "t1", "t2"]
    assert any(t.kind == "confirm" for t in st.trials)
    assert len(c.created) == len(set(c.created))
    assert not c.pods  # every finished trial's pods were deleted
    conds = {k.type: k for k in st.conditions}
    assert conds["Complete"].status == "True" and conds["Complete"].reason == "Improved"
    assert all(k.observed_generation == 1 for k in st.conditions)


def test_restart_every_tick_never_duplicates(fake_tuner):
    c = FakeCluster(make_job(maxTrials=6, parallelTrials=2))
    assert run(c, restart_every_tick=True) == "Succeeded"
    assert len(c.created) == len(set(c.created))


def test_gpu_budget_respected_across_running_trials(fake_tuner):
    c = FakeCluster(make_job(maxTrials=6, parallelTrials=2))
    c.job["spec"]["baseline"]["gpus"] = 16  # each trial needs the whole budget of 16: one at a time
    now = [0.0]
    r = Reconciler(c, metrics=FakeMetrics(c), clock=lambda: now[0])
    for _ in range(120):
        phase = r.reconcile("ns", "twin-demo")
        st = RLTuningJobStatus.model_validate(c.job["status"])
        active = [t for t in st.trials if t.state in ("Pending", "Running", "Scoring")]
        assert sum(t.gpus for t in active) <= 16
        c.step_pods()
        now[0] += 1
        if phase == "Succeeded":
            break
    assert phase == "Succeeded"
    # 16 GPUs on 8-GPU nodes: two pods per trial, rank 0 and 1
    assert any(n.endswith("-t1-1") for n in c.created)


def test_too_many_failed_trials(fake_tuner):
    c = FakeCluster(make_job(maxTrials=6, parallelTrials=1, maxFailedTrials=1))
    assert run(c, fail_trial="t1") == "Failed"
    st = RLTuningJobStatus.model_validate(c.job["status"])
    t1 = next(t for t in st.trials if t.id == "t1")
    assert t1.state == "Failed" and "OOMKilled" in t1.reason and "137" in t1.reason
    assert {k.type: k.reason for k in st.conditions}["Failed"] == "TooManyFailedTrials"


def test_baseline_failure_fails_job(fake_tuner):
    c = FakeCluster(make_job())
    assert run(c, fail_trial="baseline") == "Failed"
    st = RLTuningJobStatus.model_validate(c.job["status"])
    assert {k.type: k.reason for k in st.conditions}["Failed"] == "BaselineFailed"


def test_metrics_unavailable_never_scored_on_guesses(fake_tuner):
    c = FakeCluster(make_job(metricsTimeoutSeconds=5))
    m = FakeMetrics(c)
    m.steps = lambda *a: []  # Prometheus has nothing
    now = [0.0]
    r = Reconciler(c, metrics=m, clock=lambda: now[0])
    for _ in range(30):
        phase = r.reconcile("ns", "twin-demo")
        c.step_pods()
        now[0] += 1
    assert phase == "Failed"
    base = RLTuningJobStatus.model_validate(c.job["status"]).trials[0]
    assert base.state == "MetricsUnavailable" and base.measured_seconds is None


def test_unschedulable_all_or_nothing(fake_tuner):
    c = FakeCluster(make_job(scheduleTimeoutSeconds=5))
    c.step_pods = lambda fail_trial=None: None  # nothing ever schedules
    assert run(c, ticks=20) == "Failed"
    base = RLTuningJobStatus.model_validate(c.job["status"]).trials[0]
    assert base.state == "Unschedulable"
    assert not c.pods


def test_raising_max_trials_resumes(fake_tuner):
    c = FakeCluster(make_job(maxTrials=2, parallelTrials=2))
    assert run(c) == "Succeeded"
    c.job["spec"]["budget"]["maxTrials"] = 4
    c.job["metadata"]["generation"] = 2
    assert run(c) == "Succeeded"
    st = RLTuningJobStatus.model_validate(c.job["status"])
    assert st.trials_done == "4/4" and st.observed_generation == 2
    assert len(c.created) == len(set(c.created))


def test_invalid_spec_condition_names_field(fake_tuner):
    job = make_job()
    job["spec"]["baseline"].update({"placement": "disaggregated", "trainerGpus": 8, "gpus": 8})
    c = FakeCluster(job)
    assert run(c, ticks=2) == "Failed"
    st = RLTuningJobStatus.model_validate(c.job["status"])
    cond = {k.type: k for k in st.conditions}["SpecValid"]
    assert cond.status == "False" and cond.reason == "InvalidSpec" and "baseline.trainerGpus" in cond.message
    assert not c.created
    job = make_job()
    job["spec"]["budget"]["stepsPerTrial"] = "many"
    c = FakeCluster(job)
    assert run(c, ticks=2) == "Failed"
    msg = {k.type: k for k in RLTuningJobStatus.model_validate(c.job["status"]).conditions}["SpecValid"].message
    assert "spec.budget.stepsPerTrial" in msg


def test_pod_manifests_multi_node():
    from rltune.api.models import RLTuningJobSpec

    spec = RLTuningJobSpec.model_validate(make_job()["spec"])
    cfg = spec.baseline.with_knobs({"gpus": 16})
    pods, svc = P.trial_manifests("ns", "twin-demo", {"uid": "u"}, spec, "t1", cfg, 4, 1, "http://pgw")
    assert [p["metadata"]["name"] for p in pods] == ["twin-demo-t1-0", "twin-demo-t1-1"]
    assert svc and svc["spec"]["clusterIP"] == "None"
    c = pods[1]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["RLTUNE_RANK"] == "1" and env["WORLD_SIZE"] == "2" and env["MASTER_ADDR"].startswith("twin-demo-t1-0.")
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert pods[0]["spec"]["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-B300"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pods[0]["spec"]["tolerations"]
    assert pods[0]["spec"]["restartPolicy"] == "Never"
    long = P.pod_name("a" * 80, "t123", 0)
    assert len(long) <= 63 and long == P.pod_name("a" * 80, "t123", 0)


def test_config_diff_round_trip():
    base = RLConfig()
    cfg = base.with_knobs({"rollout.maxNumSeqs": 1024, "gpus": 16, "placement": "disaggregated", "trainerGpus": 8})
    diff = tp.config_diff(base, cfg)
    assert diff == {"rollout.maxNumSeqs": 1024, "gpus": 16, "placement": "disaggregated", "trainerGpus": 8}
    assert tp.config_from_diff(base, diff) == cfg


def test_summary_round_trip():
    s = TrialSummary(steps=3, total_steps=4, step_time_mean=10.0, step_time_std=1.0,
                     phases={"generation": 8.0}, rewards=[0.1, 0.2, 0.3], nan=False)
    assert tp.unflatten_summary(tp.flatten_summary(s, keep_rewards=True)) == s


def test_render_verl():
    out = render_overrides("verl", {"rollout.maxNumSeqs": 512, "rollout.cudaGraphs": True})
    assert "actor_rollout_ref.rollout.max_num_seqs=512" in out
    assert "actor_rollout_ref.rollout.enforce_eager=false" in out


def test_promql_scoring_query_and_parse(monkeypatch):
    from rltune.controller import prom

    seen = {}

    class R:
        status_code = 200

        def raise_for_status(self):
            pass

        def json(self):
            res = []
            for step in range(3):
                base = {"namespace": "ns", "rltune_job": "j", "trial": "t1", "step": str(step)}
                res.append({"metric": {"__name__": "rltune_step_duration_seconds", **base}, "value": [0, "10.5"]})
                res.append({"metric": {"__name__": "rltune_step_phase_seconds", "phase": "generation", **base},
                            "value": [0, "8"]})
                res.append({"metric": {"__name__": "rltune_step_warmup", **base}, "value": [0, "1" if step == 0 else "0"]})
            return {"status": "success", "data": {"resultType": "vector", "result": res}}

    def get(url, params, timeout):
        seen["url"], seen["q"] = url, params["query"]
        return R()

    monkeypatch.setattr(prom.requests, "get", get)
    steps = prom.query_trial("http://p:9090", "ns", "j", "t1")
    assert seen["url"] == "http://p:9090/api/v1/query"
    assert 'namespace="ns"' in seen["q"] and 'rltune_job="j"' in seen["q"] and 'trial="t1"' in seen["q"]
    assert "rltune_step_duration_seconds" in seen["q"]
    assert [s.step for s in steps] == [0, 1, 2] and steps[0].warmup and not steps[1].warmup
    assert steps[1].duration == 10.5 and steps[1].phases == {"generation": 8.0}
