"""Behaviour of the digital twin (rltune.twin): determinism, feasibility, knob responses."""

import math

import pytest

from rltune.api.metrics import PHASES
from rltune.api.models import ModelSpec, RLConfig, TaskSpec, TrialSpec
from rltune.twin import TWIN_VERSION, Infeasible, simulate_step_breakdown, simulate_step_time, simulate_trial

M7 = ModelSpec(preset="qwen2.5-7b").resolved()
SMALL = TaskSpec(promptsPerStep=128, samplesPerPrompt=16, maxResponseTokens=8192)


def cfg(**kw) -> RLConfig:
    return RLConfig.model_validate(kw)


def spec(**kw) -> TrialSpec:
    d = dict(
        model=ModelSpec(preset="qwen2.5-7b"),
        task=SMALL,
        gpu_type="B300",
        config=cfg(gpus=16, rollout=dict(tp=1, gpuMemoryUtilization=0.6), trainer=dict(tp=2)),
        steps=4,
        warmup_steps=1,
        seed=3,
    )
    d.update(kw)
    return TrialSpec(**d)


def test_version_is_a_string():
    assert isinstance(TWIN_VERSION, str) and TWIN_VERSION


def test_same_seed_same_trial_and_different_seed_differs():
    a = simulate_trial(spec(seed=11))
    b = simulate_trial(spec(seed=11))
    c = simulate_trial(spec(seed=12))
    assert [r.duration for r in a] == [r.duration for r in b]
    assert [r.reward for r in a] == [r.reward for r in b]
    assert [r.duration for r in a] != [r.duration for r in c]
    # step-to-step noise exists but is moderate
    d = [r.duration for r in a[1:]]
    assert max(d) / min(d) < 1.5 and len(set(d)) == len(d)


def test_noiseless_is_reproducible_and_matches_step_time():
    a = simulate_trial(spec(), noise=False)
    b = simulate_trial(spec(seed=99), noise=False)
    assert [r.duration for r in a] == [r.duration for r in b]
    assert a[1].duration == a[2].duration
    st = simulate_step_time(M7, SMALL, "B300", 8, spec().config)
    assert math.isclose(st, a[1].duration, rel_tol=1e-9)


def test_records_are_complete_and_warmup_flagged():
    recs = simulate_trial(spec(steps=5, warmup_steps=2))
    assert [r.warmup for r in recs] == [True, True, False, False, False]
    assert recs[0].duration > recs[2].duration  # warm-up pays CUDA-graph capture etc.
    for r in recs:
        assert set(r.phases) == set(PHASES)
        assert r.generated_tokens > 0 and r.trained_tokens > r.generated_tokens
        assert 0 < r.kv_usage <= 1
        assert 0.002 < r.logprob_mismatch < 0.02
        total = r.phases["generation"] + r.phases["old_logprob"] + r.phases["training"] + r.phases["weight_sync"]
        assert math.isclose(r.duration, total, rel_tol=1e-6)  # colocated: phases are sequential


def test_trainer_oom_raises_infeasible_naming_memory():
    bad = cfg(gpus=8, rollout=dict(tp=1), trainer=dict(tp=1, recompute="none", microBatchTokens=262144))
    with pytest.raises(Infeasible) as e:
        simulate_step_time(M7, SMALL, "H100", 8, bad)
    assert e.value.oom and "out of memory" in str(e.value).lower() and "GiB" in str(e.value)
    with pytest.raises(Infeasible):
        simulate_trial(spec(config=bad, gpu_type="H100"))


def test_rollout_weights_that_do_not_fit_raise():
    big = ModelSpec(preset="qwen3-235b-a22b").resolved()
    with pytest.raises(Infeasible) as e:
        simulate_step_time(
            big, SMALL, "H100", 8, cfg(gpus=8, rollout=dict(tp=1, gpuMemoryUtilization=0.9), trainer=dict(tp=8))
        )
    assert "weights do not fit" in str(e.value)


def test_max_num_seqs_raises_throughput_when_kv_allows():
    task = TaskSpec(promptsPerStep=128, samplesPerPrompt=16, maxResponseTokens=8192)
    base = dict(gpus=8, rollout=dict(tp=1, gpuMemoryUtilization=0.85), trainer=dict(tp=2))
    gens = []
    for s in (32, 128, 512):
        c = cfg(**base).with_knobs({"rollout.maxNumSeqs": s})
        b = simulate_step_breakdown(M7, task, "B300", 8, c)
        gens.append(b["phases"]["generation"])
        assert b["preemptions"] == 0
    assert gens[0] > gens[1] > gens[2]


def test_max_num_seqs_causes_preemptions_when_kv_is_tight():
    task = TaskSpec(promptsPerStep=128, samplesPerPrompt=16, maxResponseTokens=8192)
    base = dict(gpus=8, rollout=dict(tp=1, gpuMemoryUtilization=0.12), trainer=dict(tp=2))
    small = simulate_step_breakdown(M7, task, "B300", 8, cfg(**base).with_knobs({"rollout.maxNumSeqs": 8}))
    big = simulate_step_breakdown(M7, task, "B300", 8, cfg(**base).with_knobs({"rollout.maxNumSeqs": 1024}))
    assert small["preemptions"] == 0
    assert big["preemptions"] > 0
    assert big["kv_usage"] > 0.9


