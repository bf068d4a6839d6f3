"""Tuner benchmark: rltune vs Optuna TPE vs random search vs the exhaustive oracle (docs/benchmark.md).

    python -m bench.run [--jobs NAME,...] [--seeds 3] [--budgets 4,8,16] [--no-write]

For each benchmark job (bench/jobs.py), side by side:
- baseline: noiseless twin step time of the job's starting configuration;
- oracle: exhaustive search of the same space on the twin's noiseless simulate_step_time
  (cached in bench/oracle_cache.json, keyed by TWIN_VERSION and the job's spec);
- rltune, Optuna TPE (ask-and-tell) and random search, each with the same trial budgets, several
  seeds; trials run in-process through simulate_trial (noise on) and are scored exactly like the
  operator scores them (rltune.tuner summarize + quality gates). A method's result after k trials is
  the configuration with the best *measured* objective among its first k gated trials, reported at
  its *true* (noiseless) objective: what a user would deploy and get.
The tuner never sees the twin; only this harness does.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "operator"))

from bench.jobs import jobs as bench_jobs  # noqa: E402
from rltune import twin  # noqa: E402
from rltune.api.models import RLConfig, RLTuningJobSpec, trial_spec_for  # noqa: E402
from rltune.api.status import TrialState  # noqa: E402
from rltune.tuner import Tuner, baseline_record, summarize  # noqa: E402
from rltune.tuner.knobs import OUTER_KNOBS, ROLLOUT_KNOBS, TRAINER_KNOBS  # noqa: E402
from rltune.tuner.records import failure_cause, objective_of  # noqa: E402
from rltune.tuner.search import Space, flat_key  # noqa: E402

CACHE = ROOT / "bench" / "oracle_cache.json"
STEPS, WARMUP = 4, 1


# ------------------------------------------------------------------------------------ space


def enumerate_space(space: Space) -> list[dict]:
    """Every valid configuration of the job's space (flat knob dicts), de-duplicated."""
    from rltune.tuner import physics

    out, seen = [], set()
    r_all = space.halves(ROLLOUT_KNOBS)
    t_all = space.halves(TRAINER_KNOBS)
    for o in space.outer():
        ko = dict(space.base) | o
        _, gt, gr = physics.split(ko, space.budget, space.gpn)
        if gt < 1 or gr < 1:
            continue
        rs = [r for r in r_all if not space.rollout_valid(r, gr)]
        ts = [t for t in t_all if not space.trainer_valid(t, gt)]
        for r in rs:
            for t in ts:
                k = ko | r | t
                if k["placement"] == "colocated":
                    k["trainerGpus"] = None
                key = flat_key(k, space.budget, space.gpn)
                if key not in seen:
                    seen.add(key)
                    out.append(k)
    return out


_W: dict = {}


def _init(spec_json: str) -> None:
    spec = RLTuningJobSpec.model_validate_json(spec_json)
    _W["spec"] = spec
    _W["space"] = Space(spec)
    _W["model"] = spec.workload.model.resolved()


def _true(k: dict):
    spec, space = _W["spec"], _W["space"]
    cfg = space.config(k)
    try:
        st = twin.simulate_step_time(
            _W["model"],
            spec.workload.task,
            spec.resources.gpu_type,
            spec.resources.gpus_per_node,
            cfg,
            spec.workload.scenario,
        )
    except twin.Infeasible:
        return None
    return objective_of(spec, st, cfg.gpus), st


def true_objective(spec: RLTuningJobSpec, cfg: RLConfig):
    _init(spec.model_dump_json(by_alias=True))
    return _true(cfg.flat())


def twin_hash() -> str:
    """Hash of the twin's source: the oracle is recomputed when the twin changes, even if a change
    forgot to bump TWIN_VERSION."""
    h = hashlib.sha256()
    for f in sorted((ROOT / "operator" / "rltune" / "twin").glob("*.py")):
        h.update(f.read_bytes())
    return h.hexdigest()[:12]


def spec_hash(spec: RLTuningJobSpec) -> str:
    return hashlib.sha256(spec.model_dump_json(by_alias=True).encode()).hexdigest()[:16]


