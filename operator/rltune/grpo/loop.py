"""The trainer side of rltune's reference GRPO loop, and `run(spec, emit)`.

Per step k the trainer:
  1. waits for rollout batch k from the rollout process (phase `waiting`);
  2. computes group-relative advantages from the verifiable rewards;
  3. recomputes the sampled tokens' log-probs with its own weights (`old_logprob`) and compares them
     with vLLM's (`logprob_mismatch` = mean |logp_vllm - logp_trainer_old| per generated token);
  4. takes one PPO-clip optimizer step, accumulating gradients over micro-batches of at most
     trainer.microBatchTokens (padded) tokens (`training`);
  5. publishes the new weights (version k+1) to the rollout process (`weight_sync`: the trainer's
     snapshot + hand-off, plus the rollout's in-place load into the live engine).
The rollout process generates batch k+1 while 3-5 run when async.staleness >= 1.
"""

from __future__ import annotations

import math
import os
import queue
import tempfile
import time
from typing import Any, Callable, Optional

from rltune.api.metrics import PHASES, StepRecord
from rltune.api.models import TrialSpec

from .model import DTYPES, build_trainer_model, qwen2_config, write_model_dir
from .task import PAD, ReverseTask

LR = float(os.environ.get("RLTUNE_GRPO_LR", "1e-3"))  # not a knob: the tuner never changes the algorithm
CLIP_EPS = 0.2
GRAD_CLIP = 1.0
# Supervised warm start: a weak teacher (each response digit replaced by a random one with probability
# PRETRAIN_NOISE) until the greedy (argmax) token accuracy against the true answer reaches the target.
# The model then knows the format and leans to the right answer but samples wrong digits often at
# temperature 1: the reward has room to rise, and RL has signal from the first step.
PRETRAIN_NOISE = float(os.environ.get("RLTUNE_GRPO_PRETRAIN_NOISE", "0.5"))
PRETRAIN_TARGET_ACC = float(os.environ.get("RLTUNE_GRPO_PRETRAIN_ACC", "0.85"))
PRETRAIN_MAX_STEPS = 400
PRETRAIN_BATCH = 64
PRETRAIN_LR = float(os.environ.get("RLTUNE_GRPO_PRETRAIN_LR", "3e-3"))
READY_TIMEOUT_S = float(os.environ.get("RLTUNE_GRPO_READY_TIMEOUT", "600"))
BATCH_TIMEOUT_S = float(os.environ.get("RLTUNE_GRPO_BATCH_TIMEOUT", "900"))


