"""Memory fit as a probability (rltune.tuner.memfit), learned tool wait, extrapolation flags."""

import copy

from test_tuner_fixtures import job, steps

from rltune.api.models import RLConfig, RLTuningJobSpec
from rltune.tuner import Forecaster, Tuner, baseline_record, summarize
from rltune.tuner.memfit import MEM_SD, P_FIT_MIN, SideFit
from rltune.tuner.search import Space, candidates

PH = {"generation": 420.0, "generation_tail": 200.0, "old_logprob": 55.0, "training": 160.0, "weight_sync": 6.0}
DS = {"framework": "twin", "model": {"preset": "deepseek-flash"}, "task": {"kind": "math"}}


def test_side_fit_is_a_probability_bounded_by_what_trials_showed():
    s = SideFit(centre=0.95)
    xs = [0.80, 0.90, 0.95, 0.98, 1.05]
    ps = [s.p(x) for x in xs]
    assert ps == sorted(ps, reverse=True) and ps[0] > 0.99 and abs(ps[2] - 0.5) < 1e-9 and ps[-1] < 0.01
    # a configuration that ran proves everything at most as hungry fits
    s.fits_to = 0.97
    assert s.p(0.96) == 1.0 and s.p(0.97) == 1.0 and 0.0 < s.p(0.99) < 1.0
    # an out-of-memory failure: certain above it, and less likely just below it than before
    before = s.p(0.99)
    s.fails_from = 1.0
    assert s.p(1.0) == 0.0 and s.p(1.2) == 0.0 and s.p(0.99) < before


def _tight():
    return RLConfig.model_validate(
        {
            "gpus": 32,
            "trainer": {"tp": 2, "ep": 4, "recompute": "none", "microBatchTokens": 38912},
            "rollout": {"tp": 4, "gpuMemoryUtilization": 0.5},
        }
    )


def test_just_beyond_the_physics_limit_is_a_risk_not_a_verdict():
    spec = job(workload=DS)
    fc = Forecaster(spec)
    tight = _tight()
    bd = fc.raw(tight.flat())
    assert bd.memory and bd.trainer_mem_frac > fc.limits.trainer_max  # the physics' hard cut said no
    p = fc.predict(tight)
    assert bd.trainer_mem_frac < fc.limits.trainer_max + 3 * MEM_SD  # ... by less than 3 sd
    assert p.feasible and P_FIT_MIN <= p.p_fit < 0.5  # a risk the search may take, not a verdict
    # far beyond it stays out
    huge = tight.with_knobs({"trainer.tp": 1, "trainer.ep": 1, "trainer.microBatchTokens": 131072})
    ph = fc.predict(huge)
    assert not ph.feasible and ph.p_fit == 0.0 and "out of memory" in ph.reason


def test_an_oom_lowers_the_fit_of_every_layout_on_its_side():
    spec = job(workload=DS)
    base = spec.baseline
    fc0 = Forecaster(spec)
    # two different layouts, the second less trainer-hungry than the first
    a = base.with_knobs({"trainer.recompute": "selective", "trainer.microBatchTokens": 32768, "trainer.tp": 2})
    b = base.with_knobs({"trainer.recompute": "selective", "trainer.microBatchTokens": 16384, "trainer.tp": 2})
    ha, hb = fc0.raw(a.flat()).trainer_mem_frac, fc0.raw(b.flat()).trainer_mem_frac
    assert hb < ha
    fc1 = Forecaster(spec, oom_failures=[(a, "CUDA out of memory: trainer needs 300 GiB")])
    assert not fc1.predict(a).feasible
    # any layout a little less trainer-hungry than the failure shares its cause: its fit moved too
    x = ha - MEM_SD
    assert fc1.memory.p_side("trainer", x) < fc0.memory.p_side("trainer", x)
    assert fc1.memory.p_side("trainer", hb) <= fc0.memory.p_side("trainer", hb)
    # the rollout side is not touched by a trainer-side failure
    assert fc1.memory.sides["rollout"].fails_from == fc0.memory.sides["rollout"].fails_from


def test_colocated_oom_is_its_own_side():
    from rltune.tuner.forecast import _oom_side

    msg = "CUDA out of memory: colocated rollout takes gpuMemoryUtilization 0.9 x 268 GiB while the trainer keeps"
    assert _oom_side(msg) == "colocated"
    assert _oom_side("CUDA out of memory: trainer needs 300 GiB/GPU") == "trainer"


def test_the_search_keeps_the_edge_and_weighs_it_by_its_fit():
    spec = job(workload=DS)
    t = Tuner(spec, baseline_record(spec, summarize(steps(PH))), [])
    cands = candidates(t.space, t.forecaster)
    edge = [c for c in cands if c.p_fit < 0.5]
    assert edge, "configurations beyond the physics' memory limits must stay in the search"
    assert all(c.p_fit >= P_FIT_MIN for c in cands)
    assert any(p.fit_probability < 1.0 for p in t.proposer.rank(limit=500))