def oracle(name: str, spec: RLTuningJobSpec, procs: int = 2) -> dict:
    cache = json.loads(CACHE.read_text()) if CACHE.exists() else {}
    key = f"{twin.TWIN_VERSION}:{twin_hash()}:{name}:{spec_hash(spec)}"
    if key in cache:
        return cache[key]
    space = Space(spec)
    ks = enumerate_space(space)
    t0 = time.time()
    if procs <= 1:
        _init(spec.model_dump_json(by_alias=True))
        res = [_true(k) for k in ks]
    else:
        ctx = mp.get_context("fork")
        with ctx.Pool(procs, initializer=_init, initargs=(spec.model_dump_json(by_alias=True),)) as pool:
            res = pool.map(_true, ks, chunksize=8)
    feas = [(r[0], r[1], k) for r, k in zip(res, ks) if r is not None]
    best = min(feas, key=lambda x: x[0])
    out = {
        "configs": len(ks),
        "feasible": len(feas),
        "objective": best[0],
        "step": best[1],
        "config": space.config(best[2]).dump(),
        "seconds": round(time.time() - t0, 1),
    }
    cache = json.loads(CACHE.read_text()) if CACHE.exists() else {}
    cache = {k: v for k, v in cache.items() if k.startswith(f"{twin.TWIN_VERSION}:{twin_hash()}:")}
    cache[key] = out
    tmp = CACHE.with_suffix(".tmp")
    tmp.write_text(json.dumps(cache, indent=1, sort_keys=True))
    tmp.replace(CACHE)
    return out


# ------------------------------------------------------------------------------------ trials


class Runner:
    """Runs (and memoises) noisy in-process trials of one job and scores them like the operator."""

    def __init__(self, name: str, spec: RLTuningJobSpec):
        self.name, self.spec = name, spec
        self.space = Space(spec)
        self.cache: dict = {}
        _init(spec.model_dump_json(by_alias=True))
        self.truth: dict = {}

    def run(self, cfg: RLConfig, trial: str, seed: int):
        ts = trial_spec_for("bench", self.name, trial, self.spec, cfg, STEPS, WARMUP, seed=seed)
        try:
            return summarize(twin.simulate_trial(ts)), ""
        except twin.Infeasible as e:
            return None, str(e)

    def true(self, cfg: RLConfig):
        k = flat_key(cfg.flat(), self.space.budget, self.space.gpn)
        if k not in self.truth:
            self.truth[k] = _true(cfg.flat())
        return self.truth[k]


def run_rltune(rn: Runner, base, budget: int, seed: int) -> dict:
    spec = rn.spec
    hist = []
    t0 = time.time()
    stop_reason = ""
    while len(hist) < budget:
        tuner = Tuner(spec, base, hist)
        done, why = tuner.done()
        if done:
            stop_reason = why
            break
        props = tuner.propose(1, spec.resources.gpu_budget)
        if not props:
            stop_reason = "no proposal"
            break
        rec = tuner.record_for(f"t{len(hist) + 1}", props[0])
        s, err = rn.run(rec.config, rec.id, seed * 1000 + len(hist) + 1)
        if s is None:
            rec.state, rec.reason, rec.cause = TrialState.FAILED, err, failure_cause(err)
        else:
            rec = tuner.judge(rec, s)
        hist.append(rec)
    tuner = Tuner(spec, base, hist)
    return {
        "history": hist,
        "forecast_error": tuner.forecast_error(),
        "forecast_trials": tuner.forecast_trials(),
        "seconds": time.time() - t0,
        "stop": stop_reason,
    }


def _choices(space: Space) -> dict[str, list]:
    ch = {"gpus": space.gpus}
    for k in OUTER_KNOBS + ROLLOUT_KNOBS + TRAINER_KNOBS:
        ch[k] = space.values[k]
    splits = sorted({t for g in space.gpus for t in space.trainer_splits(g)})
    ch["trainerGpus"] = splits or [None]
    return ch


def _valid(space: Space, k: dict) -> bool:
    if k["placement"] == "colocated":
        k["trainerGpus"] = None
    elif k["trainerGpus"] is None or k["trainerGpus"] >= k["gpus"]:
        return False
    if k["async.partialRollout"] and k["async.staleness"] < 1:
        return False
    if k["placement"] == "disaggregated" and k["trainerGpus"] not in space.trainer_splits(k["gpus"]):
        return False
    return space.all_valid(k) is None


