"""bench.forecast's tables: what it reports per job and per trial index follows from the trials."""

from bench.forecast import LAST_INDEX, render, summarize_runs


def _run(job, seed, trials):
    errs = sorted(abs(p - m) / m for _, p, _, m in trials)
    return {"job": job, "seed": seed, "forecast_error": errs[len(errs) // 2], "trials": trials}


def test_signed_error_sign_coverage_and_pooling_of_late_trials():
    runs = [
        # optimistic forecasts (predicted 90 for a measured 100), the second inside its sd
        _run("a", 0, [(1, 90.0, 5.0, 100.0), (2, 90.0, 20.0, 100.0), (12, 101.0, 2.0, 100.0)]),
        # pessimistic ones
        _run("b", 0, [(1, 120.0, 30.0, 100.0), (2, 110.0, 1.0, 100.0), (11, 99.0, 2.0, 100.0)]),
    ]
    st = summarize_runs(runs)
    assert st["jobs"]["a"]["signed"] < 0 < st["jobs"]["b"]["signed"]
    assert abs(st["jobs"]["a"]["abs"] - 0.10) < 1e-9
    assert st["index"][1]["within_sd"] == 0.5  # 10 off with sd 5: out; 20 off with sd 30: in
    assert set(st["index"]) == {1, 2, LAST_INDEX}  # trials 11 and 12 pooled
    assert st["index"][LAST_INDEX]["trials"] == 2
    assert abs(st["headline"] - 0.10) < 1e-9  # per-job run errors 0.10 and 0.10
    lo, hi = st["interval"]
    assert lo <= st["headline"] <= hi
    text = render(st)
    assert f"| {LAST_INDEX}+ | 2 |" in text and "| a | 3 |" in text


def test_runs_without_scored_trials_have_no_headline():
    st = summarize_runs([{"job": "a", "seed": 0, "forecast_error": None, "trials": []}])
    assert st["headline"] is None and st["jobs"] == {} and st["index"] == {}
    assert "forecast error" not in render(st)


def test_first_seed_runs_the_held_out_seeds_not_seed_zero():
    from bench.forecast import job_trials
    from bench.run import select_jobs

    job = select_jobs("seed-35b-a3b-math")[0]
    held_out = job_trials(job, seeds=1, budget=3, first_seed=5)
    assert [r["seed"] for r in held_out] == [5]
    assert held_out == job_trials(job, seeds=1, budget=3, first_seed=5)  # a seed is reproducible
    first = job_trials(job, seeds=1, budget=3)
    assert [r["seed"] for r in first] == [0]
    # the measured step times of the same trial indices differ: other seeds, other noisy trials
    assert [t[3] for t in held_out[0]["trials"]] != [t[3] for t in first[0]["trials"]]