def thread_plan(spec: TrialSpec, ncpu: Optional[int] = None) -> dict[str, Any]:
    """Threads and core sets of the rollout and trainer processes.

    cpu.rolloutThreads / cpu.trainerThreads when given; otherwise with staleness 0 (the two sides
    alternate) each side gets every core, and with staleness >= 1 (they overlap) the cores are split.
    The sides are pinned to disjoint cores when their threads fit the machine side by side.
    """
    ncpu = ncpu or len(os.sched_getaffinity(0))
    cpu = spec.config.cpu
    overlap = spec.config.async_.staleness >= 1
    r = cpu.rollout_threads if cpu and cpu.rollout_threads else (max(1, ncpu // 2) if overlap else ncpu)
    t = cpu.trainer_threads if cpu and cpu.trainer_threads else (max(1, ncpu - r) if overlap else ncpu)
    cores = sorted(os.sched_getaffinity(0))
    plan = {"rollout_threads": r, "trainer_threads": t, "rollout_cpus": None, "trainer_cpus": None}
    if r + t <= len(cores):
        plan["rollout_cpus"] = cores[:r]
        plan["trainer_cpus"] = cores[r : r + t]
    return plan


def engine_kwargs(spec: TrialSpec, model_dir: str, max_model_len: int, on_gpu: bool) -> dict[str, Any]:
    ro = spec.config.rollout
    arch = spec.model.resolved()
    kw: dict[str, Any] = dict(
        model=model_dir,
        load_format="dummy",
        skip_tokenizer_init=True,
        dtype=DTYPES[arch.dtype],
        max_model_len=max_model_len,
        max_num_seqs=ro.max_num_seqs,
        max_num_batched_tokens=ro.max_num_batched_tokens,
        seed=spec.seed,
        enable_prefix_caching=True,
    )
    if on_gpu:
        kw.update(
            tensor_parallel_size=ro.tp,
            gpu_memory_utilization=ro.gpu_memory_utilization,
            enforce_eager=not ro.cuda_graphs,
        )
    else:
        kw.update(enforce_eager=True)  # CPU: no CUDA graphs; torch.compile warm-up costs minutes on 2 cores
    return kw


# --------------------------------------------------------------------------- trainer math


# The trainer's CUDA allocator (bench.trainer_memory on an H200): with PyTorch's default segments,
# blocks cut for one micro-batch's shapes do not fit the next one's, and the reserved peak ran 15-20
# points of the GPU above what expandable segments reserve for the same step (0.5B-shaped model,
# 8k-token micro-batches: 46% against 31%), and followed the number of micro-batches rather than the
# longest sequence. PyTorch reads it at the first CUDA allocation; a user's setting wins.
ALLOC_CONF = "expandable_segments:True"


def trainer_allocator() -> None:
    """Give this process's CUDA allocator expandable segments, unless the user chose a setting.
    Call before its first CUDA allocation, in the trainer process only (vLLM's sleep mode, which
    colocated frameworks use, refuses expandable segments)."""
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", ALLOC_CONF)


def peak_trainer_memory(device) -> float:
    """Peak memory the trainer reserved since the last call / the GPU's memory; 0 on the CPU, where
    the contract's gauge means "not measured" (a host process has no fixed memory to run out of)."""
    import torch

    if getattr(device, "type", str(device)) != "cuda" or not torch.cuda.is_available():
        return 0.0
    peak = torch.cuda.max_memory_reserved(device)
    torch.cuda.reset_peak_memory_stats(device)
    return float(peak) / float(torch.cuda.get_device_properties(device).total_memory)


def _pad_batch(seqs: list[list[int]], device) -> Any:
    """Token ids padded on the right to the longest sequence. No attention mask goes with them: under
    causal attention a real token never sees the pads after it, and SDPA's flash kernels take no
    padding mask (is_causal only)."""
    import torch

    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), PAD, dtype=torch.long)
    for r, s in enumerate(seqs):
        ids[r, : len(s)] = torch.tensor(s)
    return ids.to(device)


def _compute_dtype(model):
    import torch

    return getattr(torch, getattr(model.config, "compute_dtype", "float32"))


def _mixed_precision(model, device) -> bool:
    """bf16/fp16 autocast on a GPU when the model is served in that dtype; the CPU stays in fp32."""
    import torch

    return getattr(device, "type", str(device)) == "cuda" and _compute_dtype(model) != torch.float32


def token_logprobs(model, seqs: list[list[int]], starts: list[int], device) -> list[Any]:
    """Per sequence, log p(token) of tokens seqs[r][starts[r]:] under the model (a list of 1-D tensors).

    On a GPU the forward runs in the served dtype (bf16 autocast over fp32 master weights, as verl and
    Megatron train): fp32 attention has no flash kernel there, and SDPA's fallback keeps every
    (query, key) pair per head and layer. log p = logit - logsumexp(logits): no vocabulary-wide
    log-softmax tensor is kept for the backward."""
    import torch

    ids = _pad_batch(seqs, device)
    with torch.autocast("cuda", dtype=_compute_dtype(model), enabled=_mixed_precision(model, device)):
        logits = model(input_ids=ids).logits[:, :-1].float()
    lp = logits.gather(-1, ids[:, 1:, None])[..., 0] - torch.logsumexp(logits, dim=-1)
    return [lp[r, starts[r] - 1 : len(seqs[r]) - 1] for r in range(len(seqs))]


