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

import heapq
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Optional

from rltune.api.hardware import GiB
from rltune.api.hardware import gpu as gpu_spec
from rltune.api.models import ModelArch, RLConfig, TaskSpec

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


def _epoch(rc: ReplicaCost, b: int, k0: float, n: int) -> float:
    """Sum over n decode iterations of the roofline time, KV growing by b per iteration."""
    if n <= 0:
        return 0.0
    am = rc.m0(b) + rc.m1 * k0
    bm = rc.m1 * b
    ac = rc.c_tok * b + rc.c1 * k0
    bc = rc.c1 * b
    tri = n * (n - 1) / 2.0
    fixed = n * rc.f0(b)
    if am >= ac and bm >= bc:
        return n * am + bm * tri + fixed
    if ac >= am and bc >= bm:
        return n * ac + bc * tri + fixed
    # The two lines cross inside: split at the crossing iteration.
    j = int(math.ceil((ac - am) / (bm - bc)))
    j = min(max(j, 0), n)
    t1 = j * (j - 1) / 2.0
    # Before j the line with the larger intercept dominates, after j the other one.
    if am > ac:
        first = j * am + bm * t1
        rest_a, rest_b = ac + bc * j, bc
    else:
        first = j * ac + bc * t1
        rest_a, rest_b = am + bm * j, bm
    m = n - j
    return first + m * rest_a + rest_b * m * (m - 1) / 2.0 + fixed


