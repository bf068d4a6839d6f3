"""The search-space bounds (rltune.tuner.search.MAX_SPACE, MAX_WORK) against every job the project ships.

`.venv/bin/python -m bench.space_bound [--time] [--shapes]`:

- counts (Space.count, Space.work: arithmetic, nothing enumerated) the space of every RLTuningJob in
  examples/*.yaml, tests/invalid_jobs/ (the invalid corpus) and bench/jobs.py (the eight seed jobs,
  the generated and the fresh set), and exits 1 when a job that must run is over a bound (the
  corpus's space-too-large case must be over, the rest need not);
- `--time`: also times one enumeration (search.candidates, a fresh process-wide physics cache per
  job: the first tick) of each example;
- `--shapes`: times spaces near the bounds, the numbers quoted at MAX_SPACE.

Timing belongs here, not in unit tests: the numbers depend on the machine (the docstrings quote 2 cores).
"""

from __future__ import annotations

import argparse
import copy
import sys
import time

import yaml

from bench import jobs
from bench.paths import ROOT
from rltune.controller.reconcile import InvalidSpec, validate_spec
from rltune.tuner import Tuner, baseline_record, physics
from rltune.tuner.search import MAX_SPACE, MAX_WORK, Space, candidates

MUST_BE_OVER = {"tests/invalid_jobs/space-too-large.yaml"}


def _specs():
    for group, pattern in (("examples", "examples/*.yaml"), ("invalid corpus", "tests/invalid_jobs/*.yaml")):
        for f in sorted(ROOT.glob(pattern)):
            for d in yaml.safe_load_all(f.read_text()):
                if d and d.get("kind") == "RLTuningJob":
                    yield group, str(f.relative_to(ROOT)), d["spec"]
    for name, made in (("seed", jobs.jobs()), ("generated", jobs.generated_jobs()), ("fresh", jobs.fresh_jobs())):
        for j in made:
            yield f"bench {name}", j["metadata"]["name"], j["spec"]


def _enumerate_seconds(spec) -> float:
    physics.rollout_part.cache_clear()  # the first tick's cost, not a warm cache's
    t = Tuner(spec, baseline_record(spec), [])
    t0 = time.perf_counter()
    candidates(t.space, t.forecaster)
    return time.perf_counter() - t0


def shapes() -> dict[str, dict]:
    """searchSpace.knobs of examples/twin-demo.yaml near the bounds (rollout.fp8 frozen as there)."""
    one_context = {"placement": ["colocated"], "async.staleness": [0], "async.partialRollout": [False]}
    return {
        "count near MAX_SPACE": one_context
        | {
            "weightSync": ["nccl"],
            "rollout.maxNumSeqs": list(range(16, 16 * 65, 16)),
            "trainer.microBatchTokens": [1024 * i for i in range(1, 65)],
            "cpu.rolloutThreads": [1, 2, 3, 4],
        },
        "45 CPU splits": {"cpu.rolloutThreads": list(range(1, 46))},
        "3 rollout knobs x 8": {
            "rollout.gpuMemoryUtilization": [round(0.3 + 0.01 * i, 2) for i in range(8)],
            "rollout.maxNumSeqs": [16 + 16 * i for i in range(8)],
            "rollout.maxNumBatchedTokens": [4096 + 512 * i for i in range(8)],
        },
        "3 rollout knobs x 12": {
            "rollout.gpuMemoryUtilization": [round(0.3 + 0.01 * i, 2) for i in range(12)],
            "rollout.maxNumSeqs": [16 + 16 * i for i in range(12)],
            "rollout.maxNumBatchedTokens": [4096 + 512 * i for i in range(12)],
        },
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time", action="store_true", help="time one enumeration of each example")
    ap.add_argument("--shapes", action="store_true", help="time spaces near the bounds")
    args = ap.parse_args(argv)
    print(f"bounds: MAX_SPACE {MAX_SPACE:,} configurations, MAX_WORK {MAX_WORK:,} units")
    bad, largest = [], {}
    for group, name, raw in _specs():
        try:
            spec = validate_spec(raw)
            space = Space(spec)
        except (InvalidSpec, ValueError) as e:  # refused before the space is built
            print(f"  {group:16s} {name:58s} (refused earlier: {str(e)[:50]})")
            continue
        n, w = space.count(), space.work()
        over = n > MAX_SPACE or w > MAX_WORK
        secs = f"  {_enumerate_seconds(spec):6.2f} s" if args.time and group == "examples" and not over else ""
        print(f"  {group:16s} {name:58s} {n:>20,} {w:>14,}{'  OVER' if over else ''}{secs}")
        if over != (name in MUST_BE_OVER) and (over or name in MUST_BE_OVER):
            bad.append(name)
        if not over:
            largest[group] = max(largest.get(group, (0, 0)), (n, w))
    for group, (n, w) in largest.items():
        print(f"largest under the bounds, {group}: {n:,} configurations, {w:,} units")
    if args.shapes:
        demo = yaml.safe_load((ROOT / "examples" / "twin-demo.yaml").read_text())["spec"]
        for name, knobs in shapes().items():
            raw = copy.deepcopy(demo)
            raw["searchSpace"] = {"frozen": ["rollout.fp8"], "knobs": knobs}
            spec = validate_spec(raw)
            space = Space(spec)
            print(
                f"  shape {name:24s} {space.count():>16,} configurations {space.work():>12,} units "
                f"{_enumerate_seconds(spec):7.2f} s"
            )
    if bad:
        print(f"on the wrong side of the bounds: {bad}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
