"""`rltune` command line: plan, tune --local, report, operator.

rltune plan JOB.yaml [--top N]                      forecast-only ranking, no trials
rltune tune JOB.yaml --local [--real] [--report out.md|out.html] [--results out.json]
rltune report RESULTS.json --output out.md|out.html
rltune report --job NAMESPACE/NAME --output out.html  from a job the operator ran
rltune --version
rltune operator [...]                               the kopf operator (rltune.controller)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Optional

from .api.models import RLTuningJobSpec
from .api.status import TrialState


def load_job(path: str) -> tuple[str, str, RLTuningJobSpec]:
    """(namespace, name, spec) of an RLTuningJob manifest (or a bare spec)."""
    import yaml

    with open(path) as f:
        doc = yaml.safe_load(f)
    if not isinstance(doc, dict):
        raise SystemExit(f"rltune: {path}: not a YAML mapping")
    meta = doc.get("metadata") or {}
    body = doc.get("spec", doc) if "kind" in doc or "spec" in doc else doc
    from .admission import Refused, admit

    try:
        spec = admit(body)  # the operator's own admission check: what it refuses, the CLI refuses
    except Refused as e:
        raise SystemExit(f"rltune: {path}: refused ({e.reason}): {e}") from None
    return meta.get("namespace", "default"), meta.get("name", Path(path).stem), spec


def _fmt_changes(ch: dict, width: int = 110) -> str:
    if not ch:
        return "(baseline)"
    parts = []
    for k, (_, b) in ch.items():
        short = k.replace("rollout.", "r.").replace("trainer.", "t.").replace("async.", "")
        parts.append(f"{short}={_v(b)}")
    s = " ".join(parts)
    return s if len(s) <= width else s[: width - 1] + "…"


def _v(x) -> str:
    if isinstance(x, bool):
        return "on" if x else "off"
    if isinstance(x, float):
        return f"{x:g}"
    return str(x)


def _table(rows: list[list[str]], head: list[str]) -> str:
    w = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    line = "  ".join(h.ljust(w[i]) for i, h in enumerate(head))
    out = [line, "  ".join("-" * x for x in w)]
    for r in rows:
        out.append("  ".join(str(c).ljust(w[i]) for i, c in enumerate(r)))
    return "\n".join(out)


# ----------------------------------------------------------------------------- plan


def cmd_plan(args) -> int:
    from .tuner import Tuner, baseline_record

    t0 = time.monotonic()
    ns, name, spec = load_job(args.job)
    run = _run_baseline(spec, args.log) if args.log else None
    tuner = Tuner(spec, baseline_record(spec, run.summary if run else None), [])
    base = tuner.forecaster.predict(tuner.baseline.config)
    print(
        f"rltune plan {ns}/{name}: {spec.workload.model.preset or 'custom'} {spec.workload.task.kind} on "
        f"{spec.resources.gpu_budget}x {spec.resources.gpu_type}; objective {spec.objective}"
    )
    if run is None:
        print(
            "no measured baseline: the forecaster runs on its physics priors (uncalibrated, +/-30%); "
            "`rltune tune` calibrates it on the baseline's measured phases, `--log` on your run's log"
        )
    else:
        s = run.summary
        print(
            f"measured baseline from {len(args.log)} log file(s): {run.steps} steps, {run.warmup} warm-up "
            f"excluded; {s.step_time:.1f} s/step (sd {s.step_time_std:.1f} s over {s.steps} steps)"
        )
        for line in run.fallbacks():
            print(f"  the log has {line}")
        prof = tuner.profile()
        if prof is not None:
            print(f"profile: {prof.evidence}")
    if not base.feasible:
        print(f"warning: the baseline itself looks infeasible to the forecaster: {base.reason}")
        base_obj = None
    else:
        base_obj = tuner.objective_of(base.step, base.gpus)
        ph = ", ".join(
            f"{k} {v:.0f}s" for k, v in base.phases.items() if v > 0.5 and k not in ("waiting", "rollout_idle")
        )
        print(f"baseline forecast: {base.step:.1f} s/step ({ph})")
    for knob, left_out in tuner.space.narrowed.items():
        print(f"narrowed: {knob} leaves out {', '.join(map(str, left_out))} (the space past the operator's bounds)")
    props = tuner.proposer.rank(limit=args.top)
    rows = []
    for i, p in enumerate(props, 1):
        sp = f"{base_obj / p.predicted_objective:.2f}x" if base_obj else "-"
        fit = f"{p.fit_probability:.0%}" if p.fit_probability < 1.0 else "yes"
        rows.append(
            [str(i), _fmt_changes(p.changes), f"{p.predicted:.1f}", f"±{p.std:.0f}", sp, str(p.gpus), fit, p.bottleneck]
        )
    if not props:
        print(_nothing_ranks(spec, tuner, base))
    print(_table(rows, ["rank", "changes vs baseline", "pred s/step", "std", "speed-up", "GPUs", "fits", "addresses"]))
    print("(fits: the probability that it fits in memory where the memory model is unsure; trials settle it)")
    print(f"({tuner.space.size():,} configurations in the space; ranked in {time.monotonic() - t0:.1f} s)")
    _print_framework_plan(spec, props[0].config if props else None)
    return 0


def _run_baseline(spec, paths: list[str]):
    """The baseline measured by the run's console logs (tuner.from_run), or exit naming the problem."""
    from .tuner.from_run import from_logs

    texts = []
    for path in paths:
        try:
            texts.append(Path(path).read_text(errors="replace"))
        except OSError as e:
            raise SystemExit(f"rltune: --log {path}: {e.strerror or e}") from None
    try:
        return from_logs(spec, texts)
    except ValueError as e:
        raise SystemExit(f"rltune: --log: {e}") from None


