"""The twin's mechanisms fixed for GitHub issue 14, each pinned by the behaviour it must show.

- weight sync: sharded, parallel transfers (time falls with more trainer shard owners);
- async pipeline: fractional staleness orders the step times and leaves a measurable trainer wait;
- rollout across nodes: a replica spanning two NVLink domains pays network latency per collective,
  not a multiple of the in-node cost;
- NVLink domain: a property of the hardware (NVL72 racks), not of gpusPerNode;
- offload: verl's swap of the state between phases is not DeepSpeed's CPU Adam.
"""

import pytest

from rltune.api.hardware import gpu
from rltune.api.models import ModelSpec, RLConfig, TaskSpec
from rltune.api.pipeline import pipeline_step
from rltune.twin import Infeasible, simulate_step_breakdown
from rltune.twin.efficiency import efficiency
from rltune.twin.rollout import replica_cost
from rltune.twin.simulate import _weight_sync, make_plan

M7 = ModelSpec(preset="qwen2.5-7b").resolved()
MOE = ModelSpec(preset="qwen3-235b-a22b").resolved()
LONG = TaskSpec(
    promptsPerStep=512, samplesPerPrompt=16, maxPromptTokens=2048, maxResponseTokens=28672, meanResponseTokens=3000
)
SHORT = TaskSpec(promptsPerStep=128, samplesPerPrompt=8, maxPromptTokens=2048, maxResponseTokens=8192)


def cfg(**kw) -> RLConfig:
    return RLConfig.model_validate(kw)


# ------------------------------------------------------------------------------------ weight sync


def _sync_seconds(model, trainer: dict, method: str = "nccl", gpus: int = 128) -> float:
    c = cfg(
        gpus=gpus,
        placement="disaggregated",
        trainerGpus=gpus // 2,
        weightSync=method,
        rollout=dict(tp=8, expertParallel=True, gpuMemoryUtilization=0.85),
        trainer=trainer,
    )
    p = make_plan(model, SHORT, "B300", 8, c)
    return _weight_sync(p, None)[0]


@pytest.mark.parametrize("method", ["nccl", "checkpoint-engine"])
def test_weight_sync_falls_with_more_trainer_shard_owners(method):
    one = _sync_seconds(MOE, dict(tp=4, pp=1, ep=1, etp=1), method)
    stages = _sync_seconds(MOE, dict(tp=4, pp=4, ep=1, etp=1), method)
    experts = _sync_seconds(MOE, dict(tp=4, pp=4, ep=4, etp=1), method)
    assert experts < stages < one
    # parallel streams, not a fixed pipe: 4 stages send ~4x faster (fixed costs aside)
    assert one / stages > 2.5


def test_weight_sync_is_bounded_below_by_each_rollout_gpus_own_shard():
    """However many senders, a rollout GPU receives its TP shard through its own NIC."""
    t = _sync_seconds(MOE, dict(tp=4, pp=4, ep=4), "nccl")
    total, _ = MOE.params()
    g = gpu("B300")
    floor = total * 2.0 / 8 / (g.nic_bw * efficiency("B300").nic)
    assert t >= floor


def test_fsdp_gathers_onto_one_sender():
    """FSDP (verl's default) gathers full tensors and sends them from one rank: one stream."""
    c = cfg(gpus=32, placement="disaggregated", trainerGpus=16, rollout=dict(tp=4), trainer=dict(tp=1, cp=4))
    fsdp = make_plan(M7, SHORT, "H20", 8, c, {"fsdp": True})
    megatron = make_plan(M7, SHORT, "H20", 8, c.model_copy(update={"trainer": c.trainer.model_copy(update={"pp": 2})}))
    assert _weight_sync(fsdp, None)[0] > _weight_sync(megatron, None)[0]


# ------------------------------------------------------------------------------------ async pipeline


