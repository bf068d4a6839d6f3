"""Rollout: a discrete-event simulation of vLLM engine replicas, jumping event to event.

One replica = `rollout.tp` GPUs. Within an epoch between events (admission, finish, KV overflow,
tool return) the running batch B is constant and the total KV length grows by B per iteration, so
the epoch's time is a closed-form sum over iterations of a roofline per-iteration time:

    t_iter(i) = max(mem(i), comp(i)) + fixed(B)
    mem(i)  = (weight bytes read(B) + kv_bytes/token * K(i)) / (HBM bw * hbm eff)      K(i) = K0 + B*i
    comp(i) = (2 N_active B + attention FLOPs(K(i))) / (peak * decode eff)
    fixed   = engine CPU overhead + TP/EP collectives (+ kernel launches without CUDA graphs)

Admission follows vLLM: FIFO, at most maxNumSeqs running, a request is admitted only when its
context fits in free KV blocks; prefills are chunked into iterations of maxNumBatchedTokens shared
with the running decodes. When a running batch outgrows the KV pool the most recently admitted
request is preempted (KV discarded, recomputed later: vLLM V1 recompute preemption).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from rltune.api.hardware import GiB
from rltune.api.hardware import gpu as gpu_spec
from rltune.api.models import ModelArch, RLConfig, TaskSpec

from . import replica_loop
from .efficiency import Efficiency
from .errors import Infeasible
from .workload import Episodes, max_model_len


@dataclass
class ReplicaCost:
    """Per-iteration roofline coefficients of one engine replica."""

    tp: int
    bw: float  # achieved HBM bytes/s per GPU
    f_dec: float  # achieved decode FLOP/s per GPU
    f_pre: float  # achieved prefill FLOP/s per GPU
    dense_bytes: float  # weight bytes per GPU always read per iteration
    expert_bytes: float  # bytes per GPU of one expert across all MoE layers
    experts: int
    active: int
    m1: float  # s per KV token read
    c_tok: float  # s of compute per decoded token (linear layers)
    c1: float  # s of compute per KV token attended
    pre_tok: float  # s of compute per prefilled token (linear layers)
    pre_pair: float  # s of compute per (prefill token, context token) pair
    fixed0: float  # s fixed per iteration
    fixed_per_seq: float
    comm_per_tok: float  # s per token in the batch for TP/EP collectives
    eager_extra: float  # s of launch overhead per iteration without CUDA graphs
    graph_max: int
    cuda_graphs: bool
    kv_capacity: int  # KV tokens the replica can hold
    weights_gib: float
    _m0: dict = field(default_factory=dict)
    _f0: dict = field(default_factory=dict)

    def m0(self, b: int) -> float:
        v = self._m0.get(b)
        if v is None:
            touched = self.experts * (1.0 - (1.0 - self.active / self.experts) ** b) if self.experts else 0.0
            v = (self.dense_bytes + touched * self.expert_bytes) / self.bw
            self._m0[b] = v
        return v

    def f0(self, b: int) -> float:
        v = self._f0.get(b)
        if v is None:
            v = self.fixed0 + self.fixed_per_seq * b + self.comm_per_tok * b
            if not self.cuda_graphs or b > self.graph_max:
                v += self.eager_extra
            self._f0[b] = v
        return v

    def tables(self, smax: int) -> tuple[list, list]:
        """m0(b) and f0(b) for b = 0..smax as lists (fast indexing in the event loop)."""
        t = self._m0.get(("tab", smax))
        if t is None:
            t = ([self.m0(b) for b in range(smax + 2)], [self.f0(b) for b in range(smax + 2)])
            self._m0[("tab", smax)] = t
        return t

    def table_arrays(self, smax: int) -> tuple[np.ndarray, np.ndarray]:
        """tables() as float64 arrays (the compiled event loop's arguments)."""
        t = self._m0.get(("arr", smax))
        if t is None:
            m, f = self.tables(smax)
            t = (np.asarray(m, dtype=np.float64), np.asarray(f, dtype=np.float64))
            self._m0[("arr", smax)] = t
        return t

    def iter_time(self, b: int, k: float) -> float:
        return max(self.m0(b) + self.m1 * k, self.c_tok * b + self.c1 * k) + self.f0(b)


def replica_cost(
    model: ModelArch, task: TaskSpec, gpu_type: str, gpus_per_node: int, cfg: RLConfig, eff: Efficiency
) -> ReplicaCost:
    g = gpu_spec(gpu_type)
    ro = cfg.rollout
    tp = ro.tp
    total, active = model.params()
    wbytes = 1.0 if ro.fp8 else float(model.bytes_per_param)
    peak = (g.fp8_tflops if ro.fp8 else g.bf16_tflops) * 1e12
    bw = g.hbm_bw * eff.hbm
    weights_gpu = total * wbytes / tp
    expert_params_layer = 3 * model.hidden * model.expert_ffn
    if model.is_moe:
        moe_l = model.moe_layers()
        dense_bytes = (total - model.routed_params()) * wbytes / tp
        # Thin expert slices (expert FFN / TP) stream less efficiently than whole experts.
        slice_w = model.expert_ffn / (1 if ro.expert_parallel else tp)
        slice_eff = 1.0 / (1.0 + 32.0 / max(slice_w, 1.0))
        expert_bytes = moe_l * expert_params_layer * wbytes / tp / slice_eff
    else:
        dense_bytes = weights_gpu
        expert_bytes = 0.0
    # KV per GPU per token: GQA heads split over TP (replicated beyond kv_heads); MLA latent replicated.
    kvb = model.kv_bytes_per_token()
    kv_gpu = kvb if model.is_mla else kvb / min(tp, model.kv_heads)
    attn_dim = (model.kv_lora_rank + model.rope_head_dim) if model.is_mla else model.head_dim
    attn_flops_per_ctx = 4.0 * model.layers * model.heads * attn_dim  # QK + AV per context token
    f_dec = peak * eff.decode_compute
    f_pre = peak * eff.prefill_mfu
    # Collectives per iteration: one all-reduce after attention and one after the MLP per layer
    # (MoE layers with expert parallel: dispatch + combine all-to-all instead of the MLP all-reduce).
    # A replica spanning nodes (TP beyond the NVLink reach) all-reduces hierarchically, as NCCL does:
    # within each NVLink domain over NVLink, across the `nodes` domains over the NICs, every GPU's NIC
    # carrying 1/`inner` of the data; a small all-reduce adds ~2 log2(nodes) network hops of latency.
    inner = min(tp, g.nvlink_reach(gpus_per_node))
    nodes = math.ceil(tp / inner)
    multi_node = nodes > 1
    nvl = g.nvlink_bw * eff.nvlink
    nic = g.nic_bw * eff.nic
    fixed_comm = 0.0
    comm_per_tok = 0.0
    if tp > 1:
        tok = model.hidden * 2.0  # bf16 activations of one token
        ar_tok = tok * 2 * (inner - 1) / inner / nvl + (
            tok * 2 * (nodes - 1) / nodes / inner / nic if multi_node else 0.0
        )
        lat = eff.allreduce_latency * (1 + 0.25 * math.log2(inner))
        if multi_node:
            lat += 2 * math.ceil(math.log2(nodes)) * eff.net_latency
        n_ar = model.layers * 2
        if model.is_moe and ro.expert_parallel:
            n_ar = model.layers + model.dense_layers
            # dispatch + combine all-to-all: each GPU sends its 1/tp of the batch's tokens to their
            # experts' ranks; the share bound for other nodes crosses the NICs, the rest NVLink
            per_copy = ((tp - inner) / tp) / nic + ((inner - 1) / tp) / nvl
            fixed_comm += model.moe_layers() * 2 * (eff.a2a_latency + (eff.net_latency if multi_node else 0.0))
            comm_per_tok += model.moe_layers() * 2 * tok * model.active_experts / tp * per_copy
        fixed_comm += n_ar * lat
        comm_per_tok += n_ar * ar_tok
    eager = model.layers * eff.kernels_per_layer * eff.launch_overhead
    # KV pool: gpu_memory_utilization x HBM - weights/TP - activation and CUDA-graph peak.
    reserve = eff.activation_reserve * g.hbm_bytes + (1.0 * GiB if ro.cuda_graphs else 0.0)
    reserve += ro.max_num_batched_tokens * model.hidden * 24.0 / tp
    budget_bytes = ro.gpu_memory_utilization * g.hbm_bytes
    kv_bytes = budget_bytes - weights_gpu - reserve
    if kv_bytes <= 0 or weights_gpu > budget_bytes:
        raise Infeasible(
            f"rollout weights do not fit: {weights_gpu / GiB:.0f} GiB/GPU of weights at rollout TP {tp} plus "
            f"{reserve / GiB:.0f} GiB activation reserve exceed gpuMemoryUtilization {ro.gpu_memory_utilization:g} "
            f"x {g.hbm_bytes / GiB:.0f} GiB (CUDA out of memory)",
            oom=True,
        )
    cap = int(kv_bytes / kv_gpu)
    need = max_model_len(task)
    if cap < need:
        raise Infeasible(
            f"rollout KV cache too small: {cap} tokens fit in {kv_bytes / GiB:.1f} GiB/GPU but the max model "
            f"length is {need} (raise gpuMemoryUtilization or rollout TP)",
            oom=False,
        )
    return ReplicaCost(
        tp=tp,
        bw=bw,
        f_dec=f_dec,
        f_pre=f_pre,
        dense_bytes=dense_bytes,
        expert_bytes=expert_bytes,
        experts=model.experts,
        active=model.active_experts,
        m1=kv_gpu / bw,
        c_tok=2.0 * active / tp / f_dec,
        c1=attn_flops_per_ctx / tp / f_dec,
        pre_tok=2.0 * active / tp / f_pre,
        pre_pair=attn_flops_per_ctx / tp / f_pre,
        fixed0=eff.sched_overhead + fixed_comm,
        fixed_per_seq=eff.sched_per_seq,
        comm_per_tok=comm_per_tok,
        eager_extra=eager,
        graph_max=eff.graph_max_batch,
        cuda_graphs=ro.cuda_graphs,
        kv_capacity=cap,
        weights_gib=weights_gpu / GiB,
    )


@dataclass
class ReplicaResult:
    finish: np.ndarray  # per episode: finish time of its last turn (incl. final tool call)
    busy: float  # time the replica had work running
    end: float
    preemptions: int
    kv_peak: float  # peak fraction of the KV pool in use
    kv_mean_tokens: float  # time-averaged KV tokens in use
    tool_idle: float  # time idle waiting only for tools
    generated: int


def simulate_replica(
    rc: ReplicaCost,
    ep: Episodes,
    idx: list,
    cfg: RLConfig,
    speed: float = 1.0,
    sandboxes: Optional[int] = None,
    prefix_caching: bool = True,
    quantum: int = 16,
) -> ReplicaResult:
    """Simulate one engine replica serving episodes `idx` (FIFO), times scaled by `speed` (>1 slower).

    Requests are admitted FIFO while they fit (maxNumSeqs, free KV blocks above a 1% watermark),
    prefill in chunks of maxNumBatchedTokens shared with the running decodes, decode in closed-form
    epochs between events (events closer than `quantum` iterations are merged), and are preempted
    newest-first when the KV pool overflows. Multi-turn episodes come back after their tool call
    with the turn's observation appended (prefix-cached while the pool has room); at most
    `sandboxes` episodes are in flight. The loop itself is replica_loop (compiled with numba when
    installed)."""
    ro = cfg.rollout
    S = min(ro.max_num_seqs, ro.max_num_batched_tokens)
    n_ep = len(idx)
    ft = ep.select(np.asarray(idx, dtype=np.int64))
    limit = (sandboxes or n_ep) if ep.multi else n_ep
    cap = len(ft.gen)  # one request per turn (a preempted request keeps its slot)
    M0, F0 = rc.tables(S)
    args = (rc.m1, rc.c_tok, rc.c1, rc.pre_tok, rc.pre_pair, rc.kv_capacity, S, ro.max_num_batched_tokens)
    args += (quantum, float(speed), bool(prefix_caching), bool(ep.multi), int(limit))
    if replica_loop.compiled_replica_loop is not None:
        finish = np.zeros(n_ep)
        state = [np.zeros(cap, np.int64) for _ in range(7)]
        out = replica_loop.compiled_replica_loop(
            *rc.table_arrays(S), *args, *ft, finish, *state, np.zeros(cap + 1, np.int64)
        )
    else:  # interpreted: Python lists index faster than arrays
        fin = [0.0] * n_ep
        state = [[0] * cap for _ in range(7)]
        turns = [a.tolist() for a in ft]
        out = replica_loop.replica_loop(M0, F0, *args, *turns, fin, *state, [0] * (cap + 1))
        finish = np.asarray(fin)
    busy, t, preempt, kv_peak, kv_area, tool_idle, generated = out
    return ReplicaResult(
        finish=finish,
        busy=float(busy),
        end=float(t),
        preemptions=int(preempt),
        kv_peak=min(1.0, float(kv_peak)),
        kv_mean_tokens=float(kv_area) / float(t) if t > 0 else 0.0,
        tool_idle=float(tool_idle),
        generated=int(generated),
    )


@dataclass
class RolloutResult:
    finish: np.ndarray  # per episode finish times (merged over replicas, in episode order; NaN: not simulated)
    end: float  # time the last episode finished
    median: float  # time the median episode finished
    preemptions: int
    kv_peak: float
    kv_mean_tokens: float  # per replica, averaged
    tool_idle: float  # mean per replica
    generated: int
    replicas: int


def simulate_rollout(
    rc: ReplicaCost,
    ep: Episodes,
    cfg: RLConfig,
    rollout_gpus: int,
    speeds=None,
    sandboxes: Optional[int] = None,
    prefix_caching: bool = True,
    sample_replicas: Optional[int] = None,
) -> RolloutResult:
    """All replicas (or only the first `sample_replicas`: finishes of the others stay NaN)."""
    replicas = max(1, rollout_gpus // cfg.rollout.tp)
    n = len(ep)
    finish = np.zeros(n) if not sample_replicas else np.full(n, math.nan)
    simulated = min(replicas, sample_replicas or replicas)
    pre = 0
    peak = 0.0
    kvm = 0.0
    idle = 0.0
    gen = 0
    end = 0.0
    per_sb = None
    if sandboxes:
        per_sb = max(1, -(-sandboxes // replicas))
    for r in range(simulated):
        idx = np.arange(r, n, replicas)  # round-robin assignment (verl splits the batch evenly)
        if not len(idx):
            continue
        res = simulate_replica(
            rc,
            ep,
            idx,
            cfg,
            speed=speeds[r] if speeds is not None else 1.0,
            sandboxes=per_sb,
            prefix_caching=prefix_caching,
        )
        finish[idx] = res.finish
        pre += res.preemptions
        peak = max(peak, res.kv_peak)
        kvm += res.kv_mean_tokens
        idle += res.tool_idle
        gen += res.generated
        end = max(end, res.end, float(res.finish.max()))
    srt = np.sort(finish[~np.isnan(finish)])
    scale = replicas / simulated
    return RolloutResult(
        finish=finish,
        end=end,
        median=float(srt[len(srt) // 2]),
        preemptions=int(pre * scale),
        kv_peak=peak,
        kv_mean_tokens=kvm / simulated,
        tool_idle=idle / simulated,
        generated=int(gen * scale),
        replicas=replicas,
    )
