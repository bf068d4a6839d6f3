"""Forecaster: calibration to a measured baseline, phases moving the right way, memory fit."""

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
from test_tuner_fixtures import job, steps

from bench.jobs import CODING  # the benchmark's agentic task: 30 turns, 20k mean, 65k max response
from rltune.api.models import RLConfig
from rltune.tuner import Forecaster, physics, summarize
from rltune.tuner.forecast import step_variance
from rltune.tuner.physics import longest_response, task_facts, truncated_at, truncated_mean
from rltune.twin.simulate import make_plan, simulate_one_step

PH = {"generation": 420.0, "generation_tail": 200.0, "old_logprob": 55.0, "training": 160.0, "weight_sync": 6.0}


def test_uncalibrated_forecast_is_finite_with_wide_uncertainty():
    spec = job()
    p = Forecaster(spec).predict(spec.baseline)
    assert p.feasible and 10 < p.step < 1e5
    assert p.std / p.step == pytest.approx(0.30)


def test_calibrates_to_the_measured_baseline():
    spec = job()
    s = summarize(steps(PH, noise=0.0))
    fc = Forecaster(spec, [(spec.baseline, s)])
    p = fc.predict(spec.baseline)
    assert p.step == pytest.approx(s.step_time_mean, rel=0.03)
    for ph in ("generation", "old_logprob", "training", "weight_sync"):
        assert p.phases[ph] == pytest.approx(PH[ph], rel=0.05), ph
    assert "ref_logprob" in fc.absent and p.phases["ref_logprob"] == 0.0
    assert p.std < 0.1 * p.step  # uncertainty shrinks at a measured configuration


def test_phases_move_the_right_way():
    spec = job()
    fc = Forecaster(spec, [(spec.baseline, summarize(steps(PH, noise=0.0)))])
    base = fc.predict(spec.baseline)
    more_kv = fc.predict(spec.baseline.with_knobs({"rollout.gpuMemoryUtilization": 0.85, "rollout.maxNumSeqs": 1024}))
    assert more_kv.phases["generation"] < base.phases["generation"]
    full = fc.predict(spec.baseline.with_knobs({"trainer.recompute": "full"}))
    assert full.phases["training"] > base.phases["training"]
    partial = fc.predict(spec.baseline.with_knobs({"async.staleness": 1, "async.partialRollout": True}))
    assert partial.phases["generation_tail"] < base.phases["generation_tail"]
    # disaggregated + one step off: rollout overlaps training, so the step is shorter than the serial sum
    dis = spec.baseline.with_knobs({"placement": "disaggregated", "trainerGpus": 16, "async.staleness": 1})
    dsync = spec.baseline.with_knobs({"placement": "disaggregated", "trainerGpus": 16})
    assert fc.predict(dis).step < fc.predict(dsync).step
    # a cheaper trainer-side knob moves the trainer phase only
    tp = fc.predict(spec.baseline.with_knobs({"trainer.microBatchTokens": 32768}))
    assert tp.phases["generation"] == pytest.approx(base.phases["generation"])


def test_memory_fit_predicts_oom():
    spec = job(workload={"framework": "twin", "model": {"preset": "deepseek-flash"}, "task": {"kind": "math"}})
    fc = Forecaster(spec)
    huge = RLConfig.model_validate(
        {
            "trainer": {"tp": 1, "ep": 1, "recompute": "none", "microBatchTokens": 131072},
            "rollout": {"tp": 1, "gpuMemoryUtilization": 0.5},
        }
    )
    p = fc.predict(huge)
    assert not p.feasible and "out of memory" in p.reason


def test_learned_oom_fence():
    spec = job()
    cfg = spec.baseline.with_knobs({"trainer.recompute": "none", "trainer.microBatchTokens": 32768})
    fc = Forecaster(spec, oom_failures=[(cfg, "CUDA out of memory: trainer needs 300 GiB")])
    assert not fc.predict(cfg).feasible
    hungrier = cfg.with_knobs({"trainer.tp": 1})
    assert not fc.predict(hungrier).feasible
    assert fc.predict(spec.baseline).feasible


def test_long_tail_grows_with_samples():
    spec = job()
    tf = task_facts(spec.workload.task)
    assert longest_response(tf) > 3 * tf.mean_len
    assert longest_response(tf) <= tf.max_len


