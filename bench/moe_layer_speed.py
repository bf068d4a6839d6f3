"""How long one MoE layer takes per micro-batch on a GPU in BF16, by local experts and tokens: a loop of
per-expert GEMMs (Megatron's SequentialMLP; the shape of any per-expert host loop) against one grouped
GEMM (torch._grouped_mm), forward + backward, and the per-local-expert floor fitted over them.

    PYTHONPATH=operator python3 -m bench.moe_layer_speed [--model qwen3-30b-a3b] [--ep 16,8,4]
        [--tokens 4096,8192,16384,32768] [--repeats 5] [--device cuda] [--out out/moe-layer-speed.json]

Why (issue 14; docs/twin.md 'Megatron MoE recipes'): Megatron-Bridge's dropless MoE recipes at small
micro-batches run far slower than the twin, and the rows agree with a floor of ~0.6-1.0 ms per local
expert per micro-batch and layer in MXFP8 (~2 ms in H100 FP8 current scaling). The twin's BF16
trainers (every RL benchmark job) have no such floor because its BF16 constant was never measured;
with 16-32 local experts it would decide the small-expert MoE jobs. This script is the measurement,
prepared for a session with a GPU (none has been lent since); it runs on the CPU too, at toy shapes,
which is how the tests check it (the two paths give the same outputs and gradients).

One rank's share of an expert-parallel layer with `ep` ranks: the router over its `tokens` (a linear
to every expert, softmax, top-k), a balanced uniform assignment of its tokens x top-k slots to the
experts / ep local experts (what the all-to-all delivers in expectation; the all-to-all itself is not
timed: it is the twin's NVLink/NIC term), the permutation into expert order, each local expert's
SwiGLU (fc1 hidden -> 2 x expert_ffn, silu(gate) x up, fc2 expert_ffn -> hidden), and the weighted
un-permutation. Timed forward + backward (gradients of the input, the router and every expert weight)
with CUDA events, median of `--repeats` after a warm-up; the expert GEMMs' share of peak is printed
next to it. The fit: time = floor x local experts + per-slot x slots, least squares over every point
of one path, so `floor` is the per-local-expert cost the twin lacks.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from bench.paths import ROOT
from rltune.api.models import ModelArch, ModelSpec

PATHS = ("loop", "grouped")


@dataclass
class LayerShape:
    """The layer one rank runs: its tokens, the experts it holds and the slots routed to them."""

    hidden: int
    expert_ffn: int
    experts: int  # all experts of the layer (the router scores every one)
    local_experts: int
    top_k: int
    tokens: int

    @property
    def slots(self) -> int:
        return self.tokens * self.top_k

    def expert_flops(self) -> float:
        """Forward + backward FLOPs of the local experts' GEMMs (3 matrices of hidden x expert_ffn)."""
        return 3.0 * 2.0 * self.slots * 3 * self.hidden * self.expert_ffn


@dataclass
class Point:
    path: str
    ep: int
    local_experts: int
    tokens: int
    slots: int
    ms: float  # forward + backward of the whole local layer, median
    expert_tflops: float  # the expert GEMMs' FLOPs over that time