def _async_step(frac, partial=True):
    c = cfg(
        gpus=64,
        placement="disaggregated",
        trainerGpus=32,
        rollout=dict(tp=4, gpuMemoryUtilization=0.8, maxNumSeqs=256),
        trainer=dict(tp=1, cp=4, microBatchTokens=61440, recompute="full"),
        **{"async": dict(staleness=1, partialRollout=partial, staleFraction=frac)},
    )
    return simulate_step_breakdown(M7, LONG, "H20", 8, c, {"fsdp": True, "rollout_logprobs": True})


def test_fractional_staleness_orders_the_step_times():
    steps = [_async_step(f)["duration"] for f in (0.0, 0.1, 0.3)]
    assert steps[0] > steps[1] > steps[2]


def test_trainer_wait_is_reported_and_shrinks_with_the_fraction():
    w0 = _async_step(0.0)["phases"]["waiting"]
    w1 = _async_step(0.1)["phases"]["waiting"]
    assert w0 > w1 >= 0.0 and w0 > 0.05 * _async_step(0.0)["duration"]


def test_stale_fraction_needs_a_separate_rollout_pool():
    c = cfg(gpus=16, rollout=dict(tp=2), **{"async": dict(staleness=1, partialRollout=True, staleFraction=0.3)})
    with pytest.raises(Infeasible, match="staleFraction"):
        simulate_step_breakdown(M7, SHORT, "H20", 8, c)


def test_pipeline_without_run_ahead_pays_the_fill_of_each_step():
    """Fraction 0: the rollout makes only the current step's batch, so one mini-batch of each side
    is not overlapped; a full step of run-ahead hides it (the integer-staleness steady state)."""
    zero = pipeline_step(gen=100, train=80, sync_trainer=3, sync_rollout=3, ahead=0.0, units=4, streaming=True)
    one = pipeline_step(gen=100, train=80, sync_trainer=3, sync_rollout=3, ahead=1.0, units=4, streaming=True)
    assert zero.duration == pytest.approx(100 + 80 / 4 + 3)
    assert one.duration == pytest.approx(max(100 + 3, 80 + 3))
    assert one.trainer_wait == pytest.approx(100 - 80)  # rollout-bound: the trainer still waits


def test_a_rollout_of_no_duration_leaves_the_trainer_alone():
    """The forecaster's step variance composes a side at its lower spread, down to zero seconds: the
    pipeline is then trainer-bound (it divided by the rollout's duration before)."""
    for streaming in (True, False):
        r = pipeline_step(gen=0.0, train=80, sync_trainer=3, sync_rollout=3, ahead=1.0, units=4, streaming=streaming)
        assert r.duration == pytest.approx(83) and r.trainer_wait == pytest.approx(0.0)


def test_one_step_off_matches_the_classic_overlap():
    r = pipeline_step(gen=100, train=80, sync_trainer=3, sync_rollout=3, ahead=1.0, units=4, streaming=False)
    assert r.duration == pytest.approx(103)


# ------------------------------------------------------------------------------------ rollout across nodes


def _replica(tp: int, gpn: int, gpu_type: str = "B300"):
    c = cfg(gpus=32, rollout=dict(tp=tp, expertParallel=True, gpuMemoryUtilization=0.85))
    return replica_cost(MOE, SHORT, gpu_type, gpn, c, efficiency(gpu_type))


def test_cross_node_tp_costs_network_hops_not_a_multiple_of_everything():
    r8, r16 = _replica(8, 8), _replica(16, 8)
    assert r16.fixed0 > r8.fixed0  # crossing nodes costs network hops ...
    assert r16.fixed0 < 1.5 * r8.fixed0  # ... not a multiple of every in-node collective
    it8, it16 = r8.iter_time(256, 256 * 3000), r16.iter_time(256, 256 * 3000)
    # half the weights per GPU at TP16: the iteration gets no slower, and collectives stay a minority
    assert it16 < 1.2 * it8
    crossing = (r16.fixed0 + r16.comm_per_tok * 256) - (r8.fixed0 + r8.comm_per_tok * 256)
    assert 0 < crossing < 0.25 * it16


