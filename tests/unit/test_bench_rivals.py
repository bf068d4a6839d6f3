"""The benchmark's rivals, its generated job set and its tuning-cost figures (bench/run.py, bench/jobs.py)."""

import json

import pytest

from bench.confirm import Confirmation
from bench.jobs import FRESH_PREFIX, fresh_jobs, generated_jobs, jobs
from bench.run import (
    RIVALS,
    _int_keys,
    best_after,
    deploy,
    fits_memory,
    matched_trials,
    measured_baseline,
    run_baseline_search,
    select_jobs,
    tuning_cost,
)
from rltune.api.models import RLTuningJobSpec
from rltune.api.status import TrialState
from rltune.tuner import Tuner, records, summarize
from rltune.tuner.search import flat_key

pytest.importorskip("optuna")


@pytest.fixture(scope="module")
def bench_job():
    job = select_jobs("seed-35b-a3b-math")[0]
    rn, base = measured_baseline(job["metadata"]["name"], RLTuningJobSpec.model_validate(job["spec"]))
    return rn, base


@pytest.mark.parametrize("method", RIVALS)
def test_every_rival_runs_distinct_valid_trials(bench_job, method):
    rn, base = bench_job
    out = run_baseline_search(rn, base, 5, 0, method, Tuner(rn.spec, base, []))
    hist = out["history"]
    assert len(hist) == 5
    keys = {flat_key(r.config.flat(), rn.space.budget, rn.space.gpn) for r in hist}
    assert len(keys) == 5 and flat_key(base.config.flat(), rn.space.budget, rn.space.gpn) not in keys
    assert all(rn.space.all_valid(r.config.flat()) is None for r in hist)
    assert all(r.state in (TrialState.SUCCEEDED, TrialState.REJECTED, TrialState.FAILED) for r in hist)


def test_warm_tpe_starts_from_the_plans_top_configurations(bench_job):
    rn, base = bench_job
    judge = Tuner(rn.spec, base, [])
    plan = [p.config.key() for p in judge.proposer.rank(limit=4)]
    hist = run_baseline_search(rn, base, 4, 1, "tpe-warm", judge)["history"]
    assert [r.config.key() for r in hist] == plan


def test_memory_filtered_random_only_runs_what_the_memory_model_fits(bench_job):
    rn, base = bench_job
    hist = run_baseline_search(rn, base, 8, 2, "random-fit", Tuner(rn.spec, base, []))["history"]
    assert all(fits_memory(rn.spec, r.config.flat()) for r in hist)


def _prop(cfg):
    from bench.run import _FakeProp

    return _FakeProp(cfg)


def test_tuning_cost_and_payback():
    c = tuning_cost(10.0, base_gpu_s=7200.0, pick_gpu_s=3600.0)  # saves one GPU-hour per step
    assert c["saved_gpu_h"] == pytest.approx(500.0) and c["share"] == pytest.approx(0.02)
    assert c["payback_steps"] == pytest.approx(10.0)
    none = tuning_cost(10.0, 3600.0, 3600.0)
    assert none["share"] is None and none["payback_steps"] is None


def test_trial_gpu_hours_count_the_warm_up_step_as_it_ran(bench_job):
    rn, base = bench_job
    tuner = Tuner(rn.spec, base, [])
    steps, _ = rn.steps(base.config, "t1", 7)
    steady = [s.duration for s in steps[1:]]
    assert steps[0].warmup and steps[0].duration > sum(steady) / len(steady)  # graph capture, slower training
    rec = tuner.judge(tuner.record_for("t1", _prop(base.config)), summarize(steps))
    _, gpu_h, _ = best_after(rn, base, [rec], 1)
    assert gpu_h == pytest.approx(sum(s.duration for s in steps) * rec.gpus / 3600)
    assert gpu_h > rec.summary.step_time_mean * rec.summary.total_steps * rec.gpus / 3600


def test_generated_jobs_are_fixed_valid_and_apart_from_the_seed_jobs():
    a, b = generated_jobs(), generated_jobs()
    assert a == b and len(a) == 10
    seed_pairs = {(j["spec"]["workload"]["model"]["preset"], j["spec"]["resources"]["gpuType"]) for j in jobs()}
    kinds, placements = set(), set()
    for j in a:
        spec = RLTuningJobSpec.model_validate(j["spec"])
        assert (spec.workload.model.preset, spec.resources.gpu_type) not in seed_pairs
        kinds.add(spec.workload.task.kind)
        placements.add(spec.baseline.placement)
        assert j["spec"]["workload"]["scenario"]  # perturbed efficiency factors
    assert kinds == {"math", "agentic-coding"} and placements == {"colocated", "disaggregated"}
    assert any(
        j["spec"]["workload"]["task"].get("toolLatencySeconds") is None for j in a if "coding" in j["metadata"]["name"]
    )
    assert len({j["metadata"]["name"] for j in a}) == len(a)