def run_baseline_search(rn: Runner, base, budget: int, seed: int, method: str, judge_tuner: Tuner) -> dict:
    """Optuna TPE (ask-and-tell) or random search over the same space, validity rules known."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = rn.space
    ch = _choices(space)
    rng = random.Random(seed)
    dists = {k: optuna.distributions.CategoricalDistribution([json.dumps(v) for v in vals]) for k, vals in ch.items()}
    study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=seed, n_startup_trials=4))
    tried = {flat_key(base.config.flat(), space.budget, space.gpn)}
    hist = []
    penalty = (base.objective or 1.0) * 1.5
    valid_pool = None
    while len(hist) < budget:
        k = None
        for _ in range(200):
            if method == "tpe":
                tr = study.ask(dists)
                cand = dict(space.base) | {p: json.loads(tr.params[p]) for p in ch}
                ok = _valid(space, cand) and flat_key(cand, space.budget, space.gpn) not in tried
                if not ok:
                    study.tell(tr, state=optuna.trial.TrialState.FAIL)  # not a trial: a static rule says no
                    continue
                k = cand
                break
            else:
                if valid_pool is None:
                    valid_pool = enumerate_space(space)
                    rng.shuffle(valid_pool)
                while valid_pool:
                    cand = valid_pool.pop()
                    if flat_key(cand, space.budget, space.gpn) not in tried:
                        k = cand
                        break
                break
        if k is None:
            break
        tried.add(flat_key(k, space.budget, space.gpn))
        cfg = space.config(k)
        rec = judge_tuner.record_for(f"{method}{len(hist) + 1}", _FakeProp(cfg))
        s, err = rn.run(cfg, rec.id, seed * 1000 + 500 + len(hist))
        if s is None:
            rec.state, rec.reason, rec.cause = TrialState.FAILED, err, failure_cause(err)
        else:
            rec = judge_tuner.judge(rec, s)
        hist.append(rec)
        if method == "tpe":
            val = rec.objective if rec.state == TrialState.SUCCEEDED else penalty
            study.tell(tr, val)
    return {"history": hist}


class _FakeProp:
    def __init__(self, cfg):
        self.config, self.gpus = cfg, cfg.gpus
        self.predicted = None
        self.std = None
        self.bottleneck = None
        self.rationale = None


def best_after(rn: Runner, base, hist, k: int) -> tuple[float, float]:
    """(true objective, GPU-hours) of a method's pick after its first k trials."""
    ok = [r for r in hist[:k] if r.state == TrialState.SUCCEEDED and r.objective is not None]
    gpu_h = (
        sum(
            r.summary.step_time_mean * r.gpus * r.summary.total_steps
            for r in hist[:k]
            if r.summary is not None and r.summary.steps
        )
        / 3600
    )
    if not ok:
        return rn.true(base.config)[0], gpu_h
    pick = min(ok, key=lambda r: r.objective)
    if base.objective is not None and pick.objective >= base.objective:
        return rn.true(base.config)[0], gpu_h
    t = rn.true(pick.config)
    return (t[0] if t else rn.true(base.config)[0]), gpu_h


def measured_baseline(name: str, spec: RLTuningJobSpec) -> tuple["Runner", object]:
    """The job's trial runner and its baseline, measured once (fixed seed) and judged: every method
    and every seed starts from the same measured baseline, as a tuning run on a cluster would."""
    rn = Runner(name, spec)
    b0 = baseline_record(spec)
    s, err = rn.run(b0.config, "baseline", 7)
    if s is None:
        raise RuntimeError(f"{name}: baseline infeasible: {err}")
    return rn, Tuner(spec, b0, []).judge(b0, s)


def bench_job(
    job: dict,
    seeds: int,
    budgets: list[int],
    log=print,
    oracle_procs: int = 2,
    methods: tuple = ("rltune", "tpe", "random"),
) -> dict:
    name = job["metadata"]["name"]
    spec = RLTuningJobSpec.model_validate(job["spec"])
    t0 = time.time()
    orc = oracle(name, spec, procs=oracle_procs)
    log(f"{name}: oracle {orc['objective']:.1f} over {orc['feasible']}/{orc['configs']} configs ({orc['seconds']} s)")
    rn, base = measured_baseline(name, spec)
    base_true = rn.true(base.config)[0]
    judge_tuner = Tuner(spec, base, [])
    prof = judge_tuner.profile()
    kmax = max(budgets)
    res = {
        "job": name,
        "baseline": base_true,
        "oracle": orc["objective"],
        "oracle_speedup": base_true / orc["objective"],
        "configs": orc["configs"],
        "bottleneck": prof.bottleneck if prof else "",
        "objective": spec.objective,
        "methods": {},
    }
    for method in methods:
        per_k = {k: [] for k in budgets}
        gpuh = {k: [] for k in budgets}
        ferr, used, stops = [], [], []
        for sd in range(seeds):
            if method == "rltune":
                out = run_rltune(rn, base, kmax, sd)
                if out["forecast_error"] is not None:
                    ferr.append(out["forecast_error"])
                stops.append(out["stop"])
            else:
                out = run_baseline_search(rn, base, kmax, sd, method, judge_tuner)
            hist = out["history"]
            used.append(len(hist))
            for k in budgets:
                v, g = best_after(rn, base, hist, k)
                per_k[k].append(base_true / v)
                gpuh[k].append(g)
        res["methods"][method] = {
            "speedup": {k: statistics.median(v) for k, v in per_k.items()},
            "speedup_mean": {k: statistics.fmean(v) for k, v in per_k.items()},
            "speedup_all": {k: v for k, v in per_k.items()},
            "gpu_hours": {k: statistics.median(v) for k, v in gpuh.items()},
            "trials_used": statistics.median(used),
            "forecast_error": statistics.median(ferr) if ferr else None,
            "forecast_errors": ferr,  # per seed: the headline's sampling spread comes from these
            "stops": stops,
        }
        m = res["methods"][method]
        log(
            f"  {method:7s} "
            + "  ".join(f"@{k}: {m['speedup'][k]:.2f}x" for k in budgets)
            + (f"  ferr {m['forecast_error']:.1%}" if m["forecast_error"] is not None else "")
            + f"  trials {m['trials_used']}"
        )
    res["seconds"] = round(time.time() - t0, 1)
    log(f"  oracle {res['oracle_speedup']:.2f}x; {res['seconds']} s")
    return res


