"""bench.rejudge: the stored picks of a benchmark run re-judged on a finer yardstick."""

import json

import pytest

from bench.rejudge import RESULTS, Rejudged, rejudge_job, render
from bench.run import select_jobs


@pytest.fixture(scope="module")
def gen08():
    stored = {r["job"]: r for r in json.loads(RESULTS["generated"].read_text())}
    job = next(j for j in select_jobs(None, "generated") if j["metadata"]["name"].startswith("gen-08"))
    return job, stored[job["metadata"]["name"]], stored


def test_on_the_tables_own_samples_it_reproduces_the_stored_medians(gen08):
    """The first 12 samples are the table's draws: re-judged on them, every method's median is the stored one."""
    job, res, _ = gen08
    r = rejudge_job(job, res, 12, 8)
    assert set(r.medians) == set(res["methods"])
    for method, m in res["methods"].items():
        assert r.medians[method] == pytest.approx(m["speedup"]["8"], rel=1e-9)


def test_more_samples_move_the_medians_and_the_table_shows_both(gen08):
    job, res, stored = gen08
    r = rejudge_job(job, res, 24, 8)
    assert any(abs(r.medians[m] / v["speedup"]["8"] - 1) > 1e-6 for m, v in res["methods"].items())
    lines = render([r], stored, 8)
    assert lines[2].startswith(f"| {res['job']} |") and "->" in lines[2]
    assert "on 24 samples" in lines[-1]


def test_the_verdict_is_bench_runs():
    assert Rejudged("j", 96, {"rltune": 1.00, "tpe": 1.004}).not_behind
    assert not Rejudged("j", 96, {"rltune": 1.00, "tpe": 1.006}).not_behind
    assert not Rejudged("j", 96, {"rltune": 1.00, "tpe": 1.00}).ahead
    assert Rejudged("j", 96, {"rltune": 1.01, "tpe": 1.00}).ahead