def _nothing_ranks(spec, tuner, base) -> str:
    """Why the ranking is empty: what refuses the baseline itself (the physics, the framework's
    rules), which the search's other configurations mostly share."""
    from .adapters.registry import problems

    why = [f"the forecaster: {base.reason}"] if not base.feasible else []
    why += [f"{spec.workload.framework}: {p}" for p in problems(spec, tuner.baseline.config)[:2]]
    head = (
        f"nothing ranks: none of the {tuner.space.size():,} configurations is forecast to fit and run "
        "(memory model, framework rules)"
    )
    return (
        head
        + ("; the baseline: " + "; ".join(why) if why else "")
        + (". Widen spec.searchSpace (more GPUs, offload, smaller micro-batches) or check spec.workload.model")
    )


def _print_framework_plan(spec, top) -> None:
    """A verl/OpenRLHF job: what the framework cannot express, and rank 1 as the command to run."""
    import shlex

    from .adapters.registry import coverage, framework_command

    cov = coverage(spec)
    if not cov.version:
        return
    print(f"framework: {cov.framework} {cov.version} ({cov.backend}); kept at the baseline (no {cov.framework} key):")
    for d in cov.dropped:
        print(f"  {d.knob}: {d.why}")
    if top is not None:
        cmd = framework_command(spec, top)
        print(f"rank 1 as a {cov.framework} command (mode {cmd.mode}):\n  {shlex.join(cmd.argv)}")


def cmd_frameworks(args) -> int:
    """The knob coverage table of each framework adapter, from the adapters themselves."""
    from .adapters.registry import FRAMEWORKS, adapter_for

    for fw in FRAMEWORKS if args.framework is None else [args.framework]:
        ad = adapter_for(fw)
        for backend in ad.backends:
            rules = ad.rules(backend)
            rows = [[k, str(r.treatment), (", ".join(r.keys) or "-")[:70], r.note[:90]] for k, r in rules.items()]
            counts = {
                t: sum(1 for r in rules.values() if str(r.treatment) == t) for t in ("mapped", "transformed", "refused")
            }
            print(f"{fw} {ad.version}, backend {backend}: " + ", ".join(f"{n} {t}" for t, n in counts.items()))
            print(_table(rows, ["knob", "treatment", "keys", "note"]) + "\n")
    return 0


# ----------------------------------------------------------------------------- tune


def _record_row(r, base_obj, changes: dict) -> list[str]:
    meas = r.summary.step_time if r.summary and r.summary.steps else None
    sp = f"{base_obj / r.objective:.2f}x" if (r.objective and base_obj and r.state == TrialState.SUCCEEDED) else "-"
    return [
        r.id,
        r.state,
        f"{r.predicted:.1f}" if r.predicted else "-",
        f"{meas:.1f}" if meas else "-",
        sp,
        str(r.gpus),
        _fmt_changes(changes, 50),
        (r.reason or "")[:60],
    ]


