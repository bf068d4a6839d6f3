"""One RL step on a simulated GPU cluster: placement, async overlap, weight sync, noise, quality.

Placement (docs/twin.md):
- colocated: generation -> switch (vLLM sleep/wake, trainer onload) -> old/ref log-prob -> update ->
  local weight sync, sequentially on all GPUs. Staleness > 0 gives no overlap on shared GPUs; with
  partial rollout the long tail is cut (unfinished samples carry over to the next step, APRIL-style).
- disaggregated: rollout GPUs and trainer GPUs are separate pools. Staleness 0: strictly sequential
  (each side idles while the other works). Staleness >= 1: pipelined, steady-state step =
  max(rollout + its sync stall, train + its sync stall); without partial rollout each batch still
  drains its long tail (one-step-off), with partial rollout generation streams (no tail).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

import numpy as np

from rltune.api.hardware import GiB
from rltune.api.hardware import gpu as gpu_spec
from rltune.api.layout import layout
from rltune.api.metrics import StepRecord
from rltune.api.models import ModelArch, RLConfig, TaskSpec, TrialSpec
from rltune.api.pipeline import pipeline_step

from .efficiency import Efficiency, efficiency
from .errors import Infeasible
from .rollout import ReplicaCost, replica_cost, simulate_rollout
from .training import TrainCost, train_cost
from .workload import sample_episodes

DEFAULT_GPUS = 8


@dataclass
class Plan:
    model: ModelArch
    task: TaskSpec
    gpu_type: str
    gpus_per_node: int
    cfg: RLConfig
    eff: Efficiency
    gpus: int
    train_gpus: int
    rollout_gpus: int
    rc: ReplicaCost
    colocated: bool
    staleness: int
    partial: bool
    streaming: bool  # generation measured as a steady-state stream (no per-step tail)
    reference: bool
    sandboxes: Optional[int]


def make_plan(
    model: ModelArch, task: TaskSpec, gpu_type: str, gpus_per_node: int, cfg: RLConfig, scenario: Optional[dict] = None
) -> Plan:
    eff = efficiency(gpu_type, scenario)
    gpus = cfg.gpus or int(eff.extra.get("gpus", DEFAULT_GPUS))
    lay = layout(gpus, cfg.placement, cfg.trainer_gpus, gpus, gpus_per_node)
    colocated, train_g, roll_g = lay.colocated, lay.trainer, lay.rollout
    if not colocated:
        if roll_g < cfg.rollout.tp:
            raise Infeasible(
                f"disaggregated placement leaves {roll_g} rollout GPUs (gpus {gpus} - trainerGpus {train_g}), "
                f"fewer than rollout TP {cfg.rollout.tp}"
            )
    if cfg.rollout.tp > gpus:
        raise Infeasible(f"rollout TP {cfg.rollout.tp} exceeds the {gpus} GPUs of the configuration")
    if model.heads % cfg.rollout.tp:
        raise Infeasible(f"rollout TP {cfg.rollout.tp} does not divide {model.heads} attention heads")
    rc = replica_cost(model, task, gpu_type, gpus_per_node, cfg, eff)
    s = cfg.async_.staleness
    partial = cfg.async_.partial_rollout and s > 0
    if cfg.async_.stale_fraction is not None and (colocated or s < 1):
        raise Infeasible(
            "async.staleFraction bounds how far a separate rollout pool runs ahead of the trainer: it needs "
            "placement disaggregated and async.staleness >= 1 (unset it for colocated or synchronous runs)"
        )
    reference = bool(eff.extra.get("reference_policy", getattr(task, "reference_policy", False) or False))
    sandboxes = None
    if task.kind == "agentic-coding":
        sandboxes = task.sandboxes or eff.sandboxes
    plan = Plan(
        model=model,
        task=task,
        gpu_type=gpu_type,
        gpus_per_node=gpus_per_node,
        cfg=cfg,
        eff=eff,
        gpus=gpus,
        train_gpus=train_g,
        rollout_gpus=roll_g,
        rc=rc,
        colocated=colocated,
        staleness=s,
        partial=partial,
        streaming=partial,
        reference=reference,
        sandboxes=sandboxes,
    )
    return plan


def _weight_sync(p: Plan, tc: TrainCost) -> tuple[float, float, float]:
    """(transfer seconds, trainer stall, rollout stall) of one weight update."""
    g = gpu_spec(p.gpu_type)
    eff = p.eff
    total, _ = p.model.params()
    nbytes = total * 2.0
    quant = (total * 3.0 / p.cfg.rollout.tp / (g.hbm_bw * eff.hbm) + 0.5) if p.cfg.rollout.fp8 else 0.0
    if p.colocated:
        # Local resharding over NVLink; every rollout GPU gathers weights/TP bytes.
        t = eff.colocated_sync_fixed + nbytes / p.cfg.rollout.tp / (g.nvlink_bw * eff.nvlink) + quant
        return t, t, t
    nodes = max(1.0, p.rollout_gpus / p.gpus_per_node)
    # One stream: a trainer rank broadcasts gathered buckets to every rollout rank (pipelined over a
    # tree of NICs, so more rollout nodes add bandwidth only weakly: fitted, docs/calibration.md).
    bw_ce = eff.ckpt_engine_eff * g.nic_bw * nodes**0.25
    # Model-parallel trainers own disjoint shards (each pipeline stage its layers, each expert rank
    # its experts), and each owner broadcasts its own shard at the same time over its own NIC:
    # the streams run in parallel, bounded by the trainer's NICs. FSDP gathers every tensor onto one
    # sender: one stream whatever the number of ranks.
    streams = _sync_streams(p)
    # Each rollout GPU must still receive its own TP shard through its own NIC.
    recv = nbytes / p.cfg.rollout.tp / (g.nic_bw * eff.nic)
    n_tensors = p.model.layers * 9 + 3
    method = p.cfg.weight_sync
    if method == "checkpoint-engine":
        t = max(nbytes / (bw_ce * streams), recv) + 0.3 + quant
        return t, 0.3 * t, 0.3 * t
    if method == "nccl":
        t = max(nbytes / (bw_ce * eff.nccl_sync_ratio * streams), recv) + n_tensors / streams * 1e-3 + 1.0 + quant
        return t, t, t
    # disk: trainer writes a checkpoint, every rollout node reads it.
    t_w = nbytes / eff.disk_bw + 2.0
    t_r = nbytes / eff.disk_bw + 2.0 + quant
    return t_w + t_r, t_w, t_r


def _sync_streams(p: Plan) -> float:
    """Parallel weight-sync streams: distinct trainer shards whose owners send at once (>= 1)."""
    if p.eff.extra.get("fsdp"):
        return 1.0
    tr = p.cfg.trainer
    total, _ = p.model.params()
    expert = p.model.routed_params()
    ep = tr.ep if p.model.is_moe else 1
    # each owner (a pipeline stage's expert rank) sends its stage's dense bytes and its own experts;
    # tensor-parallel shards (dense TP and expert TP alike) are gathered to one sender first
    per_owner = (total - expert) / tr.pp + expert / (tr.pp * ep)
    return max(1.0, min(float(p.train_gpus), total / per_owner))


def _switch(p: Plan, tc: TrainCost) -> float:
    """Colocated rollout<->trainer switch: vLLM sleep/wake and trainer onload/offload over PCIe."""
    eff = p.eff
    return eff.switch_fixed + (p.rc.weights_gib * GiB + 2.0 * tc.params_gib * GiB) / eff.pcie_bw


def _node_factors(p: Plan, rng: Optional[np.random.Generator]) -> np.ndarray:
    nodes = max(1, math.ceil(p.gpus / p.gpus_per_node))
    f = np.ones(nodes)
    if rng is None:
        return f
    hit = rng.random(nodes) < p.eff.straggler_prob
    f[hit] += p.eff.straggler_slowdown * (0.5 + rng.random(int(hit.sum())))
    return f


@dataclass
class StepResult:
    duration: float
    phases: dict
    generated: float
    trained: float
    staleness: float
    kv_usage: float
    preemptions: float
    trainer_memory: float = 0.0  # the trainer's peak memory / HBM in this step
    longest_sequence: float = 0.0  # tokens of the step's longest trained sequence


def simulate_one_step(p: Plan, rng: Optional[np.random.Generator], warmup: bool = False) -> StepResult:
    eff = p.eff
    batches = 3 if p.streaming else 1
    ep = sample_episodes(p.task, eff, rng, batches=batches)
    n = p.task.prompts_per_step * p.task.samples_per_prompt
    # Speed factors: replica noise x straggling nodes.
    node_f = _node_factors(p, rng)
    replicas = max(1, p.rollout_gpus // p.cfg.rollout.tp)
    first_gpu = 0 if p.colocated else p.train_gpus
    speeds = np.empty(replicas)
    for r in range(replicas):
        a = first_gpu + r * p.cfg.rollout.tp
        b = a + p.cfg.rollout.tp - 1
        speeds[r] = node_f[a // p.gpus_per_node : b // p.gpus_per_node + 1].max()
    if rng is not None:
        speeds *= np.exp(eff.noise * rng.standard_normal(replicas))
    prefix = bool(eff.extra.get("prefix_caching", eff.prefix_caching))
    # Streaming (partial rollout): replicas are statistically alike and none waits for the slowest,
    # so a sample of replicas gives the steady-state rate; synchronous steps need every replica (tail).
    ro = simulate_rollout(
        p.rc,
        ep,
        p.cfg,
        p.rollout_gpus,
        speeds=speeds,
        sandboxes=p.sandboxes,
        prefix_caching=prefix,
        sample_replicas=8 if p.streaming else None,
    )
    if p.streaming:
        fin = np.asarray(ro.finish)
        srt = np.sort(fin[np.isfinite(fin)])
        frac = len(srt) / len(fin)
        k1 = max(0, int(n * frac) - 1)
        k2 = min(len(srt) - 1, int(2 * n * frac) - 1)
        gen = float(srt[k2] - srt[k1])
        # Interrupted requests re-prefill their context after each sync (partial rollout resume).
        resume = (
            ro.kv_mean_tokens
            * (p.rc.pre_tok + p.rc.pre_pair * 0.5 * ro.kv_mean_tokens / max(1.0, p.cfg.rollout.max_num_seqs))
            * float(np.mean(speeds))
        )
        gen += resume
        tail = resume
        sl = slice(n, 2 * n)
        seqs = ep.seq_lens()[sl]
        generated = float(np.sum(seqs - ep.prompt[sl])) if not ep.multi else float(ep.generated()) / batches
    else:
        gen = ro.end
        tail = max(0.0, ro.end - ro.median)
        seqs = ep.seq_lens()
        generated = float(ep.generated())
    tc = train_cost(p.model, seqs, p.gpu_type, p.gpus_per_node, p.train_gpus, p.cfg, eff, p.reference)
    if p.colocated:
        g = gpu_spec(p.gpu_type)
        if p.cfg.rollout.gpu_memory_utilization * g.hbm_bytes + tc.resident_gib * GiB + 1.0 * GiB > g.hbm_bytes:
            raise Infeasible(
                f"CUDA out of memory: colocated rollout takes gpuMemoryUtilization "
                f"{p.cfg.rollout.gpu_memory_utilization:g} x {g.hbm_bytes / GiB:.0f} GiB while the trainer keeps "
                f"{tc.resident_gib:.0f} GiB/GPU of weights resident (lower gpuMemoryUtilization, raise trainer "
                f"tp/pp or enable offload)",
                oom=True,
            )
    # Trainer noise: synchronous collectives run at the pace of the slowest trainer node.
    tf = 1.0
    if rng is not None:
        tnodes = node_f[: max(1, math.ceil(p.train_gpus / p.gpus_per_node))]
        tf = float(tnodes.max()) * math.exp(eff.noise * rng.standard_normal())
    old, ref, train = tc.old_logprob * tf, tc.ref_logprob * tf, tc.training * tf
    if bool(eff.extra.get("rollout_logprobs", False)):
        old = 0.0
    if warmup:
        gen += eff.warmup_gen_seconds * (1.0 if p.cfg.rollout.cuda_graphs else 0.3)
        train *= eff.warmup_train_factor
    sync, st_t, st_r = _weight_sync(p, tc)
    tool = ro.tool_idle
    phases = dict(
        generation=gen,
        generation_tail=tail,
        tool=tool,
        old_logprob=old,
        ref_logprob=ref,
        training=train,
        weight_sync=sync,
        waiting=0.0,
        rollout_idle=0.0,
    )
    T = old + ref + train
    s = p.staleness
    if p.colocated:
        sw = _switch(p, tc)
        phases["weight_sync"] = sync + sw
        dur = gen + sw + T + sync
        lag = 0.0 if (s == 0 or not p.partial) else 1.0
    elif s == 0 or warmup:
        dur = gen + T + sync
        phases["waiting"] = gen
        phases["rollout_idle"] = T + sync
        lag = 0.0
    else:
        frac = p.cfg.async_.stale_fraction
        pipe = pipeline_step(gen, T, st_t, st_r, s if frac is None else frac, eff.mini_batches, streaming=p.partial)
        dur = pipe.duration
        phases["waiting"] = pipe.trainer_wait
        phases["rollout_idle"] = pipe.rollout_idle
        lag = float(min(s, (s if gen < T else 1) + (1 if p.partial else 0)))
    trained = float(np.sum(seqs))
    phases = {k: float(v) for k, v in phases.items()}
    return StepResult(
        duration=float(dur),
        phases=phases,
        generated=generated,
        trained=trained,
        staleness=lag,
        kv_usage=ro.kv_peak,
        preemptions=float(ro.preemptions),
        trainer_memory=tc.mem_gib / tc.avail_gib,
        longest_sequence=float(np.max(seqs)),
    )


def _quality(p: Plan, step: int, lag: float, rng: Optional[np.random.Generator]) -> tuple[float, float]:
    eff = p.eff
    base = eff.mismatch_fp8 if p.cfg.rollout.fp8 else eff.mismatch_bf16
    if p.cfg.rollout.tp != p.cfg.trainer.tp:
        base *= 1.1
    mismatch = base + eff.mismatch_per_staleness * lag
    tau = eff.reward_tau * (1.0 + eff.lag_penalty * lag + (eff.fp8_tau_stretch if p.cfg.rollout.fp8 else 0.0))
    reward = eff.reward_start + eff.reward_gain * (1.0 - math.exp(-(step + 1) / tau))
    reward -= 0.5 * max(0.0, mismatch - 0.05)
    if rng is not None:
        mismatch *= math.exp(0.1 * rng.standard_normal())
        reward += eff.reward_noise * rng.standard_normal()
    return reward, mismatch


def simulate_trial(spec: TrialSpec, noise: bool = True) -> list[StepRecord]:
    """All steps of one trial (warm-up flagged). Raises Infeasible if the configuration cannot run."""
    model = spec.model.resolved()
    p = make_plan(model, spec.task, spec.gpu_type, spec.gpus_per_node, spec.config, spec.scenario)
    out = []
    for i in range(spec.steps):
        rng = np.random.default_rng([spec.seed, i]) if noise else None
        r = simulate_one_step(p, rng, warmup=(i == 0))
        reward, mismatch = _quality(p, i, r.staleness, rng)
        out.append(
            StepRecord(
                step=i,
                duration=r.duration,
                phases=r.phases,
                generated_tokens=r.generated,
                trained_tokens=r.trained,
                staleness=r.staleness,
                reward=reward,
                logprob_mismatch=mismatch,
                kv_usage=r.kv_usage,
                preemptions=r.preemptions,
                trainer_memory=r.trainer_memory,
                longest_sequence=r.longest_sequence,
                warmup=i < spec.warmup_steps,
            )
        )
    return out


def _key(*parts) -> str:
    return json.dumps(
        [x.model_dump(mode="json") if hasattr(x, "model_dump") else x for x in parts], sort_keys=True, default=str
    )


@lru_cache(maxsize=4096)
def _cached_step(key: str) -> tuple:
    model_d, task_d, gpu_type, gpn, cfg_d, scenario = json.loads(key)
    model = ModelArch.model_validate(model_d)
    task = TaskSpec.model_validate(task_d)
    cfg = RLConfig.model_validate(cfg_d)
    try:
        p = make_plan(model, task, gpu_type, gpn, cfg, scenario)
        r = simulate_one_step(p, None, warmup=False)
    except Infeasible as e:
        return ("infeasible", e.reason, e.oom)
    return ("ok", r.duration, r.phases, r.staleness, r.kv_usage, r.preemptions)


def simulate_step_breakdown(
    model: ModelArch,
    task: TaskSpec,
    gpu_type: str,
    gpus_per_node: int,
    config: RLConfig,
    scenario: Optional[dict] = None,
) -> dict:
    """Noiseless steady-state step: {'duration', 'phases', 'staleness', 'kv_usage', 'preemptions'}."""
    res = _cached_step(_key(model, task, gpu_type, gpus_per_node, config, scenario))
    if res[0] == "infeasible":
        raise Infeasible(res[1], oom=res[2])
    _, dur, phases, lag, kv, pre = res
    return dict(duration=dur, phases=dict(phases), staleness=lag, kv_usage=kv, preemptions=pre)


def simulate_step_time(
    model: ModelArch,
    task: TaskSpec,
    gpu_type: str,
    gpus_per_node: int,
    config: RLConfig,
    scenario: Optional[dict] = None,
) -> float:
    """Noiseless expected steady-state step time in seconds (cached). Raises Infeasible."""
    return simulate_step_breakdown(model, task, gpu_type, gpus_per_node, config, scenario)["duration"]
