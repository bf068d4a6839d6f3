"""Tuner API: summaries, profile, JSON round trip and reconstruction, early stop, done, best, error."""

import dataclasses
import json
import math
import statistics

import numpy as np
import pytest
from test_tuner_fixtures import job, steps

from rltune.api.status import FailureCause, TrialState
from rltune.tuner import TrialRecord, Tuner, baseline_record, profile, summarize
from rltune.tuner.search import noisy_trial_value

PH = {"generation": 420.0, "generation_tail": 300.0, "old_logprob": 55.0, "training": 160.0, "weight_sync": 6.0}


def test_summarize_excludes_warmup_and_flags_nan():
    st = steps(PH, n=5, warmup=2, noise=0.0)
    st[0].duration = 9999.0  # warm-up: ignored
    s = summarize(st)
    assert s.steps == 3 and s.total_steps == 5
    assert math.isclose(s.step_time_mean, sum(PH[p] for p in PH if p != "generation_tail"))
    assert len(s.rewards) == 3 and not s.nan and not s.failed
    st[4].logprob_mismatch = float("inf")
    assert summarize(st).nan
    assert summarize([]).failed


def test_profile_finds_the_long_tail():
    spec = job()
    p = profile(spec, summarize(steps(PH)))
    assert p.bottleneck == "rollout-long-tail"
    assert 0.6 < p.long_tail_share < 0.8 and "long tail" in p.evidence
    t = profile(spec, summarize(steps(dict(PH, training=900.0))))
    assert t.bottleneck == "trainer-bound"
    w = profile(spec, summarize(steps(dict(PH, weight_sync=200.0))))
    assert w.bottleneck == "weight-sync-bound"


def _loop(spec, truth, n=6):
    """Drive the Tuner with a synthetic cluster: measured = truth(config)."""
    base = baseline_record(spec, summarize(steps(truth(spec.baseline), seed=99)))
    hist = []
    for i in range(n):
        t = Tuner(spec, base, hist)
        if t.terminator.done()[0]:
            break
        p = t.proposer.propose(1, spec.resources.gpu_budget)[0]
        rec = t.record_for(f"t{i + 1}", p)
        hist.append(t.judge(rec, summarize(steps(truth(p.config), seed=i))))
    return base, hist


def _truth(cfg):
    # a made-up cluster: rollout likes more KV and TP 4, the tail shrinks with partial rollout
    g = 420.0 * (0.6 / cfg.rollout.gpu_memory_utilization) ** 0.5 * (1.0 if cfg.rollout.tp == 4 else 1.2)
    tail = 250.0 * (0.4 if cfg.async_.partial_rollout else 1.0)
    return {"generation": g + tail, "generation_tail": tail, "old_logprob": 55.0, "training": 160.0, "weight_sync": 6.0}


def test_reconstruction_from_json_gives_the_same_proposals():
    spec = job()
    base, hist = _loop(spec, _truth, n=3)
    wire = json.dumps({"baseline": base.dump(), "history": [h.dump() for h in hist]})
    d = json.loads(wire)
    base2 = TrialRecord.model_validate(d["baseline"])
    hist2 = [TrialRecord.model_validate(h) for h in d["history"]]
    a = Tuner(spec, base, hist).proposer.propose(3, 32)
    b = Tuner(spec, base2, hist2).proposer.propose(3, 32)
    assert [p.config.key() for p in a] == [p.config.key() for p in b]
    assert base2.summary.rewards == base.summary.rewards


def test_loop_improves_and_reports():
    spec = job()
    base, hist = _loop(spec, _truth, n=6)
    t = Tuner(spec, base, hist)
    best = t.picker.best()
    assert best is not None and best.objective < base.objective
    assert t.speedup(best) > 1.0
    fe = t.forecast_error()
    assert fe is not None and fe >= 0
    assert len({h.config.key() for h in hist}) == len(hist)


