"""Quality gates: reward collapse, log-prob mismatch, staleness, NaN; the reward test's statistics."""

import random

import pytest
from test_tuner_fixtures import job, steps

from rltune.api.models import Constraints
from rltune.api.status import TrialState
from rltune.tuner import Tuner, baseline_record, summarize
from rltune.tuner.gates import evaluate, passed, reward_test, t_cdf, t_ppf

PH = {"generation": 300.0, "generation_tail": 150.0, "old_logprob": 40.0, "training": 120.0, "weight_sync": 5.0}


def _setup():
    spec = job()
    base = baseline_record(spec, summarize(steps(PH, reward=0.50, reward_sd=0.01, seed=1)))
    assert base.state == TrialState.SUCCEEDED
    tuner = Tuner(spec, base, [])
    from rltune.tuner.values import Proposal

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


def test_student_t_quantiles_match_tables():
    assert t_ppf(0.95, 3) == pytest.approx(2.353363, abs=1e-5)
    assert t_ppf(0.95, 7) == pytest.approx(1.894579, abs=1e-5)
    assert t_ppf(0.975, 10) == pytest.approx(2.228139, abs=1e-5)
    assert t_ppf(0.05, 4) == pytest.approx(-2.131847, abs=1e-5)
    assert t_ppf(0.5, 9) == 0.0
    for df in (1, 2, 5, 30):
        assert t_cdf(t_ppf(0.9, df), df) == pytest.approx(0.9, abs=1e-9)


BASE = [0.50, 0.51, 0.49, 0.50, 0.52]


def test_a_clear_drop_is_rejected():
    rt = reward_test([0.30, 0.31, 0.29, 0.30, 0.32], BASE, 0.05, 0.05)
    assert rt.reject and rt.lo > 0.05 and rt.drop == pytest.approx(0.2 / 0.504)
    assert rt.method == "trend-adjusted t" and rt.df == 7


def test_equal_rewards_are_accepted():
    rt = reward_test(list(BASE), BASE, 0.05, 0.05)
    assert not rt.reject and rt.drop == pytest.approx(0.0, abs=1e-12) and rt.lo < 0 < rt.hi
    rt = reward_test([0.5] * 5, [0.5] * 5, 0.05, 0.05)  # no variance at all
    assert not rt.reject and rt.se == 0


def test_a_drop_within_tolerance_that_the_data_resolve_is_accepted():
    # 2% lower with little noise: significantly lower, but shown within the 5% tolerance
    base = [0.50, 0.502, 0.498, 0.501, 0.499, 0.50, 0.502, 0.498, 0.501, 0.499]
    rt = reward_test([x - 0.01 for x in base], base, 0.05, 0.05)
    assert rt.lo > 0 and rt.hi < 0.05 and not rt.reject
    assert rt.verdict == "shown within the tolerance"


def test_the_tolerance_boundary():
    # A shift of the same residual pattern moves the estimated drop, not its error: the candidate is
    # rejected exactly when the lower bound of the drop passes the tolerance, i.e. when the drop is
    # significantly larger than rewardTolerance; a drop of exactly the tolerance passes.
    base = [1.00, 1.02, 0.99, 1.01, 0.98, 1.00, 1.02, 0.99, 1.01, 0.98]
    mb, tol, alpha = sum(base) / len(base), 0.05, 0.05
    ref = reward_test(list(base), base, tol, alpha)
    q = t_ppf(1 - alpha, ref.df)
    assert ref.df == 17 and ref.se > 0
    edge = tol + q * ref.se  # the smallest drop shown to exceed the tolerance
    inside = reward_test([x - (edge - 1e-4) * mb for x in base], base, tol, alpha)
    outside = reward_test([x - (edge + 1e-4) * mb for x in base], base, tol, alpha)
    at_tol = reward_test([x - tol * mb for x in base], base, tol, alpha)
    assert inside.se == pytest.approx(ref.se) and outside.se == pytest.approx(ref.se)
    assert inside.lo < tol and not inside.reject
    assert outside.lo > tol and outside.reject
    assert at_tol.drop == pytest.approx(tol) and not at_tol.reject


