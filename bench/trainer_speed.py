"""How fast an FSDP-style trainer (transformers' Qwen2 in bf16 autocast, as verl's FSDP workers run
it) trains per token on a real GPU, by model size, against the digital twin's training time for the
same batch (issue 14: the twin's training side on published FSDP rows of small models).

    PYTHONPATH=operator python3 -m bench.trainer_speed [--shapes 0.5b,1.5b,3b,7b] [--seq 2048]
        [--seqs 16] [--mbt 4096] [--repeats 3] [--out out/trainer-speed.json]
    PYTHONPATH=operator python3 -m bench.trainer_speed --points bench/data/trainer-speed-h200/*.json

Runs rltune's own reference trainer functions (rltune.grpo.loop.old_logprobs and ppo_update, the
code a real-mode trial runs) on `--seqs` random sequences of `--seq` tokens (no padding), micro-batched
to `--mbt` tokens, after one untimed warm-up step; the median of `--repeats` timed steps. Each shape is
run twice: with its real vocabulary and with a 4,096-token one, so the vocabulary's share (LM head
GEMM plus the fp32 log-probabilities over it) shows apart from the layers'. One extra step per shape
runs under torch.profiler and splits the GPU time into GEMMs, attention and the rest (element-wise
and reduction kernels: memory-bound work whose time follows bytes, not FLOPs).
Shapes the GPU cannot train (7B: fp32 master weights, grads and Adam state alone are 122 GB) are
timed forward-only and say so. `--points` re-prints saved runs next to the current twin, and fits
the element-wise bytes the twin's FSDP trainer takes (rltune.twin.efficiency: eager_fwd_bytes,
eager_train_bytes), the attention kernels' speed by sequence length (attn_fwd_ratio, attn_bwd_ratio,
attn_half_len) and the forward passes' GEMM rate (fwd_ratio) over them.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from bench.paths import DATA, ROOT
from bench.trainer_memory import PROMPT, SHAPES
from rltune.api.models import ModelArch, RLConfig
from rltune.grpo.loop import micro_batches, old_logprobs, ppo_update, trainer_allocator
from rltune.grpo.model import build_trainer_model, qwen2_config

SMALL_VOCAB = 4096
GPU_TYPE = "H200"
TRACKED = DATA / "trainer-speed-h200"  # the H200 runs the twin's trainer constants were fitted on


@dataclass
class Point:
    shape: str
    vocab: int
    params: float  # parameters of the model as built (untied LM head)
    tokens: int
    fwd_s: Optional[float]  # old_logprobs over the batch (no grad)
    train_s: Optional[float]  # ppo_update: forward + backward + AdamW step; None = out of memory
    profile: dict = field(default_factory=dict)  # per pass ("fwd", "train"): GPU ms per kernel name


def arch_of(shape: str, vocab: int) -> ModelArch:
    """The Qwen2.5 shape of SHAPES with `vocab` tokens."""
    return ModelArch.model_validate({"name": shape, "dtype": "bf16", **{**SHAPES[shape], "vocab": vocab}})


def token_layer_hidden(p: Point) -> float:
    """A point's tokens x layers x hidden units: what element-wise bytes are counted per."""
    return p.tokens * SHAPES[p.shape]["layers"] * SHAPES[p.shape]["hidden"]


def twin_bandwidth() -> float:
    """The twin's achieved HBM bandwidth on GPU_TYPE (bytes/s): the unit of the eager bytes."""
    from rltune.api.hardware import gpu as gpu_spec
    from rltune.twin.efficiency import efficiency

    return gpu_spec(GPU_TYPE).hbm_bw * efficiency(GPU_TYPE).hbm


def load_runs(paths) -> list[tuple[list[Point], dict]]:
    """Saved runs (the JSON `main` writes) as (points, the run's settings)."""
    runs = [json.loads(Path(f).read_text()) for f in paths]
    return [([Point(**p) for p in r["points"]], r) for r in runs]


def tracked_runs() -> list[tuple[list[Point], dict]]:
    return load_runs(sorted(TRACKED.glob("*.json")))


def kernel_class(name: str) -> str:
    n = name.lower()
    if "flash" in n or "fmha" in n or "attention" in n or "sdpa" in n:
        return "attention"
    if any(k in n for k in ("gemm", "xmma", "cutlass", "cublas", "matmul", "nvjet", "sm90_")):
        return "gemm"
    return "other"


