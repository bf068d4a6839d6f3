"""The forecaster's first-principles step-time model (the prior, before calibration).

Deliberately simpler than the digital twin and written independently of it: a roofline decode
model with a KV-capacity concurrency limit and a long-tail term, training FLOPs against an
efficiency that depends on parallelism, micro-batch size, recompute and the pipeline bubble,
weight sync by method and placement, and the overlap that staleness allows. Constants are
public facts (docs/references.md, cited inline by section) or round priors the calibration corrects.

Everything here is pure arithmetic on (ModelArch, TaskSpec, GPU, RLConfig); results of the
rollout and trainer halves are cached separately because a search space is a product of both.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist
from typing import Any, Mapping, Optional

from ..api.hardware import GPU
from ..api.hardware import gpu as gpu_lookup
from ..api.layout import Layout, layout
from ..api.models import ModelArch, TaskSpec
from ..api.pipeline import pipeline_step

# Work phases the forecaster predicts and calibrates (a subset of api.metrics.PHASES; `waiting`
# and `rollout_idle` are derived from the overlap model).
WORK_PHASES = ("generation", "old_logprob", "ref_logprob", "training", "weight_sync")
# Informational parts of `generation` (not added to the step).
SUB_PHASES = ("generation_tail", "tool")

# Priors (docs/references.md 'GPUs' and 'Performance-model facts'): achieved HBM ~90% in
# microbenchmarks, lower in real decode; big GEMMs 55-70% of peak; RL training MFU 0.19-0.40 (verl docs).
HBM_EFF = 0.75
DECODE_GEMM_EFF = 0.5
TRAIN_MFU_DENSE = 0.42
TRAIN_MFU_MOE = 0.30
PREFILL_EFF = 0.5
ROLLOUT_OVERHEAD_BYTES = 4e9  # activations, sampler, NCCL buffers
CUDA_GRAPH_BYTES = 1.5e9
TRAINER_TEMP_BYTES = 6e9
ITER_OVERHEAD_S = 1.5e-3  # scheduler + sampling per engine iteration
LAUNCH_S_PER_LAYER = {True: 3e-6, False: 20e-6}  # CUDA graphs vs eager
COLL_LATENCY_S = 6e-6
# Scale-out network: a hop of a small InfiniBand/RoCE collective (NCCL's inter-node small-message
# latency is of order 10 us) and the share of the NIC's line rate a collective achieves (DeepEP over
# RDMA: ~45-58 of 100 GB/s per docs/references.md 'GPUs').
NET_LATENCY_S = 10e-6
NIC_EFF = 0.5
# Slowdown per unit of KV over-subscription (held sequences / what the cache holds, capped at 4x) from
# preemption by recomputation: a round prior the calibration corrects.
PREEMPT_COST = 0.35


# ------------------------------------------------------------------------------------ knobs
# The physics reads a configuration through these typed views; `of` is the one place each reads
# them from the flat knobs the search composes (RLConfig.flat(), or one half of it).


@dataclass(frozen=True)
class TrainerKnobs:
    """The trainer half's knobs."""

    tp: int
    pp: int
    cp: int
    ep: int
    etp: Optional[int]  # unset: the dense tp (Megatron's default; RLConfig's TrainerKnobs.expert_tp)
    micro_batch_tokens: int
    recompute: str
    offload: bool

    @property
    def expert_tp(self) -> int:
        return int(self.etp) if self.etp is not None else int(self.tp or 1)

    @classmethod
    def of(cls, k: Mapping[str, Any]) -> "TrainerKnobs":
        return cls(
            k["trainer.tp"],
            k["trainer.pp"],
            k["trainer.cp"],
            k["trainer.ep"],
            k.get("trainer.etp"),
            k["trainer.microBatchTokens"],
            k["trainer.recompute"],
            k["trainer.offload"],
        )


@dataclass(frozen=True)
class AsyncKnobs:
    """What may overlap: the staleness, partial rollouts and verl's fractional bound."""

    staleness: int
    partial_rollout: bool
    stale_fraction: Optional[float]

    @property
    def streams(self) -> bool:
        """Partial rollout carries unfinished samples into the next step only when the trainer may
        lag (staleness >= 1); at staleness 0 it drains."""
        return bool(self.partial_rollout and self.staleness >= 1)

    @classmethod
    def of(cls, k: Mapping[str, Any]) -> "AsyncKnobs":
        return cls(k["async.staleness"], bool(k.get("async.partialRollout")), k.get("async.staleFraction"))


@dataclass(frozen=True)
class RolloutKnobs:
    """The rollout half's knobs, with the one thing the rollout physics needs of the rest (whether
    it streams); `on(model)` is `rollout_part`'s cache key."""

    tp: int
    expert_parallel: bool
    gpu_memory_utilization: float
    max_num_seqs: int
    max_num_batched_tokens: int
    cuda_graphs: bool
    fp8: bool
    streams: bool  # partial rollout that carries unfinished samples over (AsyncKnobs.streams)

    def on(self, mf: "ModelFacts") -> "RolloutKnobs":
        """As a model runs them: expert parallel only where it has MoE layers; the memory share
        rounded so that float noise does not split the cache."""
        ep = bool(self.expert_parallel and mf.moe_layers)
        return dataclasses.replace(
            self, expert_parallel=ep, gpu_memory_utilization=round(self.gpu_memory_utilization, 4)
        )

    @classmethod
    def of(cls, k: Mapping[str, Any], streaming: bool) -> "RolloutKnobs":
        return cls(
            k["rollout.tp"],
            bool(k["rollout.expertParallel"]),
            k["rollout.gpuMemoryUtilization"],
            k["rollout.maxNumSeqs"],
            k["rollout.maxNumBatchedTokens"],
            k["rollout.cudaGraphs"],
            k["rollout.fp8"],
            streaming,
        )