def test_forecast_error_counts_only_forecast_and_scored_trials():
    import statistics

    spec = job()
    base, hist = _loop(spec, _truth, n=3)
    t = Tuner(spec, base, hist)
    p = t.proposer.propose(1, 32)[0]
    failed = t.record_for("x1", p).model_copy(
        update={"state": TrialState.FAILED, "reason": "OOMKilled", "cause": FailureCause.OUT_OF_MEMORY}
    )
    pending = t.record_for("x2", p)  # forecast, not yet measured
    assert failed.predicted and pending.predicted
    t2 = Tuner(spec, base, hist + [failed, pending])
    assert [r.id for r in t2.forecast_trials()] == [r.id for r in hist]
    errs = [abs(r.predicted - r.summary.step_time) / r.summary.step_time for r in hist]
    assert math.isclose(t2.forecast_error(), statistics.median(errs))


def test_done_when_budget_spent():
    spec = job(budget={"maxTrials": 2, "parallelTrials": 1, "stepsPerTrial": 4})
    base, hist = _loop(spec, _truth, n=5)
    assert len(hist) == 2
    assert Tuner(spec, base, hist).terminator.done() == (True, "trial budget spent (2/2)")


def test_done_after_too_many_failures():
    spec = job(budget={"maxTrials": 8, "parallelTrials": 1, "stepsPerTrial": 4, "maxFailedTrials": 2})
    base = baseline_record(spec, summarize(steps(_truth(spec.baseline))))
    t = Tuner(spec, base, [])
    fails = [
        t.record_for(f"t{i}", p).model_copy(
            update={"state": TrialState.FAILED, "reason": "boom", "cause": FailureCause.CRASHED}
        )
        for i, p in enumerate(t.proposer.propose(2, 64))
    ]
    done, why = Tuner(spec, base, fails).terminator.done()
    assert done and "failed" in why


def test_early_stop_only_when_clearly_losing():
    spec = job()
    base = baseline_record(spec, summarize(steps(_truth(spec.baseline))))
    t = Tuner(spec, base, [])
    slow = steps({k: v * 2.0 for k, v in _truth(spec.baseline).items()}, n=3)
    same = steps(_truth(spec.baseline), n=3, seed=5)
    assert t.pruner.early_stop(slow)
    assert not t.pruner.early_stop(same)
    assert not t.pruner.early_stop(slow[:1])  # warm-up only: nothing measured yet


def test_an_early_stopped_trial_is_not_proposed_again():
    spec = job()
    base = baseline_record(spec, summarize(steps(_truth(spec.baseline))))
    p = Tuner(spec, base, []).proposer.propose(1, 32)[0]
    r = TrialRecord(id="t1", config=p.config, state=TrialState.STOPPED, summary=summarize(steps(_truth(p.config))))
    t = Tuner(spec, base, [r])
    assert p.config.key() not in {x.config.key() for x in t.proposer.propose(4, 32)}
    assert p.predicted_std == p.std


def test_early_stop_threshold_is_the_step_noise():
    # one measured step: stopped only when 2 sd of step noise (NOISE_SD per step) below it is
    # still slower than the incumbent: ~16% slower, not 60%
    from rltune.tuner.forecast import NOISE_SD
    from rltune.tuner.pruning import EARLY_STOP_Z

    spec = job()
    base = baseline_record(spec, summarize(steps(_truth(spec.baseline), noise=0.0)))
    t = Tuner(spec, base, [])
    inc = t.incumbent()
    edge = 1.0 / (1.0 - EARLY_STOP_Z * NOISE_SD)
    for f, stop in ((edge * 1.03, True), (edge * 0.97, False), (1.0, False)):
        one = steps({k: v * f for k, v in _truth(spec.baseline).items()}, n=2, noise=0.0)
        assert t.pruner.early_stop(one) is stop, (f, summarize(one).step_time_mean / inc)


def test_uncertainty_scale_follows_the_forecasters_realized_errors():
    spec = job()
    base, hist = _loop(spec, _truth, n=4)
    t = Tuner(spec, base, hist)
    assert t.forecast_trials()

    def with_error(z):
        h = []
        for r in hist:
            if r.summary is None or not r.summary.steps:
                continue
            m = r.summary.step_time
            h.append(r.model_copy(update={"predicted": m - z * 10.0, "predicted_std": 10.0}))
        return Tuner(spec, base, h)

    right, wrong = with_error(0.1), with_error(3.0)
    assert right.uncertainty_scale() < 1.0 < wrong.uncertainty_scale()
    # and the search's candidate sd moves with it
    c_right = right.proposer.candidates(exclude=right.excluded)
    c_wrong = wrong.proposer.candidates(exclude=wrong.excluded)
    assert min(c.objective_std for c in c_right) < min(c.objective_std for c in c_wrong)