def _profiled(fn) -> dict:
    """GPU milliseconds of one call per kernel name (torch.profiler, CUDA activity only)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    out: dict[str, float] = {}
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None)
        if t is None:
            t = getattr(ev, "cuda_time_total", 0.0)
        if getattr(ev, "device_type", None) is not None and str(ev.device_type).endswith("CPU"):
            continue
        out[ev.key] = out.get(ev.key, 0.0) + t / 1000.0
    return out


def gpu_seconds(kernels: dict) -> float:
    """GPU time of a profiled pass: the sum of its kernels (what the twin models; the wall time adds
    Python's dispatch where the GPU waits on it)."""
    return sum(kernels.values()) / 1000.0


def by_class(kernels: dict) -> dict:
    out = {"gemm": 0.0, "attention": 0.0, "other": 0.0}
    for name, ms in kernels.items():
        out[kernel_class(name)] += ms
    return out


def measure(
    shape: str, vocab: int, seq: int, nseq: int, mbt: int, repeats: int, profile: bool, recompute: bool, log=print
) -> Point:
    import torch

    trainer_allocator()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    arch = arch_of(shape, vocab)
    cfg = qwen2_config(arch, seq + 8)
    torch.manual_seed(0)
    with dev:
        model = build_trainer_model(cfg).to(dev)
    model.train()
    if recompute:  # gradient checkpointing, as every verl example enables it: the backward redoes the forward
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    params = float(sum(p.numel() for p in model.parameters()))
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(4, vocab, (seq,), generator=g).tolist() for _ in range(nseq)]
    starts = [PROMPT] * nseq
    groups = micro_batches([seq] * nseq, mbt)
    adv = [(-1.0) ** i for i in range(nseq)]
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    def fwd():
        return old_logprobs(model, seqs, starts, groups, dev)

    fwd()
    sync()
    fwd_t = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        old = fwd()
        sync()
        fwd_t.append(time.perf_counter() - t0)
    prof: dict = {}
    if profile and dev.type == "cuda":
        prof["fwd"] = _profiled(fwd)
    train_t: list[float] = []
    try:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0, betas=(0.9, 0.99))

        def train():
            ppo_update(model, opt, seqs, starts, groups, old, adv, dev)

        train()
        sync()
        for _ in range(repeats):
            t0 = time.perf_counter()
            train()
            sync()
            train_t.append(time.perf_counter() - t0)
        if profile and dev.type == "cuda":
            prof["train"] = _profiled(train)
    except torch.cuda.OutOfMemoryError:
        train_t = []
    pt = Point(
        shape,
        vocab,
        params,
        seq * nseq,
        statistics.median(fwd_t),
        statistics.median(train_t) if train_t else None,
        prof,
    )
    log(
        f"{shape} vocab {vocab}: {pt.tokens} tokens, forward {pt.fwd_s:.3f} s, "
        f"train {'out of memory' if pt.train_s is None else f'{pt.train_s:.3f} s'} "
        f"{ {k: {c: round(v, 1) for c, v in by_class(d).items()} for k, d in prof.items()} }"
    )
    return pt  # the model goes with this frame; main() empties the CUDA cache


def twin_seconds(
    shape: str, vocab: int, seq: int, nseq: int, mbt: int, forward_only: bool = False, recompute: str = "none"
):
    """The twin's (forward log-prob pass, update) seconds for the same batch on one GPU_TYPE, as an
    FSDP trainer with `recompute`, one optimizer step (scenario fsdp, mini_batches 1); with
    `forward_only`, the forward pass alone of a GPU with room for any state (the twin's memory check
    is the update's)."""
    from rltune.twin.efficiency import efficiency
    from rltune.twin.training import train_cost

    arch = arch_of(shape, vocab)
    cfg = RLConfig.model_validate(
        {"gpus": 1, "trainer": {"tp": 1, "pp": 1, "microBatchTokens": mbt, "recompute": recompute}}
    )
    eff = efficiency(GPU_TYPE, {"fsdp": True, "mini_batches": 1})
    if forward_only:  # with offload the state fits; its forward then also uploads the bf16 weights once
        cfg = cfg.model_copy(update={"trainer": cfg.trainer.model_copy(update={"offload": True})})
        fwd = train_cost(arch, np.full(nseq, seq), GPU_TYPE, 1, 1, cfg, eff, reference=False).old_logprob
        return fwd - arch.params()[0] * 2.0 / eff.pcie_bw
    tc = train_cost(arch, np.full(nseq, seq), GPU_TYPE, 1, 1, cfg, eff, reference=False)
    return tc.old_logprob, tc.training