@dataclass(frozen=True)
class Knobs:
    """One whole configuration as the physics reads it."""

    gpus: Optional[int]
    placement: str
    trainer_gpus: Optional[int]
    weight_sync: str
    trainer: TrainerKnobs
    rollout: RolloutKnobs
    async_: AsyncKnobs

    @property
    def colocated(self) -> bool:
        return self.placement == "colocated"

    @property
    def overlapped(self) -> bool:
        """The next batch's rollout overlaps this batch's training (disaggregated, staleness >= 1)."""
        return self.placement == "disaggregated" and self.async_.staleness >= 1

    def layout(self, budget: int, gpus_per_node: int) -> Layout:
        return layout(self.gpus, self.placement, self.trainer_gpus, budget, gpus_per_node)

    @classmethod
    def of(cls, k: Mapping[str, Any]) -> "Knobs":
        """From a whole configuration's flat knobs (RLConfig.flat())."""
        a = AsyncKnobs.of(k)
        return cls(
            k.get("gpus"),
            k["placement"],
            k.get("trainerGpus"),
            k["weightSync"],
            TrainerKnobs.of(k),
            RolloutKnobs.of(k, a.streams),
            a,
        )


@dataclass
class Breakdown:
    """Raw (uncalibrated) per-phase estimate of one configuration, plus its memory picture."""

    phases: dict[str, float]
    feasible: bool = True
    reason: str = ""
    trainer_mem_frac: float = 0.0  # trainer peak / HBM
    rollout_kv_tokens: float = 0.0  # KV capacity per replica in tokens
    rollout_free_frac: float = 0.0  # (gmu*HBM - weights - overhead)/HBM
    colocated_frac: float = 0.0  # colocated: (vLLM share + resident trainer weights)/HBM
    memory: bool = False  # infeasible for memory only (phases are still estimated)
    kv_pressure: float = 0.0  # wanted concurrency / KV-limited concurrency
    preempt_log: float = 0.0  # log slowdown of the rollout from preemption (RolloutPart.preempt_log)
    batch: float = 0.0  # decode batch per replica
    replicas: int = 0
    rollout_gpus: int = 0
    trainer_gpus: int = 0


@dataclass(frozen=True)
class RolloutPart:
    """The rollout half of one configuration (depends only on the rollout GPUs, the rollout knobs
    and whether partial rollout streams): seconds per step and the engines' memory picture."""

    bulk: float  # rollout seconds other than the long tail and the engines' idle tool waits
    tail: float  # seconds after the median response finished (the long tail)
    tool: float  # seconds the engines idle while every live episode waits for a tool
    feasible: bool
    reason: str
    kv_tokens: float  # KV-cache capacity per replica, tokens
    free_frac: float  # (gmu*HBM - weights - reserves)/HBM
    kv_pressure: float  # wanted concurrency / KV-limited concurrency
    batch: float  # decode batch per replica
    replicas: int
    # log of the rollout's slowdown from the preemption term (0 when the KV cache holds every held
    # sequence): the forecaster's calibration scales this mechanism, not only knob values
    preempt_log: float = 0.0

    @classmethod
    def refused(cls, reason: str) -> "RolloutPart":
        return cls(0, 0, 0, False, reason, 0, 0, 0, 0, 0)


@dataclass(frozen=True)
class TrainerPart:
    """The trainer half of one configuration (depends only on the trainer GPUs and the trainer
    knobs): seconds per step of the three passes and the trainer's memory."""

    old_logprob: float
    ref_logprob: float
    training: float
    feasible: bool
    reason: str
    mem_frac: float  # trainer peak / HBM
    weight_bytes: float  # bf16 weights resident per GPU
    state_frac: float = 0.0  # the model state (weights, gradients, optimizer) / HBM: does not grow with the sequence
    activation_frac: float = 0.0  # activations + logits of the largest micro-batch / HBM: grows with it

    @classmethod
    def refused(cls, reason: str) -> "TrainerPart":
        return cls(0, 0, 0, False, reason, 0, 0)


@dataclass(frozen=True)
class ModelFacts:
    total: float
    active: float
    nonexpert: float
    expert_one: float
    moe_layers: int
    experts: int
    k: int
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    kv_bytes: float
    mla: bool


def facts(m: ModelArch) -> ModelFacts:
    total, active = m.params()
    expert_one = 3.0 * m.hidden * m.expert_ffn
    routed = m.routed_params()
    return ModelFacts(
        total,
        active,
        total - routed,
        expert_one,
        m.moe_layers(),
        m.experts,
        m.active_experts,
        m.layers,
        m.hidden,
        m.heads,
        m.kv_heads,
        m.head_dim,
        m.vocab,
        m.kv_bytes_per_token(),
        m.is_mla,
    )