def old_logprobs(model, seqs: list[list[int]], starts: list[int], groups: list[list[int]], device) -> list[Any]:
    """Per sequence, the log-probs of its response under the trainer's current weights (no grad),
    computed micro-batch by micro-batch: the ratio's denominator of the PPO step."""
    import torch

    old: list[Any] = [None] * len(seqs)
    with torch.no_grad():
        for g in groups:
            for i, lp in zip(g, token_logprobs(model, [seqs[i] for i in g], [starts[i] for i in g], device)):
                old[i] = lp.detach()
    return old


def ppo_update(model, opt, seqs, starts, groups, old, adv, device) -> float:
    """One PPO-clip optimizer step on the whole batch, gradients accumulated over the micro-batches
    (token mean over the responses); returns the share of response tokens whose ratio was clipped."""
    import torch

    n_resp = [len(s) - st for s, st in zip(seqs, starts)]
    total_tokens = max(1, sum(n_resp))
    opt.zero_grad(set_to_none=True)
    clipped = 0.0
    for g in groups:
        new = token_logprobs(model, [seqs[i] for i in g], [starts[i] for i in g], device)
        loss = 0.0
        for i, lp in zip(g, new):
            if n_resp[i] == 0:
                continue
            ratio = torch.exp(lp - old[i])
            a = adv[i]
            surr = torch.minimum(ratio * a, torch.clamp(ratio, 1 - CLIP_EPS, 1 + CLIP_EPS) * a)
            loss = loss - surr.sum()
            clipped += float(((ratio - 1).abs() > CLIP_EPS).float().sum())
        if torch.is_tensor(loss):
            (loss / total_tokens).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
    opt.step()
    return clipped / total_tokens


def micro_batches(lengths: list[int], budget: int) -> list[list[int]]:
    """Indices grouped so each group's padded size (count x longest) stays within the token budget."""
    groups: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for i, n in enumerate(lengths):
        if cur and max(longest, n) * (len(cur) + 1) > budget:
            groups.append(cur)
            cur, longest = [], 0
        cur.append(i)
        longest = max(longest, n)
    if cur:
        groups.append(cur)
    return groups


def advantages(rewards: list[float], groups: list[int]) -> list[float]:
    """GRPO: (r - mean of the prompt's group) / (std of the group + eps)."""
    by: dict[int, list[float]] = {}
    for r, g in zip(rewards, groups):
        by.setdefault(g, []).append(r)
    stats = {}
    for g, rs in by.items():
        m = sum(rs) / len(rs)
        sd = math.sqrt(sum((x - m) ** 2 for x in rs) / len(rs))
        stats[g] = (m, sd)
    return [(r - stats[g][0]) / (stats[g][1] + 1e-6) for r, g in zip(rewards, groups)]


def pretrain(model, task: ReverseTask, seed: int, device) -> dict[str, float]:
    """Brief supervised warm start on the task's format until teacher-forced accuracy reaches a target."""
    import numpy as np
    import torch

    rng = np.random.default_rng([seed, 104729])
    opt = torch.optim.AdamW(model.parameters(), lr=PRETRAIN_LR, weight_decay=0.0)
    t0 = time.perf_counter()
    acc = 0.0
    steps = 0
    for steps in range(1, PRETRAIN_MAX_STEPS + 1):  # noqa: B007 - the count is read after the loop
        pairs = task.supervised_batch(rng, PRETRAIN_BATCH, PRETRAIN_NOISE)
        clean = [task.target(p) for p, _ in pairs]
        seqs = [p + r for p, r in pairs]
        starts = [len(p) for p, _ in pairs]
        ids = _pad_batch(seqs, device)
        logits = model(input_ids=ids).logits.float()
        lp = torch.log_softmax(logits[:, :-1], dim=-1)
        tgt = ids[:, 1:]
        sel = torch.zeros_like(tgt, dtype=torch.bool)
        for r, (s, n) in enumerate(zip(starts, map(len, seqs))):
            sel[r, s - 1 : n - 1] = True
        nll = -lp.gather(-1, tgt[..., None])[..., 0][sel]
        loss = nll.mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        clean_ids = _pad_batch([p + c for (p, _), c in zip(pairs, clean)], device)
        acc = float((lp.argmax(-1) == clean_ids[:, 1:])[sel].float().mean())
        if acc >= PRETRAIN_TARGET_ACC:
            break
    return {"pretrain_steps": steps, "pretrain_accuracy": acc, "pretrain_seconds": time.perf_counter() - t0}