def test_a_drop_the_steps_cannot_resolve_is_not_rejected():
    # Three noisy steps: a 6% drop is not significant, so the gate keeps its false-alarm bound
    # (docs/tuner.md: the detectable drop per step count) instead of rejecting on the estimate.
    base = [0.32, 0.35, 0.31]
    rt = reward_test([x - 0.06 * 0.3267 for x in base], base, 0.05, 0.05)
    assert rt.drop == pytest.approx(0.06, rel=1e-3) and rt.lo < 0 and rt.hi > 0.05 and not rt.reject


def test_the_common_learning_trend_is_not_noise():
    # Rewards climbing 0.01 per step on both sides, no noise: the comparison is exact.
    base = [0.30 + 0.01 * i for i in range(5)]
    mb = sum(base) / 5
    assert reward_test([x - 0.06 * mb for x in base], base, 0.05, 0.05).reject
    assert not reward_test([x - 0.04 * mb for x in base], base, 0.05, 0.05).reject
    # a longer run (confirmation) on the same curve has a higher raw mean but no drop
    long = [0.30 + 0.01 * i for i in range(9)]
    rt = reward_test(long, base, 0.05, 0.05)
    assert rt.drop == pytest.approx(0.0, abs=1e-9) and not rt.reject
    assert reward_test([x - 0.06 * mb for x in long], base, 0.05, 0.05).reject


def test_fallbacks_without_degrees_of_freedom():
    rt = reward_test([0.40], [0.50], 0.05, 0.05)
    assert rt.method == "means" and rt.reject
    assert not reward_test([0.48], [0.50], 0.05, 0.05).reject
    rt = reward_test([0.40, 0.41], [0.50], 0.05, 0.05)
    assert rt.method == "pooled t" and rt.df == 1


def test_alpha_is_the_rejection_rate_at_the_tolerance():
    # Seeded simulation of the statistic (5 steps, 3% noise per step, a shared trend): a drop of
    # exactly the tolerance is rejected at about rewardTestAlpha, no drop almost never, a drop of
    # 4x the tolerance almost always.
    rng = random.Random(17)

    def trial(shift):
        return [0.33 + 0.008 * i - shift + rng.gauss(0, 0.01) for i in range(5)]

    n, mu = 2000, 0.346
    fa = sum(reward_test(trial(0), trial(0), 0.05, 0.05).reject for _ in range(n)) / n
    at_tol = sum(reward_test(trial(0.05 * mu), trial(0), 0.05, 0.05).reject for _ in range(n)) / n
    hit = sum(reward_test(trial(0.20 * mu), trial(0), 0.05, 0.05).reject for _ in range(n)) / n
    assert fa <= 0.01
    assert 0.025 <= at_tol <= 0.075
    assert hit >= 0.95


def test_gate_detail_and_non_finite_rewards():
    s = summarize(steps(PH, reward=0.40, seed=8))
    b = summarize(steps(PH, reward=0.50, seed=9))
    g = evaluate(s, b, Constraints())
    assert (
        not g["reward"].passed and "tolerance 5.0%" in g["reward"].detail and "trend-adjusted t" in g["reward"].detail
    )
    s.rewards[1] = float("nan")
    assert not evaluate(s, b, Constraints())["reward"].passed


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
    for p in t2.proposer.propose(6, 32):
        assert not p.config.rollout.fp8


def test_bans_survive_a_status_round_trip():
    # the status keeps each gate as a boolean; the ban learned from the failed gate must survive
    from rltune.api.status import TrialStatus
    from rltune.tuner import records, restore

    spec, tuner, rec = _setup()
    bad = rec.model_copy(update={"config": spec.baseline.with_knobs({"rollout.fp8": True})})
    out = tuner.judge(bad, summarize(steps(PH, mismatch=0.2, seed=7)))
    st = TrialStatus(id=out.id, config=records.config_diff(spec.baseline, out.config), gpus=out.gpus)
    records.apply_judgement(st, out)
    assert st.gates["mismatch"] is False and st.state == TrialState.REJECTED
    r = restore.to_record(spec, st)
    t2 = Tuner(spec, tuner.baseline, [r])
    assert t2.bans and all(not p.config.rollout.fp8 for p in t2.proposer.propose(6, 32))