@dataclass(frozen=True)
class TaskFacts:
    n_seq: int
    prompt: float
    mean_len: float
    cv: float
    max_len: float
    turns: int
    tool_s: float
    sandboxes: int
    agentic: bool
    tool_per_token: float = 0.0  # tool seconds per generated token (a turn's tool call / its tokens)
    # mean of the length distribution before truncation, when episodes end below max_response_tokens
    # (an agentic episode stops when its observations fill the context): mean_len is then the
    # truncated mean and max_len the truncation point (0: no truncation beyond max_len)
    shape_mean: float = 0.0
    # agentic: tool-observation tokens in the context per generated token, once measured (a
    # baseline's trained / generated tokens); -1: unknown, a turn's observation taken as the prompt
    obs_per_token: float = -1.0
    # what trainer.offload is in the job's framework (offload_swaps): verl swaps the state between
    # phases and steps Adam on the GPU; otherwise DeepSpeed-style CPU Adam every optimizer step
    offload_swap: bool = False
    # the trainer shards its whole state over the data-parallel ranks (FSDP, ZeRO-3: weights,
    # gradients and optimizer), not only the optimizer as Megatron's distributed optimizer does
    fully_sharded: bool = False
    # the trainer's memory as the job's trials measured it (tuner/task_learning.py trainer_memory): the
    # longest sequence they trained (memory is sized for it: a sequence is never split across
    # micro-batches) and, per recompute mode a trial ran, measured / physics activations and logits
    train_seq: float = 0.0
    activation_scale: tuple[tuple[str, float], ...] = ()


def activation_scale(tf: TaskFacts, recompute: str) -> float:
    """Measured / physics activations and logits for a recompute mode (1: no trial ran it)."""
    return dict(tf.activation_scale).get(recompute, 1.0)


def task_facts(t: TaskSpec) -> TaskFacts:
    mean_len = float(t.mean_response_tokens or t.max_response_tokens / 4)
    turns = t.turns or (1 if t.kind == "math" else 20)
    tool = t.tool_latency_seconds if t.tool_latency_seconds is not None else (0.0 if t.kind == "math" else 10.0)
    n = t.prompts_per_step * t.samples_per_prompt
    return TaskFacts(
        n,
        float(t.max_prompt_tokens) * 0.5,
        min(mean_len, float(t.max_response_tokens)),
        float(t.response_length_cv or 1.0),
        float(t.max_response_tokens),
        int(turns),
        float(tool),
        int(t.sandboxes or n),
        t.kind == "agentic-coding",
        float(turns) * float(tool) / max(mean_len, 1.0) if t.kind == "agentic-coding" else 0.0,
    )


# host<->GPU bytes per second per GPU of an offload swap (PCIe 4/5 x16 in practice; docs/twin.md 'Offload')
SWAP_PCIE_BYTES_S = 25e9


def offload_swaps(framework: str) -> bool:
    """Whether the framework's trainer.offload swaps the trainer's state between phases (verl's actor
    param/optimizer offload: Adam on the GPU, the whole state there while it trains, nothing resident
    during colocated rollouts) rather than running Adam on the host every optimizer step (DeepSpeed's
    ZeRO-Offload, OpenRLHF's --ds.adam_offload). docs/twin.md 'Offload'."""
    return framework == "verl"


# the trainer backends that shard the whole state over the data-parallel ranks
FULLY_SHARDED_BACKENDS = ("fsdp", "fsdp2")


def job_task_facts(task: TaskSpec, framework: str, backend: str = "") -> TaskFacts:
    """A job's task facts with its framework's offload semantics and its trainer backend's sharding."""
    tf = task_facts_cached(task)
    if offload_swaps(framework):
        tf = dataclasses.replace(tf, offload_swap=True)
    if backend in FULLY_SHARDED_BACKENDS:
        tf = dataclasses.replace(tf, fully_sharded=True)
    return tf


def trainer_of(
    mf: ModelFacts, tf: TaskFacts, gpu_type: str, gt: int, t: TrainerKnobs, seq_tokens: float = 0.0
) -> TrainerPart:
    """trainer_part of the trainer knobs `t` on `gt` trainer GPUs."""
    return trainer_part(
        mf,
        tf,
        gpu_type,
        gt,
        t.tp,
        t.pp,
        t.cp,
        t.ep,
        t.micro_batch_tokens,
        t.recompute,
        t.offload,
        seq_tokens,
        t.expert_tp,
    )


@dataclass(frozen=True)
class TrainerMemory:
    """The trainer's peak / HBM at one longest sequence, with the part that is the model state
    (weights, gradients, optimizer: fixed by the parameter count and the optimizer's bytes per
    parameter, whatever the sequence) and the part that follows the largest micro-batch
    (activations and logits)."""

    total: float
    state: float
    activations: float


def trainer_memory_at(
    model: ModelArch,
    task: "TaskSpec | TaskFacts",
    gpu_type: str,
    gpus_per_node: int,
    k: Knobs,
    budget: int,
    seq_tokens: float,
) -> Optional[TrainerMemory]:
    """The trainer's memory picture of configuration `k` when its largest micro-batch holds one
    `seq_tokens`-token sequence (None where the physics refuses the layout)."""
    mf, tf = facts_cached(model), task if isinstance(task, TaskFacts) else task_facts_cached(task)
    gt = k.layout(budget, gpus_per_node).trainer
    tr = trainer_of(mf, tf, gpu_type, gt, k.trainer, seq_tokens)
    return TrainerMemory(tr.mem_frac, tr.state_frac, tr.activation_frac) if tr.feasible else None


def _lognormal(tf: TaskFacts) -> tuple[float, float]:
    """(mu, sigma) of the lognormal response length with the task's mean and CV (before truncation)."""
    s2 = math.log(1 + tf.cv**2)
    return math.log(tf.shape_mean or tf.mean_len) - s2 / 2, math.sqrt(s2)


def truncated_mean(tf: TaskFacts, cap: float) -> float:
    """E[min(L, cap)] for the task's lognormal response length L."""
    mu, s = _lognormal(tf)
    s2 = s * s
    lc = math.log(cap)
    nd = NormalDist()
    return math.exp(mu + s2 / 2) * nd.cdf((lc - mu - s2) / s) + cap * (1.0 - nd.cdf((lc - mu) / s))


