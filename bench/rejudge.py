"""Re-judge a benchmark run's stored picks on a finer yardstick (docs/benchmark.md, "How fine the yardstick is").

    python -m bench.rejudge [--set seed|generated|fresh] [--samples 96] [--budget 8] [--procs 2]

bench.run judges every pick by the mean of EXPECT_SAMPLES (12) noisy steady steps with common random
numbers; its "not behind any rival (within 0.5%)" verdict compares medians over seeds that may lie
within 1% of each other. This re-judges each method's stored picks at `--budget` trials (the
results JSON of the set in bench/results/: results.json, results-generated.json, results-fresh.json) and the
baseline on `--samples` steps (the first 12 are the table's own draws), and prints each job's
medians and whether the table's verdict holds. Nothing here feeds the tuner or chooses a constant.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from bench import paths
from bench.oracle import _init, expected_steps
from bench.run import SETS, TIE, not_behind, select_jobs
from rltune.api.models import RLConfig, RLTuningJobSpec
from rltune.tuner import baseline_record
from rltune.tuner.records import objective_of
from rltune.tuner.search import Space, flat_key

RESULTS = {name: paths.RESULTS / fname for name, (_, _, fname) in SETS.items()}  # each set's results JSON


@dataclass
class Rejudged:
    """One job's median speed-up per method at the budget, on the finer yardstick."""

    job: str
    samples: int
    medians: dict[str, float]

    @property
    def best_rival(self) -> float:
        return max(s for m, s in self.medians.items() if m != "rltune")

    @property
    def not_behind(self) -> bool:
        """bench.run's verdict: rltune within TIE of the best rival."""
        return not_behind(self.medians["rltune"], self.best_rival)

    @property
    def ahead(self) -> bool:
        return self.medians["rltune"] > self.best_rival


def rejudge_job(job: dict, stored: dict, samples: int, budget: int) -> Rejudged:
    spec = RLTuningJobSpec.model_validate(job["spec"])
    _init(spec.model_dump_json(by_alias=True))
    space = Space(spec)
    memo: dict[str, float] = {}

    def objective(cfg: RLConfig) -> float:
        key = flat_key(cfg.flat(), space.budget, space.gpn)
        if key not in memo:
            steps = expected_steps(spec, cfg, samples)
            if not steps:
                raise ValueError(f"{stored['job']}: a stored pick the yardstick refuses (the twin changed?)")
            memo[key] = objective_of(spec, statistics.fmean(steps), cfg.gpus or space.budget)
        return memo[key]

    base = objective(baseline_record(spec).config)
    medians = {
        method: statistics.median(base / objective(RLConfig.model_validate(c)) for c in m["picks"][str(budget)])
        for method, m in stored["methods"].items()
    }
    return Rejudged(stored["job"], samples, medians)


def _one(args) -> Rejudged:
    return rejudge_job(*args)


def render(rows: list[Rejudged], stored: dict, budget: int) -> list[str]:
    methods = list(rows[0].medians) if rows else []
    samples = rows[0].samples if rows else 0
    lines = [
        f"| job | {' | '.join(methods)} | not behind at 12 -> {samples} samples |",
        "|---|" + "---:|" * len(methods) + "---|",
    ]
    for r in rows:
        m12 = stored[r.job]["methods"]
        was = Rejudged(r.job, 12, {m: v["speedup"][str(budget)] for m, v in m12.items()}).not_behind
        cells = [f"{m12[m]['speedup'][str(budget)]:.3f} -> {r.medians[m]:.3f}" for m in methods]
        lines.append(
            f"| {r.job} | {' | '.join(cells)} | {'yes' if was else 'no'} -> {'yes' if r.not_behind else 'no'} |"
        )
    lines += [
        "",
        f"rltune not behind any rival at {budget} trials (within {TIE:.1%}) on "
        f"{sum(r.not_behind for r in rows)}/{len(rows)} jobs on {samples} samples, ahead of every rival on "
        f"{sum(r.ahead for r in rows)}/{len(rows)}.",
    ]
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.rejudge", description=__doc__.splitlines()[0])
    ap.add_argument("--set", choices=list(RESULTS), default="generated")
    ap.add_argument("--samples", type=int, default=96, help="noisy steady steps per configuration")
    ap.add_argument("--budget", type=int, default=8, help="trials after which the picks are judged")
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--results", help="the results JSON to re-judge (default: the set's)")
    a = ap.parse_args(argv)
    t0 = time.time()
    stored = {r["job"]: r for r in json.loads(Path(a.results or RESULTS[a.set]).read_text())}
    jobs = [j for j in select_jobs(None, a.set) if j["metadata"]["name"] in stored]
    todo = [(j, stored[j["metadata"]["name"]], a.samples, a.budget) for j in jobs]
    with mp.Pool(a.procs) as pool:
        rows = pool.map(_one, todo)
    print("\n".join(render(rows, stored, a.budget)))
    print(f"({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
