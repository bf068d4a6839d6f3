"""Training side of one RL step: old/ref log-prob passes and the policy update (Megatron-style).

FLOPs per token (docs/references.md 'Performance-model facts'): training 6*N_active + 6*L*s*d_q
(s = token-weighted sequence length,
causal), forward-only log-prob passes 2*N_active + 2*L*s*d_q each; full recompute adds a forward.
Linear layers run at hardware MFU x micro-batch GEMM efficiency x TP/CP shape factors; attention at
the flash-attention kernels' own speed by sequence length (measured on an H200), plus explicit
TP/EP/DP communication, the pipeline bubble (PP-1)/m per optimizer step, and offload transfers (CPU Adam
every optimizer step, or verl's swap of the state between phases: docs/twin.md 'Offload'). FSDP
trainers (scenario fsdp) add the memory-bound element-wise kernels of the eager Hugging Face layers,
measured on an H200 (bench/trainer_speed.py; docs/twin.md 'Eager FSDP layers').
Memory per GPU: Megatron distributed optimizer 6 + 12/d bytes per parameter (params and grads
replicated over data parallel, optimizer state sharded), activations per layer (Korthikanti et al.,
with flash attention: no s^2 term) and the fp32 logits of one micro-batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rltune.api.hardware import GiB
from rltune.api.hardware import gpu as gpu_spec
from rltune.api.models import ModelArch, RLConfig

from .efficiency import Efficiency
from .errors import Infeasible


@dataclass
class TrainCost:
    old_logprob: float
    ref_logprob: float
    training: float
    mem_gib: float
    avail_gib: float
    resident_gib: float  # trainer bytes per GPU that stay resident while colocated rollouts run
    params_gib: float  # bf16 weights per GPU (for switches)
    mfu: float  # achieved model FLOPs utilisation of the update


def _check_layout(model: ModelArch, g_t: int, cfg: RLConfig) -> tuple[int, int, int]:
    """(ep, etp, dp) of the trainer layout, or Infeasible naming the rule Megatron-core enforces: the
    dense layout tp*pp*cp and the expert layout ep*etp*pp must each divide the trainer GPUs."""
    tr = cfg.trainer
    ep = tr.ep if model.is_moe else 1
    mp = tr.tp * tr.pp * tr.cp
    if g_t % mp:
        raise Infeasible(f"trainer layout invalid: {g_t} trainer GPUs not divisible by tp*pp*cp = {mp}")
    if model.heads % tr.tp or (model.kv_heads % tr.tp and tr.tp % model.kv_heads):
        raise Infeasible(f"trainer layout invalid: tp {tr.tp} does not divide {model.heads} attention heads")
    if tr.pp > model.layers:
        raise Infeasible(f"trainer layout invalid: pp {tr.pp} exceeds {model.layers} layers")
    etp = tr.expert_tp if model.is_moe else 1
    if model.is_moe:
        per_stage = g_t // tr.pp
        if model.experts % ep or per_stage % (ep * etp):
            raise Infeasible(
                f"trainer layout invalid: ep {ep} must divide the {model.experts} experts, and ep*etp = "
                f"{ep * etp} the {per_stage} GPUs per pipeline stage (trainer.etp 1 keeps experts whole)"
            )
        if model.expert_ffn % etp:
            raise Infeasible(f"trainer layout invalid: etp {etp} does not divide the expert width {model.expert_ffn}")
    return ep, etp, g_t // mp


def dp_imbalance(seqs: np.ndarray, lin: float, attn: float, dp: int, chunks: int) -> float:
    """Slowdown of data-parallel training from uneven sequences: each of `chunks` optimizer steps waits
    for its slowest data-parallel rank, which holds at least its share of the chunk's work and at
    least the chunk's longest sequence (a sequence is not split across ranks; the frameworks balance
    the rest: verl's balance_batch, Megatron's dynamic batching). Work of a sequence of s tokens:
    s (lin + attn s) FLOPs (linear layers + causal attention). 1.0 when one rank does everything."""
    if dp <= 1:
        return 1.0
    w = seqs * (lin + attn * seqs)
    n = len(w) // chunks * chunks
    if n == 0:
        return 1.0
    parts = w[:n].reshape(chunks, -1)
    slowest = np.maximum(parts.sum(axis=1) / dp, parts.max(axis=1)).sum()
    return float(slowest / (parts.sum() / dp))


def train_cost(
    model: ModelArch,
    seq_lens: np.ndarray,
    gpu_type: str,
    gpus_per_node: int,
    g_t: int,
    cfg: RLConfig,
    eff: Efficiency,
    reference: bool,
) -> TrainCost:
    g = gpu_spec(gpu_type)
    tr = cfg.trainer
    ep, etp, dp = _check_layout(model, g_t, cfg)
    tp, pp, cp = tr.tp, tr.pp, tr.cp
    total, active = model.params()
    h, L = model.hidden, model.layers
    seqs = seq_lens.astype(np.float64)
    T = float(seqs.sum())
    s_eff = float((seqs * seqs).sum() / T)
    s_max = float(seqs.max())
    dq = model.heads * model.head_dim
    # Linear layers: 2 N_active FLOPs per token per forward; the update runs forward + backward (3x),
    # full recompute one forward more. Attention: flash-attention kernels run at their own speed,
    # a fraction of the GEMMs' that grows with the sequence (e = ratio x train_mfu x s / (s + half);
    # measured on an H200, docs/twin.md 'Attention kernels'), so summed over a batch they cost as if
    # each token attended `attn_half_len` more context tokens; context parallel splits each sequence
    # into cp shorter blocks. Selective and full recompute both rerun the forward's attention.
    lin_passes = 3.0 + (1.0 if tr.recompute == "full" else 0.0)
    attn_fwd_passes = 1.0 + (0.0 if tr.recompute == "none" else 1.0)
    attn_kernel_tok = 2.0 * L * dq * (s_eff + eff.attn_half_len * cp)
    # FP8 training (scenario train_fp8, used for Megatron-Bridge rows): quantisation overheads keep the
    # real speed-up well under the 2x datasheet ratio.
    peak = g.bf16_tflops * 1e12 * (eff.fp8_train_speedup if eff.extra.get("train_fp8") else 1.0)

    # Micro-batches: dynamic batch size packs sequences up to microBatchTokens per GPU (x cp per
    # context-parallel group); a longer sequence forms its own micro-batch.
    mb = float(tr.micro_batch_tokens)
    per_gpu_seq = s_eff / cp
    mb_eff = max(0.9 * mb, min(per_gpu_seq, s_max / cp)) if per_gpu_seq > 0.9 * mb else 0.9 * mb
    f_mb = mb_eff / (mb_eff + eff.mb_half_tokens)
    f_tp = 1.0 / (1.0 + 0.03 * (tp - 1))
    f_cp = 1.0 / (1.0 + 0.04 * (cp - 1))
    mfu = eff.train_mfu * f_mb * f_tp * f_cp
    attn_fwd_speed = peak * eff.train_mfu * f_cp * eff.attn_fwd_ratio
    attn_bwd_speed = peak * eff.train_mfu * f_cp * eff.attn_bwd_ratio
    # MoE grouped GEMMs: tokens per local expert per micro-batch.
    expert_frac = 0.0
    f_moe = 1.0
    if model.is_moe:
        routed_active = model.moe_layers() * model.active_experts * 3 * h * model.expert_ffn
        expert_frac = routed_active / active
        x = mb_eff * model.active_experts * ep / model.experts
        # Grouped expert GEMMs: few tokens per local expert and narrow experts both run far from peak
        # (router, permutation and all-to-all glue included): Megatron-Bridge reaches ~6% of peak on
        # Qwen3-30B-A3B (docs/references.md 'Performance-model facts'). Expert tensor parallelism
        # splits each expert's FFN over etp GPUs, so each GEMM is etp times narrower (as the rollout's
        # TP slices, rollout.py).
        width = model.expert_ffn / etp
        f_moe = x / (x + eff.moe_gemm_tokens) * width / (width + eff.moe_width_half)
    slow = (1.0 - expert_frac) + expert_frac / f_moe

    intra = g.nvlink_reach(gpus_per_node)
    nvl = g.nvlink_bw * eff.nvlink
    nic = g.nic_bw * eff.nic
    tok_per_group = T / (dp * cp)

    def comm(passes: float) -> float:
        """TP + EP + CP communication seconds per GPU for `passes` forward-equivalents."""
        c = 0.0
        if tp > 1:
            link = nvl if tp <= intra else nic
            c += tok_per_group * (L / pp) * 4 * h * 2 * (tp - 1) / tp / link * passes * (1 - eff.tp_overlap)
        if model.is_moe and ep > 1:
            # the expert group spans ep*etp consecutive ranks (Megatron orders expert ranks etp-ep-dp-pp)
            link = nvl if ep * etp <= intra else nic
            c += (
                (tok_per_group / tp)
                * (model.moe_layers() / pp)
                * 2
                * model.active_experts
                * h
                * 2
                * (ep - 1)
                / ep
                / link
                * passes
                * 0.7
            )
        if cp > 1:
            link = nvl if tp * cp <= intra else nic
            kvb = model.kv_bytes_per_token() / L
            c += tok_per_group * (L / pp) * kvb * (cp - 1) / cp / link * passes * 0.2
        return c

    def bubble(mbs_per_flush: float, flushes: int, fwd_only: bool) -> float:
        if pp == 1:
            return 1.0
        m = max(1.0, mbs_per_flush)
        return 1.0 + (pp - 1) / m

    # Update: mini_batches optimizer steps, each a pipeline flush.
    nmb = max(1, eff.mini_batches)
    m_per_flush = tok_per_group / nmb / mb_eff
    imb_train = dp_imbalance(seqs, 2.0 * active, 2.0 * L * dq, dp, nmb)
    attn_train = attn_kernel_tok * (attn_fwd_passes / attn_fwd_speed + 2.0 / attn_bwd_speed)
    compute = T * (2.0 * active * lin_passes * slow / (peak * mfu) + attn_train) / g_t * imb_train
    # FSDP trainers run the Hugging Face model code eagerly: its RMSNorms (in fp32), rotary embedding,
    # SwiGLU and residual adds are separate memory-bound kernels whose time follows the bytes they move
    # (tokens x layers x hidden), not the GEMMs' FLOPs. Megatron fuses them (Transformer Engine); its
    # share stays inside train_mfu. Gradient checkpointing repeats the forward's.
    eager = bool(eff.extra.get("fsdp"))
    hbm = g.hbm_bw * eff.hbm
    if eager:
        ew_bytes = eff.eager_train_bytes + (eff.eager_fwd_bytes if tr.recompute == "full" else 0.0)
        compute += T * L * h * ew_bytes / (g_t * hbm) * imb_train
    train_passes = 3.0 + (1.0 if tr.recompute == "full" else 0.0)
    t_train = (compute + comm(train_passes)) * bubble(m_per_flush, nmb, False)
    # Data-parallel gradient reduce-scatter + param all-gather per optimizer step.
    p_dense = total - model.routed_params()
    p_exp = total - p_dense
    p_gpu = p_dense / (tp * pp) + p_exp / (ep * etp * pp)
    if dp > 1:
        link = nvl if g_t <= intra else nic
        t_dp = p_gpu * 6.0 * (dp - 1) / dp / link
        t_train += nmb * t_dp * (1 - eff.fsdp_overlap)
    # Optimizer step (+ offload traffic and CPU Adam).
    d_dense = g_t / (tp * pp)
    d_exp = g_t / (etp * pp * ep)
    shard = p_dense / (tp * pp) / d_dense + p_exp / (ep * etp * pp) / d_exp
    # Model state per GPU when it stays on the GPU, and its bf16 weights.
    if eff.extra.get("fsdp"):
        # FSDP / ZeRO-3 (verl's default trainer): params, grads and optimizer all sharded over data parallel.
        state_gpu = (p_dense / (tp * pp)) * 18.0 / d_dense + (p_exp / (ep * etp * pp)) * 18.0 / d_exp
        state_gpu += total / L * 2.0 * 2
        # bf16 weights that stay on the GPU while colocated rollouts run: FSDP keeps only its data-parallel
        # shard (full tensors exist only inside a layer's forward/backward); Megatron its model-parallel shard
        weights_gpu = (p_dense / (tp * pp)) * 2.0 / d_dense + (p_exp / (ep * etp * pp)) * 2.0 / d_exp
    else:
        state_gpu = (p_dense / (tp * pp)) * (6.0 + 12.0 / d_dense) + (p_exp / (ep * etp * pp)) * (6.0 + 12.0 / d_exp)
        weights_gpu = p_gpu * 2.0
    cpu_adam = tr.offload and not eff.offload_swap
    if cpu_adam:  # ZeRO-Offload (DeepSpeed, OpenRLHF --ds.adam_offload): CPU Adam every optimizer step
        t_train += nmb * (shard / eff.cpu_adam_params_per_s + shard * 6.0 / eff.pcie_bw + p_gpu * 2.0 * 2 / eff.pcie_bw)
    else:
        t_train += nmb * shard * 16.0 * 2 / (g.hbm_bw * eff.hbm)
    if tr.offload and eff.offload_swap:
        # verl's actor offload: the state leaves the GPU between phases and comes back for the update,
        # where Adam runs on the GPU; the weights' own moves are the colocated switch's (simulate._switch)
        t_train += 2.0 * (state_gpu - weights_gpu) / eff.pcie_bw

    # Forward-only log-prob passes (bigger micro-batches: verl uses 3x the train token budget).
    fwd_mfu = mfu * eff.fwd_ratio * ((3 * mb_eff) / (3 * mb_eff + eff.mb_half_tokens)) / f_mb
    imb_fwd = dp_imbalance(seqs, 2.0 * active, 2.0 * L * dq, dp, 1)
    t_fwd = T * (2.0 * active * slow / (peak * fwd_mfu) + attn_kernel_tok / attn_fwd_speed) / g_t * imb_fwd
    if eager:
        t_fwd += T * L * h * eff.eager_fwd_bytes / (g_t * hbm) * imb_fwd
    t_fwd += comm(1.0)
    t_fwd *= bubble(tok_per_group / (3 * mb_eff), 1, True)
    if cpu_adam:
        t_fwd += p_gpu * 2.0 / eff.pcie_bw
    t_old = t_fwd
    t_ref = t_fwd if reference else 0.0

    # Memory per GPU (a swapped state is all on the GPU while it trains).
    state = p_gpu * 4.0 if cpu_adam else state_gpu
    act_tok = max(mb, s_max / cp)
    f_act = model.ffn if not model.is_moe else (model.active_experts + model.shared_experts) * model.expert_ffn * 1.2
    per_layer_tok = (17.0 * h + 6.0 * f_act) / tp
    if tr.recompute == "none":
        act = L * act_tok * per_layer_tok
    elif tr.recompute == "selective":
        act = L * act_tok * per_layer_tok * 0.8
    else:
        act = L * act_tok * 2.0 * h / tp + act_tok * per_layer_tok
    logits = act_tok * model.vocab / tp * 2.0  # bf16 logits; fp32 log-softmax is chunked/fused
    if pp > 1:
        act_logits = max(act, logits + act / pp)
    else:
        act_logits = act + logits
    need = (state + act_logits) * 1.05 + 3.0 * GiB
    avail = g.hbm_bytes
    if need > avail:
        raise Infeasible(
            f"CUDA out of memory: trainer needs {need / GiB:.0f} GiB/GPU, {avail / GiB:.0f} GiB available "
            f"(params+grads+optimizer {state / GiB:.0f} GiB, activations {act / GiB:.0f} GiB, "
            f"logits {logits / GiB:.0f} GiB; raise tp/pp/cp, lower microBatchTokens, recompute or offload)",
            oom=True,
        )
    resident = 0.0 if tr.offload else weights_gpu
    achieved = T * 6.0 * active / (g_t * peak * t_train) if t_train > 0 else 0.0
    return TrainCost(
        old_logprob=t_old,
        ref_logprob=t_ref,
        training=t_train,
        mem_gib=need / GiB,
        avail_gib=avail / GiB,
        resident_gib=resident / GiB,
        params_gib=p_gpu * 2.0 / GiB,
        mfu=achieved,
    )