def truncated_at(tf: TaskFacts, mean: float, cap: float) -> TaskFacts:
    """The task whose lengths (the declared CV) stop at `cap` tokens and average `mean`: an agentic
    episode ends when its prompt, turns and tool observations fill the context, so it generates
    fewer tokens than declared and the longest far fewer than max_response_tokens. The mean of the
    length distribution before the cut is solved for (bisection: E[min(L, cap)] grows with it)."""
    if cap >= tf.max_len or mean >= 0.95 * cap:
        return dataclasses.replace(tf, mean_len=mean)
    lo, hi = math.log(mean), math.log(mean) + 6.0
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        if truncated_mean(dataclasses.replace(tf, shape_mean=math.exp(mid), max_len=cap), cap) < mean:
            lo = mid
        else:
            hi = mid
    return dataclasses.replace(tf, shape_mean=math.exp(0.5 * (lo + hi)), mean_len=mean, max_len=cap)


def longest_response(tf: TaskFacts, n: Optional[int] = None) -> float:
    """Expected longest of n lognormal lengths (default: one step's sequences) with the task's mean
    and CV, capped at the maximum (docs/references.md 'Performance-model facts': the max of K
    samples is several times the mean)."""
    mu, s = _lognormal(tf)
    z = NormalDist().inv_cdf(1 - 1.0 / ((tf.n_seq if n is None else n) + 1))
    return min(tf.max_len, math.exp(mu + s * z))


def live_length(tf: TaskFacts) -> float:
    """Mean tokens already generated by a sequence caught at a random moment of its life:
    E[min(L, max)^2] / (2 E[min(L, max)]) (longer sequences are live for longer)."""
    mu, s = _lognormal(tf)
    s2 = s * s
    lc = math.log(tf.max_len)
    nd = NormalDist()
    above = 1.0 - nd.cdf((lc - mu) / s)
    m2 = math.exp(2 * mu + 2 * s2) * nd.cdf((lc - mu - 2 * s2) / s) + tf.max_len**2 * above
    return m2 / (2.0 * truncated_mean(tf, tf.max_len))


def median_response(tf: TaskFacts) -> float:
    return math.exp(_lognormal(tf)[0])


# ------------------------------------------------------------------------------------ rollout


def _decode_iter(
    mf: ModelFacts,
    g: GPU,
    tp: int,
    ep: bool,
    fp8: bool,
    graphs: bool,
    b: float,
    ctx: float,
    kv_tok_gpu: float,
    reach: int,
) -> float:
    """Seconds of one decode iteration of one engine replica with b running sequences; `reach` is
    how many GPUs the replica's collectives reach over NVLink (a replica wider than that spans
    NVLink domains and its collectives cross the scale-out NICs)."""
    wb = 1.0 if fp8 else 2.0
    touched = 0.0
    if mf.moe_layers:
        # experts touched E*(1-(1-k/E)^B): docs/references.md 'Performance-model facts'
        frac = 1.0 - (1.0 - mf.k / mf.experts) ** max(b, 1.0)
        touched = mf.moe_layers * mf.experts * frac * mf.expert_one
    w_read = (mf.nonexpert - mf.vocab * mf.hidden + touched) * wb / tp
    kv_read = b * ctx * kv_tok_gpu
    t_mem = (w_read + kv_read) / (g.hbm_bw * HBM_EFF)
    peak = (g.fp8_tflops if fp8 else g.bf16_tflops) * 1e12
    t_cmp = 2.0 * mf.active * b / tp / (peak * DECODE_GEMM_EFF)
    t_comm = 0.0
    if tp > 1:
        # hierarchical all-reduce (NCCL's ring/tree across domains): NVLink inside each of the
        # `domains` NVLink domains, then the NICs, each GPU's NIC carrying 1/inner of the data, and
        # ~2 log2(domains) network hops of latency (docs/references.md 'GPUs')
        inner = min(tp, reach)
        domains = math.ceil(tp / inner)
        tok = b * mf.hidden * 2.0
        lat = COLL_LATENCY_S
        net = 0.0
        if domains > 1:
            lat += 2 * math.ceil(math.log2(domains)) * NET_LATENCY_S
            net = tok * 2 * (domains - 1) / domains / inner / (g.nic_bw * NIC_EFF)
        ar = lat + tok * (inner - 1) / inner / g.nvlink_bw + net
        n_ar = 2 * mf.layers
        if ep and mf.moe_layers:
            n_ar = 2 * mf.layers - mf.moe_layers
            # dispatch + combine: the share of a token's experts on other domains crosses the NICs
            off = (tp - inner) / tp
            per_tok = mf.k * mf.hidden * 2.0 / tp
            a2a_lat = COLL_LATENCY_S * 1.5 + (NET_LATENCY_S if domains > 1 else 0.0)
            t_comm += (
                mf.moe_layers * 2 * (a2a_lat + b * per_tok * ((1 - off) / g.nvlink_bw + off / (g.nic_bw * NIC_EFF)))
            )
        t_comm += n_ar * ar
    t_launch = mf.layers * LAUNCH_S_PER_LAYER[bool(graphs)] + ITER_OVERHEAD_S
    return max(t_mem, t_cmp) + t_comm + t_launch


def _survival(tf: TaskFacts, i: float) -> float:
    """P(L > i) for the task's lognormal response length L, truncated at the maximum."""
    if i >= tf.max_len:
        return 0.0
    mu, s = _lognormal(tf)
    return 1.0 - NormalDist().cdf((math.log(max(i, 1.0)) - mu) / s)