@dataclass
class EagerBytes:
    """Element-wise GPU time of a pass as HBM bytes at the twin's H200 bandwidth: per token x layer x
    hidden unit (the layers' normalisations, rotary, SwiGLU and residual kernels) and per parameter
    per micro-batch (autocast's bf16 weight copies; in the update also the fp32 gradient adds)."""

    pass_: str
    per_token_layer_hidden: float
    per_param_microbatch: float
    fit: list[float]  # fitted / measured element-wise time of each point


def eager_bytes(runs: list[tuple[list[Point], int]]) -> list[EagerBytes]:
    """Least squares of the profiled non-GEMM, non-attention GPU time of the small-vocabulary points
    (their LM head and log-probabilities are negligible, so what remains is the layers') on
    tokens x layers x hidden and parameters x micro-batches, over every run (list of (points, mbt))."""
    bw = twin_bandwidth()
    out = []
    for name in ("fwd", "train"):
        x, y = [], []
        for points, mbt in runs:
            for p in points:
                if p.vocab != SMALL_VOCAB or name not in p.profile:
                    continue
                x.append([token_layer_hidden(p), p.params * max(1, p.tokens // mbt)])
                y.append(by_class(p.profile[name])["other"] / 1000.0)
        if len(y) < 2:
            continue
        a, b = np.array(x), np.array(y)
        coef = np.linalg.lstsq(a, b, rcond=None)[0]
        out.append(EagerBytes(name, float(coef[0] * bw), float(coef[1] * bw), [float(v) for v in a @ coef / b]))
    return out


def recompute_bytes(plain: list[Point], recomputed: list[Point]) -> dict[tuple[str, int], float]:
    """Per (shape, vocab) measured both ways on the same batch (two runs' points): the element-wise GPU
    time gradient checkpointing adds to the update, as HBM bytes per token x layer x hidden unit at the
    twin's H200 bandwidth (the twin adds eager_fwd_bytes: the backward redoes the forward's kernels)."""
    bw = twin_bandwidth()
    base = {(p.shape, p.vocab): p for p in plain if "train" in p.profile}
    out = {}
    for p in recomputed:
        q = base.get((p.shape, p.vocab))
        if q is None or "train" not in p.profile:
            continue
        extra = (by_class(p.profile["train"])["other"] - by_class(q.profile["train"])["other"]) / 1000.0
        out[(p.shape, p.vocab)] = extra * bw / token_layer_hidden(p)
    return out


@dataclass
class AttentionSpeed:
    """Flash-attention kernel speed as a fraction of the dense bf16 peak, by sequence length s:
    e(s) = e_max s / (s + half_len) for the forward and for the backward kernels. Summed over a
    batch, attention time is then 2 L d_q sum(s (s + half_len)) / (peak e_max): the kernels cost as
    if every token attended half_len more context tokens (rltune.twin.efficiency: attn_*)."""

    fwd_max: float
    bwd_max: float
    half_len: float
    fit: list[float]  # fitted / measured attention time of each point and pass


def attention_flops(p: Point, seq: int) -> float:
    """Causal attention FLOPs of one forward over a point's batch of `seq`-token sequences
    (QK^T and AV: 2 s^2 d_q per layer and sequence)."""
    sh = SHAPES[p.shape]
    return 2.0 * seq * seq * sh["heads"] * sh["headDim"] * sh["layers"] * (p.tokens // seq)


def attention_speed(runs: list[tuple[list[Point], dict]], head_dim: int = 128) -> AttentionSpeed:
    """Least squares of the profiled attention GPU time of every pass of every point whose heads are
    `head_dim` wide: a forward pass runs the forward kernels once, the update forward + backward,
    and under gradient checkpointing the forward twice (Qwen2.5-0.5B's 64-wide heads run slower and
    are left out). The half length is the grid value with the least relative error."""
    from rltune.api.hardware import gpu as gpu_spec

    peak = gpu_spec(GPU_TYPE).bf16_tflops * 1e12
    obs = []  # (seq, forward kernel passes, backward kernel passes, FLOPs of one forward, seconds)
    for points, r in runs:
        for p in points:
            if SHAPES[p.shape]["headDim"] != head_dim:
                continue
            f = attention_flops(p, r["seq"])
            for name, nf, nb in (("fwd", 1, 0), ("train", 2 if r.get("recompute") == "full" else 1, 1)):
                if name in p.profile:
                    obs.append((r["seq"], nf, nb, f, by_class(p.profile[name])["attention"] / 1000.0))
    seq, nf, nb, flops, t = (np.array(c, dtype=float) for c in zip(*obs))
    passes = np.stack([nf, 2.0 * nb], axis=1)  # forward kernel passes, backward at twice the FLOPs
    best = None
    for half in np.arange(100.0, 4000.0, 10.0):
        # t = F (s + half) / (s peak) (nf / e_fwd + 2 nb / e_bwd): linear in 1 / e_fwd and 1 / e_bwd
        a = (flops * (seq + half) / (seq * peak))[:, None] * passes
        coef = np.linalg.lstsq(a / t[:, None], np.ones_like(t), rcond=None)[0]  # relative errors
        fit = a @ coef / t
        err = float(np.sum((fit - 1.0) ** 2))
        if best is None or err < best[0]:
            best = (err, half, coef, fit)
    _, half, coef, fit = best
    return AttentionSpeed(1.0 / coef[0], 1.0 / coef[1], float(half), [float(v) for v in fit])


def forward_gemm_ratio(runs: list[tuple[list[Point], dict]]) -> list[float]:
    """Per small-vocabulary point measured both ways (no recompute): the GEMM rate of its forward-only
    log-prob pass over that of its update (which runs 3x the forward's GEMM FLOPs), from the profiled
    GEMM time. The twin's `fwd_ratio` says how much slower forward-only passes run their GEMMs."""
    out = []
    for points, r in runs:
        if r.get("recompute", "none") != "none":
            continue
        for p in points:
            if p.vocab == SMALL_VOCAB and "fwd" in p.profile and "train" in p.profile:
                fwd, train = by_class(p.profile["fwd"])["gemm"], by_class(p.profile["train"])["gemm"]
                out.append(train / (3.0 * fwd))
    return out


def gemm_rates(tokens=(256, 512, 1024, 2048, 4096, 8192, 16384)) -> list[tuple[int, int, int, float]]:
    """bf16 [tokens, k] x [k, n] products at the FFN shapes of Qwen2.5-1.5B, -7B and -14B: TFLOP/s,
    the mean of 20 after 3 warm-ups (how GEMM speed follows the micro-batch's tokens)."""
    import torch

    rows = []
    for k, n in ((1536, 8960), (3584, 18944), (5120, 13824)):
        for m in tokens:
            a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
            for _ in range(3):
                a @ b
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(20):
                a @ b
            torch.cuda.synchronize()
            rows.append((k, n, m, 2.0 * m * k * n / ((time.perf_counter() - t0) / 20) / 1e12))
    return rows


def render(points: list[Point], seq: int, nseq: int, mbt: int, peak_tflops: float, recompute: str = "none") -> str:
    out = [
        "| shape | vocab | params | tokens | forward s | update s | update MFU | twin forward s | twin update s "
        "| update: twin / measured | update GPU s | twin / GPU | GPU time of the update: GEMM / attention / other |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    from rltune.twin.errors import Infeasible

    for p in points:
        try:
            tf, tt = twin_seconds(p.shape, p.vocab, seq, nseq, mbt, recompute=recompute)
        except Infeasible:  # the twin's memory model rules the update out (7B: 122 GB of fp32 state)
            tf, tt = twin_seconds(p.shape, p.vocab, seq, nseq, mbt, forward_only=True), None
        mfu = 6.0 * p.params * p.tokens / (p.train_s * peak_tflops * 1e12) if p.train_s else None
        pr = by_class(p.profile.get("train") or {})
        tot = sum(pr.values())
        split = " / ".join(f"{pr[k] / tot:.0%}" for k in ("gemm", "attention", "other")) if tot else "n/a"
        out.append(
            f"| {p.shape} | {p.vocab:,} | {p.params / 1e9:.2f}B | {p.tokens:,} | {p.fwd_s:.3f} | "
            f"{'out of memory' if p.train_s is None else f'{p.train_s:.3f}'} | "
            f"{'n/a' if mfu is None else f'{mfu:.1%}'} | {tf:.3f} | {'out of memory' if tt is None else f'{tt:.3f}'} | "
            f"{'n/a' if p.train_s is None or tt is None else f'{tt / p.train_s:.2f}'} | "
            f"{f'{tot / 1000:.3f}' if tot else 'n/a'} | {f'{tt / (tot / 1000):.2f}' if tot and tt else 'n/a'} | "
            f"{split} |"
        )
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="0.5b,1.5b,3b,7b")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--seqs", type=int, default=16)
    ap.add_argument("--mbt", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--recompute", action="store_true", help="gradient checkpointing (twin: recompute full)")
    ap.add_argument("--gemm", action="store_true", help="only the GEMM speed per micro-batch size (needs a GPU)")
    ap.add_argument("--out", default=str(ROOT / "out" / "trainer-speed.json"))
    ap.add_argument("--points", nargs="+", default=None, help="JSON of previous runs: re-print them, measure nothing")
    a = ap.parse_args(argv)
    from rltune.api.hardware import gpu as gpu_spec

    peak = gpu_spec(GPU_TYPE).bf16_tflops
    if a.gemm:
        print("| k | n | tokens | TFLOP/s |\n|---:|---:|---:|---:|")
        for k, n, m, tf in gemm_rates():
            print(f"| {k} | {n} | {m} | {tf:.1f} |")
        return 0
    if a.points:
        parsed = load_runs(a.points)
    else:
        import torch

        device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
        points = []
        for shape in a.shapes.split(","):
            for vocab in (SHAPES[shape]["vocab"], SMALL_VOCAB):
                points.append(measure(shape, vocab, a.seq, a.seqs, a.mbt, a.repeats, not a.no_profile, a.recompute))
                gc.collect()
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        out = {
            "device": device,
            "seq": a.seq,
            "seqs": a.seqs,
            "mbt": a.mbt,
            "recompute": "full" if a.recompute else "none",
            "points": [asdict(p) for p in points],
        }
        Path(a.out).write_text(json.dumps(out, indent=1))
        parsed = [(points, out)]
    for points, r in parsed:
        print(
            f"\ndevice: {r['device']}; {r['seqs']} x {r['seq']} tokens, microBatchTokens {r['mbt']}, "
            f"recompute {r.get('recompute', 'none')}; MFU against {GPU_TYPE}'s {peak:.0f} TFLOP/s dense bf16"
        )
        print(render(points, r["seq"], r["seqs"], r["mbt"], peak, r.get("recompute", "none")))
    print(
        "\nElement-wise GPU time as HBM bytes at the twin's H200 bandwidth (least squares over the "
        f"{SMALL_VOCAB:,}-token-vocabulary points of the runs without recompute):\n"
    )
    print("| pass | per token x layer x hidden | per parameter per micro-batch | fitted / measured |")
    print("|---|---:|---:|---|")
    for e in eager_bytes([(points, r["mbt"]) for points, r in parsed if r.get("recompute", "none") == "none"]):
        print(
            f"| {e.pass_} | {e.per_token_layer_hidden:.0f} | {e.per_param_microbatch:.1f} | "
            f"{', '.join(f'{v:.2f}' for v in e.fit)} |"
        )
    att = attention_speed(parsed)
    print(
        f"\nAttention kernels (heads 128 wide), fraction of {peak:.0f} TFLOP/s by sequence length s: "
        f"forward {att.fwd_max:.3f} s / (s + {att.half_len:.0f}), backward {att.bwd_max:.3f} s / (s + "
        f"{att.half_len:.0f}); fitted / measured: {', '.join(f'{v:.2f}' for v in att.fit)}"
    )
    ratios = forward_gemm_ratio(parsed)
    if ratios:
        print(
            "\nForward-only GEMM rate over the update's (small vocabulary, no recompute): "
            + ", ".join(f"{v:.2f}" for v in ratios)
        )
    extra = {}
    for full, rf in parsed:  # each recomputed run against the plain run of the same batch
        for plain, rp in parsed:
            same = all(rf[k] == rp[k] for k in ("seq", "seqs", "mbt"))
            if same and rf.get("recompute") == "full" and rp.get("recompute", "none") == "none":
                extra.update(recompute_bytes(plain, full))
    if extra:
        print(
            "\nElement-wise time gradient checkpointing adds to the update, same units (the twin adds the forward's):\n"
        )
        print("| shape | vocab | bytes per token x layer x hidden |\n|---|---:|---:|")
        for (shape, vocab), v in extra.items():
            print(f"| {shape} | {vocab:,} | {v:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