def _bench_job_quiet(job, seeds, budgets, methods):
    lines: list[str] = []

    def log(s):
        lines.append(s)
        print(s, flush=True)

    try:
        r = bench_job(job, seeds, budgets, log=log, oracle_procs=1, methods=methods)
    except Exception as e:  # one broken job must not sink the run
        log(f"{job['metadata']['name']}: FAILED: {type(e).__name__}: {e}")
        return {"job": job["metadata"]["name"], "error": str(e), "log": lines}
    r["log"] = lines
    return r


def median_of_medians_interval(
    per_job: list[list[float]], level: float = 0.9, reps: int = 4000, seed: int = 0
) -> tuple[float, float]:
    """Seed-bootstrap interval of the median over jobs of each job's median over seeds.

    One tuning run's forecast error depends on which trials that run happened to pick, so ten seeds
    per job leave the headline a few tenths of a point uncertain; resampling each job's seeds says
    how many."""
    import numpy as np

    rng = np.random.default_rng(seed)
    arrs = [np.asarray(v, dtype=float) for v in per_job if len(v)]
    stats = np.empty(reps)
    for i in range(reps):
        stats[i] = np.median([np.median(a[rng.integers(0, len(a), len(a))]) for a in arrs])
    lo, hi = np.quantile(stats, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def write_markdown(results: list[dict], budgets: list[int], seeds: int, path: Path) -> None:
    k8 = 8 if 8 in budgets else budgets[len(budgets) // 2]
    lines = []
    head = (
        ["job", "bottleneck", "configs", "baseline", "oracle"]
        + [f"rltune@{k}" for k in budgets]
        + [f"TPE@{k}" for k in budgets]
        + [f"random@{k}" for k in budgets]
        + [f"rltune mean@{k8}", f"TPE mean@{k8}", f"TPE worst@{k8}"]
        + [f"rltune %oracle@{k8}", "rltune trials", "rltune GPU-h (sim.)", "forecast err"]
    )
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    fracs, ferrs, beats, beats_med = [], [], [], []
    for r in results:
        m = r["methods"]
        unit = "GPU·s" if r["objective"] == "gpuSecondsPerStep" else "s"
        frac = m["rltune"]["speedup"][k8] / r["oracle_speedup"]
        fracs.append(frac)
        mean = {meth: m[meth].get("speedup_mean", m[meth]["speedup"])[k8] for meth in ("rltune", "tpe")}
        beats.append(mean["rltune"] > mean["tpe"])
        beats_med.append(m["rltune"]["speedup"][k8] > m["tpe"]["speedup"][k8])
        fe = m["rltune"]["forecast_error"]
        if fe is not None:
            ferrs.append(fe)
        row = [
            r["job"].replace("bench-", ""),
            r["bottleneck"],
            str(r["configs"]),
            f"{r['baseline']:.0f} {unit}",
            f"{r['oracle_speedup']:.2f}x",
        ]
        row += [f"{m['rltune']['speedup'][k]:.2f}x" for k in budgets]
        row += [f"{m['tpe']['speedup'][k]:.2f}x" for k in budgets]
        row += [f"{m['random']['speedup'][k]:.2f}x" for k in budgets]
        row += [f"{mean['rltune']:.2f}x", f"{mean['tpe']:.2f}x", f"{min(m['tpe']['speedup_all'][k8]):.2f}x"]
        row += [
            f"{frac:.0%}",
            f"{m['rltune']['trials_used']:g}",
            f"{m['rltune']['gpu_hours'][max(budgets)]:.0f}",
            f"{fe:.1%}" if fe is not None else "-",
        ]
        lines.append("| " + " | ".join(row) + " |")
    per_seed = [r["methods"]["rltune"].get("forecast_errors") for r in results]
    ferr_ci = ""
    if per_seed and all(per_seed):
        lo, hi = median_of_medians_interval(per_seed)
        ferr_ci = f"; 90% seed-bootstrap interval {lo:.1%}-{hi:.1%}"
    summary = [
        "",
        f"Median over jobs: rltune reaches {statistics.median(fracs):.0%} of the oracle speed-up within {k8} trials "
        f"(target >= 95%); rltune beats TPE at {k8} trials on {sum(beats)}/{len(beats)} jobs by the mean over seeds "
        f"and on {sum(beats_med)}/{len(beats_med)} by the median; forecaster median |error| "
        f"{statistics.median(ferrs):.1%} (median over jobs of each job's median over its trials{ferr_ci}).",
        f"Speed-ups are medians over {seeds} seeds unless marked mean; each is the true (noiseless) objective of "
        "the configuration the method would deploy after k trials, relative to the baseline's.",
    ]
    text = path.read_text() if path.exists() else ""
    start, end = "<!-- bench:results:start -->", "<!-- bench:results:end -->"
    block = start + "\n" + "\n".join(lines + summary) + "\n" + end
    if start in text and end in text:
        text = text[: text.index(start)] + block + text[text.index(end) + len(end) :]
    else:
        text = text + "\n" + block + "\n"
    path.write_text(text)


def select_jobs(names: Optional[str]) -> list[dict]:
    """The benchmark jobs a comma-separated --jobs value names (with or without the "bench-"
    prefix); all eight when it is empty."""
    sel = set(names.split(",")) if names else None
    return [
        j
        for j in bench_jobs()
        if not sel or j["metadata"]["name"] in sel or j["metadata"]["name"].replace("bench-", "") in sel
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", help="comma-separated job names (default: all eight)")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--budgets", default="4,8,16")
    ap.add_argument("--no-write", action="store_true", help="do not update docs/benchmark.md")
    ap.add_argument("--json", default=str(ROOT / "bench" / "results.json"))
    ap.add_argument("--procs", type=int, default=2, help="jobs benchmarked in parallel (processes)")
    ap.add_argument("--from-json", help="only re-render docs/benchmark.md from a results JSON")
    ap.add_argument(
        "--methods",
        default="rltune,tpe,random",
        help="methods to run (a subset only checks them; the page needs all three)",
    )
    args = ap.parse_args(argv)
    budgets = [int(x) for x in args.budgets.split(",")]
    methods = tuple(args.methods.split(","))
    if set(methods) != {"rltune", "tpe", "random"}:
        args.no_write = True
    if args.from_json:
        res = json.loads(Path(args.from_json).read_text())
        for r in res:
            for m in r["methods"].values():
                for key in ("speedup", "gpu_hours", "speedup_mean", "speedup_all"):
                    if key in m:
                        m[key] = {int(k): v for k, v in m[key].items()}
        write_markdown(res, budgets, args.seeds, ROOT / "docs" / "benchmark.md")
        return 0
    results = []
    t0 = time.time()
    todo = select_jobs(args.jobs)
    if args.procs > 1 and len(todo) > 1:
        # one job per process (slowest first); each job's oracle then runs single-process
        todo.sort(key=lambda j: j["spec"]["workload"]["task"]["kind"] != "agentic-coding")
        ctx = mp.get_context("fork")
        with ctx.Pool(args.procs) as pool:
            res = pool.starmap(_bench_job_quiet, [(j, args.seeds, budgets, methods) for j in todo])
        order = {j["metadata"]["name"]: i for i, j in enumerate(bench_jobs())}
        results = sorted(res, key=lambda r: order[r["job"]])
        print("\n---- per job ----")
        for r in results:
            print("\n".join(r.pop("log")))
        results = [r for r in results if "error" not in r]
    else:
        for job in todo:
            results.append(bench_job(job, args.seeds, budgets, log=lambda s: print(s, flush=True), methods=methods))
    print(f"total {time.time() - t0:.0f} s")
    Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    if not args.no_write and results:
        write_markdown(results, budgets, args.seeds, ROOT / "docs" / "benchmark.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
