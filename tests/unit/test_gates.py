"""Quality gates: reward collapse, log-prob mismatch, staleness, NaN; the Welch test itself."""

import pytest
from test_tuner_fixtures import job, steps

from rltune.api.status import TrialState
from rltune.tuner import Tuner, baseline_record, summarize
from rltune.tuner.gates import passed, t_cdf, welch_one_sided

PH = {"generation": 300.0, "generation_tail": 150.0, "old_logprob": 40.0, "training": 120.0, "weight_sync": 5.0}


def _setup():
    spec = job()
    base = baseline_record(spec, summarize(steps(PH, reward=0.50, reward_sd=0.01, seed=1)))
    assert base.state == TrialState.SUCCEEDED
    tuner = Tuner(spec, base, [])
    from rltune.tuner.core import Proposal

    rec = tuner.record_for(
        "t1",
        Proposal(
            config=spec.baseline.with_knobs({"rollout.tp": 4}),
            gpus=32,
            predicted=400.0,
            std=20.0,
            predicted_objective=400.0,
            bottleneck="rollout-throughput",
        ),
    )
    return spec, tuner, rec


def test_student_t_cdf_matches_tables():
    assert t_cdf(0.0, 5) == pytest.approx(0.5)
    assert t_cdf(2.0, 10) == pytest.approx(0.963306, abs=1e-5)
    assert t_cdf(-2.228, 10) == pytest.approx(0.025, abs=2e-4)
    assert t_cdf(1.96, 1e6) == pytest.approx(0.975, abs=1e-3)


def test_welch_detects_a_drop_beyond_tolerance_only():
    base = [0.50, 0.51, 0.49, 0.50, 0.52]
    p, *_ = welch_one_sided([0.30, 0.31, 0.29, 0.30, 0.32], base, 0.05)
    assert p < 0.01
    p, *_ = welch_one_sided([0.49, 0.50, 0.48, 0.49, 0.51], base, 0.05)  # 2% lower: within tolerance
    assert p > 0.05


def test_healthy_trial_succeeds():
    _, tuner, rec = _setup()
    out = tuner.judge(rec, summarize(steps(PH, reward=0.50, seed=2)))
    assert out.state == TrialState.SUCCEEDED, out.gates
    assert passed(out.gates) and out.objective and out.objective > 0


def test_reward_collapse_is_rejected():
    _, tuner, rec = _setup()
    out = tuner.judge(rec, summarize(steps(PH, reward=0.20, seed=3)))
    assert out.state == TrialState.REJECTED
    assert not out.gates["reward"].passed
    assert "reward" in out.reason


def test_mismatch_over_limit_is_rejected():
    _, tuner, rec = _setup()
    out = tuner.judge(rec, summarize(steps(PH, mismatch=0.2, seed=4)))
    assert out.state == TrialState.REJECTED and not out.gates["mismatch"].passed


def test_staleness_over_limit_is_rejected():
    _, tuner, rec = _setup()  # constraints.maxStaleness defaults to 1
    out = tuner.judge(rec, summarize(steps(PH, staleness=3, seed=5)))
    assert out.state == TrialState.REJECTED and not out.gates["staleness"].passed


def test_nan_is_rejected():
    _, tuner, rec = _setup()
    st = steps(PH, seed=6)
    st[3].reward = float("nan")
    out = tuner.judge(rec, summarize(st))
    assert out.state == TrialState.REJECTED and not out.gates["nan"].passed


def test_no_steady_steps_fails():
    _, tuner, rec = _setup()
    out = tuner.judge(rec, summarize(steps(PH, n=2, warmup=2)))
    assert out.state == TrialState.FAILED


def test_rejected_fp8_is_never_proposed_again():
    spec, tuner, rec = _setup()
    bad = rec.model_copy(update={"config": spec.baseline.with_knobs({"rollout.fp8": True})})
    out = tuner.judge(bad, summarize(steps(PH, mismatch=0.2, seed=7)))
    assert out.state == TrialState.REJECTED
    t2 = Tuner(spec, tuner.baseline, [out])
    for p in t2.propose(6, 32):
        assert not p.config.rollout.fp8


def test_bans_survive_a_status_round_trip():
    # the status keeps each gate as a boolean; the ban learned from the failed gate must survive
    from rltune.api.status import TrialStatus
    from rltune.tuner import records

    spec, tuner, rec = _setup()
    bad = rec.model_copy(update={"config": spec.baseline.with_knobs({"rollout.fp8": True})})
    out = tuner.judge(bad, summarize(steps(PH, mismatch=0.2, seed=7)))
    st = TrialStatus(id=out.id, config=records.config_diff(spec.baseline, out.config), gpus=out.gpus)
    records.apply_judgement(st, out)
    assert st.gates["mismatch"] is False and st.state == TrialState.REJECTED
    r = records.to_record(spec, st)
    t2 = Tuner(spec, tuner.baseline, [r])
    assert t2.bans and all(not p.config.rollout.fp8 for p in t2.propose(6, 32))
