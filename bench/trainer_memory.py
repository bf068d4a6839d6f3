"""How the reference trainer's peak memory follows the longest sequence, on a real GPU, and how well
the memory gate's carry (rltune.tuner.headroom.carry) forecasts it.

    PYTHONPATH=operator python3 -m bench.trainer_memory [--shapes 0.5b,1.5b] [--mbt 4096]
        [--lengths 2048,4096,8192,16384,32768] [--out out/trainer-memory.json]
    PYTHONPATH=operator python3 -m bench.trainer_memory --points bench/data/trainer-memory-h200/mbt4096-default.json

The memory gate takes a trial's measured trainer peak (the metrics contract's
step_trainer_memory_ratio) at the longest sequence the trial trained, and carries it to the longest
sequence the planned run will train. This runs rltune's own GRPO trainer code (rltune.grpo.loop:
micro_batches, old_logprobs, ppo_update and peak_trainer_memory, the functions a trial runs) on batches
whose longest sequence is each of `--lengths` under one microBatchTokens budget, reads the measured
peak after each step, and prints, for every pair of lengths, the measured peak at the longer one
against the gate's carry from the shorter one. It needs a CUDA GPU: on the CPU the trainer reports
no peak (0 = not measured), and the table says so instead of printing numbers. `--points` re-judges
a saved run's measurements with the current carry (no GPU needed).

The batches are random token ids (the memory of a step does not depend on which tokens): the longest
sequence plus enough quarter-length ones to fill two micro-batches (step_lengths); prompts of 64
tokens. The allocator is the trainer's (rltune.grpo.loop.trainer_allocator: expandable segments)
unless PYTORCH_CUDA_ALLOC_CONF says otherwise; the JSON records it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.paths import ROOT
from rltune.api.models import ModelArch, RLTuningJobSpec
from rltune.grpo.loop import micro_batches, old_logprobs, peak_trainer_memory, ppo_update, trainer_allocator
from rltune.grpo.model import build_trainer_model, qwen2_config
from rltune.tuner import baseline_record, headroom

# Public Qwen2.5 shapes (config.json of Qwen/Qwen2.5-0.5B, -1.5B, -3B and -7B on the Hugging Face hub;
# docs/references.md 'Model architectures' lists the family), plus a tiny one for the CPU.
SHAPES: dict[str, dict] = {
    "tiny": dict(layers=2, hidden=128, heads=4, kvHeads=2, headDim=32, ffn=256, vocab=151936),
    "0.5b": dict(layers=24, hidden=896, heads=14, kvHeads=2, headDim=64, ffn=4864, vocab=151936),
    "1.5b": dict(layers=28, hidden=1536, heads=12, kvHeads=2, headDim=128, ffn=8960, vocab=151936),
    "3b": dict(layers=36, hidden=2048, heads=16, kvHeads=2, headDim=128, ffn=11008, vocab=151936),
    "7b": dict(layers=28, hidden=3584, heads=28, kvHeads=4, headDim=128, ffn=18944, vocab=152064),
}
PROMPT = 64
OOM = -1.0  # Point.measured of a step that ran out of memory
GPU_TYPE = "H200"  # the physics' catalog entry the carry is computed with (its state share and growth)


@dataclass
class Point:
    shape: str
    micro_batch_tokens: int
    longest: int
    measured: float  # peak reserved / GPU memory; 0 = not measured (CPU), OOM = out of memory
    seconds: float


def job_spec(shape: str, mbt: int, longest: int) -> RLTuningJobSpec:
    """A real-mode job of the shape whose responses reach `longest` tokens (the physics' inputs)."""
    return RLTuningJobSpec.model_validate(
        {
            "workload": {
                "framework": "reference",
                "image": "ghcr.io/rltune/trial:0.1.0",
                "model": {"dtype": "bf16", **SHAPES[shape]},
                "task": {
                    "kind": "math",
                    "promptsPerStep": 1,
                    "samplesPerPrompt": 4,
                    "maxPromptTokens": PROMPT,
                    "maxResponseTokens": max(longest, 64),
                },
            },
            "resources": {"gpuType": GPU_TYPE, "gpuBudget": 1, "gpusPerNode": 1},
            "baseline": {"gpus": 1, "trainer": {"microBatchTokens": mbt, "recompute": "none"}},
        }
    )


def carried(shape: str, mbt: int, measured: float, seen: int, run: int) -> float:
    """The memory gate's forecast at `run` tokens of a peak measured at `seen` (headroom.carry)."""
    spec = job_spec(shape, mbt, max(seen, run))
    return headroom.carry(spec, baseline_record(spec).config, measured, seen, run)


def step_lengths(longest: int, mbt: int) -> list[int]:
    """A step's sequence lengths: its longest, then sequences of a quarter of min(longest, mbt) until
    the step holds two micro-batches' worth of tokens, so that every micro-batch is full (a real
    step's thousands of sequences fill them; the physics sizes a micro-batch at microBatchTokens)."""
    short = max(64, min(longest, mbt) // 4)
    n = max(3, -(-(2 * max(longest, mbt)) // short))
    return [longest] + [short] * n


def measure(shape: str, mbt: int, lengths: list[int], seed: int = 0, log=print) -> list[Point]:
    """One PPO step of the reference trainer per longest sequence; the peak read after each."""
    import torch

    trainer_allocator()  # as the trial's trainer process does, before its first CUDA allocation
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    arch = ModelArch.model_validate({"name": shape, "dtype": "bf16", **SHAPES[shape]})
    cfg = qwen2_config(arch, max(lengths) + 8)
    torch.manual_seed(seed)
    with dev:  # initialise on the device: a 1.5B model's random init takes minutes on a CPU
        model = build_trainer_model(cfg).to(dev)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0, betas=(0.9, 0.99))
    g = torch.Generator().manual_seed(seed)
    # one step at the shortest length first: optimizer state exists from then on, as in a trial
    out: list[Point] = []
    peak_trainer_memory(dev)
    for longest in [lengths[0]] + lengths:
        lens = step_lengths(longest, mbt)
        seqs = [torch.randint(4, cfg["vocab_size"], (n,), generator=g).tolist() for n in lens]
        starts = [min(PROMPT, n - 1) for n in lens]
        groups = micro_batches(lens, mbt)
        t0 = time.perf_counter()
        try:
            old = old_logprobs(model, seqs, starts, groups, dev)
            ppo_update(model, opt, seqs, starts, groups, old, [(-1.0) ** i for i in range(len(seqs))], dev)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            peak = peak_trainer_memory(dev)
        except torch.cuda.OutOfMemoryError:
            old = None
            opt.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            peak_trainer_memory(dev)
            peak = OOM
        pt = Point(shape, mbt, longest, peak, time.perf_counter() - t0)
        out.append(pt)
        log(f"{shape} mbt {mbt} longest {longest}: peak {pt.measured:.4f} of the GPU ({pt.seconds:.1f} s)")
    del model, opt
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return out[1:]  # the first step only created the optimizer state


def table(points: list[Point]) -> list[dict]:
    """Every pair (seen < run) of one shape: measured peak at run against the gate's carry from seen."""
    rows = []
    for p in points:
        for q in points:
            if p.shape != q.shape or p.micro_batch_tokens != q.micro_batch_tokens or not p.longest < q.longest:
                continue
            fc = carried(p.shape, p.micro_batch_tokens, p.measured, p.longest, q.longest) if p.measured > 0 else None
            ok = q.measured > 0
            rows.append(
                dict(
                    shape=p.shape,
                    mbt=p.micro_batch_tokens,
                    seen=p.longest,
                    run=q.longest,
                    measured_seen=p.measured,
                    measured_run=q.measured,
                    carried_scale=(fc / p.measured) if fc else None,
                    measured_scale=(q.measured / p.measured) if p.measured > 0 and ok else None,
                    carried=fc,
                    error=(fc / q.measured - 1.0) if fc and ok else None,
                )
            )
    return rows


def render(rows: list[dict]) -> str:
    head = (
        "| shape | microBatchTokens | seen | run | peak at seen | peak at run | measured x | gate's x "
        "| carried | error |"
    )
    out = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def f(x, spec):
        if x == OOM:
            return "out of memory"
        return "not measured" if not x else format(x, spec)

    for r in rows:
        out.append(
            f"| {r['shape']} | {r['mbt']} | {r['seen']:,} | {r['run']:,} | {f(r['measured_seen'], '.1%')} | "
            f"{f(r['measured_run'], '.1%')} | {f(r['measured_scale'], '.2f')} | {f(r['carried_scale'], '.2f')} | "
            f"{f(r['carried'], '.1%')} | {f(r['error'], '+.1%')} |"
        )
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="0.5b,1.5b")
    ap.add_argument("--mbt", type=int, default=4096, help="trainer.microBatchTokens")
    ap.add_argument("--lengths", default="2048,4096,8192,16384,32768")
    ap.add_argument("--out", default=str(ROOT / "out" / "trainer-memory.json"))
    ap.add_argument("--points", default=None, help="JSON of a previous run: re-judge its points, measure nothing")
    a = ap.parse_args(argv)
    lengths = sorted(int(x) for x in a.lengths.split(","))
    points: list[Point] = []
    if a.points:
        saved = json.loads(Path(a.points).read_text())
        points = [Point(**p) for p in saved["points"]]
        alloc = saved.get("alloc_conf", "")
    else:
        for shape in a.shapes.split(","):
            points += measure(shape, a.mbt, lengths)
        alloc = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")  # measure() set the trainer's default
    rows = table(points)
    print(render(rows))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    out = {"alloc_conf": alloc, "points": [asdict(p) for p in points], "pairs": rows}
    Path(a.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
