"""Judge the digital twin on published RL step times it was not fitted on (GitHub issue 14).

    PYTHONPATH=operator python -m bench.published            # fit, in-sample + held-out report
    PYTHONPATH=operator python -m bench.published --folds    # also leave-one-source-out folds
    PYTHONPATH=operator python -m bench.published --no-fit   # shipped factors only (fast)
    make bench-published                                     # --folds

Rows: bench/data/published_steps.yaml (sources, split and scoring rules fixed there before fitting, and
each row's twin inputs in its `twin` block, read by `twin_inputs`; summary in docs/published-steps.md).
Output: out/bench-published.md and out/bench-published.json; `report()` returns the markdown and the
stats so docs/calibration.md can embed them.

Fitting: the per-hardware factors bench/calibrate.py's `fit` searches (FIT_KEYS within BOUNDS), on
calibrate's non-RL rows (inference, pre-training) plus published rows. calibrate's own RL and weight-sync
rows are NOT added again: each of them is a row of this dataset (same numbers, same assumptions; ids in
CALIBRATE_TWINS), so adding both would count them twice and, in a leave-one-source-out fold, let the
left-out source's rows into its own fit. H800 rows are fitted and predicted with H100's factors (same die).

Assumption rules, decided before any held-out error was looked at (each row's report names those it used):
R-a  a published mean response length is used as is (RLinf rows).
R-b  rows also in bench/calibrate.py keep its assumptions (model, batch shape, mean response, engine and trainer
     knobs, scenario); other verl-async-h20 rows copy the conventions of their calibrate sibling (same page,
     model and backend) and change only what the YAML states differently (GPUs, placement, batch, async).
R-c  AReaL R1-Distill rows (AReaL-boba math): mean response = RLinf's published mean for the same model on the
     same dataset family (1.5B: 14,255; 7B: 10,426). GPU split and trainer parallelism are not stated for
     Table 2. Asynchronous rows: AReaL's own scaling benchmark at v0.3.0
     (benchmark/verl_v0_3_0_post1_76084d3/build_cmd.py, get_allocation_mode: 3/4 of the GPUs to SGLang at TP 1,
     trainer TP 1 with PP 2 for 1.5B, PP 4 for 7B; mem_fraction_static 0.8, 0.7 for 7B; max_tokens_per_mb 32768).
     Synchronous rows: AReaL's synchronous configs at v0.3.0 (training/configs/sync-ppo.yaml
     `sglang.d4p1m1+d2p2m1` and examples/configs/v0.2-qwen2-math/*-distill/ppo-*-gpus-128.yaml
     `sglang.d64p1m1+d32p2m1`: half the GPUs to SGLang at TP 1, trainer PP 2; mem_fraction_static 0.8,
     max_tokens_per_mb 30720), the same half split at 192 GPUs. Both: 512 x 16, max prompt 1024, max new tokens
     27,648, ppo_n_minibatches 4, gradient checkpointing, recomputed old log-probs, kl_ctl 0 (no reference
     pass), weights to SGLang via update_weights_from_disk (realhf/impl/model/backend/sglang.py at v0.3.0)
     -> weightSync disk; asynchronous: max_head_offpolicyness 4 -> staleness 4 with partial (interruptible)
     rollout.
R-d  SimpleRL-Zoo: batch, lengths and setup from its README and train_grpo_math_tune_ray.sh at 9b928d4
     (train_batch_size 1024, n 8, max_response 8192, script default max_prompt 1024, ppo_mini_batch 256 ->
     4 mini-batches, use_kl_loss=True -> reference pass, gradient checkpointing, FSDP without sequence
     parallelism, ppo_micro_batch_size_per_gpu 2, vLLM gpu_memory_utilization 0.75, max_num_batched_tokens =
     prompt + response + 1000, rollout TP 2 / 8); no mean response length is stated: max_response / 4 = 2,048
     (the rule docs/calibration.md already uses for the 30B row).
R-e  anything else unknown: the framework's documented default at the cited commit, or the twin's default where
     the framework has none, named per row (verl: vLLM gpu_memory_utilization 0.5, max_num_seqs 1024,
     max_num_batched_tokens 8192, ppo_mini_batch_size 256, ppo_max_token_len_per_gpu 16384, gradient
     checkpointing on as in every verl example; the mean response length of rows without one: max / 4).
R-f  rows the twin cannot represent (twin_unsupported) are run where an architecture exists (reported, never in
     headline medians, never fitted on); rows whose model the twin has no architecture for (Gated-DeltaNet
     hybrids) are reported as "not run".
Modes: colocated_sync -> colocated, staleness 0; one_step_off -> disaggregated, staleness 1, no partial rollout;
fully_async -> disaggregated, partial rollout, staleness = max(1, ceil(staleness_threshold)) and
async.staleFraction = staleness_threshold for verl; AReaL max_head_offpolicyness -> staleness;
disaggregated_sync -> disaggregated, staleness 0. use_rollout_log_probs -> scenario rollout_logprobs.
FSDP/FSDP2 -> scenario fsdp, Ulysses SP as trainer cp.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import yaml

from bench import calibrate
from bench.paths import DATA, ROOT
from rltune.api.models import ModelArch, RLConfig, TaskSpec
from rltune.twin import Infeasible, efficiency, simulate_step_breakdown
from rltune.twin.simulate import _cached_step
from rltune.twin.workload import sample_episodes

YAML_PATH = DATA / "published_steps.yaml"
HEADLINE_KINDS = ("step", "mean_step_from_total")

# ------------------------------------------------------------------------------ architectures (HF config.json)
# https://huggingface.co/deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B/blob/main/config.json (the Qwen2.5-1.5B
# shape: hidden 1536, 28 layers, 12 heads, 2 KV heads, intermediate 8960, vocab 151936)
R1_DISTILL_QWEN_1_5B = ModelArch(
    name="deepseek-r1-distill-qwen-1.5b", layers=28, hidden=1536, heads=12, kv_heads=2, ffn=8960, vocab=151936
)
# https://huggingface.co/Qwen/Qwen2.5-14B/blob/main/config.json (48 layers, 40 heads, 8 KV heads)
QWEN25_14B = ModelArch(name="qwen2.5-14b", layers=48, hidden=5120, heads=40, kv_heads=8, ffn=13824, vocab=152064)
# https://huggingface.co/Qwen/Qwen2.5-32B/blob/main/config.json (64 layers, 40 heads, 8 KV heads)
QWEN25_32B = ModelArch(name="qwen2.5-32b", layers=64, hidden=5120, heads=40, kv_heads=8, ffn=27648, vocab=152064)
# https://huggingface.co/deepseek-ai/deepseek-llm-7b-chat/blob/main/config.json (LLaMA shape, MHA)
DEEPSEEK_LLM_7B = ModelArch(
    name="deepseek-llm-7b", layers=30, hidden=4096, heads=32, kv_heads=32, ffn=11008, vocab=102400
)
ARCHS = {
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B": R1_DISTILL_QWEN_1_5B,
    "Qwen/Qwen2.5-14B": QWEN25_14B,
    "Qwen/Qwen2.5-32B": QWEN25_32B,
    "deepseek-ai/deepseek-llm-7b-chat": DEEPSEEK_LLM_7B,
}

# YAML ids whose run is exactly a calibrate.py row (rule R-b); calibrate's row name in the comment.
CALIBRATE_TWINS = {
    "verl-fa-7b-colocate-32": "Qwen2.5-Math-7B DAPO 28k colocated 32xH20",
    "verl-fa-7b-colocate-64": "Qwen2.5-Math-7B DAPO 28k colocated 64xH20",
    "verl-fa-7b-colocate-128": "Qwen2.5-Math-7B DAPO 28k colocated 128xH20",
    "verl-fa-7b-async-64-64": "same, fully async 64:64 (staleness 0.5, partial rollout)",
    "verl-fa-7b-async-32-32": "same, fully async 32:32",
    "verl-fa-7b-async-16-16": "same, fully async 16:16",
    "verl-osp-7b-megatron-colocate-16": "Qwen2.5-Math-7B DAPO 8k colocated 16xH20 (vLLM+Megatron)",
    "verl-osp-7b-megatron-onestepoff-4-12": "same, one-step-off 4 rollout : 12 train GPUs",
    "verl-osp-7b-fsdp2-colocate-16": "Qwen2.5-Math-7B DAPO 20k colocated 16xH20 (vLLM+FSDP2)",
    "verl-fa-30b-colocate-128": "Qwen3-30B-A3B GRPO 8k colocated 128xH20",
    "verl-sync-30b-16-16-ckpt-engine": "Qwen3-30B-A3B 16->16 ranks",
    "verl-sync-235b-64-64-ckpt-engine": "Qwen3-235B-A22B 64->64 ranks",
    "slime-glm4.5-355b-sync-bf16": "GLM-4.5-355B BF16 sync",
}
# calibrate rows that are not in the published dataset (kept in every fit)
CALIBRATE_NAMES_IN_DATASET = set(CALIBRATE_TWINS.values())

# published phase metric -> twin phase (synchronous steps; fully-async/one-step-off "gen" is the trainer's wait)
PHASES_SYNC = {
    "gen_s": "generation",
    # verl's timing_s/generate_sequences: the engine's generation alone (gen also counts the rollout's
    # wake-up, sleep and reward); in one-step-off runs it is the rollout GPUs' generation
    "generate_sequences_s": "generation",
    "rollout_s": "generation",
    "old_log_prob_s": "old_logprob",
    "prev_logprob_s": "old_logprob",
    "ref_s": "ref_logprob",
    "update_actor_s": "training",
    "training_s": "training",
    "policy_train_s": "training",
    "train_s": "training",
}
PHASES_ASYNC = {**PHASES_SYNC, "gen_s": "waiting", "wait_prev_gen_s": "waiting"}


@dataclass
class Built:
    """One YAML row, its twin inputs and its calibrate.Row (None when the twin cannot run it)."""

    id: str
    source: str
    split: str
    hardware: str
    gpus: Optional[int]
    mode: str
    kind: str
    precision: str
    doubtful: bool
    unsupported: list
    metrics: dict  # published metric -> value (the ones the twin is scored on)
    assumptions: list
    row: Optional[calibrate.Row] = None
    not_run: Optional[str] = None
    inputs: Optional[dict] = None  # model, task, gpu, gpn, cfg, scenario (step rows)
    refused: dict = field(default_factory=dict)  # scenario key -> Infeasible reason

    @property
    def headline(self) -> bool:
        return self.kind in HEADLINE_KINDS and not self.unsupported and self.row is not None


# ------------------------------------------------------------------------------ YAML


def load(path: Path = YAML_PATH) -> dict:
    return yaml.safe_load(path.read_text())


def split_of(data: dict) -> dict[str, str]:
    sp = data["split"]
    out = {s: "fit" for s in sp["fit"]}
    out.update({s: "held_out" for s in sp["held_out"]})
    return out


# ------------------------------------------------------------------------------ twin inputs per row


def twin_inputs(r: dict) -> tuple[TaskSpec, dict, dict, list[str]]:
    """(task, RLConfig dict, scenario, assumptions) of a step or throughput row: its `twin` block as the
    YAML writes it (the file's header), bench/calibrate.py's constants named there resolved."""
    t = r["twin"]
    task = getattr(calibrate, t["task"]) if isinstance(t["task"], str) else TaskSpec(**t["task"])
    cfg, scn = (calibrate.layered(*(x if isinstance(x, list) else [x])) for x in (t["config"], t["scenario"]))
    return task, cfg, scn, list(t["assumptions"])


def _step_run(inp: dict, metrics: dict, phase_map: dict, refused: dict, kind: str) -> Callable[[dict], dict]:
    model, task, gpu, gpn, cfg, scn = inp["model"], inp["task"], inp["gpu"], inp["gpn"], inp["cfg"], inp["scenario"]

    def run(hw_scn: dict) -> dict:
        try:
            c = RLConfig.model_validate(cfg)
            b = simulate_step_breakdown(model, task, gpu, gpn, c, {**hw_scn, **scn})
        except Infeasible as e:
            refused[json.dumps(hw_scn, sort_keys=True)] = str(e)
            return {k: math.nan for k in metrics}
        if kind == "throughput":
            eff = efficiency.efficiency(gpu, {**hw_scn, **scn})
            tokens = float(np.sum(sample_episodes(task, eff, None).seq_lens()))
            return {"throughput_tokens_per_gpu_s": tokens / (b["duration"] * c.gpus)}
        out = {}
        for k in metrics:
            out[k] = b["duration"] if k == "step_s" else b["phases"][phase_map[k]]
        return out

    return run


def build(data: Optional[dict] = None) -> list[Built]:
    data = data or load()
    splits = split_of(data)
    out = []
    for r in data["rows"]:
        src = r["source"]
        hw = r.get("hardware")
        kind = r["metric_kind"]
        unsupported = list(r.get("twin_unsupported") or [])
        bt = Built(
            id=r["id"],
            source=src,
            split=splits[src],
            hardware=hw or "not stated",
            gpus=r.get("gpus"),
            mode=r["mode"],
            kind=kind,
            precision=r.get("precision", ""),
            doubtful=bool(r.get("doubtful")),
            unsupported=unsupported,
            metrics={},
            assumptions=[],
        )
        out.append(bt)
        model_known = bool(r.get("twin_preset")) or r["model"] in ARCHS
        if kind == "weight_sync":
            sync = r["twin"]["sync"]
            if not hw:  # the GPU the twin assumes (rule R-b)
                hw = sync["gpu"]
                bt.hardware = f"{hw} (assumed)"
            model = getattr(calibrate, sync["model"]) if "model" in sync else calibrate.preset(r["twin_preset"])
            fp8 = sync.get("fp8", False)
            run = calibrate.sync_row(model, hw, sync["ranks"], sync["method"], fp8=fp8, metric="weight_sync_s")
            bt.assumptions += r["twin"]["assumptions"]
            bt.metrics = {"weight_sync_s": float(r["metrics"]["weight_sync_s"])}
        elif not model_known:
            bt.not_run = "no twin architecture for this model (" + "; ".join(unsupported or ["no preset"]) + ")"
            if "step_s" in (r.get("metrics") or {}):
                bt.metrics = {"step_s": float(r["metrics"]["step_s"])}
            bt.assumptions.append("R-f")
            continue
        else:
            model = calibrate.preset(r["twin_preset"]) if r.get("twin_preset") else ARCHS[r["model"]]
            task, cfg, scn, A = twin_inputs(r)
            bt.assumptions += A
            bt.inputs = dict(model=model, task=task, gpu=hw, gpn=r.get("gpus_per_node") or 8, cfg=cfg, scenario=scn)
            asyncish = r["mode"] in ("fully_async", "one_step_off")
            pmap = PHASES_ASYNC if asyncish else PHASES_SYNC
            if kind == "throughput":
                bt.metrics = {"throughput_tokens_per_gpu_s": float(r["metrics"]["throughput_tokens_per_gpu_s"])}
            else:
                bt.metrics = {"step_s": float(r["metrics"]["step_s"])}
                for k, v in r["metrics"].items():
                    if k in pmap and v:  # a published 0.0 cannot carry a relative error
                        bt.metrics[k] = float(v)
            run = _step_run(bt.inputs, bt.metrics, pmap, bt.refused, kind)
        # H800 is fitted and predicted with H100's factors (same die): the Row's hardware is the factor family.
        fam = "H100" if hw == "H800" else hw
        bt.row = calibrate.Row(src, bt.id, fam, dict(bt.metrics), run, "; ".join(bt.assumptions))
    return out


# ------------------------------------------------------------------------------ fitting


def fold_fit_rows(built: list[Built], exclude_sources: set[str], base: Optional[list] = None) -> list[calibrate.Row]:
    """The rows a fit may see: calibrate's rows outside this dataset + published rows of other sources.

    twin_unsupported rows and rows the twin cannot run are never fitted on (rule R-f)."""
    base = [r for r in calibrate.ALL_ROWS if r.name not in CALIBRATE_NAMES_IN_DATASET] if base is None else base
    rows = list(base)
    for b in built:
        if b.row is None or b.unsupported or b.source in exclude_sources:
            continue
        rows.append(b.row)
    return rows


_FIT_CACHE: dict[tuple, dict] = {}


def fit_factors(rows: list[calibrate.Row], rounds: int = 2) -> dict[str, dict]:
    """calibrate.fit per hardware family, cached on (hardware, row names, rounds)."""
    out: dict[str, dict] = {}
    for hw in calibrate.FIT_KEYS:
        hw_rows = [r for r in rows if r.hw == hw]
        if not hw_rows:
            continue
        key = (hw, tuple(sorted(r.name for r in hw_rows)), rounds)
        if key not in _FIT_CACHE:
            _cached_step.cache_clear()
            _FIT_CACHE[key] = calibrate.fit(hw_rows, rounds=rounds).get(hw, {})
        out[hw] = _FIT_CACHE[key]
    return out


def predict(b: Built, overrides: dict[str, dict]) -> dict:
    if b.row is None:
        return {}
    return b.row.run(overrides.get(b.row.hw, {}))


def err_pct(pub: float, pred: float) -> float:
    """Signed relative error in percent: (twin - published) / published."""
    return (pred - pub) / pub * 100.0


# ------------------------------------------------------------------------------ scoring


def _med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else math.nan


def summarize(built: list[Built], preds: dict[str, dict], select: Callable[[Built], bool]) -> dict:
    rows = [b for b in built if select(b) and b.id in preds and "step_s" in preds[b.id]]
    errs = [(b, err_pct(b.metrics["step_s"], preds[b.id]["step_s"])) for b in rows]
    ok = [(b, e) for b, e in errs if e == e]
    a = [abs(e) for _, e in ok]
    nd = [abs(e) for b, e in ok if not b.doubtful]
    return dict(
        rows=len(ok),
        refused=len(errs) - len(ok),
        sources=len({b.source for b, _ in ok}),
        median=_med(a),
        max=max(a) if a else math.nan,
        median_no_doubtful=_med(nd),
        rows_no_doubtful=len(nd),
    )


def metric_errors(built: list[Built], preds: dict[str, dict], metric: str, select=lambda b: True) -> list[float]:
    out = []
    for b in built:
        if select(b) and metric in b.metrics and b.id in preds and metric in preds[b.id]:
            p = preds[b.id][metric]
            if p == p:
                out.append(err_pct(b.metrics[metric], p))
    return out


def phase_errors(built: list[Built], preds: dict[str, dict], select=lambda b: True) -> dict[str, dict]:
    out: dict[str, list] = {}
    for b in built:
        if not select(b) or b.kind not in HEADLINE_KINDS or b.unsupported:
            continue
        for k, v in b.metrics.items():
            if k == "step_s" or b.id not in preds:
                continue
            p = preds[b.id].get(k, math.nan)
            if p == p:
                out.setdefault(k, []).append(abs(err_pct(v, p)))
    return {k: dict(n=len(v), median=_med(v), max=max(v)) for k, v in sorted(out.items())}


def headline(b: Built) -> bool:
    return b.headline


# ------------------------------------------------------------------------------ the run


def twin_cpu_ms(built: list[Built]) -> dict:
    """Uncached twin CPU time per row's step. A process's first step also loads the compiled engine
    loop (numba's on-disk cache, or compiles it, ~0.25 s): a one-off cost, run untimed first
    (`first_call`) so that whichever row comes first does not carry it."""

    def one(i: dict) -> float:
        c = RLConfig.model_validate(i["cfg"])
        _cached_step.cache_clear()
        t0 = time.perf_counter()
        try:
            simulate_step_breakdown(i["model"], i["task"], i["gpu"], i["gpn"], c, i["scenario"])
        except Infeasible:
            pass
        return (time.perf_counter() - t0) * 1000.0

    runnable = [b.inputs for b in built if b.inputs is not None]
    first = one(runnable[0]) if runnable else math.nan
    times = [one(i) for i in runnable]
    return dict(n=len(times), median=_med(times), max=max(times) if times else math.nan, first_call=first)


def run_all(do_fit: bool = True, folds: bool = False, fold_rounds: int = 2, log=print) -> dict:
    t0 = time.time()
    data = load()
    built = build(data)
    sp = data["split"]

    def say(msg: str) -> None:
        log(f"[bench.published {time.time() - t0:6.1f}s] {msg}")

    _cached_step.cache_clear()
    shipped = {b.id: predict(b, {}) for b in built}
    say(f"shipped factors: {len(built)} rows")
    res = dict(built=built, shipped=shipped, fitted=None, loso=None, factors={}, fold_factors={})
    if do_fit:
        say("fitting on calibrate's non-RL rows + the fit sources' rows")
        fit_rows = fold_fit_rows(built, set(sp["held_out"]))
        ov = fit_factors(fit_rows)
        res["factors"] = ov
        _cached_step.cache_clear()
        res["fitted"] = {b.id: predict(b, ov) for b in built}
        say(f"fitted: {ov}")
    if folds:
        loso: dict[str, dict] = {}
        for i, s in enumerate(sp["leave_one_source_out"], 1):
            say(f"fold {i}/{len(sp['leave_one_source_out'])}: leave out {s}")
            ov = fit_factors(fold_fit_rows(built, {s}), rounds=fold_rounds)
            res["fold_factors"][s] = ov
            _cached_step.cache_clear()
            for b in built:
                if b.source == s:
                    loso[b.id] = predict(b, ov)
        res["loso"] = loso
    res["cpu"] = twin_cpu_ms(built)
    say("done")
    return res


def _fmt(x: float, spec: str = ".1f") -> str:
    return "n/a" if x is None or x != x else format(x, spec)


def report(res: dict) -> tuple[str, dict]:
    """Markdown report + stats (JSON-able) of a run_all() result."""
    built: list[Built] = res["built"]
    shipped, fitted, loso = res["shipped"], res["fitted"], res["loso"]
    fit_src = lambda b: b.split == "fit"  # noqa: E731
    held = lambda b: b.split == "held_out"  # noqa: E731
    sets: list[tuple[str, dict, Callable]] = [
        ("shipped factors, all sources", shipped, headline),
        ("shipped factors, fit sources", shipped, lambda b: headline(b) and fit_src(b)),
        ("shipped factors, held-out sources", shipped, lambda b: headline(b) and held(b)),
    ]
    if fitted is not None:
        sets += [
            ("in-sample (fitted on fit sources)", fitted, lambda b: headline(b) and fit_src(b)),
            ("held-out (same factors)", fitted, lambda b: headline(b) and held(b)),
        ]
    if loso is not None:
        sets.append(("leave-one-source-out (pooled folds)", loso, headline))
    stats: dict = dict(sets={}, per_source={}, separate={}, phases={}, rows=[], cpu_ms=res["cpu"])
    lines = [
        "| set | rows | sources | median abs err % | max abs err % | median without doubtful (rows) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, preds, sel in sets:
        s = summarize(built, preds, sel)
        stats["sets"][name] = s
        ref = f", {s['refused']} refused" if s["refused"] else ""
        lines.append(
            f"| {name} | {s['rows']}{ref} | {s['sources']} | {_fmt(s['median'])} | {_fmt(s['max'])} | "
            f"{_fmt(s['median_no_doubtful'])} ({s['rows_no_doubtful']}) |"
        )
    summary = "\n".join(lines)

    # per source
    best = loso if loso is not None else None
    src_lines = [
        "| source | split | headline rows | shipped median % | fitted median % | LOSO median % |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for s in dict.fromkeys(b.source for b in built):
        sel = lambda b, s=s: headline(b) and b.source == s  # noqa: E731
        n = sum(1 for b in built if sel(b))
        sh = summarize(built, shipped, sel)
        fi = summarize(built, fitted, sel) if fitted is not None else None
        lo = summarize(built, best, sel) if best is not None else None
        split = next(b.split for b in built if b.source == s)
        stats["per_source"][s] = dict(split=split, rows=n, shipped=sh, fitted=fi, loso=lo)
        src_lines.append(
            f"| {s} | {split} | {n} | {_fmt(sh['median'])} | {_fmt(fi['median']) if fi else '-'} | "
            f"{_fmt(lo['median']) if lo else '-'} |"
        )
    per_source = "\n".join(src_lines)

    # reported separately
    sep_lines = ["| group | factors | numbers | median abs err % | max abs err % |", "|---|---|---:|---:|---:|"]
    groups = [
        ("throughput (tokens/GPU/s)", "throughput_tokens_per_gpu_s", lambda b: b.kind == "throughput"),
        ("weight sync", "weight_sync_s", lambda b: b.kind == "weight_sync"),
        ("twin_unsupported steps", "step_s", lambda b: b.kind in HEADLINE_KINDS and bool(b.unsupported)),
    ]
    for label, metric, sel in groups:
        for fname, preds in (("shipped", shipped), ("fitted", fitted)):
            if preds is None:
                continue
            e = [abs(x) for x in metric_errors(built, preds, metric, sel)]
            stats["separate"][f"{label} / {fname}"] = dict(n=len(e), median=_med(e), max=max(e) if e else math.nan)
            sep_lines.append(f"| {label} | {fname} | {len(e)} | {_fmt(_med(e))} | {_fmt(max(e) if e else math.nan)} |")
    separate = "\n".join(sep_lines)

    ph_lines = ["| phase | factors | numbers | median abs err % | max abs err % |", "|---|---|---:|---:|---:|"]
    for fname, preds in (("shipped", shipped), ("fitted", fitted)):
        if preds is None:
            continue
        pe = phase_errors(built, preds)
        stats["phases"][fname] = pe
        for k, v in pe.items():
            ph_lines.append(f"| {k} | {fname} | {v['n']} | {_fmt(v['median'])} | {_fmt(v['max'])} |")
    phases = "\n".join(ph_lines)

    # per row
    row_lines = [
        "| id | source | split | hardware | GPUs | mode | published step s | twin step s (shipped) | err % shipped "
        "| err % fitted | err % LOSO | phase errors % (fitted) | assumptions |",
        "|---|---|---|---|---:|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for b in built:
        pub_metric = next(iter(b.metrics), None)
        pub = b.metrics.get(pub_metric) if pub_metric else None

        def e(preds, m=pub_metric, b=b):
            if preds is None or b.id not in preds or m not in preds[b.id]:
                return math.nan
            return err_pct(b.metrics[m], preds[b.id][m])

        sh_v = shipped.get(b.id, {}).get(pub_metric, math.nan) if pub_metric else math.nan
        phs = []
        src_preds = fitted if fitted is not None else shipped
        for k, v in b.metrics.items():
            if k == pub_metric:
                continue
            p = src_preds.get(b.id, {}).get(k, math.nan)
            phs.append(f"{k.removesuffix('_s')} {_fmt(err_pct(v, p), '+.0f')}")
        flags = []
        if b.unsupported:
            flags.append("twin_unsupported: " + ", ".join(b.unsupported))
        if b.doubtful:
            flags.append("doubtful")
        if b.precision and b.precision != "exact":
            flags.append(b.precision)
        if b.not_run:
            flags.append("not run: " + b.not_run)
        if b.refused:
            flags.append("twin refuses: " + next(iter(b.refused.values())))
        label = "" if pub_metric == "step_s" else f" ({pub_metric})"
        ent = dict(
            id=b.id,
            source=b.source,
            split=b.split,
            hardware=b.hardware,
            gpus=b.gpus,
            mode=b.mode,
            kind=b.kind,
            headline=b.headline,
            doubtful=b.doubtful,
            unsupported=b.unsupported,
            metric=pub_metric,
            published=pub,
            twin_shipped=sh_v,
            err_shipped=e(shipped),
            err_fitted=e(fitted),
            err_loso=e(loso),
            phases={
                k: dict(published=v, twin=src_preds.get(b.id, {}).get(k))
                for k, v in b.metrics.items()
                if k != pub_metric
            },
            assumptions=b.assumptions,
            flags=flags,
            not_run=b.not_run,
            refused=sorted(set(b.refused.values())),
        )
        stats["rows"].append(ent)
        row_lines.append(
            f"| {b.id} | {b.source} | {b.split} | {b.hardware} | {b.gpus or '-'} | {b.mode} | "
            f"{_fmt(pub, ',.2f') if pub is not None else '-'}{label} | {_fmt(sh_v, ',.2f')} | "
            f"{_fmt(e(shipped), '+.1f')} | {_fmt(e(fitted), '+.1f')} | {_fmt(e(loso), '+.1f')} | {', '.join(phs)} | "
            f"{'; '.join(b.assumptions + flags)} |"
        )
    rows = "\n".join(row_lines)

    fac = ""
    if res.get("factors"):
        fac = "\n\nFactors fitted on the fit sources (+ calibrate's non-RL rows): " + json.dumps(res["factors"])
    if res.get("fold_factors"):
        stats["fold_factors"] = res["fold_factors"]
    stats["factors"] = res.get("factors", {})
    cpu = res["cpu"]
    md = f"""### Published RL steps (bench/data/published_steps.yaml) through the twin

Generated by `PYTHONPATH=operator python -m bench.published` (`make bench-published`). Error = (twin -
published) / published. Headline: `step` and `mean_step_from_total` rows without `twin_unsupported`, on the
step time; doubtful rows stay in, and the median without them is shown too. The split (fit / held-out
sources) is the YAML's, fixed before fitting; a fold's factors never see the left-out source's rows.
Twin CPU time per step (uncached, one core): median {_fmt(cpu["median"])} ms, max {_fmt(cpu["max"])} ms over
{cpu["n"]} rows, after one untimed warm-up step (a process's first step also loads the compiled engine loop).{fac}

{summary}

Per source (headline rows):

{per_source}

Reported separately:

{separate}

Phases (scored per phase, never folded into step error; async "gen" = the trainer's wait = twin `waiting`):

{phases}

Rows (err % fitted: in-sample for fit sources, held-out for held-out sources):

{rows}

Assumption rules (decided before any held-out error was seen; the row's column names the ones it used):
{chr(10).join("- " + ln.strip() for ln in _rules())}
"""
    stats["rules"] = _rules()
    return md, stats


def _rules() -> list[str]:
    doc = __doc__.split("Assumption rules, decided", 1)[1].split("\n", 1)[1]
    items, cur = [], ""
    for ln in doc.splitlines():
        if ln.startswith(("R-", "Modes:")):
            if cur:
                items.append(cur)
            cur = ln
        elif ln.strip():
            cur += " " + ln.strip()
    if cur:
        items.append(cur)
    return items


def _jsonable(x):
    if isinstance(x, float):
        return None if x != x else round(x, 4)
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


DOC = ROOT / "docs" / "calibration.md"
BEGIN = "<!-- bench.published: begin (generated, do not edit) -->"
END = "<!-- bench.published: end -->"


def embed(md: str, path: Path = DOC) -> None:
    """Put the report into docs/calibration.md between the markers (before '## Summary' the first
    time); bench/calibrate.py keeps the block when it rewrites the rest of the page."""
    text = path.read_text() if path.exists() else "# Twin calibration\n\n## Summary\n"
    block = f"{BEGIN}\n{md.strip()}\n{END}"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + block + rest.split(END, 1)[1]
    elif "## Summary" in text:
        head, rest = text.split("## Summary", 1)
        text = head + block + "\n\n## Summary" + rest
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-fit", action="store_true", help="shipped factors only (fast)")
    ap.add_argument("--folds", action="store_true", help="also run the leave-one-source-out folds")
    ap.add_argument("--fold-rounds", type=int, default=2, help="coordinate-search rounds per fold fit")
    ap.add_argument("--out", default=str(ROOT / "out"))
    ap.add_argument("--write-doc", action="store_true", help=f"embed the report in {DOC.relative_to(ROOT)}")
    a = ap.parse_args(argv)
    res = run_all(
        do_fit=not a.no_fit,
        folds=a.folds and not a.no_fit,
        fold_rounds=a.fold_rounds,
        log=lambda m: print(m, file=sys.stderr, flush=True),
    )
    md, stats = report(res)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench-published.md").write_text(md)
    (out / "bench-published.json").write_text(json.dumps(_jsonable(stats), indent=1, sort_keys=True))
    print(md)
    for name, s in stats["sets"].items():
        print(
            f"{name:40s} n={s['rows']:2d} sources={s['sources']} median {_fmt(s['median'])}% max {_fmt(s['max'])}% "
            f"(without doubtful {_fmt(s['median_no_doubtful'])}%)",
            file=sys.stderr,
        )
    print(f"wrote {out / 'bench-published.md'} and {out / 'bench-published.json'}", file=sys.stderr)
    if a.write_doc:
        embed(md)
        print(f"embedded the report in {DOC}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