def warm_start(model, cfg: dict, task: ReverseTask, seed: int, device) -> dict[str, Any]:
    """pretrain(), single-threaded (so the result does not depend on the thread split) and cached on
    disk by everything it depends on: trials of one job start from the same checkpoint, like RL jobs
    that start from one SFT model. RLTUNE_GRPO_CACHE names the cache folder ("off" disables it)."""
    import hashlib
    import json

    import torch

    where = os.environ.get("RLTUNE_GRPO_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "rltune", "grpo"))
    key = hashlib.sha256(
        json.dumps(
            {
                "cfg": cfg,
                "digits": task.max_digits,
                "seed": seed,
                "noise": PRETRAIN_NOISE,
                "acc": PRETRAIN_TARGET_ACC,
                "lr": PRETRAIN_LR,
                "batch": PRETRAIN_BATCH,
                "max": PRETRAIN_MAX_STEPS,
                "torch": torch.__version__,
                "v": 2,  # 2: no padding mask (same function, other kernels)
            },
            sort_keys=True,
        ).encode()
    ).hexdigest()[:24]
    path = os.path.join(where, f"warm-{key}.pt") if where != "off" else None
    if path and os.path.exists(path):
        try:
            blob = torch.load(path, map_location=device, weights_only=False)
            model.load_state_dict(blob["state"])
            return dict(blob["info"], pretrain_cached=True)
        except Exception:
            pass  # a broken cache entry is rebuilt
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    try:
        info = pretrain(model, task, seed, device)
    finally:
        torch.set_num_threads(threads)
    if path:
        try:
            os.makedirs(where, exist_ok=True)
            tmp_path = f"{path}.{os.getpid()}.tmp"
            torch.save({"state": model.state_dict(), "info": info}, tmp_path)
            os.replace(tmp_path, path)
        except OSError:
            pass
    return dict(info, pretrain_cached=False)


# --------------------------------------------------------------------------- run


def run(spec: TrialSpec, emit: Callable[[StepRecord], None], info: Optional[dict] = None) -> None:
    """Run spec.steps GRPO steps (the first spec.warmup_steps flagged warm-up); emit one StepRecord each.

    `info`, when given, receives run-level facts (engine start-up, pre-training, thread plan).
    Raises on any failure of the trainer or the rollout process.
    """
    import numpy as np
    import torch
    import torch.multiprocessing as tmp

    if spec.steps < 1:
        raise ValueError("steps must be >= 1")
    info = info if info is not None else {}
    task_spec = spec.task
    task = ReverseTask.for_budget(task_spec.max_prompt_tokens, task_spec.max_response_tokens)
    arch = spec.model.resolved()
    max_len = task.max_prompt_len + task.max_response_len
    cfg = qwen2_config(arch, max_len)
    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda" if on_gpu else "cpu")
    plan = thread_plan(spec)
    info["threads"] = plan

    old_threads = torch.get_num_threads()
    old_affinity = os.sched_getaffinity(0)
    ctx = tmp.get_context("spawn")
    proc = None
    weight_q = ctx.Queue()
    out_q = ctx.Queue()
    tmpdir = tempfile.TemporaryDirectory(prefix="rltune-grpo-")
    try:
        torch.manual_seed(spec.seed)
        np.random.seed(spec.seed % (2**32))
        model_dir = write_model_dir(cfg, os.path.join(tmpdir.name, "model"))
        rcfg = {
            "engine": engine_kwargs(spec, model_dir, max_len + 8, on_gpu),
            "threads": plan["rollout_threads"],
            "cpus": plan["rollout_cpus"],
            "steps": spec.steps,
            "staleness": spec.config.async_.staleness,
            "prompts": task_spec.prompts_per_step,
            "samples": task_spec.samples_per_prompt,
            "seed": spec.seed,
            "max_digits": task.max_digits,
            "ppid": os.getpid(),
        }
        from .rollout import engine_env, rollout_main

        # The spawned child inherits this environment, so torch sees its thread settings at import.
        saved = {k: os.environ.get(k) for k in engine_env(1)}
        os.environ.update(engine_env(plan["rollout_threads"]))
        try:
            proc = ctx.Process(target=rollout_main, args=(rcfg, weight_q, out_q), name="rltune-rollout", daemon=True)
            proc.start()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

        if on_gpu:
            trainer_allocator()  # after the rollout process started: its engine keeps vLLM's own allocator
        # The trainer builds and warm-starts its model while the engine starts.
        torch.set_num_threads(plan["trainer_threads"])
        if plan["trainer_cpus"]:
            os.sched_setaffinity(0, plan["trainer_cpus"])
        model = build_trainer_model(cfg).to(device)
        model.train()
        info.update(warm_start(model, cfg, task, spec.seed, device))
        opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0, betas=(0.9, 0.99))
        engine_dtype = getattr(torch, DTYPES[arch.dtype])

        ready = _get(out_q, proc, READY_TIMEOUT_S, "ready")
        info["engine_init_seconds"] = ready["init_seconds"]
        info["kv_capacity_tokens"] = ready["kv_tokens"]

        keep: list[dict] = []  # the last snapshots stay alive until the rollout surely has them
        t_pub = time.perf_counter()
        keep.append(_publish(weight_q, model, 0, engine_dtype))
        first_publish = time.perf_counter() - t_pub
        version = 0
        # fp32 trainer weights of the versions rollouts may still be sampled from, so the numerical
        # mismatch of a stale batch is measured against the policy that generated it, not the lag
        snapshots: dict[int, dict] = {0: _snapshot(model)}

        for k in range(spec.steps):
            t_step = time.perf_counter()
            t0 = time.perf_counter()
            batch = _get(out_q, proc, BATCH_TIMEOUT_S, "batch")
            waiting = time.perf_counter() - t0
            if batch["step"] != k:
                raise RuntimeError(f"rollout sent batch {batch['step']} when the trainer expected {k}")
            samples = batch["samples"]
            seqs = [s["prompt_ids"] + s["response"] for s in samples]
            starts = [len(s["prompt_ids"]) for s in samples]
            n_resp = [len(s["response"]) for s in samples]
            rewards = [s["reward"] for s in samples]
            adv = advantages(rewards, [s["prompt"] for s in samples])
            groups = micro_batches([len(s) for s in seqs], spec.config.trainer.micro_batch_tokens)

            t0 = time.perf_counter()
            old = old_logprobs(model, seqs, starts, groups, device)
            old_lp_s = time.perf_counter() - t0
            mismatch = _mismatch(model, snapshots, batch["version"], version, samples, seqs, starts, old, device)

            t0 = time.perf_counter()
            ppo_update(model, opt, seqs, starts, groups, old, adv, device)
            version += 1
            training_s = time.perf_counter() - t0
            if spec.config.async_.staleness > 0:
                snapshots[version] = _snapshot(model)
                for v in [v for v in snapshots if v < version - spec.config.async_.staleness]:
                    del snapshots[v]

            t0 = time.perf_counter()
            keep.append(_publish(weight_q, model, version, engine_dtype))
            del keep[:-3]
            publish_s = time.perf_counter() - t0 + (first_publish if k == 0 else 0.0)

            duration = time.perf_counter() - t_step
            phases = {p: 0.0 for p in PHASES}
            phases.update(
                generation=batch["generation"],
                generation_tail=batch["generation_tail"],
                old_logprob=old_lp_s,
                training=training_s,
                weight_sync=publish_s + batch["weight_sync"],
                waiting=waiting,
                rollout_idle=batch["rollout_idle"],
            )
            emit(
                StepRecord(
                    step=k,
                    duration=duration,
                    phases=phases,
                    generated_tokens=float(sum(n_resp)),
                    trained_tokens=float(sum(len(s) for s in seqs)),
                    staleness=float(k - batch["version"]),
                    reward=float(np.mean(rewards)),
                    logprob_mismatch=mismatch,
                    kv_usage=float(batch["kv_usage"]),
                    preemptions=float(batch["preemptions"]),
                    trainer_memory=peak_trainer_memory(device),
                    longest_sequence=float(max(len(s) for s in seqs)),
                    warmup=k < spec.warmup_steps,
                )
            )
        weight_q.put(("stop",))
        proc.join(timeout=60)
        if proc.is_alive():
            raise RuntimeError("rollout process did not stop within 60 s")
        if proc.exitcode not in (0, None):
            raise RuntimeError(f"rollout process exited with code {proc.exitcode}")
    finally:
        if proc is not None and proc.is_alive():
            try:
                weight_q.put(("stop",))
                proc.join(timeout=10)
            except Exception:
                pass
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        for q in (weight_q, out_q):
            q.cancel_join_thread()
            q.close()
        torch.set_num_threads(old_threads)
        os.sched_setaffinity(0, old_affinity)
        tmpdir.cleanup()


