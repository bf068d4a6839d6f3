"""The rollout process: one vLLM engine that generates the step batches and takes new weights.

It runs in its own process (spawned: vLLM and OpenMP want a fresh interpreter, and vLLM pins the
torch thread count of the process it lives in). The engine lives in-process in this worker
(VLLM_ENABLE_V1_MULTIPROCESSING=0), so its model is reachable through `collective_rpc`.

Protocol (all through multiprocessing queues of the spawn context):
  weight_q  trainer -> rollout   ("weights", version, {name: tensor}) | ("stop",)
  out_q     rollout -> trainer   ("ready", info) | ("batch", dict) | ("error", summary, traceback)

The rollout generates batch k with the newest policy it has, as long as that policy is at least
version k - staleness; otherwise it blocks for newer weights (rollout_idle). staleness 0 is
therefore strictly alternating, staleness s lets generation run up to s versions ahead of training.
"""

from __future__ import annotations

import os
import queue
import time
import traceback
from typing import Any


def engine_env(threads: int) -> dict[str, str]:
    """Environment of the rollout process, set before torch/vLLM are imported there."""
    return {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # engine core in this process: collective_rpc reaches the model
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),  # GiB; the smallest setting
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # we pin with sched_setaffinity instead
        "OMP_NUM_THREADS": str(threads),
        "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE"),  # idle workers sleep: see __init__
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_LOGGING_LEVEL": os.environ.get("RLTUNE_VLLM_LOGGING_LEVEL", "ERROR"),
        "TOKENIZERS_PARALLELISM": "false",
    }


def rollout_main(cfg: dict[str, Any], weight_q, out_q) -> None:
    """Process entry point. cfg is plain data (no torch objects: torch must not load before the env)."""
    try:
        for k, v in engine_env(cfg["threads"]).items():
            os.environ[k] = v
        if cfg.get("cpus"):
            os.sched_setaffinity(0, cfg["cpus"])
        _serve(cfg, weight_q, out_q)
    except BaseException as e:  # noqa: BLE001 - everything goes back to the trainer, which raises
        summary = " ".join(f"{type(e).__name__}: {e}".split())
        try:
            out_q.put(("error", summary, traceback.format_exc()))
        except Exception:
            pass


def _serve(cfg: dict[str, Any], weight_q, out_q) -> None:
    t0 = time.perf_counter()
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from .task import EOS, ReverseTask

    task = ReverseTask(max_digits=cfg["max_digits"])
    llm = LLM(**cfg["engine"])
    engine = llm.llm_engine
    sched = _scheduler(engine)
    counters = {"preemptions": 0}
    if sched is not None and hasattr(sched, "_preempt_request"):
        orig = sched._preempt_request

        def counted(*a, **kw):
            counters["preemptions"] += 1
            return orig(*a, **kw)

        sched._preempt_request = counted
    out_q.put(("ready", {"init_seconds": time.perf_counter() - t0, "kv_tokens": _kv_capacity_tokens(engine)}))

    version = -1
    for k in range(cfg["steps"]):
        need = max(0, k - cfg["staleness"])
        t_wait = time.perf_counter()
        latest = None
        stop = False
        # Take the newest weights queued; block only while the policy is too stale.
        while True:
            have = latest[1] if latest is not None else version
            blocking = have < need
            try:
                msg = weight_q.get(timeout=1.0) if blocking else weight_q.get_nowait()
            except queue.Empty:
                if blocking:
                    _check_parent(cfg)
                    continue
                break
            if msg[0] == "stop":
                stop = True
                break
            latest = msg
        if stop:
            return
        idle = time.perf_counter() - t_wait
        sync = 0.0
        if latest is not None:
            t_sync = time.perf_counter()
            _, v, state = latest
            llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(list(state.items()))})
            llm.reset_prefix_cache()
            version = v
            del latest, state
            sync = time.perf_counter() - t_sync

        prompts = task.prompts(cfg["seed"], k, cfg["prompts"])
        n = cfg["samples"]
        start_pre = counters["preemptions"]
        t_gen = time.perf_counter()
        for i, p in enumerate(prompts):
            for j in range(n):
                # No per-request seed: the engine's seeded generator makes a run reproducible, and
                # per-request generators crash the CPU backend when a prompt's prefill is split across
                # engine steps (small maxNumBatchedTokens): "CPU Generator does not use offset".
                sp = SamplingParams(
                    n=1,
                    max_tokens=task.max_response_len,
                    temperature=1.0,
                    logprobs=0,
                    stop_token_ids=[EOS],
                    detokenize=False,
                )
                engine.add_request(f"{k}-{i}-{j}", TokensPrompt(prompt_token_ids=p), sp)
        done: dict[str, tuple[float, Any]] = {}
        kv_peak = 0.0
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    done[out.request_id] = (time.perf_counter(), out)
            if sched is not None:
                kv_peak = max(kv_peak, float(sched.kv_cache_manager.usage))
        t_end = time.perf_counter()
        finish = sorted(t for t, _ in done.values())
        median = finish[(len(finish) - 1) // 2] if finish else t_end
        samples = []
        for i, p in enumerate(prompts):
            for j in range(n):
                o = done[f"{k}-{i}-{j}"][1].outputs[0]
                toks = list(o.token_ids)
                lps = [float(d[t].logprob) for t, d in zip(toks, o.logprobs)]
                samples.append(
                    {"prompt": i, "prompt_ids": p, "response": toks, "logprobs": lps, "reward": task.reward(p, toks)}
                )
        out_q.put(
            (
                "batch",
                {
                    "step": k,
                    "version": version,
                    "samples": samples,
                    "generation": t_end - t_gen,
                    "generation_tail": max(0.0, t_end - median),
                    "weight_sync": sync,
                    "rollout_idle": idle,
                    "kv_usage": kv_peak,
                    "preemptions": counters["preemptions"] - start_pre,
                },
            )
        )

    # Drain until the trainer says stop, so its queue feeder never blocks on a full pipe.
    while True:
        try:
            msg = weight_q.get(timeout=1.0)
        except queue.Empty:
            _check_parent(cfg)
            continue
        if msg[0] == "stop":
            return


def _check_parent(cfg: dict[str, Any]) -> None:
    if os.getppid() != cfg["ppid"]:
        raise SystemExit("rollout: trainer process is gone")


def _scheduler(engine):
    try:
        return engine.engine_core.engine_core.scheduler
    except AttributeError:
        return None


def _kv_capacity_tokens(engine) -> int:
    try:
        cc = engine.vllm_config.cache_config
        return int(cc.num_gpu_blocks or 0) * int(cc.block_size)
    except Exception:
        return 0
