"""Empirical-Bayes check of the forecaster's per-knob prior sds, on the seed set only.

    python -m bench.priors [--configs 120] [--procs 2] [--cache FILE] [--json FILE]

The forecaster corrects the physics per phase with a Bayesian linear regression on knob-value
indicators (rltune.tuner.forecast._BLR); each knob's prior sd (rltune.tuner.knobs CATALOG
`prior_sd`, forecast.DERIVED_SD) says how far one knob value may move a phase away from the physics
before any trial has shown it. Those sds set how much the search pays for a long shot (expected
improvement grows with them). This script asks the seed set's jobs what they should be: for each
of the eight jobs it runs noisy twin trials of the baseline and `--configs` random configurations
of the job's space (exactly the summaries the tuner would see), builds the regressions the
forecaster builds, and maximises over the per-knob sds the marginal likelihood of the observed
log residuals, summed over jobs and over the phases of each side (type-II maximum likelihood: the
corrections themselves are integrated out, one independent draw per job). It prints the fitted sd
and its 95% profile-likelihood upper bound next to the catalog's, per knob and side.

Never run on the generated set: that set is reserved to judge the constants (docs/benchmark.md).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import pickle
import random
import sys
from pathlib import Path

import numpy as np

from bench.jobs import jobs as bench_jobs
from bench.oracle import enumerate_space
from bench.run import measured_baseline
from rltune.api.models import RLTuningJobSpec
from rltune.tuner import forecast

GRID = np.exp(np.linspace(math.log(0.01), math.log(2.0), 25))


def job_regressions(job: dict, n: int, seed: int = 0) -> list[dict]:
    """The regressions the forecaster fits on the baseline plus `n` random trials of one job: per
    calibrated phase its design (knob of each column), targets and noise."""
    name = job["metadata"]["name"]
    spec = RLTuningJobSpec.model_validate(job["spec"])
    rn, base = measured_baseline(name, spec)
    ks = enumerate_space(rn.space)
    rng = random.Random(seed)
    obs = [(base.config, base.summary)]
    for i, k in enumerate(rng.sample(ks, min(n, len(ks)))):
        s, _ = rn.run(rn.space.config(k), f"eb{i}", 10_000 + i)
        if s is not None and not s.failed and s.steps > 0:
            obs.append((rn.space.config(k), s))
    real = forecast._BLR

    class Capture(real):
        """_BLR that keeps its inputs: the design is rebuilt from the rows the forecaster passed."""

        def __init__(self, rows, y, knobs, base_f, sd, sd0, noise=forecast.NOISE_SD):
            super().__init__(rows, y, knobs, base_f, sd, sd0, noise)
            self.inputs = rows, np.asarray(y), np.broadcast_to(np.asarray(noise, dtype=float), (len(rows),))

    forecast._BLR = Capture
    try:
        fc = forecast.Forecaster(spec, obs)
    finally:
        forecast._BLR = real
    out = []
    for p, blr in fc.corrections.items():  # the phase corrections (the step-level one is not among them)
        rows, y, noise = blr.inputs
        out.append(
            {
                "job": name,
                "phase": p,
                "side": forecast.SIDE[p],
                "X": blr._x(rows),
                "knob": [c[0] for c in blr.cols],
                "y": y,
                "noise": noise,
            }
        )
    print(f"  {name}: {len(obs)} trials, phases {', '.join(r['phase'] for r in out)}", flush=True)
    return out


def loglik(reg: dict, sds: dict[str, float], sd0: float) -> float:
    """Marginal log likelihood of one regression's targets with its corrections integrated out."""
    X, y = reg["X"], reg["y"]
    d = np.array([sd0**2] + [sds[k] ** 2 for k in reg["knob"]])
    C = (X * d) @ X.T + np.diag(reg["noise"] ** 2)
    _, logdet = np.linalg.slogdet(C)
    return -0.5 * (float(y @ np.linalg.solve(C, y)) + logdet)


def upper_bound(regs: list[dict], sds: dict[str, float], sd0: float, k: str, drop: float = 1.92) -> float:
    """The largest sd of knob `k` (the others at their fit) whose log likelihood is within `drop`
    of the best: 1.92 is the 95% profile-likelihood bound of one parameter (chi-square, 1 dof).
    Eight jobs pin a small sd poorly; the bound is the largest value the jobs cannot rule out."""
    best = sum(loglik(r, sds, sd0) for r in regs)
    ub = sds[k]
    for g in GRID[GRID > sds[k]]:
        if sum(loglik(r, sds | {k: g}, sd0) for r in regs) < best - drop:
            break
        ub = float(g)
    return ub


def fit_side(regs: list[dict], start: dict[str, float], sd0: float, sweeps: int = 4) -> dict[str, float]:
    """Coordinate ascent of the summed marginal likelihood over the side's per-knob sds (log grid)."""
    sds = dict(start)
    knobs = sorted({k for r in regs for k in r["knob"]})
    for _ in range(sweeps):
        moved = False
        for k in knobs:
            best = max(GRID, key=lambda g: sum(loglik(r, sds | {k: g}, sd0) for r in regs))
            moved |= abs(best - sds[k]) > 1e-9
            sds[k] = float(best)
        if not moved:
            break
    return sds


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", type=int, default=120)
    ap.add_argument("--json")
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--cache", help="pickle of the trials' regressions: reused when it exists")
    a = ap.parse_args(argv)
    if a.cache and Path(a.cache).exists():
        regs = pickle.loads(Path(a.cache).read_bytes())
    else:
        with mp.get_context("fork").Pool(a.procs) as pool:
            regs = [r for rs in pool.starmap(job_regressions, [(j, a.configs) for j in bench_jobs()]) for r in rs]
        if a.cache:
            Path(a.cache).write_bytes(pickle.dumps(regs))
    rows = []
    for side in ("rollout", "trainer", "sync"):
        rs = [r for r in regs if r["side"] == side]
        if not rs:
            continue
        phase = next(p for p, s in forecast.SIDE.items() if s == side)
        prior = dict(forecast.KNOB_SD[phase])
        start = {k: prior.get(k, forecast.PRIOR_SD) for r in rs for k in r["knob"]}
        fitted = fit_side(rs, start, forecast.INTERCEPT_SD)
        before = sum(loglik(r, start, forecast.INTERCEPT_SD) for r in rs)
        after = sum(loglik(r, fitted, forecast.INTERCEPT_SD) for r in rs)
        print(f"\n{side}: log likelihood {before:.1f} with the catalog's sds, {after:.1f} fitted")
        print("| knob | catalog sd | fitted sd | 95% upper bound | columns |\n|---|---|---|---|---|")
        for k in sorted(fitted):
            ncol = sum(r["knob"].count(k) for r in rs)
            ub = upper_bound(rs, fitted, forecast.INTERCEPT_SD, k)
            print(f"| {k} | {start[k]:.2f} | {fitted[k]:.3f} | {ub:.3f} | {ncol} |")
            rows.append(
                {"side": side, "knob": k, "catalog": start[k], "fitted": fitted[k], "upper": ub, "columns": ncol}
            )
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
