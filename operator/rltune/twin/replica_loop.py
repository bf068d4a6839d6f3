"""The event loop of one vLLM engine replica (rollout.simulate_replica's inner loop), compiled.

The twin spends nearly all its CPU time here: one pass of this loop per batch of finishing requests,
tens of thousands per simulated step. The loop is written once, in the subset of Python that numba
compiles (flat arrays, lists, heapq; no objects), and is compiled with numba when numba is installed
(extra `fast`); without it the same function runs interpreted. Both give bit-identical results: the
compiled code performs the same IEEE operations in the same order (no fastmath), and
tests/unit/test_twin_replica_loop.py checks it on single-turn, multi-turn, sandbox-limited and
preempting replicas.
"""

from __future__ import annotations

import heapq
import math


def _epoch(m0b: float, f0b: float, m1: float, c_tok: float, c1: float, b: int, k0: float, n: int) -> float:
    """Sum over n decode iterations of the roofline time, KV growing by b per iteration: the memory
    line m0 + m1 K and the compute line c_tok b + c1 K, whichever is larger, plus the fixed time."""
    if n <= 0:
        return 0.0
    am = m0b + m1 * k0
    bm = m1 * b
    ac = c_tok * b + c1 * k0
    bc = c1 * b
    tri = n * (n - 1) / 2.0
    fixed = n * f0b
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
        rest_a = ac + bc * j
        rest_b = bc
    else:
        first = j * ac + bc * t1
        rest_a = am + bm * j
        rest_b = bm
    m = n - j
    return first + m * rest_a + rest_b * m * (m - 1) / 2.0 + fixed


