"""bench.yardstick: the noiseless yardstick against the twin's noisy steps."""

import pytest

import bench.oracle
from bench.oracle import expected_steps
from bench.yardstick import Contender, JobYardstick, measure_job


@pytest.fixture(autouse=True)
def _oracle_cache_copy(tmp_path, monkeypatch):
    """bench.oracle.oracle writes its cache back, dropping entries of other twin versions: on a tree whose
    twin was just edited, a test run would rewrite the checkout's .state/bench/oracle_cache.json. The tests
    read and write a copy instead (cache hits stay hits)."""
    copy = tmp_path / "oracle_cache.json"
    if bench.oracle.CACHE.exists():
        copy.write_bytes(bench.oracle.CACHE.read_bytes())
    monkeypatch.setattr(bench.oracle, "CACHE", copy)


def _job(*rows: tuple[str, float, float, float]) -> JobYardstick:
    return JobYardstick("j", "math", [Contender(*r) for r in rows])


def test_agreeing_yardsticks_have_no_regret():
    j = _job(("oracle", 100.0, 110.0, 1.0), ("plan#1", 105.0, 116.0, 1.0))
    assert j.same_best and j.regret == 0.0 and not j.resolved
    assert j.contenders[0].bias == pytest.approx(100 / 110 - 1)
    assert j.speedup("noiseless") is None  # no baseline among the contenders


def test_a_reversal_beyond_the_sampling_is_reported_as_resolved_regret():
    # the noiseless yardstick prefers the oracle, the noisy mean prefers plan#1 by 5%, se 1 s each
    j = _job(("oracle", 100.0, 120.0, 1.0), ("plan#1", 101.0, 114.0, 1.0))
    assert not j.same_best
    assert j.by("noisy_mean").label == "plan#1"
    assert j.regret == pytest.approx(120 / 114 - 1)
    assert j.resolved
    # the same reversal inside the noise is not
    assert not _job(("oracle", 100.0, 120.0, 4.0), ("plan#1", 101.0, 114.0, 4.0)).resolved


def test_a_real_job_measures_both_yardsticks_with_common_random_numbers():
    from bench.run import select_jobs

    job = select_jobs("gen-07-qwen3-30b-a3b-gb200-math", "generated")[0]
    r = measure_job(job, samples=2, top=1)
    labels = [c.label for c in r.contenders]
    assert labels[:2] == ["baseline", "oracle"]
    for c in r.contenders:
        assert c.noiseless > 0 and c.noisy_mean > 0 and abs(c.bias) < 0.5
    # the oracle is the noiseless yardstick's best by construction, and faster than the baseline
    assert r.by("noiseless").label == "oracle"
    assert r.speedup("noiseless") > 1.0 and r.speedup("noisy_mean") > 1.0


def test_an_infeasible_configuration_has_no_noisy_steps():
    from bench.run import select_jobs
    from rltune.api.models import RLTuningJobSpec

    job = select_jobs("gen-07-qwen3-30b-a3b-gb200-math", "generated")[0]
    spec = RLTuningJobSpec.model_validate(job["spec"])
    cfg = spec.baseline.model_copy(
        update={"rollout": spec.baseline.rollout.model_copy(update={"gpu_memory_utilization": 0.99})}
    )
    assert expected_steps(spec, cfg, 2) is None


def test_bench_run_judges_by_the_mean_of_common_random_noisy_steps():
    import statistics

    from bench.run import JobTrials, select_jobs
    from rltune.api.models import RLTuningJobSpec

    job = select_jobs("gen-07-qwen3-30b-a3b-gb200-math", "generated")[0]
    spec = RLTuningJobSpec.model_validate(job["spec"])
    rn = JobTrials("t", spec)
    a, b = expected_steps(spec, spec.baseline, 4), expected_steps(spec, spec.baseline, 4)
    assert a == b and len(set(a)) == 4  # fresh workload per sample, the same samples for every call
    objective, step = rn.true(spec.baseline)
    assert step == pytest.approx(statistics.fmean(expected_steps(spec, spec.baseline)))
    assert step != pytest.approx(rn.noiseless(spec.baseline)[1], rel=1e-6)
    assert rn.best_judged() == (objective, spec.baseline)


def test_the_benchmark_oracle_is_never_beaten_by_a_pick_and_picks_are_kept():
    from bench.run import bench_job, select_jobs

    job = select_jobs("gen-03-qwen2.5-7b-gb200-math", "generated")[0]
    r = bench_job(job, seeds=1, budgets=[2, 4], log=lambda s: None, oracle_procs=1, methods=("rltune", "random"))
    for m in r["methods"].values():
        assert all(s <= r["oracle_speedup"] + 1e-12 for s in m["speedup"].values())
        assert [len(p) for p in m["picks"].values()] == [1, 1]
    assert r["oracle_speedup"] > 1.0 and r["oracle_noiseless_speedup"] > 1.0
    assert r["baseline"] != pytest.approx(r["baseline_noiseless"], rel=1e-6)


def test_merge_reruns_one_method_and_reaches_what_a_full_run_gives(tmp_path):
    import json

    from bench.run import bench_job, merge_set, select_jobs

    job = select_jobs("gen-03-qwen2.5-7b-gb200-math", "generated")[0]
    kw = dict(seeds=1, budgets=[2, 4], log=lambda s: None, oracle_procs=1)
    full = bench_job(job, methods=("rltune", "random"), **kw)
    merged = bench_job(job, methods=("rltune",), keep=full, **kw)
    assert list(merged["methods"]) == ["rltune", "random"]  # METHODS order, the kept one carried over
    assert merged["methods"]["random"] is full["methods"]["random"]
    assert merged["methods"]["rltune"]["picks"] == full["methods"]["rltune"]["picks"]  # seeded: reproducible
    assert merged["oracle"] == full["oracle"] and merged["oracle_config"] == full["oracle_config"]
    # the yardstick values a run stores are reused, not recomputed, when the twin and job are the same
    stored = json.loads(json.dumps(full))
    key = next(k for k, v in stored["yardstick"].items() if v is not None and v[0] == full["oracle"])
    stored["yardstick"][key] = [full["oracle"] * 0.9, stored["yardstick"][key][1]]
    assert bench_job(job, methods=("rltune",), keep=stored, **kw)["oracle"] == pytest.approx(full["oracle"] * 0.9)
    stored["yardstick_id"] = "another twin"
    assert bench_job(job, methods=("rltune",), keep=stored, **kw)["oracle"] == full["oracle"]
    # a previous result judged on another yardstick (here: a baseline that moved) is refused
    with pytest.raises(ValueError, match="rerun every method"):
        bench_job(job, methods=("rltune",), keep=dict(full, baseline=full["baseline"] * 1.01), **kw)
    # merge_set refuses a file run with other seeds, before running anything, and leaves it alone
    path = tmp_path / "r.json"
    path.write_text(json.dumps([full]))
    with pytest.raises(SystemExit, match="other budgets or seeds"):
        merge_set(path, [job], 2, [2, 4], ("rltune",), 1)
    with pytest.raises(SystemExit, match="not in"):
        merge_set(path, select_jobs("gen-07-qwen3-30b-a3b-gb200-math", "generated"), 1, [2, 4], ("rltune",), 1)
    assert json.loads(path.read_text())[0]["oracle"] == full["oracle"]