def test_recalibration_learns_from_trials():
    spec = job()
    base = summarize(steps(PH, noise=0.0))
    cfg = spec.baseline.with_knobs({"rollout.tp": 4})
    fc0 = Forecaster(spec, [(spec.baseline, base)])
    p0 = fc0.predict(cfg)
    truth = dict(PH, generation=p0.phases["generation"] * 1.4)
    fc1 = Forecaster(spec, [(spec.baseline, base), (cfg, summarize(steps(truth, noise=0.0)))])
    p1 = fc1.predict(cfg)
    assert abs(p1.phases["generation"] - truth["generation"]) < abs(p0.phases["generation"] - truth["generation"]) * 0.3


def test_a_trial_with_a_straggling_step_teaches_less_than_a_steady_one():
    spec = job()
    base = summarize(steps(PH, noise=0.0))
    cfg = spec.baseline.with_knobs({"rollout.gpuMemoryUtilization": 0.85})
    p0 = Forecaster(spec, [(spec.baseline, base)]).predict(cfg)
    gen = p0.phases["generation"] * 1.3
    steady = steps(dict(PH, generation=gen), noise=0.0)
    # the same mean generation, but one of the five steady steps ran at a slow node's pace
    spiky = steps(dict(PH, generation=gen), noise=0.0)
    for i, f in zip(range(1, 6), (0.85, 0.85, 0.85, 0.85, 1.6)):
        spiky[i] = dataclasses.replace(
            spiky[i], duration=spiky[i].duration * f, phases={k: v * f for k, v in spiky[i].phases.items()}
        )
    assert summarize(spiky).step_time_mean == pytest.approx(summarize(steady).step_time_mean, rel=0.02)
    learned = {}
    for name, st in (("steady", steady), ("spiky", spiky)):
        p = Forecaster(spec, [(spec.baseline, base), (cfg, summarize(st))]).predict(cfg)
        learned[name] = p.phases["generation"] / p0.phases["generation"]
    assert learned["steady"] > 1.2  # a steady trial is believed
    assert 1.0 < learned["spiky"] < learned["steady"] - 0.05  # a noisy one moves the forecast less


def test_selective_recompute_costs_more_on_long_agentic_episodes():
    from rltune.tuner import physics

    spec = job()
    mf = physics.facts(spec.workload.model.resolved())
    short = task_facts(spec.workload.task)
    long = task_facts(
        job(
            workload={
                "framework": "twin",
                "model": {"preset": "seed-35b-a3b"},
                "task": {
                    "kind": "agentic-coding",
                    "maxResponseTokens": 65536,
                    "meanResponseTokens": 20000,
                    "turns": 30,
                },
            }
        ).workload.task
    )

    def cost(tf, rec):
        return physics.trainer_part(mf, tf, "B300", 16, 2, 1, 1, 8, 16384, rec, False).training

    sel_short, sel_long = cost(short, "selective") / cost(short, "none"), cost(long, "selective") / cost(long, "none")
    assert 1.0 < sel_short < 1.1  # a few % on math samples
    assert sel_long > sel_short + 0.1  # attention dominates an 80k-token episode
    assert sel_long < cost(long, "full") / cost(long, "none")  # still cheaper than recomputing everything


def test_a_measured_configuration_widens_the_memory_model():
    # physics says this trainer layout does not fit; a trial proved it does: similar ones become feasible
    spec = job(workload={"framework": "twin", "model": {"preset": "deepseek-flash"}, "task": {"kind": "math"}})
    tight = RLConfig.model_validate(
        {
            "gpus": 32,
            "trainer": {"tp": 2, "ep": 4, "recompute": "none", "microBatchTokens": 40960},
            "rollout": {"tp": 4, "gpuMemoryUtilization": 0.5},
        }
    )
    fc0 = Forecaster(spec)
    p0 = fc0.predict(tight)
    assert not p0.feasible and "out of memory (trainer)" in p0.reason
    fc1 = Forecaster(spec, [(tight, summarize(steps(PH)))])
    assert fc1.predict(tight).feasible


def test_partial_rollout_streams_without_a_drain():
    """Partial rollout keeps the engine at its slot limit: no long tail, less wall time than
    draining the same batch (and more slots help it, since nothing waits for the longest)."""
    spec = job()
    fc = Forecaster(spec)
    sync = spec.baseline.with_knobs({"async.staleness": 1})
    stream = spec.baseline.with_knobs({"async.staleness": 1, "async.partialRollout": True})
    a, b = fc.raw(sync.flat()), fc.raw(stream.flat())
    assert a.phases["generation_tail"] > 0.2 * a.phases["generation"]
    assert b.phases["generation_tail"] == 0.0
    assert b.phases["generation"] < 0.9 * a.phases["generation"]
    wide = fc.raw(stream.with_knobs({"rollout.gpuMemoryUtilization": 0.85, "rollout.maxNumSeqs": 1024}).flat())
    assert wide.phases["generation"] < b.phases["generation"]


