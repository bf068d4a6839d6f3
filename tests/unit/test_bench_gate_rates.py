"""bench.gate_rates' grey zone: a healthy one-step-off configuration judged by each reward gate at lag
penalties other than the twin's, on the same draws (docs/tuner.md 'The reward gate on the winner')."""

import json

from bench import gate_rates
from bench.confirm import QualityTrials
from bench.jobs import jobs as bench_jobs
from rltune.api.models import RLTuningJobSpec
from rltune.tuner import baseline_record

JOB = next(j for j in bench_jobs() if j["metadata"]["name"] == "bench-seed-35b-a3b-math")


def _one_step_off():
    spec = RLTuningJobSpec.model_validate(JOB["spec"])
    cfg = baseline_record(spec).config
    d = cfg.model_dump(by_alias=True)
    d["async"] = {"staleness": 1, "partialRollout": True}
    return spec, type(cfg).model_validate(d)


def test_the_twins_own_lag_penalty_reproduces_its_rewards_and_a_smaller_one_learns_faster():
    spec, cfg = _one_step_off()
    qt = QualityTrials(spec, cfg, 12, 1)
    assert max(t.staleness for t in qt.template) == 1
    for seed in (None, 5):
        a, b = qt.trial(seed), qt.trial(seed, gate_rates.TWIN_LAG_PENALTY)
        assert [x.reward for x in a] == [y.reward for y in b]
    means = []
    for pen in gate_rates.PENALTIES:
        scored = [r.reward for r in qt.trial(None, pen) if not r.warmup]
        means.append(sum(scored) / len(scored))
    assert means == sorted(means, reverse=True) and means[0] > means[-1]
    # mismatch and step times do not depend on the penalty: only the learning curve moves
    assert [r.logprob_mismatch for r in qt.trial(3, 0.0)] == [r.logprob_mismatch for r in qt.trial(3)]


def test_the_grey_zone_ships_the_healthy_lever_less_often_the_slower_it_learns():
    _, cfg = _one_step_off()
    judged = {"oracle": cfg, "oracle_speedup": 2.0, "best_sync_speedup": 1.2}
    row = gate_rates.run_grey_zone(JOB, 0, (6, 1, 12), 40, judged, check=True)
    cells = [row["penalties"][f"{p:g}"] for p in gate_rates.PENALTIES]
    drops = [c["true_drop"] for c in cells]
    assert abs(drops[0]) < 0.005 and drops == sorted(drops) and drops[-1] > 0.03
    ni = [c["nonInferiority"] / c["n"] for c in cells]
    screen = [c["screen"] / c["n"] for c in cells]
    assert ni[0] >= 0.9 and ni[-1] <= 0.5  # shown within the tolerance only when it learns as fast
    assert min(screen) >= 0.9  # the screening test never bans a healthy configuration for a 4% drop


def test_the_shipped_confirmation_stops_healthy_winners_early_and_still_holds_the_tolerance():
    """run_shipped judges confirmations at gates.confirmation_looks: under nonInferiority a healthy
    winner's confirmation usually stops at the interim look (fewer steps than confirmSteps) while a
    drop at the tolerance is still kept from shipping >= 90% of the time on 60 seeds (the goal's 95%
    is bench-gates' 1,600 draws); screen has one look and always runs the full length."""
    row = gate_rates.run_shipped(JOB, 0, (6, 1, 12), 60)
    agg = gate_rates.aggregate_shipped([row])
    ni, screen = agg["nonInferiority"], agg["screen"]
    assert 6 <= ni["healthy_confirm_steps"] < 10 and screen["healthy_confirm_steps"] == 12
    assert ni["catch_at_tolerance"] >= 0.9 and ni["false_alarm"] <= 0.05


def test_judged_configs_reads_the_oracle_and_the_best_synchronous_configuration(tmp_path):
    _, cfg = _one_step_off()

    def key(stale):
        return repr(sorted({"async.staleness": stale, "placement": "colocated"}.items()))

    rows = [
        {
            "job": "j",
            "baseline": 100.0,
            "oracle_speedup": 2.5,
            "oracle_config": cfg.dump(),
            "yardstick": {key(0): [80.0, 80.0], key(1): [40.0, 40.0], "[('async.staleness', 0)]": None},
        }
    ]
    p = tmp_path / "results.json"
    p.write_text(json.dumps(rows))
    got = gate_rates.judged_configs("j", p)
    assert got["oracle"] == cfg and got["oracle_speedup"] == 2.5 and got["best_sync_speedup"] == 1.25
    assert gate_rates.judged_configs("other", p) is None
    assert gate_rates.judged_configs("j", tmp_path / "missing.json") is None