@dataclass
class ReplicaResult:
    finish: list  # per episode: finish time of its last turn (incl. final tool call)
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
    """Simulate one engine replica serving episodes `idx` (FIFO), times scaled by `speed` (>1 slower)."""
    ro = cfg.rollout
    S = min(ro.max_num_seqs, ro.max_num_batched_tokens)
    budget = ro.max_num_batched_tokens
    C = rc.kv_capacity
    watermark = 0.01 * C
    multi = ep.multi
    n_ep = len(idx)
    # Request state (parallel lists, one entry per request; multi-turn appends a request per turn).
    r_ctx: list = []
    r_pref: list = []
    r_rem: list = []
    r_it0: list = []
    r_fin: list = []
    r_state: list = []
    r_ep: list = []
    ep_turn = [0] * n_ep
    finish = [0.0] * n_ep
    waiting: deque = deque()
    arrivals: list = []  # heap of (time, request) for multi-turn tool returns
    pending_eps: deque = deque()
    generated = 0
    if multi:
        limit = sandboxes or n_ep
        for j in range(n_ep):
            if j < limit:
                _new_turn_req(
                    j,
                    int(ep.prompt[idx[j]]),
                    int(ep.prompt[idx[j]]),
                    ep.turn_gen[idx[j]][0],
                    r_ctx,
                    r_pref,
                    r_rem,
                    r_it0,
                    r_fin,
                    r_state,
                    r_ep,
                )
                waiting.append(len(r_ctx) - 1)
            else:
                pending_eps.append(j)
    else:
        gens = ep.turn_gen
        prompts = ep.prompt
        for j in range(n_ep):
            e = idx[j]
            p = int(prompts[e])
            r_ctx.append(p)
            r_pref.append(p)
            r_rem.append(int(gens[e]))
            r_it0.append(0)
            r_fin.append(0)
            r_state.append(0)
            r_ep.append(j)
            waiting.append(j)
    heap: list = []
    stack: list = []
    t = 0.0
    it = 0
    B = 0
    kv_a = 0.0  # K(it) = kv_a + B*it
    busy = 0.0
    tool_idle = 0.0
    kv_area = 0.0
    kv_peak = 0.0
    preempt = 0
    push = heapq.heappush
    pop = heapq.heappop
    epoch = _epoch
    M0, F0 = rc.tables(S)
    m1, c_tok, c1 = rc.m1, rc.c_tok, rc.c1
    pre_tok, pre_pair = rc.pre_tok, rc.pre_pair
    # A failed admission stays failed until a request finishes or is preempted: in between, the
    # head of the queue is the same and the free KV only shrinks (`blocked` skips the attempt).
    blocked = False
    while True:
        # Arrivals (tool returns) up to now.
        while arrivals and arrivals[0][0] <= t:
            waiting.append(pop(arrivals)[1])
        # Admission.
        if waiting and B < S and not blocked:
            K = kv_a + B * it
            free = C - K
            ptok = 0
            ppair = 0.0
            new = []
            nb = B
            while waiting and nb < S:
                r = waiting[0]
                need = r_ctx[r]
                if need + watermark > free and (nb > 0 or need > free):
                    break
                waiting.popleft()
                free -= need
                new.append(r)
                nb += 1
                p = r_pref[r]
                ptok += p
                ppair += p * (need - p) + 0.5 * p * p
            if not new:
                blocked = True
            else:
                nchunk = -(-ptok // max(budget - B, 16)) if ptok > 0 else 1
                # Mixed iterations: running decodes advance while the new prompts prefill.
                n = nchunk
                am = M0[B if B else 1] * n + m1 * (K * n + B * n * (n - 1) / 2.0)
                ac = (c_tok * B + c1 * K) * n + c1 * B * n * (n - 1) / 2.0
                ac += pre_tok * ptok + pre_pair * ppair
                dt = ((am if am >= ac else ac) + n * F0[nb]) * speed
                kv_area += (K + 0.5 * ptok) * dt
                t += dt
                busy += dt
                it += n
                for r in new:
                    r_it0[r] = it
                    f = it + r_rem[r]
                    r_fin[r] = f
                    r_state[r] = 1
                    push(heap, (f, r))
                    kv_a += r_ctx[r] - it
                    stack.append(r)
                B = nb
                kk = (kv_a + B * it) / C
                if kk > kv_peak:
                    kv_peak = kk
        # Finishes at or before this iteration.
        while heap and heap[0][0] <= it:
            f, r = pop(heap)
            if r_state[r] != 1 or r_fin[r] != f:
                continue
            r_state[r] = 2
            blocked = False
            B -= 1
            kv_a -= r_ctx[r] - r_it0[r]
            generated += r_rem[r]
            if multi:
                j = r_ep[r]
                e = idx[j]
                k = ep_turn[j]
                obs = ep.turn_obs[e][k]
                tool = ep.turn_tool[e][k]
                k += 1
                ep_turn[j] = k
                if k < len(ep.turn_gen[e]):
                    ctx_prev = r_ctx[r] + r_rem[r]
                    ctx = ctx_prev + obs
                    # the previous turn's blocks stay cached (evictable) while the pool has room for them
                    pref = obs + 1 if prefix_caching and C - (kv_a + B * it) > ctx_prev else ctx
                    push(arrivals, (t + tool, len(r_ctx)))
                    r_ctx.append(int(ctx))
                    r_pref.append(int(pref))
                    r_rem.append(int(ep.turn_gen[e][k]))
                    r_it0.append(0)
                    r_fin.append(0)
                    r_state.append(0)
                    r_ep.append(j)
                else:
                    finish[j] = t + tool
                    if pending_eps:
                        # The sandbox frees after the final tool call (tests); the next episode starts then.
                        jn = pending_eps.popleft()
                        en = idx[jn]
                        pp = int(ep.prompt[en])
                        _new_turn_req(jn, pp, pp, ep.turn_gen[en][0], r_ctx, r_pref, r_rem, r_it0, r_fin, r_state, r_ep)
                        push(arrivals, (t + tool, len(r_ctx) - 1))
            else:
                finish[r_ep[r]] = t
        if B == 0:
            if waiting:
                continue  # admit now (KV is free)
            if arrivals:
                nt = arrivals[0][0]
                if nt > t:
                    tool_idle += nt - t
                    t = nt
                continue
            break
        # KV overflow: preempt the most recently admitted requests (recompute later).
        # vLLM allocates KV in 16-token blocks: a request needs a new block every 16 tokens, so on
        # overflow enough requests are preempted to let the rest grow for one more block.
        K = kv_a + B * it
        while K + B * 16 > C and B > 1:
            v = stack.pop()
            if r_state[v] != 1:
                continue
            g = it - r_it0[v]
            kv_a -= r_ctx[v] - r_it0[v]
            B -= 1
            r_ctx[v] += g
            r_rem[v] -= g
            generated += g
            r_pref[v] = r_ctx[v]
            r_state[v] = 0
            waiting.appendleft(v)
            blocked = False
            preempt += 1
            K = kv_a + B * it
        if K / C > kv_peak:
            kv_peak = K / C
        # Next event: first finish, KV overflow, or (multi-turn) an arrival that could be admitted.
        while stack and r_state[stack[-1]] != 1:
            stack.pop()
        n = heap[0][0] - it
        if n < quantum:
            n = quantum  # merge events closer than the quantum (finishes are processed late by < quantum iterations)
        if B:
            n_o = int((C - K) // B)
            if n_o < n:
                n = max(n_o, 1)
        am = M0[B] + m1 * K
        ac = c_tok * B + c1 * K
        if arrivals and B < S and not waiting:
            # (the iteration time of ReplicaCost.iter_time, from the tables)
            it_t = ((am if am >= ac else ac) + F0[B]) * speed
            n_a = int((arrivals[0][0] - t) / it_t) + 1
            if n_a < n:
                n = n_a if n_a > 1 else 1
        # Closed-form epoch time (see _epoch), inlined for speed.
        bm = m1 * B
        bc = c1 * B
        tri = n * (n - 1) * 0.5
        if am >= ac and bm >= bc:
            dt = n * am + bm * tri
        elif ac >= am and bc >= bm:
            dt = n * ac + bc * tri
        else:
            dt = epoch(rc, B, K, n) - n * F0[B]
        dt = (dt + n * F0[B]) * speed
        kv_area += (K + 0.5 * B * n) * dt
        t += dt
        busy += dt
        it += n
        # Discard stale heap entries lazily.
        while heap:
            f, r = heap[0]
            if r_state[r] == 1 and r_fin[r] == f:
                break
            pop(heap)
    return ReplicaResult(
        finish=finish,
        busy=busy,
        end=t,
        preemptions=preempt,
        kv_peak=min(1.0, kv_peak),
        kv_mean_tokens=kv_area / t if t > 0 else 0.0,
        tool_idle=tool_idle,
        generated=generated,
    )


def _new_turn_req(j, ctx, pref, gen, r_ctx, r_pref, r_rem, r_it0, r_fin, r_state, r_ep) -> None:
    r_ctx.append(int(ctx))
    r_pref.append(int(pref))
    r_rem.append(int(gen))
    r_it0.append(0)
    r_fin.append(0)
    r_state.append(0)
    r_ep.append(j)


@dataclass
class RolloutResult:
    finish: list  # per episode finish times (merged over replicas, in episode order)
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
    finish = [0.0] * n if not sample_replicas else [math.nan] * n
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
        idx = list(range(r, n, replicas))  # round-robin assignment (verl splits the batch evenly)
        if not idx:
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
        for j, e in enumerate(idx):
            finish[e] = res.finish[j]
        pre += res.preemptions
        peak = max(peak, res.kv_peak)
        kvm += res.kv_mean_tokens
        idle += res.tool_idle
        gen += res.generated
        end = max(end, res.end, max(res.finish))
    srt = sorted(x for x in finish if x == x)
    scale = replicas / simulated
    return RolloutResult(
        finish=finish,
        end=end,
        median=srt[len(srt) // 2],
        preemptions=int(pre * scale),
        kv_peak=peak,
        kv_mean_tokens=kvm / simulated,
        tool_idle=idle / simulated,
        generated=int(gen * scale),
        replicas=replicas,
    )