def cmd_tune(args) -> int:
    from .backends.local import LocalBackend
    from .tuner import loop
    from .tuner.records import baseline_steps, config_changes

    ns, name, spec = load_job(args.job)
    if not args.local:
        print(
            "rltune tune: only --local is implemented here; on a cluster, `kubectl apply -f` the job "
            "and the operator tunes it",
            file=sys.stderr,
        )
        return 2
    if args.max_trials:
        spec.budget.max_trials = args.max_trials
        spec.budget.parallel_trials = min(spec.budget.parallel_trials, args.max_trials)
    out_json = args.results or (str(Path(args.report).with_suffix(".json")) if args.report else None)
    for flag, path in (("--results", args.results), ("--report", args.report)):
        # before the trials, not after them: a run must not end by losing its results to a missing folder
        if path:
            try:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                print(
                    f"rltune tune: {flag} {path}: cannot create its folder ({e.strerror}); "
                    f"pass a path in a writable folder",
                    file=sys.stderr,
                )
                return 2
    mode = "real" if args.real else ("real" if spec.workload.framework == "reference" else "twin")
    backend = LocalBackend(mode=mode)
    t0 = time.monotonic()
    state = {"base_obj": None}

    def on_event(e: loop.LoopEvent) -> None:
        el = f"[{time.monotonic() - t0:6.1f}s]"
        ev, r = e.event, e.record
        if ev.reason == "TrialStarted" and r is not None:
            if r.id == "baseline":
                print(f"{el} baseline started ({mode} mode, {baseline_steps(spec)} steps)", flush=True)
            else:
                ch = config_changes(spec.baseline, r.config, spec.resources.gpu_budget)
                pred = f" (predicted {r.predicted:.1f}±{r.predicted_std or 0:.0f} s)" if r.predicted else ""
                print(f"{el} {r.id} started on {r.gpus} GPUs: {_fmt_changes(ch)}{pred}", flush=True)
        elif ev.reason.startswith("Trial") and r is not None:
            meas = f"{r.summary.step_time:.1f} s/step" if r.summary and r.summary.steps else "-"
            if r.id == "baseline":
                state["base_obj"] = r.objective
                print(f"{el} baseline {r.state}: {meas if r.summary and r.summary.steps else r.reason}", flush=True)
                return
            sp = ""
            if r.state == TrialState.SUCCEEDED and r.objective and state["base_obj"]:
                sp = f", {state['base_obj'] / r.objective:.2f}x"
            print(f"{el} {r.id} {r.state}: {meas}{sp} — {(r.reason or '')[:120]}", flush=True)
        elif ev.reason == "Profiled":
            print(f"{el}   profile: {ev.message}", flush=True)
        else:
            print(f"{el} {ev.reason}: {ev.message}", flush=True)

    try:
        res = loop.run(spec, backend, on_event, job=name, namespace=ns, poll_s=0.2)
    finally:
        backend.close()
    base_obj = res.baseline.objective
    rows = []
    for r in [res.baseline] + res.trials:
        rows.append(_record_row(r, base_obj, config_changes(spec.baseline, r.config, spec.resources.gpu_budget)))
    print()
    print(_table(rows, ["trial", "state", "pred s", "meas s", "speed-up", "GPUs", "changes", "reason"]))
    best, won = res.best, res.status.best
    if best is not None and won is not None:
        # the status's figures (what `kubectl get` and `rltune report` show): the confirmation run's
        # measurement when there is one, not the search trial's
        how = "confirmed" if won.confirmed else "its trial, not confirmed"
        print(
            f"\nwinner: {won.trial} — {won.step_seconds:.1f} s/step on {won.gpus} GPUs ({how}), "
            f"{won.speedup:.2f}x the baseline ({res.baseline.summary.step_time:.1f} s/step)"
        )
        ch = config_changes(spec.baseline, best.config, spec.resources.gpu_budget)
        for k, (a, b) in ch.items():
            print(f"  {k}: {_v(a)} -> {_v(b)}")
    if res.forecast_error is not None:
        print(f"forecaster median |error|: {res.forecast_error:.1%}")
    if res.status.pool_offer is not None:
        print(f"other pools: {res.status.pool_offer.message}")
    result = results_dict(ns, name, spec, res, mode)
    if out_json:
        Path(out_json).write_text(json.dumps(result, indent=1))
        print(f"results: {out_json}")
    if args.report:
        from .report import render

        render(result, args.report)
        print(f"report: {args.report}")
    return 0 if res.baseline.state == TrialState.SUCCEEDED else 1


def results_dict(ns, name, spec, res, mode) -> dict:
    from .report import reward_gate

    return {
        "job": f"{ns}/{name}",
        "mode": mode,
        "spec": spec.dump(),
        "baseline": res.baseline.dump(),
        "trials": [r.dump() for r in res.trials],
        "best": res.best.id if res.best else None,
        "winner": res.status.best.model_dump(by_alias=True) if res.status.best else None,
        "reason": res.reason,
        "forecastError": res.forecast_error,
        "profile": res.profile.dump() if res.profile is not None else None,
        "timeline": [list(t) for t in res.timeline],
        "poolOffer": res.status.pool_offer.model_dump(by_alias=True) if res.status.pool_offer else None,
        "rewardGate": reward_gate(res.status),
    }


