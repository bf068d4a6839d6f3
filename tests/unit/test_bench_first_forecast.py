"""bench.first_forecast: the forecast before any trial, per job and rollout regime."""

import math

from bench.first_forecast import Miss, job_misses, regime_of, render
from bench.run import select_jobs


def test_partial_rollout_streams_only_with_staleness():
    assert regime_of({"async.partialRollout": True, "async.staleness": 1}) == "stream"
    assert regime_of({"async.partialRollout": True, "async.staleness": 0}) == "drain"
    assert regime_of({"async.partialRollout": False, "async.staleness": 2}) == "drain"


def test_table_reports_each_regimes_median_and_range_and_the_median_over_jobs():
    per_job = {
        "a": [Miss("stream", x, x / 2, 3.0) for x in (0.1, 0.3, 0.5)] + [Miss("drain", -0.2, -0.1, 0.0)],
        "b": [Miss("stream", x, x, 0.0) for x in (-0.1, 0.1)],
    }
    lines = render(per_job)
    assert "| a | stream | 3 | +0.30 (+0.10..+0.50) | +0.15 | 0.15 | 3/3 |" in lines
    assert "| a | drain | 1 | -0.20 (-0.20..-0.20) | -0.10 | 0.10 | 0/1 |" in lines
    assert "| b | stream | 2 | +0.00 (-0.10..+0.10) | +0.00 | 0.10 | 0/2 |" in lines
    assert not any(line.startswith("| b | drain") for line in lines)  # no configuration, no row
    # streams: per-job medians +0.30 and +0.00
    assert "stream: median over jobs of the generation miss +0.15, median |.| 0.15 (2 jobs)" in lines


def test_misses_are_drawn_in_both_regimes_against_the_twin():
    job = select_jobs("seed-27b-dense-math", "seed")[0]
    misses = job_misses(job, per=2)
    assert sorted(m.regime for m in misses) == ["drain", "drain", "stream", "stream"]
    assert all(math.isfinite(m.generation) and math.isfinite(m.step) for m in misses)
    # a forecast within a factor of two of the twin before any trial (a broken fit is far off)
    assert all(abs(m.step) < math.log(2.0) for m in misses)