MISMATCH_SAMPLES = 8  # stale batches: mismatch measured on this many samples (one extra small forward)


def _snapshot(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _mismatch(model, snapshots: dict, rollout_version: int, version: int, samples, seqs, starts, old, device) -> float:
    """Mean |log p_vllm - log p_trainer| per generated token, both under the policy version that
    sampled the batch: a numerical check of rollout against trainer. Policy lag is gated separately
    (staleness), so it must not leak into this number."""
    import torch

    if rollout_version == version or rollout_version not in snapshots:
        idx = [i for i in range(len(samples)) if len(samples[i]["response"]) > 0]
        ref = {i: old[i] for i in idx}
    else:
        idx = [i for i in range(len(samples)) if len(samples[i]["response"]) > 0][:MISMATCH_SAMPLES]
        current = _snapshot(model)
        try:
            model.load_state_dict(snapshots[rollout_version])
            with torch.no_grad():
                lps = token_logprobs(model, [seqs[i] for i in idx], [starts[i] for i in idx], device)
        finally:
            model.load_state_dict(current)
        ref = dict(zip(idx, lps))
    diffs = [(ref[i].cpu() - torch.tensor(samples[i]["logprobs"], dtype=torch.float32)).abs() for i in idx]
    return float(torch.cat(diffs).mean()) if diffs else 0.0


def _publish(weight_q, model, version: int, dtype) -> dict:
    """Hand a snapshot of the weights, in the engine's dtype, to the rollout process (tensors travel
    through shared memory)."""
    state = {k: v.detach().to("cpu", dtype=dtype, copy=True) for k, v in model.state_dict().items()}
    for v in state.values():
        v.share_memory_()
    weight_q.put(("weights", version, state))
    return state


def _get(out_q, proc, timeout: float, kind: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            msg = out_q.get(timeout=1.0)
        except queue.Empty:
            if not proc.is_alive():
                raise RuntimeError(f"rollout process died (exit code {proc.exitcode}) before sending {kind}") from None
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {kind} from the rollout process within {timeout:.0f} s") from None
            continue
        if msg[0] == "error":
            import sys

            print(f"rltune.grpo: rollout process traceback:\n{msg[2]}", file=sys.stderr, flush=True)
            raise RuntimeError(f"rollout process failed: {msg[1][:2000]}")
        if msg[0] != kind:
            raise RuntimeError(f"rollout process sent {msg[0]!r} when the trainer expected {kind!r}")
        return msg[1]
