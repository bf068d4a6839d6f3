"""The forecast before any trial: the forecaster fit on the measured baseline alone, against the
twin's noiseless step on random configurations of each job, split by rollout regime.

    python -m bench.first_forecast [--set seed|generated|fresh] [--jobs NAME,...] [--per 12] [--json FILE]

Why it exists: `make bench-forecast` scores the trials the search chose, so a forecast that is off
for a whole class of configurations shows up only where the search happened to go, mixed with the
optimizer's curse. This asks the forecaster, as the tuner holds it before its first trial, about
`--per` random valid configurations of each regime (a rollout that streams under partial rollout, one
that drains its batch) and prints, per job and regime, the median log(twin / forecast) of the
generation phase and of the step. A job-level offset in one regime that the other does not show is
what the baseline fails to teach about that regime (docs/benchmark-history.md 'What the first streaming
forecast misses'). About 2 minutes per set of ten jobs at `--per 12` on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.oracle import enumerate_space
from bench.run import measured_baseline, select_jobs
from rltune import twin
from rltune.api.models import RLTuningJobSpec
from rltune.tuner import physics
from rltune.tuner.core import Tuner

REGIMES = ("stream", "drain")


@dataclass(frozen=True)
class Miss:
    """One configuration: the twin's noiseless seconds against the forecast before any trial."""

    regime: str
    generation: float  # log(twin / forecast) of the generation phase
    step: float  # log(twin / forecast) of the step
    preemptions: float  # the twin's preemptions per step


def regime_of(k: dict) -> str:
    """The rollout regime: "stream" when partial rollout streams (it needs staleness >= 1), else "drain"."""
    return "stream" if physics.AsyncKnobs.of(k).streams else "drain"


def job_misses(job: dict, per: int, seed: int = 1) -> list[Miss]:
    """Up to `per` configurations of each regime, drawn at random (fixed `seed`) among those both the
    forecaster and the twin accept."""
    spec = RLTuningJobSpec.model_validate(job["spec"])
    rn, base = measured_baseline(job["metadata"]["name"], spec)
    fc = Tuner(spec, base, []).forecaster
    model = spec.workload.model.resolved()
    ks = enumerate_space(rn.space)
    random.Random(seed).shuffle(ks)
    out: list[Miss] = []
    count = dict.fromkeys(REGIMES, 0)
    for k in ks:
        regime = regime_of(k)
        if count[regime] >= per:
            if all(c >= per for c in count.values()):
                break
            continue
        pred = fc.predict(k)
        if not pred.feasible or pred.phases.get("generation", 0.0) <= 0.0:
            continue
        try:
            tw = twin.simulate_step_breakdown(
                model,
                spec.workload.task,
                spec.resources.gpu_type,
                spec.resources.gpus_per_node,
                rn.space.config(k),
                spec.workload.scenario,
            )
        except twin.Infeasible:
            continue
        count[regime] += 1
        out.append(
            Miss(
                regime,
                math.log(tw["phases"]["generation"] / pred.phases["generation"]),
                math.log(tw["duration"] / pred.step),
                float(tw["preemptions"]),
            )
        )
    return out


def render(per_job: dict[str, list[Miss]]) -> list[str]:
    """A markdown table: per job and regime, n, median and range of the generation miss, median step
    miss; then the median over jobs of each regime's per-job medians."""
    lines = [
        "| job | regime | n | generation, median (range) | step, median | step \\|median\\| | twin preempts |",
        "|---|---|---:|---|---:|---:|---:|",
    ]
    meds: dict[str, list[float]] = {r: [] for r in REGIMES}
    for name, misses in per_job.items():
        for regime in REGIMES:
            ms = [m for m in misses if m.regime == regime]
            if not ms:
                continue
            g = [m.generation for m in ms]
            s = [m.step for m in ms]
            meds[regime].append(statistics.median(g))
            lines.append(
                f"| {name} | {regime} | {len(ms)} | {statistics.median(g):+.2f} ({min(g):+.2f}..{max(g):+.2f}) | "
                f"{statistics.median(s):+.2f} | {statistics.median(abs(x) for x in s):.2f} | "
                f"{sum(m.preemptions > 0 for m in ms)}/{len(ms)} |"
            )
    lines.append("")
    for regime in REGIMES:
        if meds[regime]:
            v = meds[regime]
            lines.append(
                f"{regime}: median over jobs of the generation miss {statistics.median(v):+.2f}, "
                f"median |.| {statistics.median(abs(x) for x in v):.2f} ({len(v)} jobs)"
            )
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", default="seed", choices=("seed", "generated", "fresh"))
    ap.add_argument("--jobs", default="", help="comma-separated job names (default: all of the set)")
    ap.add_argument("--per", type=int, default=12, help="configurations per regime and job")
    ap.add_argument("--json", default="", help="also write the misses here")
    args = ap.parse_args(argv)
    per_job: dict[str, list[Miss]] = {}
    for job in select_jobs(args.jobs or None, args.set):
        name = job["metadata"]["name"]
        per_job[name] = job_misses(job, args.per)
        print(f"{name}: {len(per_job[name])} configurations", file=sys.stderr, flush=True)
    print("\n".join(render(per_job)))
    if args.json:
        Path(args.json).write_text(json.dumps({n: [asdict(m) for m in ms] for n, ms in per_job.items()}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