@lru_cache(maxsize=200_000)
def rollout_part(
    mf: ModelFacts, tf: TaskFacts, gname: str, gpus_r: int, knobs: RolloutKnobs, reach: int
) -> RolloutPart:
    """The rollout half on `gpus_r` GPUs (cached: a search space is a product of halves); `reach`:
    the GPUs one NVLink domain holds for this job (`GPU.nvlink_reach`)."""
    tp, ep, gmu = knobs.tp, knobs.expert_parallel, knobs.gpu_memory_utilization
    max_seqs, max_batched, graphs = knobs.max_num_seqs, knobs.max_num_batched_tokens, knobs.cuda_graphs
    fp8, partial = knobs.fp8, knobs.streams
    g = gpu_lookup(gname)
    replicas = gpus_r // tp
    if replicas < 1:
        return RolloutPart.refused("fewer rollout GPUs than rollout TP")
    w_gpu = mf.total * (1.0 if fp8 else 2.0) / tp
    free = (
        gmu * g.hbm_bytes
        - w_gpu
        - ROLLOUT_OVERHEAD_BYTES
        - (CUDA_GRAPH_BYTES if graphs else 0.0)
        - max_batched * mf.hidden * 2.0 * 8
    )
    free_frac = free / g.hbm_bytes
    # memory feasibility is judged by the caller (MemLimits); compute with a sliver of KV cache
    free = max(free, 0.005 * g.hbm_bytes)
    shard = 1 if mf.mla else min(tp, mf.kv_heads)
    kv_tok_gpu = mf.kv_bytes / shard
    kv_tokens = free / kv_tok_gpu
    n_r = tf.n_seq / replicas
    live_gen = live_length(tf)
    live_ctx = tf.prompt + live_gen
    if tf.agentic:
        # the observations a live episode has gathered so far
        live_ctx += tf.obs_per_token * live_gen if tf.obs_per_token >= 0 else tf.prompt * (tf.turns - 1) * 0.5
    b_kv = kv_tokens / live_ctx
    slots = max(1.0, min(max_seqs, b_kv))  # sequences decoding at once (max_num_seqs, KV cache)
    # An agentic episode waits tau seconds for tools per generated token on average; while it waits
    # it holds a sandbox but no decode slot. Plain generation: tau = 0.
    tau = tf.tool_per_token
    it = lambda m, i: _decode_iter(mf, g, tp, ep, fp8, graphs, max(1.0, m), tf.prompt + i, kv_tok_gpu, reach)

    def rate(m: float, i: float) -> tuple[float, float]:
        """(seconds per generated token of one of m live episodes at position i, share decoding)."""
        d = 1.0
        for _ in range(3):
            t = it(min(m * d, slots), i)
            d = t / (t + tau)
        return max(t + tau, m * d * t / slots), d

    # Episodes in flight per replica: the batch (synchronous), capped by sandboxes; partial rollout
    # streams (a sequence interrupted at the weight sync resumes next step and the next batch's
    # requests refill freed slots), so the engine stays at its slot limit instead of draining.
    inflight = n_r if not partial else math.inf
    if tf.agentic:
        inflight = min(inflight, tf.sandboxes / replicas)
    d0 = rate(min(inflight, slots), live_ctx - tf.prompt)[1]
    m0 = max(1.0, min(inflight, slots / d0))
    b = min(m0 * d0, slots)
    admitted = min(max_seqs, inflight)
    pressure = admitted / max(b_kv, 1e-9)

    def preempt(held: float) -> float:
        """Slowdown while the engine holds `held` sequences: vLLM over-admits up to max_num_seqs and,
        while their KV exceeds the cache, preempts and re-prefills (docs/references.md 'Preemption');
        a draining batch that has thinned below the cache's capacity preempts nothing."""
        p = held / max(b_kv, 1e-9)
        return 1.0 + PREEMPT_COST * min(p - 1.0, 3.0) if p > 1.0 and not partial else 1.0

    tokens = n_r * tf.mean_len
    tool = 0.0
    unpenalised = 0.0  # the same rollout without the preemption term
    if partial:  # streaming: contexts of sequences caught at a random point of their lives
        gen = tokens / m0 * rate(m0, live_ctx - tf.prompt)[0]
        t_med = gen
    else:
        # drain: m0 sequences started together; after i tokens m0*P(L > i) are still running, with
        # contexts of ~prompt + i, and a thinning batch pays the weights per token (the long tail)
        l_max = longest_response(tf)
        edges = [l_max * (j / 96) ** 2 for j in range(97)]
        drain, t_half, l_med = 0.0, None, median_response(tf)
        for lo, hi in zip(edges, edges[1:]):
            mid = 0.5 * (lo + hi)
            surv = _survival(tf, mid)
            live = max(m0 * surv, 1.0)
            r, d = rate(live, mid)
            rp = r * preempt(admitted * surv)
            drain += (hi - lo) * rp
            unpenalised += (hi - lo) * r
            tool += (hi - lo) * r * (1.0 - d) ** live if tau else 0.0  # engine idle: all live in tools
            if t_half is None and hi >= l_med:
                t_half = drain - (hi - l_med) * rp
        queued = max(0.0, tokens - m0 * tf.mean_len)  # decoded at a full batch before the drain
        bulk = queued / m0 * rate(m0, live_ctx - tf.prompt)[0]
        gen = bulk * preempt(admitted) + drain
        unpenalised += bulk
        conc = min(1.0, m0 / n_r)
        t_med = conc * (t_half or drain) + (1.0 - conc) * 0.5 * gen
    gen_decode = gen
    # prefill (compute-bound): 2*N_active*T
    pre_tok = tf.n_seq * tf.prompt * (tf.turns if tf.agentic else 1)
    peak = (g.fp8_tflops if fp8 else g.bf16_tflops) * 1e12
    gen += 2.0 * mf.active * pre_tok / (gpus_r * peak * PREFILL_EFF) * (1.0 + 4096.0 / max_batched) / 1.5
    if partial:
        # the sequences interrupted at the weight sync resume under new weights: their KV cache is
        # stale, so every step re-prefills what is in flight (prompt + tokens so far)
        gen += 2.0 * mf.active * min(m0, n_r) * live_ctx / (tp * peak * PREFILL_EFF)
    preempt_log = 0.0 if partial else math.log(gen / max(gen - (gen_decode - unpenalised), 1e-9))
    # the long tail: time after the median response finished (tool idle is part of the wall time)
    tail = 0.0 if partial else min(max(0.0, gen - t_med), gen)
    gen -= tail + min(tool, gen - tail)
    return RolloutPart(gen, tail, tool, True, "", kv_tokens, free_frac, pressure, b, replicas, preempt_log)