def _agentic_job(**task_over):
    from bench.jobs import jobs as bench_jobs

    j = copy.deepcopy([x for x in bench_jobs() if x["metadata"]["name"] == "bench-glm-flash-coding"][0])
    task = j["spec"]["workload"]["task"]
    task.pop("toolLatencySeconds")
    task.update(task_over)
    j["spec"]["workload"]["scenario"]["tool_latency"] = 30.0
    return RLTuningJobSpec.model_validate(j["spec"])


def test_tool_wait_the_spec_leaves_out_is_learned_from_the_baseline():
    from rltune import twin
    from rltune.api.models import trial_spec_for

    spec = _agentic_job()
    b0 = baseline_record(spec)
    s = summarize(twin.simulate_trial(trial_spec_for("t", "j", "baseline", spec, b0.config, 4, 1, seed=3)))
    assert s.phases["tool"] > 0
    fc = Forecaster(spec, [(b0.config, s)])
    lat = fc.learned["toolLatencySeconds"]
    assert lat != 10.0  # the physics' default moved to what the measurement says
    # the learned latency reproduces the measured engine idle at the baseline
    raw = fc.raw(b0.config.flat()).phases["tool"]
    assert abs(raw - s.phases["tool"]) <= 0.05 * s.phases["tool"]
    # a spec that states the latency is taken at its word
    stated = _agentic_job(toolLatencySeconds=10.0)
    assert "toolLatencySeconds" not in Forecaster(stated, [(b0.config, s)]).learned


def test_trainer_memory_is_sized_and_scaled_by_what_the_trials_measured():
    """The baseline's measured trainer peak and longest sequence: every layout is sized for the
    sequence the trials train (an agentic episode fills the context every step), and the measured
    recompute mode's coefficients are scaled so the baseline's own forecast is its measurement; a
    mode no trial ran keeps the physics' coefficients, at the measured length."""
    from rltune import twin
    from rltune.api.models import trial_spec_for

    spec = _agentic_job(toolLatencySeconds=10.0)
    b0 = baseline_record(spec)
    s = summarize(twin.simulate_trial(trial_spec_for("t", "j", "baseline", spec, b0.config, 4, 1, seed=3)))
    mode = b0.config.trainer.recompute
    assert s.trainer_memory_max > 0 and s.longest_sequence_max > b0.config.trainer.micro_batch_tokens
    prior, fc = Forecaster(spec), Forecaster(spec, [(b0.config, s)])
    assert fc.learned["trainedSequenceTokens"] == round(s.longest_sequence_max)
    assert f"activationScale.{mode}" in fc.learned
    k = b0.config.flat()
    assert abs(fc.raw(k).trainer_mem_frac - s.trainer_memory_max) <= 0.01 * s.trainer_memory_max
    assert abs(prior.raw(k).trainer_mem_frac - s.trainer_memory_max) > 0.05 * s.trainer_memory_max
    other = "selective" if mode != "selective" else "full"
    kk = b0.config.with_knobs({"trainer.recompute": other}).flat()
    # unmeasured mode: the physics' own coefficients, for the longest sequence the trials trained
    assert fc.raw(kk).trainer_mem_frac > prior.raw(kk).trainer_mem_frac


def test_a_forecast_says_what_it_extrapolates():
    spec = job()
    base = spec.baseline
    fc = Forecaster(spec, [(base, summarize(steps(PH)))])
    assert fc.predict(base).extrapolation == ""
    moved = base.with_knobs({"rollout.tp": 4, "async.staleness": 1})
    ex = fc.predict(moved).extrapolation
    assert "rollout.tp=4" in ex and "async.staleness=1" in ex
    assert Forecaster(spec).predict(base).extrapolation == "no measurement yet"
    # partial rollout measured only as a drain (staleness 0) has not shown a stream
    drain = base.with_knobs({"async.partialRollout": True})
    stream = base.with_knobs({"async.partialRollout": True, "async.staleness": 1})
    fc2 = Forecaster(spec, [(base, summarize(steps(PH))), (drain, summarize(steps(PH)))])
    assert "streaming rollout" in fc2.predict(stream).extrapolation
    assert "streaming rollout" not in fc2.predict(drain).extrapolation
    fc3 = Forecaster(spec, [(base, summarize(steps(PH))), (stream, summarize(steps(PH)))])
    assert "streaming rollout" not in fc3.predict(stream.with_knobs({"rollout.tp": 4})).extrapolation
    # and a proposal carries it
    t = Tuner(spec, baseline_record(spec, summarize(steps(PH))), [])
    assert all(isinstance(p.extrapolation, str) for p in t.proposer.propose(2, 32))
    assert any(p.extrapolation for p in t.proposer.propose(2, 32))


def test_space_is_unchanged_by_fit_probabilities():
    # the fit probability weighs candidates, it does not invent configurations outside the space
    spec = job(workload=DS)
    t = Tuner(spec, baseline_record(spec, summarize(steps(PH))), [])
    sp = Space(spec)
    for c in candidates(t.space, t.forecaster)[:50]:
        assert sp.all_valid(c.k) is None