def test_the_confirmation_is_judged_by_non_inferiority():
    # A drop of 3% over 5 noisy steps: the screening framing cannot show it beyond the 5% tolerance
    # (kept), the confirmation's framing cannot show it within (rejected); with 2% noise over 11 steps
    # and no drop, the confirmation shows it within the tolerance.
    rng = random.Random(5)
    base = [0.33 + 0.004 * i + rng.gauss(0, 0.01) for i in range(5)]
    cand = [0.33 + 0.004 * i - 0.03 * 0.34 + rng.gauss(0, 0.01) for i in range(5)]
    screen = reward_test(cand, base, 0.05, 0.05)
    conf = reward_test(cand, base, 0.05, 0.05, non_inferiority=True)
    assert not screen.reject and conf.reject and conf.hi > 0.05 >= conf.lo
    assert conf.verdict == "not shown within the tolerance"
    base = [0.33 + 0.004 * i + rng.gauss(0, 0.005) for i in range(11)]
    cand = [0.33 + 0.004 * i + rng.gauss(0, 0.005) for i in range(11)]
    ok = reward_test(cand, base, 0.05, 0.05, non_inferiority=True)
    assert not ok.reject and ok.verdict == "shown within the tolerance"
    # through the gates: the same summaries pass screening and fail confirmation
    b = summarize(steps(PH, n=6, reward=0.50, reward_sd=0.02, seed=3))
    c = summarize(steps(PH, n=6, reward=0.485, reward_sd=0.02, seed=4))
    assert evaluate(c, b, Constraints())["reward"].passed
    g = evaluate(c, b, Constraints(), confirmation=True)["reward"]
    assert not g.passed and "non-inferiority" in g.detail


def test_reward_power_predicts_the_confirmation_false_alarm_rate():
    # The normal approximation behind the RewardGatePowered condition against the test itself,
    # simulated: healthy winners (no drop), reward noise 0.0099 per step (3% of the starting
    # reward) around a shared learning trend.
    rng = random.Random(23)
    sd, slope = 0.0099, 0.0066

    def trial(n):
        return [0.33 + slope * i + rng.gauss(0, sd) for i in range(n)]

    from rltune.tuner.gates import reward_power

    for n, lo, hi in ((5, 0.10, 0.35), (11, 0.0, 0.05)):
        runs = 1500
        sim = sum(reward_test(trial(n), trial(n), 0.05, 0.05, non_inferiority=True).reject for _ in range(runs)) / runs
        mean = 0.33 + slope * (n - 1) / 2
        p = reward_power([mean + sd * z for z in _unit_noise(40)], n, 0.05, 0.05)
        assert lo <= sim <= hi, (n, sim)
        assert abs(p.false_alarm - sim) < 0.06, (n, p.false_alarm, sim)
    p5 = reward_power([0.33 + 0.0099 * z for z in _unit_noise(40)], 5, 0.05, 0.05)
    assert p5.false_alarm > 0.05 and p5.needed is not None and 8 <= p5.needed <= 14
    assert reward_power([0.3, 0.31], 5, 0.05, 0.05) is None  # no noise estimate from two steps


def _unit_noise(n: int) -> list[float]:
    """n draws scaled to unit sample sd exactly, so a test controls the noise reward_power sees."""
    rng = random.Random(99)
    xs = [rng.gauss(0, 1) for _ in range(n)]
    m = sum(xs) / n
    sd = (sum((x - m) ** 2 for x in xs) / (n - 2)) ** 0.5
    return [(x - m) / sd for x in xs]