def test_uncertainty_scale_does_not_count_a_trials_own_noise_as_forecast_error():
    # a measured mean misses the truth by the trial's own noise, which noisy_trial_value adds on its
    # own: a forecaster whose misses are just that noise is right (scale well below 1), not 1 sd off
    from rltune.tuner.core import SCALE_RANGE, trial_noise_sd

    spec = job()
    base, hist = _loop(spec, _truth, n=4)
    per_step = Tuner(spec, base, hist).step_noise_sd()

    def missed_by(k):
        h = []
        for r in hist:
            if r.summary is None or not r.summary.steps:
                continue
            m, noise = r.summary.step_time, trial_noise_sd(per_step, r.summary.steps)
            p = m / (1.0 + k * noise)  # off by k x the trial's noise, stated sd = that noise
            h.append(r.model_copy(update={"predicted": p, "predicted_std": noise * p}))
        return Tuner(spec, base, h)

    n = len(missed_by(1.0).forecast_trials())
    assert n >= 3
    assert missed_by(1.0).uncertainty_scale() == pytest.approx(max(SCALE_RANGE[0], (1.0 / (1 + n)) ** 0.5), rel=1e-6)
    assert missed_by(3.0).uncertainty_scale() == pytest.approx(((1.0 + 8.0 * n) / (1 + n)) ** 0.5, rel=1e-6)
    # one measured step is noisier than three: the same miss is less evidence against the forecaster
    assert trial_noise_sd(per_step, 1) > trial_noise_sd(per_step, 3)


def test_search_stops_when_no_trial_pays_for_itself():
    spec = job()
    base, hist = _loop(spec, _truth, n=3)
    short = job(budget={"maxTrials": 8, "parallelTrials": 2, "stepsPerTrial": 6, "plannedSteps": 1})
    long = job(budget={"maxTrials": 8, "parallelTrials": 2, "stepsPerTrial": 6, "plannedSteps": 10_000_000})
    done, why = Tuner(short, base, hist).terminator.done()
    assert done and "no trial pays for itself" in why and "plannedSteps 1" in why
    assert f"+-{Tuner(short, base, hist).measurement_sd():.1%}" in why  # what one trial resolves here
    assert Tuner(long, base, hist).terminator.done() == (False, "searching")


def test_one_straggling_step_moves_the_mean_but_not_the_scored_step_time():
    st = steps(PH, n=4, warmup=1, noise=0.0)
    st[2].duration *= 1.3  # one of three steady steps hit a straggling node
    s = summarize(st)
    clean = sum(PH[p] for p in PH if p != "generation_tail")
    assert s.step_time_mean > 1.09 * clean
    assert s.step_time_median == clean and s.step_time == clean
    # two steps have no middle one outlier cannot move: the mean is scored
    two = summarize(st[:3])
    assert two.steps == 2 and two.step_time == two.step_time_mean


def test_the_trial_without_a_straggler_step_is_not_picked_over_a_faster_one():
    spec = job()
    truth = _truth(spec.baseline)
    base = baseline_record(spec, summarize(steps(truth, n=4, noise=0.0)))
    t = Tuner(spec, base, [])
    p = t.proposer.rank(limit=2)
    fast = steps({k: v * 0.80 for k, v in truth.items()}, n=4, noise=0.0)
    fast[3].duration *= 1.25  # the faster configuration's trial met a straggler
    slow = steps({k: v * 0.83 for k, v in truth.items()}, n=4, noise=0.0)
    a = t.judge(t.record_for("a", p[0]), summarize(fast))
    b = t.judge(t.record_for("b", p[1]), summarize(slow))
    assert a.summary.step_time_mean > b.summary.step_time_mean  # by the mean, b would win
    assert Tuner(spec, base, [a, b]).picker.best().id == "a"


