"""The in-process twin backend on a virtual clock (rltune.backends.twin), and the benchmark that
tunes through it: rltune's benchmark figures are figures of the product's own loop."""

import pytest

from bench.run import measured_baseline, run_rltune, select_jobs
from rltune import twin
from rltune.api.models import RLConfig, RLTuningJobSpec, trial_spec_for
from rltune.api.status import Phase, TrialState
from rltune.backends.twin import TwinBackend, VirtualClock
from rltune.tuner import baseline_record, loop, restore


def _spec(name: str = "seed-35b-a3b-math") -> RLTuningJobSpec:
    return RLTuningJobSpec.model_validate(select_jobs(name)[0]["spec"])


def test_steps_appear_as_the_virtual_clock_passes_their_end():
    spec = _spec()
    backend = TwinBackend(VirtualClock(now=100.0))
    ts = trial_spec_for("ns", "job", "t1", spec, baseline_record(spec).config, 4, 1, seed=3)
    backend.launch("t1", ts)
    want = twin.simulate_trial(ts)
    assert backend.poll("t1").state == "running" and backend.poll("t1").steps == []
    for n in range(1, 5):
        backend.wait()  # to the end of the next step, and no further
        assert backend.clock() == pytest.approx(100.0 + sum(s.duration for s in want[:n]))
        obs = backend.poll("t1")
        assert obs.steps == want[:n]
        assert obs.state == ("succeeded" if n == 4 else "running")


def test_a_cancelled_trial_keeps_only_the_steps_it_ran():
    spec = _spec()
    backend = TwinBackend()
    backend.launch("t1", trial_spec_for("ns", "job", "t1", spec, baseline_record(spec).config, 4, 1))
    backend.wait()
    backend.cancel("t1")
    for _ in range(5):
        backend.wait()
    obs = backend.poll("t1")
    assert obs.state == "failed" and obs.reason == "cancelled" and len(obs.steps) == 1


def test_a_configuration_the_twin_cannot_run_fails_with_the_twins_reason():
    spec = _spec()
    huge = RLConfig.model_validate(baseline_record(spec).config.dump() | {"trainer": {"tp": 1, "pp": 1, "ep": 1}})
    backend = TwinBackend()
    ts = trial_spec_for("ns", "job", "t1", spec, huge, 4, 1)
    with pytest.raises(twin.Infeasible) as refusal:
        twin.simulate_trial(ts)
    backend.launch("t1", ts)
    obs = backend.poll("t1")
    assert obs.state == "failed" and obs.reason == str(refusal.value)


def test_a_seed_override_gives_trials_the_harness_draws():
    spec = _spec()
    backend = TwinBackend(seed_of=lambda trial, ts: 42)
    ts = trial_spec_for("ns", "job", "t1", spec, baseline_record(spec).config, 3, 1, seed=0)
    backend.launch("t1", ts)
    for _ in range(3):
        backend.wait()
    assert backend.poll("t1").steps == twin.simulate_trial(ts.model_copy(update={"seed": 42}))


@pytest.fixture(scope="module")
def bench_run():
    name = "seed-27b-dense-coding"  # early stops and a confirmation on seed 0
    rn, base = measured_baseline(name, _spec(name))
    return rn, base, run_rltune(rn, base, 8, seed=0)


def test_the_benchmark_tunes_through_the_products_loop(bench_run):
    """run_rltune is tuner.loop.run on the twin backend: the same trials, states and winner as the loop
    driven directly, and the lifecycle's phases to the end (a confirmed winner)."""
    rn, base, out = bench_run
    spec = rn.spec.model_copy(deep=True)
    spec.budget.max_trials = 8
    confirms = []

    def seed_of(trial, _ts):
        if trial == "baseline":
            return 7
        if trial.startswith("c"):
            confirms.append(trial)
            return rn.confirm_seed(0, len(confirms))
        return int(trial[1:])

    backend = TwinBackend(seed_of=seed_of)
    res = loop.run(spec, backend, job=rn.name, namespace="bench", clock=backend.clock, wait=backend.wait)
    direct = [restore.to_record(spec, t) for t in res.status.trials if t.kind == "search"]
    assert [(r.id, r.state, r.config) for r in out["history"]] == [(r.id, r.state, r.config) for r in direct]
    assert res.status.phase == Phase.SUCCEEDED and out["phase"] == "Succeeded"
    assert out["pick"].id == res.status.best.trial
    assert any(t.kind == "confirm" and t.state == TrialState.SUCCEEDED for t in res.status.trials)
    # the baseline the loop measured is the one every rival starts from (the same draw)
    loop_base = next(t for t in res.status.trials if t.kind == "baseline")
    assert loop_base.measured_seconds == pytest.approx(base.summary.step_time)


def test_a_losing_trial_stops_early_and_costs_only_its_steps(bench_run):
    rn, _, out = bench_run
    stopped = [r for r in out["history"] if r.state == TrialState.STOPPED]
    assert stopped, "seed 0 of this job early-stops losing trials"
    for r in stopped:
        assert r.summary.total_steps < rn.spec.budget.steps_per_trial
    full = [r for r in out["history"] if r.state == TrialState.SUCCEEDED]
    ran = sum(r.summary.seconds_spent * r.gpus for r in out["history"] if r.summary) / 3600
    assert out["trial_gpu_h"] > ran  # the confirmation's GPU-hours are counted too
    assert out["confirm_gpu_h"] > 0 and out["trial_gpu_h"] == pytest.approx(ran + out["confirm_gpu_h"], rel=1e-6)
    assert full