# ----------------------------------------------------------------------------- report


def cmd_report(args) -> int:
    from .report import render, result_from_job

    if bool(args.results) == bool(args.job):
        print("rltune report: give either RESULTS.json or --job NAMESPACE/NAME", file=sys.stderr)
        return 2
    if args.job:
        job = _read_job(args.job)
        try:
            result = result_from_job(job)
        except ValueError as e:
            print(f"rltune report: {e}", file=sys.stderr)
            return 1
    else:
        result = json.loads(Path(args.results).read_text())
    render(result, args.output)
    print(f"report: {args.output}")
    return 0


def _read_job(ref: str) -> dict:
    """An RLTuningJob from the cluster of the current kubeconfig (or in-cluster config)."""
    from kubernetes import client, config
    from kubernetes.client.rest import ApiException

    from .api.crdgen import GROUP, PLURAL, VERSION

    ns, _, name = ref.rpartition("/")
    if not name:
        raise SystemExit(f"rltune report: --job {ref!r}: expected NAMESPACE/NAME")
    try:
        config.load_kube_config()
    except config.ConfigException:
        config.load_incluster_config()
    try:
        return client.CustomObjectsApi().get_namespaced_custom_object(GROUP, VERSION, ns or "default", PLURAL, name)
    except ApiException as e:
        raise SystemExit(f"rltune report: --job {ref}: {e.status} {e.reason}") from None


# ----------------------------------------------------------------------------- operator
# Owned by the operator's engineer: the kopf operator lives in rltune.controller and is imported
# lazily so `rltune plan/tune` never need kopf or a cluster.


def _cmd_operator(argv: list[str]) -> int:
    from .controller import run as oprun  # lazy: kopf and kubernetes only for the operator

    p = argparse.ArgumentParser(prog="rltune operator", description="Run the rltune Kubernetes operator (kopf).")
    oprun.add_arguments(p)
    return oprun.run(p.parse_args(argv)) or 0


# ----------------------------------------------------------------------------- main


def version() -> str:
    """The installed package's version (pyproject.toml; the Helm chart's appVersion is checked against it)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as pkg_version

    try:
        return pkg_version("rltune")
    except PackageNotFoundError:
        return "unknown (not installed)"


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "operator":
        return _cmd_operator(argv[1:])
    ap = argparse.ArgumentParser(prog="rltune", description="Tune RL post-training jobs for speed.")
    ap.add_argument("--version", action="version", version=f"rltune {version()}")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plan", help="forecast-only ranking of configurations (no trials)")
    p.add_argument("job", help="RLTuningJob manifest (YAML)")
    p.add_argument("--top", type=int, default=10)
    p.add_argument(
        "--log",
        action="append",
        metavar="FILE",
        help="console log of the run you have (verl, OpenRLHF): its measured baseline calibrates the plan "
        "(repeat for a run's several files, in order)",
    )
    p.set_defaults(func=cmd_plan)
    t = sub.add_parser("tune", help="run the tuning loop")
    t.add_argument("job", help="RLTuningJob manifest (YAML)")
    t.add_argument("--local", action="store_true", help="run trials as local processes")
    t.add_argument("--real", action="store_true", help="real mode (rltune's GRPO loop) instead of the twin")
    t.add_argument("--report", help="write a report: .md or .html (PNG plots beside it)")
    t.add_argument("--results", help="write the results as JSON (default: beside the report)")
    t.add_argument("--max-trials", type=int, help="override budget.maxTrials")
    t.set_defaults(func=cmd_tune)
    r = sub.add_parser("report", help="render a report from `rltune tune --results` JSON or a job in the cluster")
    r.add_argument("results", nargs="?", help="results JSON of `rltune tune --results`")
    r.add_argument("--job", help="NAMESPACE/NAME of an RLTuningJob the operator ran (read from its status)")
    r.add_argument("--output", "-o", required=True)
    r.set_defaults(func=cmd_report)
    f = sub.add_parser(
        "frameworks", help="the knob coverage of the verl/OpenRLHF adapters (mapped/transformed/refused)"
    )
    f.add_argument("--framework", choices=["verl", "openrlhf"])
    f.set_defaults(func=cmd_frameworks)
    sub.add_parser("operator", help="run the Kubernetes operator (rltune.controller)")
    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