def test_the_fresh_draw_is_fixed_and_shares_no_job_with_the_generated_set():
    fresh, gen = fresh_jobs(), generated_jobs()
    assert fresh == fresh_jobs() and len(fresh) == 10
    assert all(j["metadata"]["name"].startswith(FRESH_PREFIX + "-") for j in fresh)
    specs = {json.dumps(j["spec"], sort_keys=True) for j in gen}
    assert not any(json.dumps(j["spec"], sort_keys=True) in specs for j in fresh)
    for j in fresh:
        RLTuningJobSpec.model_validate(j["spec"])


def test_the_baseline_is_profiled_as_long_as_the_confirmation(bench_job):
    """rewardGate nonInferiority (the default): the benchmark's baseline runs records.baseline_steps."""
    rn, base = bench_job
    assert rn.spec.constraints.reward_gate == "nonInferiority"
    assert base.summary.total_steps == records.baseline_steps(rn.spec) == rn.spec.budget.confirm_steps


def _async_pick(rn, base):
    """rltune plan's best one-step-off configuration for the job (the async lever a confirmation judges)."""
    plan = [p.config for p in Tuner(rn.spec, base, []).proposer.rank(limit=12)]
    return next(c for c in plan if c.async_.staleness >= 1)


def test_a_pick_confirms_as_fast_as_one_step_off_learns(bench_job):
    """The confirmation draws the pick's rewards from the twin: with the twin's lag penalty a one-step-off
    pick confirms on most seeds; on a cluster where one step of lag slows learning 2x it rarely does.
    The baseline itself never confirms (not better than the baseline)."""
    rn, base = bench_job
    cfg = _async_pick(rn, base)
    runs = [rn.confirms(cfg, rn.confirm_seed(sd, 1)) for sd in range(20)]
    healthy = sum(r.passed for r in runs)
    assert healthy >= 14, healthy
    # the interim look (gates.confirmation_looks) confirms some early; a failed one ran its full length
    full = rn.spec.budget.confirm_steps
    assert any(r.passed and r.steps < full for r in runs) and all(r.passed or r.steps == full for r in runs)
    assert not rn.confirms(base.config, rn.confirm_seed(0, 1)).passed
    slow_spec = rn.spec.model_copy(deep=True)
    slow_spec.workload.scenario = dict(slow_spec.workload.scenario or {}, lag_penalty=1.0)
    rn2, _ = measured_baseline(rn.name, slow_spec)
    slow = sum(rn2.confirms(cfg, rn2.confirm_seed(sd, 1)).passed for sd in range(20))
    assert slow <= 6 and slow < healthy, (slow, healthy)


def test_a_pick_that_does_not_confirm_gives_way_to_the_next_best(bench_job):
    """deploy rejects a pick that fails its confirmation and takes the method's next best, charging every
    confirmation run. The first pick's verdict is set in the runner's memo (a failed confirmation of a
    given configuration cannot be chosen otherwise); the second is drawn."""
    rn, base = bench_job
    hist = run_baseline_search(rn, base, 6, 3, "tpe-warm", Tuner(rn.spec, base, []))["history"]
    first = deploy(rn, "tpe-warm", base, hist, 6, 0)
    assert first.record is not base and first.attempts >= 1
    key = (flat_key(first.record.config.flat(), rn.space.budget, rn.space.gpn), rn.confirm_seed(1, 1))
    rn.confirmed[key] = Confirmation(False, rn.spec.budget.confirm_steps)
    second = deploy(rn, "tpe-warm", base, hist, 6, 1)
    assert second.first_failed and second.attempts >= 2
    assert second.record is base or second.record.id != first.record.id
    one = rn.spec.budget.confirm_steps * rn.true(first.record.config)[1] * first.record.gpus / 3600
    assert second.confirm_gpu_h > one


def test_results_read_back_from_json_keep_their_per_budget_cells():
    """--from-json re-renders the tables from JSON, whose keys are strings: every per-budget field is
    read back by its trial budget (the first-pick column once rendered '-' for every job)."""
    stored = json.loads(json.dumps([{"methods": {"rltune": {"speedup": {8: 1.5}, "first_pick_failed": {8: 2}}}}]))
    m = _int_keys(stored)[0]["methods"]["rltune"]
    assert m["speedup"][8] == 1.5 and m["first_pick_failed"][8] == 2


def test_the_equal_cost_comparison_stops_each_rival_at_rltunes_gpu_hours(bench_job):
    """A rival is judged after as many of its trials as cost closest to rltune's trial GPU-hours on the
    same seed: none when even its first trial costs more than twice rltune's, all of them when rltune
    spent more than the rival's whole history, and in between the count whose spend is nearest."""
    rn, base = bench_job
    hist = run_baseline_search(rn, base, 5, 0, "random", Tuner(rn.spec, base, []))["history"]
    spend = [sum(r.summary.seconds_spent * r.gpus for r in hist[:k] if r.summary) / 3600 for k in range(6)]
    assert matched_trials(hist, 0.0) == 0 and matched_trials(hist, spend[5] * 10) == 5
    mid = (spend[2] + spend[3]) / 2
    assert matched_trials(hist, mid - 1e-6) == 2 and matched_trials(hist, mid + 1e-6) == 3
