"""The benchmark's yardstick checked against the twin's own noisy steps (docs/benchmark.md, "The yardstick").

    python -m bench.yardstick [--set seed|generated|both] [--jobs NAME,...] [--samples 12] [--top 4]

bench.run's exhaustive oracle search uses the twin's noiseless step time (simulate_step_time: one
deterministic workload sample, no speed noise, no stragglers); a production run averages noisy steps
over fresh workloads, which is the yardstick bench.run judges picks by since 2026-12-03
(bench.oracle.expected_steps). This measures, per job, for the contenders that decide the table (the
baseline, the noiseless oracle's pick and `rltune plan`'s top-k), the noiseless step against the mean
of `--samples` noisy steady steps (common random numbers), and whether the two yardsticks name the
same best contender: how far the noiseless search that shortlists the oracle can be trusted.
Nothing here feeds the tuner or chooses a constant.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from bench.oracle import expected_steps, oracle
from bench.run import JobTrials, measured_baseline, select_jobs
from rltune.api.models import RLConfig, RLTuningJobSpec
from rltune.tuner import Tuner
from rltune.tuner.search import flat_key


@dataclass
class Contender:
    """One configuration measured on both yardsticks (seconds per step)."""

    label: str
    noiseless: float
    noisy_mean: float
    noisy_se: float  # standard error of noisy_mean

    @property
    def bias(self) -> float:
        """How far the noiseless step is from the noisy mean, relative to the noisy mean."""
        return self.noiseless / self.noisy_mean - 1.0


@dataclass
class JobYardstick:
    job: str
    kind: str
    contenders: list[Contender]

    def by(self, attr: str) -> Contender:
        return min(self.contenders, key=lambda c: getattr(c, attr))

    def speedup(self, attr: str) -> Optional[float]:
        """The oracle's speed-up over the baseline on one yardstick."""
        by = {c.label: getattr(c, attr) for c in self.contenders}
        return by["baseline"] / by["oracle"] if "baseline" in by and "oracle" in by else None

    @property
    def same_best(self) -> bool:
        """Whether both yardsticks name the same best contender."""
        return self.by("noiseless").label == self.by("noisy_mean").label

    @property
    def regret(self) -> float:
        """What following the noiseless yardstick costs on the noisy one: its best contender's noisy
        mean over the noisy yardstick's best, minus one (0 when they agree)."""
        return self.by("noiseless").noisy_mean / self.by("noisy_mean").noisy_mean - 1.0

    @property
    def resolved(self) -> bool:
        """Whether the regret exceeds two standard errors of the difference (else: within the sampling)."""
        a, b = self.by("noiseless"), self.by("noisy_mean")
        return a.noisy_mean - b.noisy_mean > 2.0 * math.hypot(a.noisy_se, b.noisy_se)


def contenders(name: str, spec: RLTuningJobSpec, top: int) -> tuple[JobTrials, list[tuple[str, RLConfig]]]:
    """The configurations that decide a job's row: baseline, oracle pick, plan's top-k (distinct)."""
    rn, base = measured_baseline(name, spec)
    orc = oracle(name, spec, procs=1)
    out = [("baseline", base.config), ("oracle", RLConfig.model_validate(orc["config"]))]
    for i, p in enumerate(Tuner(spec, base, []).proposer.rank(limit=top)):
        out.append((f"plan#{i + 1}", p.config))
    seen, uniq = set(), []
    for label, cfg in out:
        key = flat_key(cfg.flat(), rn.space.budget, rn.space.gpn)
        if key not in seen:
            seen.add(key)
            uniq.append((label, cfg))
    return rn, uniq


def measure_job(job: dict, samples: int, top: int) -> JobYardstick:
    name = job["metadata"]["name"]
    spec = RLTuningJobSpec.model_validate(job["spec"])
    rn, cands = contenders(name, spec, top)
    rows = []
    for label, cfg in cands:
        t = rn.noiseless(cfg)
        steps = expected_steps(rn.spec, cfg, samples)
        if t is None or not steps:
            continue
        se = statistics.stdev(steps) / math.sqrt(len(steps)) if len(steps) > 1 else float("nan")
        rows.append(Contender(label, t[1], statistics.mean(steps), se))
    return JobYardstick(name, spec.workload.task.kind, rows)


def render(results: list[JobYardstick], samples: int) -> list[str]:
    lines = [
        f"| job | task | noiseless vs noisy mean: oracle | range over contenders | oracle speed-up noiseless / "
        f"noisy | same best? | regret of the noiseless pick ({samples} noisy steps each) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        orc = next((c for c in r.contenders if c.label == "oracle"), None)
        biases = [c.bias for c in r.contenders]
        reg = f"{r.regret:+.1%}" + ("" if r.regret == 0 else (" (beyond 2 se)" if r.resolved else " (within 2 se)"))
        lines.append(
            f"| {r.job.replace('bench-', '')} | {r.kind} | {orc.bias:+.1%} | "
            f"{min(biases):+.1%} to {max(biases):+.1%} | "
            f"{r.speedup('noiseless'):.2f}x / {r.speedup('noisy_mean'):.2f}x | "
            f"{'yes' if r.same_best else 'no: ' + r.by('noisy_mean').label} | {reg} |"
            if orc
            else f"| {r.job} | {r.kind} | - | - | - | - | - |"
        )
    for kind in sorted({r.kind for r in results}):
        sub = [r for r in results if r.kind == kind]
        orc_bias = statistics.median(c.bias for r in sub for c in r.contenders if c.label == "oracle")
        ratio = statistics.median(r.speedup("noisy_mean") / r.speedup("noiseless") for r in sub)
        lines += [
            "",
            f"{kind}: the oracle's speed-up on the noisy yardstick is {ratio:.2f}x its noiseless one (median); "
            f"median bias of the oracle's noiseless step {orc_bias:+.1%}; same best contender on "
            f"{sum(r.same_best for r in sub)}/{len(sub)} jobs; regret beyond two standard errors on "
            f"{sum(r.resolved for r in sub)}/{len(sub)}.",
        ]
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.yardstick", description=__doc__.splitlines()[0])
    ap.add_argument("--set", choices=["seed", "generated", "both"], default="both")
    ap.add_argument("--jobs", help="comma-separated job names (default: the whole set)")
    ap.add_argument("--samples", type=int, default=12, help="noisy steady steps per contender")
    ap.add_argument("--top", type=int, default=4, help="contenders from `rltune plan`'s ranking")
    ap.add_argument("--json", help="write the per-contender numbers here")
    ap.add_argument("--from-json", help="only re-render the table from a --json file")
    a = ap.parse_args(argv)
    t0 = time.time()
    results = []
    if a.from_json:
        for d in json.loads(Path(a.from_json).read_text()):
            results.append(JobYardstick(d["job"], d["kind"], [Contender(**c) for c in d["contenders"]]))
        print("\n".join(render(results, a.samples)))
        return 0
    for name in ["seed", "generated"] if a.set == "both" else [a.set]:
        for job in select_jobs(a.jobs, name):
            r = measure_job(job, a.samples, a.top)
            results.append(r)
            print(
                f"{r.job}: " + ", ".join(f"{c.label} {c.noiseless:.0f}/{c.noisy_mean:.0f}s" for c in r.contenders),
                f"({time.time() - t0:.0f} s)",
                flush=True,
            )
    print("\n".join(["", *render(results, a.samples)]))
    if a.json:
        Path(a.json).write_text(json.dumps([asdict(r) for r in results], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