def test_partial_rollout_re_prefills_what_was_in_flight(monkeypatch):
    """Sequences interrupted at the weight sync resume under new weights (stale KV cache), so a
    streaming rollout pays prefill for its in-flight contexts every step; a draining one only
    prefills the new prompts. Slower prefill therefore costs the streaming rollout more."""
    from rltune.tuner import physics

    spec = job()
    sync = spec.baseline.with_knobs({"async.staleness": 1}).flat()
    stream = spec.baseline.with_knobs({"async.staleness": 1, "async.partialRollout": True}).flat()

    def gens():
        physics.rollout_part.cache_clear()
        fc = Forecaster(spec)
        return fc.raw(sync).phases["generation"], fc.raw(stream).phases["generation"]

    s0, p0 = gens()
    monkeypatch.setattr(physics, "PREFILL_EFF", physics.PREFILL_EFF / 4)
    s1, p1 = gens()
    physics.rollout_part.cache_clear()
    assert s1 > s0 and p1 > p0
    assert p1 - p0 > 2.0 * (s1 - s0)


def test_live_length_is_the_length_biased_mean():
    import numpy as np

    from rltune.tuner.physics import live_length

    tf = task_facts(job().workload.task)
    rng = np.random.default_rng(0)
    s2 = np.log(1 + tf.cv**2)
    L = np.minimum(np.exp(np.log(tf.mean_len) - s2 / 2 + np.sqrt(s2) * rng.standard_normal(400_000)), tf.max_len)
    assert live_length(tf) == pytest.approx((L**2).mean() / (2 * L.mean()), rel=0.02)


def test_measured_generated_tokens_replace_the_declared_mean():
    """Episodes stop early (context limit, EOS): the baseline's measured tokens per sequence drive
    the physics, so a shorter measured mean predicts a shorter rollout elsewhere in the space."""
    spec = job()
    tf = task_facts(spec.workload.task)
    other = spec.baseline.with_knobs({"rollout.gpuMemoryUtilization": 0.85})
    preds = []
    for frac in (1.0, 0.5):
        s = summarize(steps(PH, noise=0.0)).model_copy(update={"generated_tokens": tf.n_seq * tf.mean_len * frac})
        fc = Forecaster(spec, [(spec.baseline, s)])
        assert fc.task.mean_len == pytest.approx(tf.mean_len * frac)
        preds.append(fc.raw(other.flat()).phases["generation"])
    assert preds[1] < 0.8 * preds[0]


def _physics_phases(spec, cfg, monkeypatch=None, preempt_cost=None) -> dict:
    """The physics' phases of `cfg`, optionally with another preemption cost (the 'true' cluster)."""
    from rltune.tuner import physics

    if preempt_cost is not None:
        monkeypatch.setattr(physics, "PREEMPT_COST", preempt_cost)
    physics.rollout_part.cache_clear()
    try:
        return dict(Forecaster(spec).raw(cfg.flat()).phases)
    finally:
        if preempt_cost is not None:
            monkeypatch.undo()
        physics.rollout_part.cache_clear()


def test_preemption_slows_what_the_kv_cache_cannot_hold_not_the_thinned_drain(monkeypatch):
    """vLLM preempts only while it holds more sequences than its KV cache fits: the full batch pays
    the whole preemption term, the last batch's drain less and less as it thins, and a configuration
    whose cache holds its batch pays nothing. preempt_log is the log of the slowdown it adds."""
    from rltune.tuner import physics

    spec = job()
    starved = spec.baseline.with_knobs({"rollout.tp": 1, "rollout.gpuMemoryUtilization": 0.4})
    roomy = spec.baseline.with_knobs({"rollout.tp": 4})
    bd = Forecaster(spec).raw(starved.flat())
    full_batch = 1.0 + physics.PREEMPT_COST * min(bd.kv_pressure - 1.0, 3.0)
    slowdown = (
        _physics_phases(spec, starved)["generation"]
        / _physics_phases(spec, starved, monkeypatch, preempt_cost=0.0)["generation"]
    )
    assert 1.3 < slowdown < full_batch - 0.1
    assert bd.preempt_log == pytest.approx(math.log(slowdown), rel=1e-6)
    assert Forecaster(spec).raw(roomy.flat()).preempt_log == 0.0
    assert _physics_phases(spec, roomy) == _physics_phases(spec, roomy, monkeypatch, preempt_cost=0.0)