def test_a_summary_stored_before_the_median_is_scored_by_its_mean():
    from rltune.tuner.records import flatten_summary, unflatten_summary
    from rltune.tuner.summary import TrialSummary

    s = summarize(steps(PH, n=4, noise=0.05))
    back = unflatten_summary(flatten_summary(s, keep_rewards=False))
    assert s.step_time == s.step_time_median != s.step_time_mean
    assert math.isclose(back.step_time, s.step_time, rel_tol=1e-6)
    flat = {k: v for k, v in flatten_summary(s, keep_rewards=False).items() if k != "step_time_median"}
    old = unflatten_summary(flat)
    assert old.step_time == old.step_time_mean
    assert math.isclose(old.step_time, s.step_time_mean, rel_tol=1e-6)
    assert TrialSummary.model_validate(s.dump()).step_time == s.step_time  # camelCase JSON (reports)


def test_the_seconds_a_trial_spent_count_its_slow_warm_up_step():
    from rltune.tuner.records import flatten_summary, unflatten_summary

    st = steps(PH, n=4, warmup=1, noise=0.0)
    st[0].duration *= 1.8  # the first step captures CUDA graphs and fills the pipeline
    s = summarize(st)
    assert s.seconds_spent == pytest.approx(sum(x.duration for x in st))
    assert s.seconds_spent > 1.15 * s.step_time_mean * s.total_steps  # steady mean x steps undercounts
    assert unflatten_summary(flatten_summary(s, keep_rewards=False)).seconds_spent == pytest.approx(s.seconds_spent)
    old = unflatten_summary({k: v for k, v in flatten_summary(s, keep_rewards=False).items() if k != "seconds_total"})
    assert old.seconds_spent == pytest.approx(s.step_time_mean * s.total_steps)  # stored before: the old estimate
    # a trial stopped in its warm-up still spent that step
    assert summarize(st[:1]).seconds_spent == pytest.approx(st[0].duration)


def test_a_trial_is_costed_with_its_warm_up_as_measured():
    spec = job(budget={"maxTrials": 8, "parallelTrials": 2, "stepsPerTrial": 4, "plannedSteps": 500})
    base, hist = _loop(spec, _truth, n=3)
    t = Tuner(spec, base, hist)
    extra = [r.summary.seconds_total / r.summary.step_time_mean - r.summary.total_steps for r in [base] + hist]
    assert t.trial_steps() == pytest.approx(4 + max(0.0, statistics.median(extra)))

    def slow_first(summary_steps):
        st = [dataclasses.replace(s) for s in summary_steps]
        st[0].duration *= 2.5  # a warm-up that captures CUDA graphs and fills an empty pipeline
        return summarize(st)

    slow_base = base.model_copy(update={"summary": slow_first(steps(_truth(spec.baseline), seed=99))})
    slow = [r.model_copy(update={"summary": slow_first(steps(_truth(r.config), seed=i))}) for i, r in enumerate(hist)]
    ts = Tuner(spec, slow_base, slow)
    assert ts.trial_steps() > t.trial_steps() + 1.0  # the warm-up costs more than one more steady step
    # the steady steps are the same, so the forecasts are; each candidate is worth its objective
    # times the extra warm-up steps less
    cands = t.proposer.candidates(exclude=t.excluded)
    objective = np.array([c.objective for c in cands])
    lost = t.proposer.expected_value(cands) - ts.proposer.expected_value(cands)
    assert np.allclose(lost, objective * (ts.trial_steps() - t.trial_steps()))


def test_a_noisy_trial_is_worth_only_what_it_can_resolve():
    spec = job(budget={"maxTrials": 8, "parallelTrials": 2, "stepsPerTrial": 4, "plannedSteps": 500})
    base, hist = _loop(spec, _truth, n=3)
    t = Tuner(spec, base, hist)
    cands = t.proposer.candidates(exclude=t.excluded)
    sd = np.array([c.objective_std for c in cands])
    obj = np.array([c.objective for c in cands])
    # a noiseless trial resolves it all
    assert np.allclose([c.objective_std for c in noisy_trial_value(cands, 0.0)], sd)
    # noise as large as the forecast's own sd: the trial moves the estimate by sd / sqrt(2)
    same = noisy_trial_value([dataclasses.replace(c, objective_std=0.05 * c.objective) for c in cands], 0.05)
    assert np.allclose([c.objective_std for c in same], 0.05 * obj / math.sqrt(2))

    # the same trials, the same medians, ten times the step-to-step spread
    def noisy(r):
        s = r.summary
        return r.model_copy(update={"summary": s.model_copy(update={"step_time_std": 10 * s.step_time_std})})

    tn = Tuner(spec, noisy(base), [noisy(r) for r in hist])
    assert tn.incumbent() == t.incumbent() and tn.trial_steps() == t.trial_steps()
    assert tn.measurement_sd() > 3 * t.measurement_sd()
    # with the default 7% per step, three steady steps scored by their median: 0.07 * sqrt(pi/2 / 3)
    assert Tuner(spec, baseline_record(spec), []).measurement_sd() == pytest.approx(0.07 * math.sqrt(math.pi / 6))
    # a trial whose noise swamps what it could find is worth less, so the search stops sooner
    assert np.all(tn.proposer.expected_value(cands) <= t.proposer.expected_value(cands) + 1e-9)
    assert np.any(tn.proposer.expected_value(cands) < t.proposer.expected_value(cands) - 1.0)