# ------------------------------------------------------------------------------------ NVLink domain


def test_nvlink_domain_comes_from_the_catalog_not_gpus_per_node():
    assert gpu("GB200").nvlink_reach(4) == 72
    assert gpu("B300").nvlink_reach(8) == 8
    assert gpu("H100").nvlink_reach(4) == 4
    c = cfg(gpus=64, rollout=dict(tp=16, expertParallel=True, gpuMemoryUtilization=0.85), trainer=dict(tp=4, ep=8))
    on4 = simulate_step_breakdown(MOE, SHORT, "GB200", 4, c)
    on72 = simulate_step_breakdown(MOE, SHORT, "GB200", 72, c)
    for phase in ("generation", "training", "old_logprob"):
        assert on4["phases"][phase] == pytest.approx(on72["phases"][phase], rel=1e-9)


# ------------------------------------------------------------------------------------ FSDP memory


def test_fsdp_keeps_only_its_shard_of_the_weights_resident_under_colocated_rollouts():
    """A 14B model under FSDP on 16 GPUs colocated with vLLM at 0.75: Megatron-style whole
    replicas would not fit beside the KV pool; FSDP's data-parallel shard does."""
    from rltune.twin.training import train_cost

    m14 = ModelSpec(preset="qwen2.5-7b").resolved().model_copy(update={"layers": 56, "hidden": 5120, "ffn": 13824})
    import numpy as np

    c = cfg(
        gpus=16,
        rollout=dict(tp=2, gpuMemoryUtilization=0.75),
        trainer=dict(tp=2, recompute="full", microBatchTokens=4096),
    )
    seqs = np.full(64, 4096)
    fsdp = train_cost(m14, seqs, "H100", 8, 16, c, efficiency("H100", {"fsdp": True}), False)
    megatron = train_cost(m14, seqs, "H100", 8, 16, c, efficiency("H100"), False)
    assert fsdp.resident_gib == pytest.approx(megatron.resident_gib / 8, rel=0.05)  # 8-way data parallel


# ------------------------------------------------------------------------------------ offload


def _offload_costs(scenario: dict):
    """train_cost of a 7B FSDP update on 32 H20s (16 mini-batches) without and with trainer.offload."""
    import numpy as np

    from rltune.twin.training import train_cost

    seqs = np.full(512 * 16, 3000)
    eff = efficiency("H20", {"fsdp": True, "mini_batches": 16, **scenario})
    out = []
    for off in (False, True):
        c = cfg(gpus=32, trainer=dict(tp=1, cp=4, recompute="full", microBatchTokens=61440, offload=off))
        out.append(train_cost(M7, seqs, "H20", 8, 32, c, eff, False))
    return out


def test_verl_offload_swaps_the_state_once_per_step_with_adam_on_the_gpu():
    """verl's actor offload moves the state to the host between phases and back for the update
    (fsdp_workers.update_actor), Adam on the GPU: under a second here, and the GPU holds the whole
    state while it trains. DeepSpeed's CPU Adam pays PCIe and a host optimizer every optimizer step."""
    on_gpu, swap = _offload_costs({"offload_swap": True})
    _, cpu_adam = _offload_costs({})
    assert 0 < swap.training - on_gpu.training < 1.0
    assert swap.mem_gib == pytest.approx(on_gpu.mem_gib, rel=1e-9)
    assert swap.resident_gib == cpu_adam.resident_gib == 0.0 < on_gpu.resident_gib
    assert cpu_adam.training - on_gpu.training > 10 * (swap.training - on_gpu.training)


# ------------------------------------------------------------------------------------ eager FSDP layers


def _fsdp_vs_megatron(model, recompute: str):
    """(FSDP, Megatron) train_cost of the same batch and layout on 8 H200s, data parallel only."""
    import numpy as np

    from rltune.twin.training import train_cost

    c = cfg(gpus=8, trainer=dict(tp=1, recompute=recompute, microBatchTokens=8192))
    seqs = np.full(256, 4096)
    fsdp = train_cost(model, seqs, "H200", 8, 8, c, efficiency("H200", {"fsdp": True}), False)
    megatron = train_cost(model, seqs, "H200", 8, 8, c, efficiency("H200"), False)
    return fsdp, megatron