def test_the_preemption_mechanism_is_calibrated_as_a_mechanism_not_a_knob_value(monkeypatch):
    """A KV-starved baseline whose preemption costs less than the physics thinks: a per-knob
    correction would put that surprise into the intercept and carry it to every configuration
    (here the unmeasured rollout TP 2, whose cache holds its batch), forecasting it far too fast. The
    mechanism term (m:preempt) takes it instead, so the unstarved forecast stays near the truth."""
    from rltune.tuner import forecast

    spec = job(baseline={"rollout": {"tp": 1, "gpuMemoryUtilization": 0.4}, "trainer": {"tp": 2, "ep": 8}})
    roomy = spec.baseline.with_knobs({"rollout.tp": 4})
    target = spec.baseline.with_knobs({"rollout.tp": 2})
    base_t, roomy_t, target_t = (
        _physics_phases(spec, c, monkeypatch, preempt_cost=0.05) for c in (spec.baseline, roomy, target)
    )
    obs = [(c, summarize(steps(t, noise=0.0))) for c, t in ((spec.baseline, base_t), (roomy, roomy_t))]
    assert Forecaster(spec).raw(spec.baseline.flat()).preempt_log > 0.3
    assert Forecaster(spec).raw(target.flat()).preempt_log < 0.1

    def error() -> float:
        fc = Forecaster(spec, obs)
        return abs(fc.predict(target).phases["generation"] / target_t["generation"] - 1.0)

    with_mechanism = error()
    monkeypatch.setitem(forecast.KNOB_SD["generation"], "m:preempt", 1e-6)
    without = error()
    assert with_mechanism < 0.15 and with_mechanism < without / 2


def test_truncated_at_keeps_the_measured_mean_and_cuts_the_longest():
    """An agentic episode stops when its context is full: the length distribution is cut at the
    context's bound and still averages what was measured."""
    spec = job(workload={"framework": "twin", "model": {"preset": "seed-35b-a3b"}, "task": CODING})
    tf = task_facts(spec.workload.task)
    cut = truncated_at(tf, 0.7 * tf.mean_len, 24_000.0)
    assert cut.max_len == 24_000.0 and cut.mean_len == pytest.approx(0.7 * tf.mean_len)
    assert truncated_mean(cut, cut.max_len) == pytest.approx(cut.mean_len, rel=1e-3)
    assert cut.shape_mean > cut.mean_len  # the mean before the cut is above what the cut leaves
    assert longest_response(cut) <= 24_000.0 < longest_response(dataclasses.replace(tf, mean_len=cut.mean_len))
    # a bound beyond max_response_tokens, or one the measured mean nearly reaches, cuts nothing
    assert truncated_at(tf, 0.7 * tf.mean_len, 1e6).max_len == tf.max_len
    assert truncated_at(tf, 0.7 * tf.mean_len, 0.7 * tf.mean_len).max_len == tf.max_len


def test_agentic_context_per_generated_token_sets_the_cut():
    """The baseline's trained tokens per generated token (prompt + observations + generation) say
    where the context stops an episode and how long a live one's context is; a single-turn task
    keeps its max_response_tokens."""
    spec = job(workload={"framework": "twin", "model": {"preset": "seed-35b-a3b"}, "task": CODING})
    tf = task_facts(spec.workload.task)
    s = summarize(steps(PH, noise=0.0)).model_copy(
        update={"generated_tokens": tf.n_seq * 14_000.0, "trained_tokens": tf.n_seq * 14_000.0 * 2.9}
    )
    fc = Forecaster(spec, [(spec.baseline, s)])
    assert fc.task.mean_len == pytest.approx(14_000.0)
    rho = (14_000.0 * 2.9 - tf.prompt) / 14_000.0 - 1.0  # observation tokens per generated token
    assert fc.task.obs_per_token == pytest.approx(rho)
    assert fc.task.max_len == pytest.approx((4096 + 65536 - tf.prompt) / (1.0 + rho))
    # the live context that sizes the KV cache's batch follows the measured observations
    k = spec.baseline.flat()
    fewer_obs = Forecaster(spec, [(spec.baseline, s.model_copy(update={"trained_tokens": tf.n_seq * 14_000.0 * 1.5}))])
    assert fewer_obs.raw(k).kv_pressure < fc.raw(k).kv_pressure
    math_spec = job()
    mtf = task_facts(math_spec.workload.task)
    m = summarize(steps(PH, noise=0.0)).model_copy(
        update={"generated_tokens": mtf.n_seq * 4000.0, "trained_tokens": mtf.n_seq * 4500.0}
    )
    assert Forecaster(math_spec, [(math_spec.baseline, m)]).task.max_len == mtf.max_len