def test_staleness_one_disaggregated_is_faster_than_zero():
    d = dict(
        gpus=16,
        placement="disaggregated",
        trainerGpus=8,
        rollout=dict(tp=1, gpuMemoryUtilization=0.85),
        trainer=dict(tp=2),
    )
    s0 = simulate_step_breakdown(M7, SMALL, "B300", 8, cfg(**d))
    s1 = simulate_step_breakdown(M7, SMALL, "B300", 8, cfg(**d, **{"async": dict(staleness=1)}))
    assert s1["duration"] < 0.85 * s0["duration"]
    assert s0["staleness"] == 0 and s1["staleness"] >= 1
    assert s0["phases"]["waiting"] > 0 and s0["phases"]["rollout_idle"] > 0
    # observed staleness never exceeds the configured limit
    recs = simulate_trial(spec(config=cfg(**d, **{"async": dict(staleness=1, partialRollout=True)})))
    assert all(r.staleness <= 1 for r in recs) and any(r.staleness == 1 for r in recs)


def test_partial_rollout_cuts_the_tail_in_async_mode():
    d = dict(
        gpus=16,
        placement="disaggregated",
        trainerGpus=4,
        rollout=dict(tp=1, gpuMemoryUtilization=0.85),
        trainer=dict(tp=2),
    )
    a = simulate_step_breakdown(M7, SMALL, "B300", 8, cfg(**d, **{"async": dict(staleness=1)}))
    b = simulate_step_breakdown(M7, SMALL, "B300", 8, cfg(**d, **{"async": dict(staleness=1, partialRollout=True)}))
    assert b["phases"]["generation"] < a["phases"]["generation"]
    assert b["phases"]["generation_tail"] < a["phases"]["generation_tail"]


def test_fewer_gpus_is_slower():
    c = dict(rollout=dict(tp=1, gpuMemoryUtilization=0.6), trainer=dict(tp=2))
    t16 = simulate_step_time(M7, SMALL, "B300", 8, cfg(gpus=16, **c))
    t8 = simulate_step_time(M7, SMALL, "B300", 8, cfg(gpus=8, **c))
    assert t8 > 1.3 * t16


def test_fp8_and_cuda_graphs_and_staleness_quality_signals():
    c = dict(gpus=16, rollout=dict(tp=1, gpuMemoryUtilization=0.6), trainer=dict(tp=2))
    bf16 = simulate_trial(spec(config=cfg(**c)), noise=False)
    fp8 = simulate_trial(spec(config=cfg(**c).with_knobs({"rollout.fp8": True})), noise=False)
    eager = simulate_trial(spec(config=cfg(**c).with_knobs({"rollout.cudaGraphs": False})), noise=False)
    assert fp8[-1].phases["generation"] < bf16[-1].phases["generation"]
    assert fp8[-1].logprob_mismatch > 0.02 > bf16[-1].logprob_mismatch
    assert eager[-1].phases["generation"] > bf16[-1].phases["generation"]
    # reward rises over steps
    assert bf16[-1].reward > bf16[0].reward


def test_agentic_coding_step_has_tool_time_and_respects_sandboxes():
    m = ModelSpec(preset="seed-35b-a3b").resolved()
    task = TaskSpec(
        kind="agentic-coding",
        promptsPerStep=16,
        samplesPerPrompt=4,
        maxPromptTokens=4096,
        maxResponseTokens=32768,
        turns=8,
        toolLatencySeconds=10,
        sandboxes=64,
    )
    c = cfg(gpus=8, rollout=dict(tp=2, gpuMemoryUtilization=0.6), trainer=dict(tp=1, ep=8, recompute="full"))
    b = simulate_step_breakdown(m, task, "B300", 8, c)
    assert b["duration"] > 80  # at least a few turns of 10 s tool latency
    few = simulate_step_breakdown(m, task.model_copy(update={"sandboxes": 8}), "B300", 8, c)
    assert few["phases"]["generation"] > 1.5 * b["phases"]["generation"]


def test_scenario_overrides_hidden_factors():
    c = cfg(gpus=16, rollout=dict(tp=1, gpuMemoryUtilization=0.6), trainer=dict(tp=2))
    base = simulate_step_breakdown(M7, SMALL, "B300", 8, c)
    slow = simulate_step_breakdown(M7, SMALL, "B300", 8, c, {"hbm_efficiency": 0.4, "mfu_scale": 0.5})
    assert slow["phases"]["generation"] > 1.4 * base["phases"]["generation"]
    assert slow["phases"]["training"] > 1.6 * base["phases"]["training"]
    noisy = [r.duration for r in simulate_trial(spec(scenario={"noise": 0.2}, steps=6))[1:]]
    quiet = [r.duration for r in simulate_trial(spec(scenario={"noise": 0.0, "straggler_prob": 0.0}, steps=6))[1:]]
    spread = lambda xs: (max(xs) - min(xs)) / min(xs)
    assert spread(noisy) > spread(quiet)


