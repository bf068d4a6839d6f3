"""`python -m rltune.grpo --spec FILE [--out FILE.jsonl]`: run the reference GRPO loop by hand.

The spec is a TrialSpec (JSON or YAML; mode is ignored) or an RLTuningJob (its spec.workload and
baseline are used). One JSON line per step goes to stdout (and --out).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys


def load(path: str, steps=None, staleness=None, seed=None):
    from rltune.api.models import RLTuningJobSpec, TrialSpec, read_document, trial_spec_for

    data = read_document(path)
    if isinstance(data, dict) and data.get("kind") == "RLTuningJob":
        job = RLTuningJobSpec.model_validate(data["spec"])
        b = job.budget
        spec = trial_spec_for(
            data.get("metadata", {}).get("namespace", "default"),
            data.get("metadata", {}).get("name", "local"),
            "manual",
            job,
            job.baseline,
            steps=b.steps_per_trial,
            warmup=b.warmup_steps,
        )
    else:
        spec = TrialSpec.model_validate(data)
    upd = {}
    if steps is not None:
        upd["steps"] = steps
    if seed is not None:
        upd["seed"] = seed
    if staleness is not None:
        upd["config"] = spec.config.with_knobs({"async.staleness": staleness})
    return spec.model_copy(update=upd) if upd else spec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rltune.grpo", description=__doc__.splitlines()[0])
    ap.add_argument("--spec", required=True, help="TrialSpec or RLTuningJob file (JSON or YAML)")
    ap.add_argument("--steps", type=int, help="override the number of steps")
    ap.add_argument("--staleness", type=int, help="override async.staleness")
    ap.add_argument("--seed", type=int, help="override the seed")
    ap.add_argument("--out", help="also write the step records here (JSON lines)")
    args = ap.parse_args(argv)
    from rltune.grpo import run

    spec = load(args.spec, args.steps, args.staleness, args.seed)
    out = open(args.out, "w") if args.out else None

    def emit(rec) -> None:
        line = json.dumps(dataclasses.asdict(rec))
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()

    info: dict = {}
    try:
        run(spec, emit, info)
    finally:
        print(json.dumps({"info": info}), file=sys.stderr, flush=True)
        if out:
            out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