def test_eager_fsdp_layers_cost_bytes_not_flops():
    """An FSDP (eager Hugging Face) trainer pays memory-bound element-wise kernels per token, layer and
    hidden unit on top of the GEMMs: a narrow model pays a larger share of its step than a wide one,
    the forward-only log-prob pass pays it too, and gradient checkpointing repeats the forward's."""
    small = ModelSpec(preset="qwen2.5-7b").resolved().model_copy(update={"layers": 28, "hidden": 1536, "ffn": 8960})
    share = {}
    for name, m in (("1.5b", small), ("7b", M7)):
        fsdp, megatron = _fsdp_vs_megatron(m, "none")
        share[name] = fsdp.training / megatron.training - 1.0
        assert fsdp.old_logprob > megatron.old_logprob
    assert share["1.5b"] > 1.25 * share["7b"] > 0.0  # a FLOP-proportional cost would give equal shares
    none, megatron_none = _fsdp_vs_megatron(M7, "none")
    full, megatron_full = _fsdp_vs_megatron(M7, "full")
    extra_none = none.training - megatron_none.training
    extra_full = full.training - megatron_full.training
    eff = efficiency("H200", {"fsdp": True})
    assert extra_full / extra_none == pytest.approx(
        (eff.eager_train_bytes + eff.eager_fwd_bytes) / eff.eager_train_bytes, rel=0.01
    )


def test_eager_bytes_are_the_h200_measurement():
    """The twin's element-wise bytes are the least-squares fit of the tracked H200 runs
    (bench/data/trainer-speed-h200, `python -m bench.trainer_speed --points`), which explains each
    measured point's element-wise time within 10%; gradient checkpointing's extra element-wise time
    is the forward's, as the twin charges it."""
    from bench.trainer_speed import eager_bytes, recompute_bytes, tracked_runs

    runs = [(points, r["mbt"], r.get("recompute", "none")) for points, r in tracked_runs()]
    fitted = {e.pass_: e for e in eager_bytes([(p, mbt) for p, mbt, rc in runs if rc == "none"])}
    eff = efficiency("H200")
    assert fitted["fwd"].per_token_layer_hidden == pytest.approx(eff.eager_fwd_bytes, rel=0.02)
    assert fitted["train"].per_token_layer_hidden == pytest.approx(eff.eager_train_bytes, rel=0.02)
    for e in fitted.values():
        assert len(e.fit) >= 4 and all(0.9 < v < 1.1 for v in e.fit)
    # gradient checkpointing (the twin's recompute "full") adds the forward's element-wise time again
    plain = next(p for p, mbt, rc in runs if rc == "none" and mbt == 4096)
    full = next(p for p, mbt, rc in runs if rc == "full" and mbt == 4096)
    extra = recompute_bytes(plain, full)
    assert len(extra) >= 2 and all(v == pytest.approx(eff.eager_fwd_bytes, rel=0.1) for v in extra.values())


def test_fsdp_update_is_within_a_fifth_of_the_h200_gpu_time():
    """The twin's FSDP update of the measured batches (full vocabulary; 1.5B and 3B: the 0.5B model
    left the H200 idle half the time, waiting on Python) against the H200's GPU time of the update
    (its kernels' sum: the twin models the GPU's work, not Python's kernel dispatch)."""
    from bench.trainer_speed import gpu_seconds, tracked_runs, twin_seconds

    n = 0
    for points, saved in tracked_runs():
        for p in points:
            if p.shape not in ("1.5b", "3b") or p.vocab < 100_000 or not p.train_s:
                continue
            _, update = twin_seconds(
                p.shape, p.vocab, saved["seq"], saved["seqs"], saved["mbt"], recompute=saved.get("recompute", "none")
            )
            gpu = gpu_seconds(p.profile["train"])
            assert 0.8 < update / gpu < 1.2, (saved["mbt"], p.shape, update, gpu)
            n += 1
    assert n == 5