def test_a_lucky_measurement_of_a_slower_layout_is_not_picked_over_a_consistent_one():
    """The winner's curse: among near-tied trials the lowest measurement is biased low. A layout the
    other trials forecast to be slower, measured 1% faster than the best one by luck, is what the
    best *measured* pick deploys; best_estimate weighs that measurement against the forecast."""
    from rltune.tuner.forecast import Forecaster

    spec = job()
    physics = Forecaster(spec)

    def measure(cfg, seed, scale=1.0, noise=0.07):  # a cluster that runs as the physics says
        p = physics.predict(cfg)
        ph = {k: v * scale for k, v in p.phases.items()}
        return summarize(steps(ph, duration=p.step * scale, noise=noise, seed=seed))

    base = baseline_record(spec, measure(spec.baseline, 99))
    hist = []
    for i in range(6):
        t = Tuner(spec, base, hist)
        p = t.proposer.propose(1, spec.resources.gpu_budget)[0]
        hist.append(t.judge(t.record_for(f"t{i + 1}", p), measure(p.config, i)))
    t = Tuner(spec, base, hist)
    a = t.picker.best()
    ok = [r for r in hist if r.state == TrialState.SUCCEEDED and r.objective is not None and r is not a]
    b = max(ok, key=lambda r: r.objective)  # the slowest gated trial
    assert b.objective > 1.05 * a.objective
    # b's trial run again, and lucky: every step 1% faster than a
    b2 = Tuner(spec, base, [h for h in hist if h is not b]).judge(
        b.model_copy(deep=True), measure(b.config, 7, 0.99 * a.objective / physics.predict(b.config).step, noise=0.0)
    )
    assert b2.state == TrialState.SUCCEEDED and b2.objective < a.objective
    t2 = Tuner(spec, base, [b2 if h is b else h for h in hist])
    assert t2.picker.best().id == b.id  # the measurement alone picks the lucky one
    est = t2.picker.shrunk_objectives([a, b2])
    assert b2.objective < est[b.id] < b.objective  # pulled towards what the other trials forecast for it
    pick = t2.picker.best_estimate()
    assert pick.id != b.id and physics.predict(pick.config).step < physics.predict(b.config).step
    # with nothing else to forecast from, a measurement stands as it is
    assert Tuner(spec, base, []).picker.shrunk_objectives([base])[base.id] == base.objective


def test_only_a_passed_streaming_trial_lifts_the_streaming_prior():
    """Partial rollout at staleness 0 drains (physics.streams): its passing says nothing about a
    streaming rollout's quality, so the streaming prior stays until a streaming trial passed."""
    spec = job()
    base = baseline_record(spec, summarize(steps(PH)))
    assert not base.config.async_.partial_rollout

    def with_async(partial: bool, staleness: int):
        a = base.config.async_.model_copy(update={"partial_rollout": partial, "staleness": staleness})
        return base.config.model_copy(update={"async_": a})

    def passed(cfg):
        return TrialRecord(id="t1", config=cfg, gpus=base.gpus, state=TrialState.SUCCEEDED)

    stream = with_async(True, 1).flat()
    none = Tuner(spec, base, []).proposer.p_pass(stream)
    assert none < Tuner(spec, base, []).proposer.p_pass(with_async(False, 1).flat())  # the streaming risk
    assert Tuner(spec, base, [passed(with_async(True, 0))]).proposer.p_pass(stream) == none
    assert Tuner(spec, base, [passed(with_async(True, 1))]).proposer.p_pass(stream) > none
