"""How much one step of policy lag slows learning, measured on a real RL loop: rltune's reference GRPO
loop (rltune.grpo: vLLM rollouts, torch PPO-clip training) run on-policy and one step off-policy with
the same seeds, and the twin's learning-curve model fitted to both.

    PYTHONPATH=operator python3 -m bench.lag_penalty [--spec examples/real-grpo-cpu.yaml] [--seeds 8]
        [--steps 30] [--lr 1e-3] [--dir out/lag-penalty]
    PYTHONPATH=operator python3 -m bench.lag_penalty --from bench/data/lag-penalty-cpu/lr1e-3

Why (issue 17; docs/tuner.md 'The reward gate on the winner'): whether `rewardGate nonInferiority`
can be the default turns on how much slower a one-step-off run learns per step than a synchronous
one. No public source pins how far the learning curve's time constant stretches per step of lag;
the twin assumed 35% until 0.3.8 and now takes this benchmark's measurement (Efficiency.lag_penalty,
twin/simulate.py::_quality). This measures it where a real loop is at hand. Each run is
`python -m rltune.grpo --spec SPEC --steps N --staleness S --seed K` in its own process (real mode:
hack/install-torch-vllm.sh), its per-step rewards saved as JSON lines in --dir. The fit: reward(t)
= a + g (1 - exp(-(t + 1) / tau)), least squares in a and g on a grid of tau, on the mean curve over
seeds of each staleness; the lag penalty is tau(lag 1) / tau(lag 0) - 1 (Efficiency.lag_penalty in
the twin), and the reward drop over a 12-step confirmation's scored steps (steps 1-11) is what
`nonInferiority` judges. Intervals: 90% bootstrap over seeds
(pairs kept together). The learning rate (environment RLTUNE_GRPO_LR, the loop's 1e-3 by default)
sets how far the policy moves per step, and with it how much a step of lag costs: the sweep over it
is the regime check. A toy task on a tiny model: evidence for the mechanism and its regime, not an
LLM's constant.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from bench.paths import ROOT
from rltune.twin.efficiency import Efficiency

CONFIRM_WINDOW = slice(1, 12)  # a 12-step confirmation's scored steps (warm-up step 0 left out)
TAU_GRID = np.linspace(0.5, 200.0, 4000)


@dataclass
class CurveFit:
    start: float  # a
    gain: float  # g
    tau: float  # steps


@dataclass
class LagPenalty:
    seeds: int
    steps: int
    tau_sync: float
    tau_lag1: float
    penalty: float  # tau_lag1 / tau_sync - 1
    penalty_90: tuple[float, float]
    window_drop: float  # 1 - mean reward at lag 1 / at lag 0 over CONFIRM_WINDOW
    window_drop_90: tuple[float, float]
    per_seed_window_drop: list[float]


def fit_curve(rewards: np.ndarray) -> CurveFit:
    """The twin's learning curve (module docstring) fitted to one reward curve, step 0 first: for
    every tau on TAU_GRID the least-squares a and g in closed form, then the tau of least error."""
    y = np.asarray(rewards, dtype=float)
    t = np.arange(len(y), dtype=float)
    phi = 1.0 - np.exp(-(t + 1.0) / TAU_GRID[:, None])  # [taus, steps]
    n, s1, s11 = float(len(y)), phi.sum(1), (phi * phi).sum(1)
    sy, s1y = y.sum(), (phi * y).sum(1)
    det = np.maximum(n * s11 - s1 * s1, 1e-300)
    a = (s11 * sy - s1 * s1y) / det
    g = (n * s1y - s1 * sy) / det
    err = ((a[:, None] + g[:, None] * phi - y) ** 2).sum(1)
    k = int(np.argmin(err))
    return CurveFit(float(a[k]), float(g[k]), float(TAU_GRID[k]))


def _point(sync: np.ndarray, lag1: np.ndarray) -> tuple[float, float, float, float]:
    t0, t1 = fit_curve(sync.mean(0)).tau, fit_curve(lag1.mean(0)).tau
    drop = 1.0 - lag1.mean(0)[CONFIRM_WINDOW].mean() / sync.mean(0)[CONFIRM_WINDOW].mean()
    return t1 / t0 - 1.0, float(drop), t0, t1


def lag_penalty(sync: np.ndarray, lag1: np.ndarray, boot: int = 400, seed: int = 0) -> LagPenalty:
    """Rewards [seeds, steps] of the on-policy and the one-step-off runs (row i: the same seed)."""
    if sync.shape != lag1.shape or sync.shape[1] <= CONFIRM_WINDOW.stop:
        raise ValueError(f"need paired runs of more than {CONFIRM_WINDOW.stop} steps, got {sync.shape} / {lag1.shape}")
    pen, drop, t0, t1 = _point(sync, lag1)
    rng = np.random.default_rng(seed)
    n = sync.shape[0]
    bs = np.array([_point(sync[i], lag1[i])[:2] for i in (rng.integers(0, n, n) for _ in range(boot))])
    lo, hi = np.percentile(bs, [5, 95], axis=0)
    per_seed = [float(1.0 - b[CONFIRM_WINDOW].mean() / a[CONFIRM_WINDOW].mean()) for a, b in zip(sync, lag1)]
    return LagPenalty(n, sync.shape[1], t0, t1, pen, (lo[0], hi[0]), drop, (lo[1], hi[1]), per_seed)


def read_runs(d: Path) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """The paired reward curves saved in d (s{staleness}-{seed}.jsonl), seeds present at both lags."""

    def rewards(p: Path) -> list[float]:
        return [json.loads(line)["reward"] for line in p.read_text().splitlines() if line.strip()]

    runs = {s: {int(p.stem.split("-")[1]): rewards(p) for p in d.glob(f"s{s}-*.jsonl")} for s in (0, 1)}
    seeds = sorted(set(runs[0]) & set(runs[1]))
    if not seeds:
        raise SystemExit(f"{d}: no seed run at both staleness 0 and 1 (files s0-SEED.jsonl, s1-SEED.jsonl)")
    n = min(len(runs[s][k]) for s in (0, 1) for k in seeds)
    return (np.array([runs[0][k][:n] for k in seeds]), np.array([runs[1][k][:n] for k in seeds]), seeds)


def run_loop(spec: str, steps: int, staleness: int, seed: int, out: Path, lr: Optional[str]) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "operator"))
    if lr:
        env["RLTUNE_GRPO_LR"] = lr
    cmd = [sys.executable, "-m", "rltune.grpo", "--spec", spec, "--steps", str(steps)]
    cmd += ["--staleness", str(staleness), "--seed", str(seed), "--out", str(out)]
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def report(r: LagPenalty, sync: np.ndarray, lag1: np.ndarray) -> None:
    print(f"mean reward by step, lag 0: {np.round(sync.mean(0), 3).tolist()}")
    print(f"mean reward by step, lag 1: {np.round(lag1.mean(0), 3).tolist()}")
    print(
        f"{r.seeds} seeds x {r.steps} steps: tau {r.tau_sync:.1f} steps on-policy, {r.tau_lag1:.1f} one step off; "
        f"lag penalty {r.penalty:+.2f} (90%: {r.penalty_90[0]:+.2f} to {r.penalty_90[1]:+.2f}; the twin uses "
        f"{Efficiency.lag_penalty:+.2f}); reward drop over a 12-step confirmation {r.window_drop:+.1%} "
        f"(90%: {r.window_drop_90[0]:+.1%} to {r.window_drop_90[1]:+.1%}); "
        f"per seed {', '.join(f'{x:+.1%}' for x in r.per_seed_window_drop)}"
    )


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", default=str(ROOT / "examples" / "real-grpo-cpu.yaml"))
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--lr", help="the loop's learning rate (RLTUNE_GRPO_LR; default: the loop's own)")
    ap.add_argument("--dir", default=str(ROOT / "out" / "lag-penalty"), help="where the runs' JSON lines go")
    ap.add_argument("--from", dest="from_dir", help="only fit the runs already saved in this directory")
    ap.add_argument("--out", help="write the result as JSON here")
    a = ap.parse_args(argv)
    d = Path(a.from_dir or a.dir)
    if not a.from_dir:
        d.mkdir(parents=True, exist_ok=True)
        for seed in range(1, a.seeds + 1):
            for st in (0, 1):
                f = d / f"s{st}-{seed}.jsonl"
                if not (f.exists() and len(f.read_text().splitlines()) >= a.steps):
                    print(f"seed {seed}, staleness {st} ...", flush=True)
                    run_loop(a.spec, a.steps, st, seed, f, a.lr)
    sync, lag1, seeds = read_runs(d)
    r = lag_penalty(sync, lag1)
    report(r, sync, lag1)
    if a.out:
        Path(a.out).write_text(json.dumps(asdict(r) | {"seeds_run": seeds, "dir": str(d)}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
