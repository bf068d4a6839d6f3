"""`python -m rltune.trial [--spec FILE]`: run one trial and export rltune's metrics.

The TrialSpec comes from --spec FILE (JSON or YAML) or env RLTUNE_TRIAL_SPEC (JSON). Env
RLTUNE_PUSHGATEWAY_URL and RLTUNE_METRICS_PORT override the spec's fields. mode twin runs the
digital twin (simulated seconds; RLTUNE_TWIN_SECONDS_PER_STEP adds wall time per step so a running
trial can be observed); mode real runs rltune.grpo.run(spec, emit).

Exit codes: 0 success; 137 CUDA out of memory (like an OOM-killed container); 1 other failures,
with exactly one line `rltune-trial: <reason>` on stderr. The final push carries trial_state 1 or 2
(and the reason in trial_info's `reason` label).

Test-only fault injection (twin mode; tests/e2e/test_faults.py): env RLTUNE_TWIN_FAULTS =
"<trial>=<fault>,..." makes the named trials misbehave: `crash` (exit 1 after the first step),
`oom` (exit 137, "CUDA out of memory"), `nometrics` (runs, exits 0, never pushes a metric),
`nan` (steady-state steps report NaN step time and reward). Unset: no effect.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Optional

from rltune.api import metrics
from rltune.api.models import TrialSpec, read_document

from .exporter import TrialExporter

EXIT_OOM = 137
EXIT_FAIL = 1


def load_spec(path: Optional[str]) -> TrialSpec:
    if path:
        data = read_document(path)
    else:
        raw = os.environ.get("RLTUNE_TRIAL_SPEC")
        if not raw:
            raise ValueError("no trial spec: pass --spec FILE or set RLTUNE_TRIAL_SPEC")
        data = json.loads(raw)
    spec = TrialSpec.model_validate(data)
    updates = {}
    if os.environ.get("RLTUNE_PUSHGATEWAY_URL"):
        updates["pushgateway_url"] = os.environ["RLTUNE_PUSHGATEWAY_URL"]
    if os.environ.get("RLTUNE_METRICS_PORT"):
        updates["metrics_port"] = int(os.environ["RLTUNE_METRICS_PORT"])
    return spec.model_copy(update=updates) if updates else spec


def _gpus(spec: TrialSpec) -> int:
    if spec.config.gpus:
        return spec.config.gpus
    if spec.mode == "twin":
        from rltune.twin.simulate import DEFAULT_GPUS

        return int((spec.scenario or {}).get("gpus", DEFAULT_GPUS))
    return 0


FAULTS = ("crash", "oom", "nometrics", "nan")


def injected_fault(spec: TrialSpec) -> str:
    """The test-only fault RLTUNE_TWIN_FAULTS names for this trial ("" = none; twin mode only)."""
    if spec.mode != "twin":
        return ""
    for item in (os.environ.get("RLTUNE_TWIN_FAULTS") or "").split(","):
        trial, _, fault = item.strip().partition("=")
        if trial == spec.trial and fault in FAULTS:
            return fault
    return ""


def run_trial(spec: TrialSpec, exporter: TrialExporter) -> None:
    """Run the trial's steps, recording each one; raise on failure."""
    if spec.mode == "twin":
        import dataclasses

        from rltune.twin import simulate_trial

        per_step = float(os.environ.get("RLTUNE_TWIN_SECONDS_PER_STEP", "0") or 0)
        fault = injected_fault(spec)
        for i, rec in enumerate(simulate_trial(spec)):
            if per_step > 0:
                time.sleep(per_step)
            if fault == "crash" and i == 1:
                raise RuntimeError("injected fault: crash")
            if fault == "oom" and i == 1:
                raise MemoryError("CUDA out of memory (injected fault)")
            if fault == "nan" and not rec.warmup:
                rec = dataclasses.replace(rec, duration=float("nan"), reward=float("nan"))
            exporter.record(rec)
    else:
        from rltune import grpo  # lazy: torch/vLLM only in real mode

        grpo.run(spec, exporter.record)


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rltune.trial", description=__doc__.splitlines()[0])
    ap.add_argument("--spec", help="TrialSpec file (JSON or YAML); default: env RLTUNE_TRIAL_SPEC")
    args = ap.parse_args(argv)
    exporter = None
    try:
        spec = load_spec(args.spec)
        bind = os.environ.get("RLTUNE_METRICS_BIND", "0.0.0.0")
        exporter = TrialExporter(
            spec.namespace,
            spec.job,
            spec.trial,
            mode=spec.mode,
            pushgateway_url=spec.pushgateway_url,
            metrics_port=spec.metrics_port,
            bind=bind,
            signing_key=os.environ.get(metrics.KEY_ENV),
        )
        if injected_fault(spec) == "nometrics":
            exporter.pushgateway_url = None  # test-only: the trial runs but nothing reaches the metrics store
        exporter.serve()
        exporter.set_gpus(_gpus(spec))
        exporter.push(force=True)
        run_trial(spec, exporter)
        exporter.finish(ok=True)
        print(f"rltune-trial: {spec.namespace}/{spec.job}/{spec.trial} done", flush=True)
        _linger()
        return 0
    except BaseException as e:  # noqa: BLE001 - every failure must end in one line and a final push
        if isinstance(e, SystemExit) and e.code in (0, None):
            raise
        reason, code = _classify(e)
        print(f"rltune-trial: {reason}", file=sys.stderr, flush=True)
        if exporter is not None:
            try:
                exporter.finish(ok=False, reason=reason)
            except Exception:
                pass
            _linger()
        return code


def _classify(e: BaseException) -> tuple[str, int]:
    from rltune.twin.errors import Infeasible

    if isinstance(e, KeyboardInterrupt):
        return "interrupted", EXIT_FAIL
    msg = " ".join(str(e).split()) or type(e).__name__
    if isinstance(e, Infeasible):
        return msg, EXIT_OOM if e.oom else EXIT_FAIL
    low = msg.lower()
    if "out of memory" in low or type(e).__name__ in ("OutOfMemoryError", "MemoryError"):
        return msg if "out of memory" in low else f"out of memory: {msg}", EXIT_OOM
    if type(e).__name__ in ("ValidationError", "ValueError", "JSONDecodeError"):
        return f"{type(e).__name__}: {msg}", EXIT_FAIL
    return f"{type(e).__name__}: {msg}", EXIT_FAIL


def _linger() -> None:
    """Keep serving /metrics a while after the end (scrape mode), if asked: RLTUNE_LINGER_SECONDS."""
    s = float(os.environ.get("RLTUNE_LINGER_SECONDS", "0") or 0)
    if s > 0:
        time.sleep(s)