def test_context_cut_brings_the_physics_rollout_ratio_to_the_twins():
    """On the twin's agentic episodes (observations fill the context, episodes end at ~1/3 of
    max_response_tokens), moving from 56 colocated GPUs to a 16-GPU rollout pool slows the rollout
    by the twin's measure ~1.4x; the physics uncut (longest episode 65k tokens, all tail and tool
    wait) said ~1.04x, cut at the measured context it says what the twin does."""
    spec = job(
        workload={"framework": "twin", "model": {"preset": "deepseek-flash"}, "task": CODING},
        resources={"gpuType": "B300", "gpuBudget": 56},
        baseline={
            "gpus": 56,
            "rollout": {"tp": 8, "gpuMemoryUtilization": 0.6},
            "trainer": {"tp": 4, "ep": 8, "etp": 1, "recompute": "full", "microBatchTokens": 16384},
        },
    )
    w = spec.workload
    small = spec.baseline.with_knobs(
        {
            "gpus": 40,
            "placement": "disaggregated",
            "trainerGpus": 24,
            "rollout.tp": 4,
            "rollout.gpuMemoryUtilization": 0.85,
            "rollout.maxNumSeqs": 1024,
            "async.staleness": 1,
        }
    )
    twin = [
        simulate_one_step(make_plan(w.model.resolved(), w.task, "B300", 8, c), None) for c in (spec.baseline, small)
    ]
    base = twin[0]
    s = summarize(steps({"generation": base.phases["generation"], "training": 200.0}, noise=0.0)).model_copy(
        update={"generated_tokens": base.generated, "trained_tokens": base.trained}
    )
    fc = Forecaster(spec, [(spec.baseline, s)])
    cut = [fc.raw(c.flat()).phases["generation"] for c in (spec.baseline, small)]
    uncut_tf = dataclasses.replace(task_facts(w.task), mean_len=fc.task.mean_len)
    uncut = [
        physics.breakdown(fc.model, uncut_tf, "B300", 8, physics.Knobs.of(c.flat()), 56).phases["generation"]
        for c in (spec.baseline, small)
    ]
    # the twin's measure is its expectation over workloads (8 noisy steps each, common seeds): one
    # deterministic sample misstates a synchronous step's longest episode (docs/benchmark.md, "The yardstick")
    gen = [
        np.mean(
            [
                simulate_one_step(
                    make_plan(w.model.resolved(), w.task, "B300", 8, c), np.random.default_rng([5, i])
                ).phases["generation"]
                for i in range(8)
            ]
        )
        for c in (spec.baseline, small)
    ]
    truth = gen[1] / gen[0]
    assert abs(cut[1] / cut[0] - truth) < 0.1 * truth
    assert abs(uncut[1] / uncut[0] - truth) > 0.2 * truth


def test_a_side_hidden_behind_the_other_adds_little_to_the_step_uncertainty():
    """Synchronous: the phases add, so do their variances. One step off: the trainer's passes run
    behind a longer rollout, so their uncertainty barely moves the step; the rollout's moves it fully."""
    k = RLConfig.model_validate({"placement": "colocated", "async": {"staleness": 0}}).flat()
    ph = {"generation": 800.0, "old_logprob": 100.0, "ref_logprob": 0.0, "training": 300.0, "weight_sync": 5.0}
    sd = {"generation": 0.1, "old_logprob": 0.3, "training": 0.3, "weight_sync": 0.3}
    assert step_variance(k, ph, sd) == pytest.approx(80.0**2 + 30.0**2 + 90.0**2 + 1.5**2)
    off = k | {"placement": "disaggregated", "trainerGpus": 8, "async.staleness": 1}
    trainer_only = step_variance(off, ph, {"training": 0.3, "old_logprob": 0.3})
    rollout_only = step_variance(off, ph, {"generation": 0.1})
    assert math.sqrt(trainer_only) < 0.2 * math.hypot(30.0, 90.0)  # 400 s behind 800 s: hidden
    assert math.sqrt(rollout_only) == pytest.approx(80.0, rel=0.1)  # the rollout sets the step
    # balanced sides: a trainer that may become the longer side counts again
    balanced = ph | {"training": 700.0}
    balanced_trainer = step_variance(off, balanced, {"training": 0.3, "old_logprob": 0.3})
    assert math.sqrt(balanced_trainer) > 0.3 * math.hypot(30.0, 210.0)