# ------------------------------------------------------------------------------------ trainer


def model_state_bytes(dense_gpu: float, experts_gpu: float, dp: int, edp: int, offload: bool = False) -> float:
    """Bytes per GPU of the trainer's weights, gradients and optimizer for `dense_gpu` + `experts_gpu`
    parameters on the GPU (Megatron's distributed optimizer: 6 + 12/d bytes per parameter, d the
    data-parallel width that shards them; docs/references.md 'Performance-model facts'). Optimizer
    CPU offload moves the Adam moments and fp32 master weights; the bf16 weights and their gradients
    stay on the GPU for the forward and backward passes."""
    if offload:
        return (dense_gpu + experts_gpu) * 4.0
    return dense_gpu * (6.0 + 12.0 / dp) + experts_gpu * (6.0 + 12.0 / edp)


def gpn_of(g: GPU) -> int:
    """GPUs sharing one NVLink domain (the node for HGX parts)."""
    return g.nvlink_domain


@lru_cache(maxsize=200_000)
def trainer_part(
    mf: ModelFacts,
    tf: TaskFacts,
    gname: str,
    gpus_t: int,
    tp: int,
    pp: int,
    cp: int,
    ep: int,
    mbt: int,
    recompute: str,
    offload: bool,
    seq_tokens: float = 0.0,
    etp: int = 1,
) -> TrainerPart:
    """The trainer half on `gpus_t` GPUs (cached: a search space is a product of halves). Memory is
    sized for a micro-batch of mbt tokens, or for one sequence of `seq_tokens` if longer (a sequence
    is never split across micro-batches; rltune.tuner.headroom carries a measured peak with it). `etp`
    is the expert tensor parallel size the layout runs (RLConfig's trainer.expert_tp)."""
    g = gpu_lookup(gname)
    if gpus_t % (tp * pp * cp):
        return TrainerPart.refused(f"tp*pp*cp={tp * pp * cp} does not divide {gpus_t} trainer GPUs")
    dp = gpus_t // (tp * pp * cp)
    etp = etp if mf.moe_layers else 1
    if mf.moe_layers and (gpus_t // pp) % (ep * etp):
        return TrainerPart.refused(f"ep*etp={ep * etp} does not divide {gpus_t // pp} GPUs per pipeline stage")
    if not mf.moe_layers and ep > 1:
        return TrainerPart.refused("expert parallel on a dense model")
    seq = tf.prompt + tf.mean_len
    if tf.agentic:
        seq += tf.prompt * (tf.turns - 1)
    tokens = tf.n_seq * seq
    attn = 2.0 * mf.layers * seq * mf.heads * mf.head_dim
    fwd = 2.0 * mf.active + attn
    # recompute re-runs part of the forward in the backward pass: selective recompute the attention
    # core (its FLOPs grow with the sequence: a small share of a 5k-token math sample, most of an
    # 80k-token agentic episode), full recompute the whole forward (Korthikanti et al.,
    # docs/references.md 'Performance-model facts')
    rc = {"none": 1.0, "selective": 1.0 + attn / (3.0 * fwd), "full": 4.0 / 3.0}[recompute]
    eff = TRAIN_MFU_MOE if mf.moe_layers else TRAIN_MFU_DENSE
    eff /= 1.0 + 0.03 * math.log2(tp) + 0.08 * math.log2(cp)
    eff *= mbt / (mbt + 3000.0)
    m = max(1.0, tokens / dp / mbt)
    eff *= 1.0 - (pp - 1) / (m + pp - 1)
    if mf.moe_layers:
        x = mbt * mf.k * ep / mf.experts  # tokens per local expert per micro-batch
        eff *= 0.55 + 0.45 * x / (x + 512.0)
        # expert tensor parallelism splits each expert's FFN over etp GPUs: a grouped GEMM slows as its
        # width falls as it does with its tokens (the same half size); relative to whole experts
        width = mf.expert_one / (3.0 * mf.hidden)
        eff *= (0.55 + 0.45 * (width / etp) / (width / etp + 512.0)) / (0.55 + 0.45 * width / (width + 512.0))
    cpu_adam = offload and not tf.offload_swap  # a swap (verl) costs a transfer per step, not efficiency
    if cpu_adam:
        eff *= 0.65
    peak = g.bf16_tflops * 1e12 * gpus_t
    # communication of one forward pass, per GPU: TP all-reduces (NVLink, half hidden behind GEMMs)
    # and MoE all-to-all (dispatch + combine) over the expert domain etp*ep, on NVLink inside a node and
    # the scale-out NIC beyond it (docs/references.md 'GPUs': DeepEP ~155 GB/s NVLink vs ~50 GB/s
    # RDMA on H800)
    tok_gpu = tokens / gpus_t
    comm = 0.0
    if tp > 1:
        comm += 0.5 * tok_gpu * tp * mf.layers * 4 * mf.hidden * 2.0 * (tp - 1) / tp / (g.nvlink_bw * 0.6)
    if mf.moe_layers and ep > 1:
        dom = etp * ep
        byts = tok_gpu * mf.moe_layers * 4.0 * mf.k * mf.hidden * (ep - 1) / ep
        off = max(0.0, (dom - gpn_of(g)) / dom)
        comm += byts * ((1 - off) / (g.nvlink_bw * 0.6) + off / (g.nic_bw * 0.5))
    passes = 2.0 + (1.0 if recompute == "full" else 0.0)
    train = 3.0 * fwd * rc * tokens / (peak * eff) + passes * comm
    old = fwd * tokens / (peak * eff / (0.65 if cpu_adam else 1.0) * 1.1) + comm
    ref = old
    # memory (docs/references.md 'Performance-model facts': Megatron distributed optimizer
    # 6 + 12/d bytes per parameter)
    routed = mf.total - mf.nonexpert
    ne_gpu = mf.nonexpert / (tp * pp)
    ex_gpu = routed / (max(ep, 1) * etp * pp) if mf.moe_layers else 0.0
    edp = max(1, gpus_t // (max(ep, 1) * etp * pp))
    if tf.fully_sharded:
        # FSDP / ZeRO-3 (docs/references.md 'Performance-model facts'): fp32 weights, gradients and
        # Adam's two moments, 16 bytes a parameter, sharded over every trainer GPU, plus two layers
        # gathered whole in bf16 (the one computing and the one prefetched)
        shard = (ne_gpu + ex_gpu) / (dp * cp)
        gathered = 2.0 * 2.0 * (mf.total / max(mf.layers, 1))
        state = shard * (4.0 if cpu_adam else 16.0) + gathered
        weights = shard * 2.0 + gathered
    else:
        state = model_state_bytes(ne_gpu, ex_gpu, dp * cp, edp, cpu_adam)
        weights = (ne_gpu + ex_gpu) * 2.0  # bf16
    if offload and not cpu_adam:
        # the swapped state beyond the bf16 weights goes to the GPU and back once per step over PCIe
        train += 2.0 * (state - weights) / SWAP_PCIE_BYTES_S
    s = max(mbt, seq_tokens or tf.train_seq) / cp
    h = mf.hidden
    # a layer's stored activations (Korthikanti et al.'s 34·s·h/t); their 5·a·s² attention scores are
    # not stored: flash attention recomputes them in the backward (memory linear in the sequence;
    # docs/references.md), so no recompute stores what selective recompute does
    layer = 34.0 * s * h / tp
    per_layer = layer if recompute != "full" else 2.0 * s * h
    act = mf.layers * per_layer * (1.3 if mf.moe_layers else 1.0)
    if recompute == "full":
        act += layer  # the one layer being recomputed holds its activations
    logits = s * mf.vocab * 6.0 / tp
    grows = (act + logits) * activation_scale(tf, recompute)
    mem = state + grows + TRAINER_TEMP_BYTES
    frac = mem / g.hbm_bytes  # memory feasibility is judged by the caller (MemLimits)
    return TrainerPart(old, ref, train, True, "", frac, weights, state / g.hbm_bytes, grows / g.hbm_bytes)


# ------------------------------------------------------------------------------------ sync


def weight_sync(mf: ModelFacts, g: GPU, k: Knobs, gpus_t: int, gpus_r: int) -> float:
    """Seconds to publish new weights to the rollout engines (docs/references.md 'Published RL step
    measurements': verl's checkpoint engine moved Qwen3-30B-A3B (61 GB) 16->16 ranks in 4.38 s and
    Qwen3-235B (470 GB) 64->64 in 23.7 s, i.e. ~14-20 GB/s; NCCL broadcast from the trainer ranks is
    slower; colocated engines reshard locally over NVLink but pay a sleep/wake switch). Separate pools:
    sharded, parallel streams from a model-parallel trainer (docs/twin.md 'Step composition')."""
    byts = mf.total * 2.0
    tp = k.rollout.tp
    method = k.weight_sync
    if method == "disk":
        return 5.0 + byts / 2e9
    if k.colocated:
        t = byts / tp / (g.nvlink_bw * 0.3)
        return 3.0 + t * (0.8 if method == "checkpoint-engine" else 1.0)
    # model-parallel trainers: each shard owner (pipeline stage x expert rank) sends its own shard at
    # once, in parallel streams; each rollout GPU still receives its TP shard through its own NIC
    pp, ep = k.trainer.pp or 1, (k.trainer.ep or 1) if mf.experts else 1
    per_owner = mf.nonexpert / pp + (mf.total - mf.nonexpert) / (pp * ep)
    streams = max(1.0, min(float(gpus_t), mf.total / per_owner))
    recv = byts / tp / (g.nic_bw * 0.5)
    rate = 17e9 if method == "checkpoint-engine" else 10e9
    return 1.0 + max(byts / (rate * streams), recv)


# ------------------------------------------------------------------------------------ composition


@dataclass(frozen=True)
class MemLimits:
    """Memory-fit thresholds (fractions of HBM). The defaults are the physics' own; the forecaster
    widens them to whatever a measured configuration proved to fit (the model is then too
    conservative for this cluster)."""

    trainer_max: float = 0.95  # trainer peak / HBM
    rollout_min_free: float = 0.02  # KV-cache share left after vLLM's weights and reserves
    colocated_max: float = 0.98  # colocated: vLLM share + resident trainer weights

    def trainer_ok(self, frac: float) -> bool:
        return frac <= self.trainer_max + 1e-9

    def rollout_ok(self, free_frac: float) -> bool:
        return free_frac >= self.rollout_min_free - 1e-9


DEFAULT_LIMITS = MemLimits()


def breakdown(
    model: ModelArch,
    task: "TaskSpec | TaskFacts",
    gpu_type: str,
    gpus_per_node: int,
    k: Knobs,
    budget: int,
    limits: MemLimits = DEFAULT_LIMITS,
) -> Breakdown:
    """Uncalibrated phases and memory picture of one configuration."""
    mf = facts_cached(model)
    tf = task if isinstance(task, TaskFacts) else task_facts_cached(task)
    g = gpu_lookup(gpu_type)
    lay = k.layout(budget, gpus_per_node)
    gt, gr = lay.trainer, lay.rollout
    if gr < 1:
        return Breakdown({}, False, "no rollout GPUs left")
    ro = rollout_part(mf, tf, gpu_type, gr, k.rollout.on(mf), g.nvlink_reach(gpus_per_node))
    tr = trainer_of(mf, tf, gpu_type, gt, k.trainer)
    bd = Breakdown({}, trainer_gpus=gt, rollout_gpus=gr)
    bd.rollout_kv_tokens, bd.rollout_free_frac, bd.kv_pressure = ro.kv_tokens, ro.free_frac, ro.kv_pressure
    bd.batch, bd.replicas, bd.preempt_log = ro.batch, ro.replicas, ro.preempt_log
    bd.trainer_mem_frac = tr.mem_frac
    if k.colocated and not k.trainer.offload:
        # the trainer's bf16 weights stay resident while vLLM holds its memory share
        bd.colocated_frac = (k.rollout.gpu_memory_utilization * g.hbm_bytes + tr.weight_bytes) / g.hbm_bytes
    if not ro.feasible:
        bd.feasible, bd.reason = False, ro.reason
    elif not tr.feasible:
        bd.feasible, bd.reason = False, tr.reason
    elif not limits.rollout_ok(bd.rollout_free_frac):
        bd.feasible, bd.memory = False, True
        bd.reason = (
            f"out of memory (rollout): weights leave no KV cache at gpuMemoryUtilization "
            f"{k.rollout.gpu_memory_utilization:g} with TP {k.rollout.tp}"
        )
    elif not limits.trainer_ok(bd.trainer_mem_frac):
        bd.feasible, bd.memory = False, True
        bd.reason = (
            f"out of memory (trainer): needs ~{bd.trainer_mem_frac * g.hbm_bytes / 1e9:.0f} GB per GPU "
            f"of {g.hbm_bytes / 1e9:.0f}"
        )
    elif bd.colocated_frac > limits.colocated_max + 1e-9:
        bd.feasible, bd.memory = False, True
        bd.reason = (
            f"out of memory (colocated): vLLM share {k.rollout.gpu_memory_utilization:g} plus resident "
            f"trainer weights ({tr.weight_bytes / 1e9:.0f} GB) exceed GPU memory"
        )
    if not ro.feasible or not tr.feasible:
        return bd
    # Contract convention (docs/metrics.md): `generation` is the whole rollout wall time; the tail
    # and the tool time are parts of it, reported for the profile.
    bd.phases = {
        "generation": ro.bulk + ro.tail + ro.tool,
        "generation_tail": ro.tail,
        "tool": ro.tool,
        "old_logprob": tr.old_logprob,
        "ref_logprob": tr.ref_logprob,
        "training": tr.training,
        "weight_sync": weight_sync(mf, g, k, gt, gr),
    }
    return bd


_FACTS: dict = {}


def facts_cached(m: ModelArch) -> ModelFacts:
    key = m.model_dump_json()
    if key not in _FACTS:
        _FACTS[key] = facts(m)
    return _FACTS[key]


def task_facts_cached(t: TaskSpec) -> TaskFacts:
    key = "task:" + t.model_dump_json()
    if key not in _FACTS:
        _FACTS[key] = task_facts(t)
    return _FACTS[key]


# PPO mini-batches per RL step: the trainer takes a batch in this many pieces (verl's and OpenRLHF's
# examples run 4-16); the pipeline's fill cost at a small run-ahead scales with 1/MINI_BATCHES
MINI_BATCHES = 4


# The sides of a step as compose adds or overlaps them: the rollout, the trainer's passes, the sync.
STEP_SIDES = (("generation",), ("old_logprob", "ref_logprob", "training"), ("weight_sync",))


def compose(phases: dict[str, float], k: Knobs) -> tuple[float, dict]:
    """Step time from work phases under the configuration's placement and staleness.

    `generation` is the rollout's wall time (tail and tool time included). Synchronous
    (staleness 0) or colocated: rollout, then log-prob passes and training, then sync.
    Disaggregated with staleness >= 1: the next batch's rollout overlaps this batch's training
    (one-step-off / fully async), so the step is the longer side plus the sync.
    """
    roll, train, sync = (sum(phases.get(p, 0.0) for p in side) for side in STEP_SIDES)
    out = dict(phases)
    if k.overlapped:
        # how far the rollout may run ahead: verl's fractional bound, else the staleness itself
        frac = k.async_.stale_fraction
        pipe = pipeline_step(
            roll,
            train,
            sync,
            sync,
            k.async_.staleness if frac is None else frac,
            MINI_BATCHES,
            streaming=k.async_.partial_rollout,
        )
        step = pipe.duration
        out["waiting"] = pipe.trainer_wait
        out["rollout_idle"] = max(0.0, pipe.rollout_idle - sync)
    elif not k.colocated:
        step = roll + train + sync
        out["waiting"] = roll
        out["rollout_idle"] = train + sync
    else:
        step = roll + train + sync
        out["waiting"] = 0.0
        out["rollout_idle"] = 0.0
    return step, out