def shape_for(model: ModelArch, ep: int, tokens: int) -> LayerShape:
    if not model.is_moe or model.experts % ep:
        raise SystemExit(f"--ep {ep}: {model.name} has {model.experts} experts, not divisible by {ep}")
    return LayerShape(model.hidden, model.expert_ffn, model.experts, model.experts // ep, model.active_experts, tokens)


class Layer:
    """One rank's MoE layer (module docstring), its weights in `dtype` on `device`."""

    def __init__(self, s: LayerShape, device: str, dtype, seed: int = 0):
        import torch

        g = torch.Generator(device="cpu").manual_seed(seed)
        self.s, self.torch = s, torch

        def w(*shape, scale):
            return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype).requires_grad_()

        h, f, e = s.hidden, s.expert_ffn, s.local_experts
        self.router = w(h, s.experts, scale=h**-0.5)
        self.fc1 = w(e, h, 2 * f, scale=h**-0.5)
        self.fc2 = w(e, f, h, scale=f**-0.5)
        self.x = w(s.tokens, h, scale=1.0)
        # balanced expected routing: every local expert receives slots // e slots (the rest spread)
        counts = torch.full((e,), s.slots // e, dtype=torch.int64)
        counts[: s.slots % e] += 1
        self.counts = counts.tolist()
        self.offsets = torch.cumsum(counts, 0).to(device=device, dtype=torch.int32)
        expert_of_slot = torch.repeat_interleave(torch.arange(e), counts)
        expert_of_slot = expert_of_slot[torch.randperm(s.slots, generator=g)]
        self.order = torch.argsort(expert_of_slot, stable=True).to(device)  # slot -> position in expert order
        self.token_of_slot = (torch.arange(s.slots) // s.top_k).to(device)

    def forward(self, path: str):
        torch = self.torch
        s = self.s
        probs = torch.softmax(self.x @ self.router, dim=-1, dtype=torch.float32)
        top = torch.topk(probs, s.top_k, dim=-1).values.reshape(-1)  # weights; which experts is the routing above
        tok = self.token_of_slot[self.order]
        xs = self.x.index_select(0, tok)  # permuted into expert order
        if path == "loop":
            outs, start = [], 0
            for i, n in enumerate(self.counts):
                a = xs[start : start + n] @ self.fc1[i]
                gate, up = a.chunk(2, dim=-1)
                outs.append((torch.nn.functional.silu(gate) * up) @ self.fc2[i])
                start += n
            ys = torch.cat(outs)
        elif path == "grouped":
            a = torch._grouped_mm(xs, self.fc1, offs=self.offsets)
            gate, up = a.chunk(2, dim=-1)
            ys = torch._grouped_mm((torch.nn.functional.silu(gate) * up).contiguous(), self.fc2, offs=self.offsets)
        else:
            raise ValueError(path)
        wgt = top[self.order].to(ys.dtype).unsqueeze(-1)
        return torch.zeros_like(self.x).index_add(0, tok, ys * wgt)

    def params(self):
        return [self.x, self.router, self.fc1, self.fc2]

    def step(self, path: str):
        """Forward + backward once; the gradients it leaves (for the equivalence check)."""
        for p in self.params():
            p.grad = None
        y = self.forward(path)
        y.float().pow(2).mean().backward()
        return y.detach(), [p.grad.detach().clone() for p in self.params()]


def time_ms(fn: Callable[[], object], device: str, repeats: int) -> float:
    """Median milliseconds of fn over `repeats` runs after one untimed warm-up."""
    import torch

    fn()
    out = []
    for _ in range(repeats):
        if device.startswith("cuda"):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            out.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn()
            out.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(out)


def measure(model: ModelArch, eps: list[int], tokens: list[int], device: str, repeats: int, dtype=None) -> list[Point]:
    import torch

    dtype = dtype or torch.bfloat16
    pts = []
    for ep in eps:
        for t in tokens:
            s = shape_for(model, ep, t)
            layer = Layer(s, device, dtype)
            for path in PATHS:
                try:
                    ms = time_ms(lambda p=path, lay=layer: lay.step(p), device, repeats)
                except RuntimeError as e:  # a grouped GEMM this GPU/torch cannot run: say so, keep the loop
                    print(f"  {path} ep {ep} tokens {t}: not run ({str(e).splitlines()[0][:120]})", flush=True)
                    continue
                pts.append(Point(path, ep, s.local_experts, t, s.slots, ms, s.expert_flops() / (ms * 1e-3) / 1e12))
                print(f"  {path:7s} ep {ep:3d} ({s.local_experts:3d} local) tokens {t:6d}: {ms:8.2f} ms", flush=True)
            del layer
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
    return pts


@dataclass
class Fit:
    path: str
    floor_ms_per_local_expert: float
    us_per_slot: float
    points: int
    max_rel_residual: float


def fit(points: list[Point]) -> list[Fit]:
    """time = floor x local experts + per-slot x slots, least squares per path (both terms >= 0)."""
    out = []
    for path in PATHS:
        ps = [p for p in points if p.path == path]
        if len(ps) < 2:
            continue
        a = np.array([[p.local_experts, p.slots] for p in ps], dtype=float)
        y = np.array([p.ms for p in ps])
        coef, *_ = np.linalg.lstsq(a, y, rcond=None)
        coef = np.maximum(coef, 0.0)
        pred = a @ coef
        out.append(Fit(path, float(coef[0]), float(coef[1]) * 1e3, len(ps), float(np.max(np.abs(pred / y - 1)))))
    return out


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen3-30b-a3b", help="a MoE preset (rltune.api.presets)")
    ap.add_argument("--ep", default="16,8,4", help="expert-parallel sizes (local experts = experts / ep)")
    ap.add_argument("--tokens", default="4096,8192,16384,32768", help="tokens per micro-batch on the rank")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default=str(ROOT / "out" / "moe-layer-speed.json"))
    args = ap.parse_args(argv)
    import torch

    model = ModelSpec(preset=args.model).resolved()
    device = args.device
    gpu = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
    print(f"{model.name} on {gpu}: hidden {model.hidden}, expert ffn {model.expert_ffn}, "
          f"{model.experts} experts, top-{model.active_experts}; torch {torch.__version__}", flush=True)  # fmt: skip
    pts = measure(model, [int(x) for x in args.ep.split(",")], [int(x) for x in args.tokens.split(",")], device,
                  args.repeats)  # fmt: skip
    fits = fit(pts)
    print("\n| path | ep | local experts | tokens | ms (fwd+bwd) | expert GEMM TFLOPS |")
    print("|---|---:|---:|---:|---:|---:|")
    for p in pts:
        print(f"| {p.path} | {p.ep} | {p.local_experts} | {p.tokens} | {p.ms:.2f} | {p.expert_tflops:.0f} |")
    for f in fits:
        print(f"{f.path}: floor {f.floor_ms_per_local_expert:.3f} ms per local expert, {f.us_per_slot:.3f} us per "
              f"slot (max residual {f.max_rel_residual:.0%} over {f.points} points)")  # fmt: skip
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"model": args.model, "gpu": gpu, "torch": torch.__version__}
    doc.update(points=[asdict(p) for p in pts], fits=[asdict(f) for f in fits])
    out.write_text(json.dumps(doc, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