@pytest.mark.parametrize("framework", ["verl", "openrlhf"])
def test_offload_costs_what_the_framework_makes_it(framework):
    """verl's offload swaps the trainer's state between phases (Adam on the GPU): about free in time,
    and no trainer memory saved while it trains. OpenRLHF's is DeepSpeed's CPU Adam: slower, and
    the optimizer's state leaves the GPU (docs/twin.md 'Offload')."""
    from rltune.tuner import baseline_record

    spec = job(
        workload={"framework": framework, "model": {"preset": "qwen2.5-7b"}, "task": {"kind": "math"}},
        baseline={"rollout": {"tp": 2, "gpuMemoryUtilization": 0.6}, "trainer": {"tp": 2}},
    )
    fc = Forecaster(spec)
    cfg = baseline_record(spec).config
    on, off = fc.raw(cfg.with_knobs({"trainer.offload": True}).flat()), fc.raw(cfg.flat())
    slower = on.phases["training"] / off.phases["training"]
    if framework == "verl":
        assert 1.0 < slower < 1.02
        assert on.trainer_mem_frac == pytest.approx(off.trainer_mem_frac)
    else:
        assert slower > 1.3
        assert on.trainer_mem_frac < off.trainer_mem_frac
    assert on.colocated_frac < off.colocated_frac  # either way nothing stays resident during rollouts


def test_a_baseline_with_a_step_time_and_no_phases_calibrates_on_the_step():
    """A log or series that carries only the step time (TRL's console does): the forecaster scales the
    physics' own phase split to the measured step instead of predicting 0 s for everything (issue 62),
    with wider intervals than a measured split gives, and the profile says it had only the step."""
    from rltune.cli import load_job
    from rltune.tuner.forecast import STEP_ONLY_SD, Forecaster
    from rltune.tuner.profile import profile
    from rltune.tuner.summary import TrialSummary

    _, _, spec = load_job(str(Path(__file__).resolve().parents[2] / "examples" / "twin-demo.yaml"))
    step_only = TrialSummary(steps=5, total_steps=6, step_time_mean=200.0, step_time_median=200.0, step_time_std=4.0)
    fc = Forecaster(spec, [(spec.baseline, step_only)])
    base = fc.predict(spec.baseline)
    assert abs(base.step - 200.0) < 4.0 and fc.step_only
    prior = Forecaster(spec).predict(spec.baseline)
    split = {k: v * 200.0 / prior.step for k, v in prior.phases.items() if k not in ("waiting", "rollout_idle")}
    measured = Forecaster(spec, [(spec.baseline, step_only.model_copy(update={"phases": split}))])
    other = spec.baseline.with_knobs({"rollout.maxNumSeqs": 1024})
    assert fc.predict(other).step > 0.0
    assert fc.predict(other).std > measured.predict(other).std
    assert fc.predict(other).std >= STEP_ONLY_SD * fc.predict(other).step
    p = profile(spec, step_only)
    assert p.bottleneck == "unknown" and "no phase times" in p.evidence


def test_the_calibrated_parts_of_generation_are_scaled_as_generation_is():
    """The long tail (and the tool time) a calibrated forecast shows are scaled as the calibration
    scaled them, so the baseline's own forecast gives back its measured tail, never a tail longer
    than the whole generation (it showed the physics' 132 s tail beside a 115 s generation)."""
    from rltune.cli import load_job
    from rltune.tuner.forecast import Forecaster
    from rltune.tuner.summary import TrialSummary

    _, _, spec = load_job(str(Path(__file__).resolve().parents[2] / "examples" / "twin-demo.yaml"))
    prior = Forecaster(spec).predict(spec.baseline)
    measured = {k: v * 0.6 for k, v in prior.phases.items() if k not in ("waiting", "rollout_idle")}
    s = TrialSummary(steps=5, total_steps=6, step_time_mean=0.6 * prior.step, step_time_median=0.6 * prior.step)
    got = Forecaster(spec, [(spec.baseline, s.model_copy(update={"phases": measured}))]).predict(spec.baseline)
    assert got.phases["generation_tail"] == pytest.approx(measured["generation_tail"], rel=0.03)
    assert got.phases["generation_tail"] <= got.phases["generation"]