def replica_loop(
    M0,
    F0,
    m1: float,
    c_tok: float,
    c1: float,
    pre_tok: float,
    pre_pair: float,
    C: int,
    S: int,
    budget: int,
    quantum: int,
    speed: float,
    prefix_caching: bool,
    multi: bool,
    limit: int,
    prompt,
    turn_off,
    turn_gen,
    turn_obs,
    turn_tool,
    finish,
    r_ctx,
    r_pref,
    r_rem,
    r_it0,
    r_fin,
    r_state,
    r_ep,
    waiting,
):
    """Serve the replica's episodes FIFO (docs of rollout.simulate_replica); fills `finish`.

    M0[b], F0[b]: the per-iteration memory intercept and fixed time at batch b (ReplicaCost.tables).
    Episode j (local index) has prompt[j] tokens and turns turn_off[j]..turn_off[j+1]-1 of the flat
    turn arrays (generated tokens, observation tokens after the turn, tool seconds after the turn).
    r_*: preallocated request state, one slot per turn; `waiting`: a ring buffer of request ids
    (len(waiting) > requests). Returns (busy, end, preemptions, kv_peak, kv_area, tool_idle, generated)."""
    n_ep = len(prompt)
    wcap = len(waiting)
    w_head = 0
    w_len = 0
    nreq = 0
    ep_turn = [0] * n_ep
    next_ep = 0  # episodes start in order, at most `limit` at once (sandboxes)
    while next_ep < n_ep and next_ep < limit:
        j = next_ep
        r_ctx[nreq] = prompt[j]
        r_pref[nreq] = prompt[j]
        r_rem[nreq] = turn_gen[turn_off[j]]
        r_it0[nreq] = 0
        r_fin[nreq] = 0
        r_state[nreq] = 0
        r_ep[nreq] = j
        waiting[(w_head + w_len) % wcap] = nreq
        w_len += 1
        nreq += 1
        next_ep += 1
    watermark = 0.01 * C
    generated = 0
    arrivals = [(0.0, 0)]  # heap of (time, request): tool returns
    arrivals.pop()
    heap = [(0, 0)]  # heap of (finish iteration, request)
    heap.pop()
    stack = [0]  # admission order, for preemption
    stack.pop()
    new = [0]
    new.pop()
    t = 0.0
    it = 0
    B = 0
    kv_a = 0.0  # K(it) = kv_a + B*it
    busy = 0.0
    tool_idle = 0.0
    kv_area = 0.0
    kv_peak = 0.0
    preempt = 0
    # A failed admission stays failed until a request finishes or is preempted: in between, the
    # head of the queue is the same and the free KV only shrinks (`blocked` skips the attempt).
    blocked = False
    while True:
        # Arrivals (tool returns) up to now.
        while len(arrivals) > 0 and arrivals[0][0] <= t:
            waiting[(w_head + w_len) % wcap] = heapq.heappop(arrivals)[1]
            w_len += 1
        # Admission.
        if w_len > 0 and B < S and not blocked:
            K = kv_a + B * it
            free = C - K
            ptok = 0
            ppair = 0.0
            new.clear()
            nb = B
            while w_len > 0 and nb < S:
                r = waiting[w_head]
                need = r_ctx[r]
                if need + watermark > free and (nb > 0 or need > free):
                    break
                w_head = (w_head + 1) % wcap
                w_len -= 1
                free -= need
                new.append(r)
                nb += 1
                p = r_pref[r]
                ptok += p
                ppair += p * (need - p) + 0.5 * p * p
            if len(new) == 0:
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
                    heapq.heappush(heap, (f, r))
                    kv_a += r_ctx[r] - it
                    stack.append(r)
                B = nb
                kk = (kv_a + B * it) / C
                if kk > kv_peak:
                    kv_peak = kk
        # Finishes at or before this iteration.
        while len(heap) > 0 and heap[0][0] <= it:
            f, r = heapq.heappop(heap)
            if r_state[r] != 1 or r_fin[r] != f:
                continue
            r_state[r] = 2
            blocked = False
            B -= 1
            kv_a -= r_ctx[r] - r_it0[r]
            generated += r_rem[r]
            j = r_ep[r]
            if multi:
                k = ep_turn[j]
                obs = turn_obs[turn_off[j] + k]
                tool = turn_tool[turn_off[j] + k]
                k += 1
                ep_turn[j] = k
                if turn_off[j] + k < turn_off[j + 1]:
                    ctx_prev = r_ctx[r] + r_rem[r]
                    ctx = ctx_prev + obs
                    # the previous turn's blocks stay cached (evictable) while the pool has room for them
                    pref = obs + 1 if prefix_caching and C - (kv_a + B * it) > ctx_prev else ctx
                    heapq.heappush(arrivals, (t + tool, nreq))
                    r_ctx[nreq] = ctx
                    r_pref[nreq] = pref
                    r_rem[nreq] = turn_gen[turn_off[j] + k]
                    r_it0[nreq] = 0
                    r_fin[nreq] = 0
                    r_state[nreq] = 0
                    r_ep[nreq] = j
                    nreq += 1
                else:
                    finish[j] = t + tool
                    if next_ep < n_ep:
                        # The sandbox frees after the final tool call (tests); the next episode starts then.
                        jn = next_ep
                        next_ep += 1
                        r_ctx[nreq] = prompt[jn]
                        r_pref[nreq] = prompt[jn]
                        r_rem[nreq] = turn_gen[turn_off[jn]]
                        r_it0[nreq] = 0
                        r_fin[nreq] = 0
                        r_state[nreq] = 0
                        r_ep[nreq] = jn
                        heapq.heappush(arrivals, (t + tool, nreq))
                        nreq += 1
            else:
                finish[j] = t
        if B == 0:
            if w_len > 0:
                continue  # admit now (KV is free)
            if len(arrivals) > 0:
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
            w_head = (w_head - 1) % wcap
            waiting[w_head] = v
            w_len += 1
            blocked = False
            preempt += 1
            K = kv_a + B * it
        if K / C > kv_peak:
            kv_peak = K / C
        # Next event: first finish, KV overflow, or (multi-turn) an arrival that could be admitted.
        while len(stack) > 0 and r_state[stack[-1]] != 1:
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
        if len(arrivals) > 0 and B < S and w_len == 0:
            # (the iteration time of ReplicaCost.iter_time, from the tables)
            it_t = ((am if am >= ac else ac) + F0[B]) * speed
            n_a = int((arrivals[0][0] - t) / it_t) + 1
            if n_a < n:
                n = n_a if n_a > 1 else 1
        # Closed-form epoch time (see _epoch), inlined for the common cases.
        bm = m1 * B
        bc = c1 * B
        tri = n * (n - 1) * 0.5
        if am >= ac and bm >= bc:
            dt = n * am + bm * tri
        elif ac >= am and bc >= bm:
            dt = n * ac + bc * tri
        else:
            dt = _epoch(M0[B], F0[B], m1, c_tok, c1, B, K, n) - n * F0[B]
        dt = (dt + n * F0[B]) * speed
        kv_area += (K + 0.5 * B * n) * dt
        t += dt
        busy += dt
        it += n
        # Discard stale heap entries lazily.
        while len(heap) > 0:
            f, r = heap[0]
            if r_state[r] == 1 and r_fin[r] == f:
                break
            heapq.heappop(heap)
    return busy, t, preempt, kv_peak, kv_area, tool_idle, generated


try:  # compiled when numba is installed (extra `fast`); the interpreted function otherwise
    import numba

    _epoch = numba.njit(cache=True)(_epoch)
    compiled_replica_loop = numba.njit(cache=True)(replica_loop)
except ImportError:  # pragma: no cover - exercised where numba is not installed
    compiled_replica_loop = None
