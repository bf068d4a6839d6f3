"""Forecaster evaluation: rltune's step-time forecast error per trial, over many seeds.

    python -m bench.forecast [--set seed|generated] [--jobs NAME,...] [--seeds 20] [--first-seed 0]
                             [--budget 16] [--json FILE]

Runs rltune on each benchmark job exactly as `make bench` does (bench.run.run_rltune: the
product's own loop on the in-process twin backend, same baseline, same noisy twin trials, same
seeds) and keeps, for every scored trial, what the
forecaster predicted before the trial ran and what the trial measured. It prints

- the headline of docs/benchmark.md (median over jobs of each job's median over seeds of one run's
  median error) with its 90% seed-bootstrap interval;
- per job: signed and absolute error over all trials;
- per trial index: signed and absolute error and the share of trials within one predicted sd.

Why it exists: a forecaster change moves which trials the search picks, so replaying a fixed
trial sequence does not predict its effect, and 10 seeds leave the headline about half a point
uncertain. Judge forecaster changes here, on 20 seeds, by the per-trial-index table as well as
the headline. About 15 minutes on 2 cores for all eight jobs.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import time
from pathlib import Path

from bench.run import measured_baseline, median_of_medians_interval, run_rltune, select_jobs
from rltune.api.models import RLTuningJobSpec

LAST_INDEX = 10  # trials from this index on are pooled in the per-index table


def job_trials(job: dict, seeds: int, budget: int, first_seed: int = 0) -> list[dict]:
    """One record per seed: the run's headline error and its trials as (index, predicted, predicted
    sd, measured) step times."""
    name = job["metadata"]["name"]
    spec = RLTuningJobSpec.model_validate(job["spec"])
    rn, base = measured_baseline(name, spec)
    out = []
    for sd in range(first_seed, first_seed + seeds):
        run = run_rltune(rn, base, budget, sd)
        index = {r.id: i + 1 for i, r in enumerate(run["history"])}
        trials = [(index[r.id], r.predicted, r.predicted_std, r.summary.step_time) for r in run["forecast_trials"]]
        out.append({"job": name, "seed": sd, "forecast_error": run["forecast_error"], "trials": trials})
    return out


def summarize_runs(runs: list[dict]) -> dict:
    """Headline, per-job and per-trial-index error statistics of job_trials records."""
    per_job: dict[str, list] = {}
    seed_err: dict[str, list] = {}
    by_index: dict[int, list] = {}
    for r in runs:
        if r["forecast_error"] is not None:
            seed_err.setdefault(r["job"], []).append(r["forecast_error"])
        for i, pred, sd, meas in r["trials"]:
            e = (pred - meas) / meas
            inside = abs(pred - meas) <= sd if sd else False
            per_job.setdefault(r["job"], []).append(e)
            by_index.setdefault(min(i, LAST_INDEX), []).append((e, inside))
    headline = statistics.median(statistics.median(v) for v in seed_err.values()) if seed_err else None
    return {
        "headline": headline,
        "interval": median_of_medians_interval(list(seed_err.values())) if seed_err else None,
        "jobs": {
            j: {
                "trials": len(v),
                "signed": statistics.median(v),
                "abs": statistics.median(map(abs, v)),
                "headline": statistics.median(seed_err[j]) if j in seed_err else None,
            }
            for j, v in sorted(per_job.items())
        },
        "index": {
            i: {
                "trials": len(v),
                "signed": statistics.median(e for e, _ in v),
                "abs": statistics.median(abs(e) for e, _ in v),
                "within_sd": sum(w for _, w in v) / len(v),
            }
            for i, v in sorted(by_index.items())
        },
    }


def render(st: dict) -> str:
    lines = []
    if st["headline"] is not None:
        lo, hi = st["interval"]
        lines.append(
            f"forecast error (median over jobs of per-job medians): {st['headline']:.2%} "
            f"(90% seed-bootstrap interval {lo:.2%}-{hi:.2%})"
        )
    lines += ["", "| job | trials | median signed error | median abs error | job headline |", "|---|---|---|---|---|"]
    for j, v in st["jobs"].items():
        hl = f"{v['headline']:.1%}" if v["headline"] is not None else "-"
        lines.append(f"| {j} | {v['trials']} | {v['signed']:+.1%} | {v['abs']:.1%} | {hl} |")
    lines += [
        "",
        "| trial | trials | median signed error | median abs error | within 1 predicted sd |",
        "|---|---|---|---|---|",
    ]
    for i, v in st["index"].items():
        label = f"{i}+" if i == LAST_INDEX else str(i)
        lines.append(f"| {label} | {v['trials']} | {v['signed']:+.1%} | {v['abs']:.1%} | {v['within_sd']:.0%} |")
    lines.append("\nsigned error: (predicted - measured) / measured; negative = the forecast was optimistic")
    return "\n".join(lines)


def _job_quiet(job, seeds, budget, first_seed=0):
    t0 = time.time()
    out = job_trials(job, seeds, budget, first_seed)
    print(f"{job['metadata']['name']}: {seeds} seeds in {time.time() - t0:.0f} s", flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.forecast", description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", help="comma-separated job names (default: the whole set)")
    ap.add_argument(
        "--set",
        choices=["seed", "generated"],
        default="seed",
        help="the eight seed-shaped jobs, or the generated set (bench.jobs.generated_jobs)",
    )
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument(
        "--first-seed",
        type=int,
        default=0,
        help="seeds first-seed .. first-seed+seeds-1: judge a change chosen on seeds 0-19 on held-out ones",
    )
    ap.add_argument("--budget", type=int, default=16, help="trials per run (as make bench's largest budget)")
    ap.add_argument("--procs", type=int, default=2, help="jobs evaluated in parallel (processes)")
    ap.add_argument("--json", help="write the per-trial records here")
    args = ap.parse_args(argv)
    todo = select_jobs(args.jobs, args.set)
    if not todo:
        names = ", ".join(j["metadata"]["name"].replace("bench-", "") for j in select_jobs(None, args.set))
        ap.error(f"--jobs {args.jobs!r} names no benchmark job; the jobs are: {names}")
    t0 = time.time()
    if args.procs > 1 and len(todo) > 1:
        with mp.get_context("fork").Pool(args.procs) as pool:
            parts = pool.starmap(_job_quiet, [(j, args.seeds, args.budget, args.first_seed) for j in todo])
    else:
        parts = [_job_quiet(j, args.seeds, args.budget, args.first_seed) for j in todo]
    runs = [r for p in parts for r in p]
    print(f"total {time.time() - t0:.0f} s\n")
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1))
    print(render(summarize_runs(runs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