def _truncate_turn_by_turn(prompt, turns, gens, obs, tools, budget0, limit):
    """The episode cut written turn by turn: the semantics _truncate_episodes computes in bulk."""
    tg, to, tt = [], [], []
    pos = 0
    for e, k in enumerate(turns.tolist()):
        g, o, tl = gens[pos : pos + k].tolist(), obs[pos : pos + k].tolist(), tools[pos : pos + k].tolist()
        pos += k
        ctx, budget = int(prompt[e]), budget0
        gg, oo, ttl = [], [], []
        for j in range(k):
            gj = min(g[j], budget, limit - ctx - 1)
            if gj <= 0:
                break
            gg.append(gj)
            budget -= gj
            ctx += gj
            oj = min(o[j], max(0, limit - ctx - 1))
            oo.append(oj)
            ttl.append(tl[j])
            ctx += oj
            if budget <= 0 or ctx >= limit - 1:
                break
        if not gg:
            gg, oo, ttl = [1], [0], [tl[0]]
        tg.append(gg)
        to.append(oo)
        tt.append(ttl)
    return tg, to, tt


@pytest.mark.parametrize("budget0,limit", [(65536, 73728), (4000, 5000), (300, 100000), (1, 600)])
def test_episode_cut_in_bulk_matches_the_turn_by_turn_rule(budget0, limit):
    import numpy as np

    from rltune.twin.workload import _truncate_episodes

    rng = np.random.default_rng(3)
    n = 400
    turns = rng.geometric(1 / 8, n)
    total = int(turns.sum())
    prompt = rng.integers(16, 512, n)
    gens = rng.integers(1, 2000, total)
    obs = rng.integers(0, 3000, total)
    tools = rng.exponential(5.0, total)
    off, g, o, t = _truncate_episodes(prompt, turns, gens, obs, tools, budget0, limit)
    got = tuple([a[off[e] : off[e + 1]].tolist() for e in range(n)] for a in (g, o, t))
    want = _truncate_turn_by_turn(prompt, turns, gens, obs, tools, budget0, limit)
    assert got == want
    cut = sum(len(g) < k for g, k in zip(want[0], turns.tolist()))
    assert cut > 0 or budget0 > 60000  # the tight cases do cut episodes


def _ranks(x):
    import numpy as np

    return np.argsort(np.argsort(np.asarray(x, dtype=float)))


def test_noiseless_agentic_draws_are_independent_per_turn_as_in_the_noisy_twin():
    """The noiseless sample's generation, observation and tool draws are arrays of one length; with one
    shared order they came out comonotone (rank correlation 1), cut more episodes at the context limit
    and thinned the tail the synchronous step waits for (docs/benchmark.md, "The yardstick")."""
    import numpy as np

    from bench.jobs import CODING
    from rltune.twin.efficiency import efficiency
    from rltune.twin.workload import sample_episodes

    task = TaskSpec.model_validate(CODING)  # the benchmark's agentic task
    eff = efficiency("B300")
    ep = sample_episodes(task, eff, None)
    gen, obs, tool = ep.per_episode()
    clean = [i for i, g in enumerate(gen) if len(g) > 1]  # episodes with whole turns
    g = [x for i in clean for x in gen[i][:-1]]
    o = [x for i in clean for x in obs[i][:-1]]
    t = [x for i in clean for x in tool[i][:-1]]
    assert abs(np.corrcoef(_ranks(g), _ranks(o))[0, 1]) < 0.1
    assert abs(np.corrcoef(_ranks(g), _ranks(t))[0, 1]) < 0.1
    assert abs(np.corrcoef(_ranks(o), _ranks(t))[0, 1]) < 0.1

    def p99(e):
        return float(np.percentile([sum(x) for x in e.per_episode()[0]], 99))

    rand = [p99(sample_episodes(task, eff, np.random.default_rng(s))) for s in range(8)]
    assert p99(ep) == pytest.approx(float(np.mean(rand)), rel=0.1)


@pytest.mark.parametrize("agentic", [False, True])
def test_episode_totals_match_their_turns(agentic):
    """seq_lens and generated, computed on the flat arrays, are the sums over each episode's turns."""
    import numpy as np

    from bench.jobs import CODING
    from rltune.twin.efficiency import efficiency
    from rltune.twin.workload import sample_episodes

    task = TaskSpec.model_validate(CODING) if agentic else TaskSpec(maxResponseTokens=8192, promptsPerStep=64)
    ep = sample_episodes(task, efficiency("B300"), np.random.default_rng(11))
    gen, obs, _ = ep.per_episode()
    assert ep.multi == agentic and len(gen) == len(ep)
    want = [int(p) + sum(g) + (sum(o) if agentic else 0) for p, g, o in zip(ep.prompt.tolist(), gen, obs)]
    assert ep.seq_lens().tolist() == want
    assert ep.generated() == sum(sum(g) for g in gen)
    assert any(len(g) > 1 for g in gen) == agentic