# ------------------------------------------------------------------------------------ attention kernels


def _attention_seconds(seq: int, recompute: str = "selective") -> tuple[float, float]:
    """(the twin's time for one more forward of the attention kernels over 128k tokens of `seq`-token
    sequences on 8 H200s, the attention FLOPs of that forward per GPU): selective recompute reruns
    exactly the attention core, so the difference to recompute none is one attention forward."""
    import numpy as np

    from rltune.twin.training import train_cost

    c = cfg(gpus=8, trainer=dict(tp=4, pp=1, microBatchTokens=16384, recompute="none"))
    sel = c.model_copy(update={"trainer": c.trainer.model_copy(update={"recompute": recompute})})
    seqs = np.full(131072 // seq, seq)
    eff = efficiency("H200")
    base = train_cost(M7, seqs, "H200", 8, 8, c, eff, False).training
    more = train_cost(M7, seqs, "H200", 8, 8, sel, eff, False).training
    flops = 2.0 * M7.layers * M7.heads * M7.head_dim * seq * 131072 / 8
    return more - base, flops


def test_attention_kernels_run_slower_on_shorter_sequences():
    """Training attention runs at the flash-attention kernels' own speed, which falls for shorter
    sequences (a GEMM-rate attention would take the same time per FLOP at every length), and at the
    speed the H200 measured for its forward: e(s) = fwd_max s / (s + half_len)."""
    eff = efficiency("H200")
    peak = gpu("H200").bf16_tflops * 1e12
    speed = {}
    for seq in (1024, 4096, 16384):
        t, flops = _attention_seconds(seq)
        speed[seq] = flops / t / peak
        want = eff.train_mfu * eff.attn_fwd_ratio * seq / (seq + eff.attn_half_len)
        assert speed[seq] == pytest.approx(want, rel=0.01)
    assert speed[1024] < 0.75 * speed[4096] < speed[16384] < eff.train_mfu * eff.attn_fwd_ratio


def test_attention_speed_is_the_h200_measurement():
    """The twin's attention constants are the fit of the tracked H200 runs' attention kernel time
    (`python -m bench.trainer_speed --points`: every pass of the 1.5B, 3B and 7B points, with and
    without gradient checkpointing), which explains each within 10%."""
    from bench.trainer_speed import attention_speed, tracked_runs

    fit = attention_speed(tracked_runs())
    eff = efficiency("H200")
    assert fit.fwd_max == pytest.approx(eff.train_mfu * eff.attn_fwd_ratio, rel=0.02)
    assert fit.bwd_max == pytest.approx(eff.train_mfu * eff.attn_bwd_ratio, rel=0.02)
    assert fit.half_len == pytest.approx(eff.attn_half_len, rel=0.05)
    assert len(fit.fit) >= 15 and all(0.9 < v < 1.1 for v in fit.fit)
    assert fit.bwd_max < fit.fwd_max  # the backward kernels are the slower ones


def test_forward_passes_run_their_gemms_at_the_training_rate():
    """A forward-only log-prob pass runs the training forward's GEMMs: on the H200 their rate was the
    update's within 6% at every model size measured, so the twin's default fwd_ratio is that ratio
    (the H20 keeps the value fitted to its published log-prob phases)."""
    import statistics

    from bench.trainer_speed import forward_gemm_ratio, tracked_runs

    ratios = forward_gemm_ratio(tracked_runs())
    assert len(ratios) >= 4 and all(0.9 < r < 1.1 for r in ratios)
    assert efficiency("H200").fwd_ratio == pytest.approx(statistics.median(ratios), rel=0.03)
    assert efficiency("B300").fwd_ratio == efficiency("H200").fwd_ratio
    assert efficiency("H20").fwd_ratio == pytest.approx(0.60)
