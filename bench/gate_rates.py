"""Quality-gate power benchmark: how often each gate catches an injected regression of known size,
and how often it rejects a healthy trial (docs/tuner.md, "Quality gates").

    python -m bench.gate_rates [--seeds 200] [--jobs NAME,...] [--budgets 4/1,6/1,11/1] [--out PATH]

For each benchmark job (bench/jobs.py, examples/bench-*.yaml) and each trial budget
(stepsPerTrial/warmupSteps: the benchmark jobs' 4/1, the CRD default 6/1 and a long 11/1, i.e. 3, 5
and 10 scored steps), `--seeds` pairs of twin trials of the job's baseline configuration are drawn:
a baseline trial and a candidate trial of the same configuration and quality with another seed.
Each candidate is then judged healthy and with one injected regression at a time:

- reward drop k x tol (k = 0.25 .. 4): every step's reward lowered by k * tol * |mu_b|, where tol is
  constraints.rewardTolerance and mu_b the baseline's noiseless mean reward over the scored steps
  (so the true relative drop is exactly k * tol);
- log-prob mismatch f x limit: every step's mismatch scaled so its noiseless mean over the scored
  steps is f * constraints.maxLogprobMismatch (f = 0.9 is a healthy trial close to the limit);
- NaN burst: the reward of one steady-state step (drawn per seed) set to NaN;
- staleness overrun: the lag of one steady-state step (drawn per seed) set to maxStaleness + 1.

Every variant is scored as the operator scores it: `summarize` over all reported steps (warm-up
excluded from the statistics), the baseline's summary round-tripped through the resource status
(records.flatten_summary / unflatten_summary, per-step rewards kept), then `gates.evaluate` with the
job's constraints, as Tuner.judge calls it. Four reward rules are compared on the same draws:
`before` (the previous gate: one-sided Welch test on the raw per-step rewards rejecting only a
significant drop beyond the tolerance, kept here as `legacy_reward_reject`), `after`
(rltune.tuner.gates as it is: the trend-adjusted test, reject when lo > tol), and two framings
on the same trend-adjusted bounds that were considered: `non-inferiority` (reject unless
hi <= tol) and `sig. drop & not NI` (reject when lo > 0 and hi > tol: non-inferiority where the
steps resolve the tolerance, false alarms <= alpha at no drop). The other gates are the same.

Twin trials come through the quality path of bench/confirm.py (QualityTrials: the noiseless steps
of the plan plus the twin's `_quality` draws, the same distribution as simulate_trial's). `--check`
(on by default) verifies the path: for every job the noiseless records equal
simulate_trial(noise=False) exactly.

After the per-budget tables, `--shipped S/W/C` (default: the CRD's 6/1/12) runs the gate as the lifecycle does:
a screening trial of S steps, then the winner's confirmation of C steps, under each
constraints.rewardGate (screen: the confirmation screened again against a baseline of S steps;
nonInferiority: judged by non-inferiority against a baseline of max(S, C) steps, at the looks of
gates.confirmation_looks: half-way at alpha/2, where a winner may confirm early, and at C steps at
alpha/2), with every regression injected into both runs of the candidate (`run_shipped`); the table
also says how many steps a healthy winner's confirmation ran on average.

Last, the grey zone (`run_grey_zone`): each seed-shaped job's oracle from `--results` (a healthy
one-step-off configuration, no injected regression) screened and confirmed the same way under each
rewardGate, with the twin's learning curve stretched by each lag penalty in PENALTIES instead of its
own (Efficiency.lag_penalty, 8% per step of lag; the same draws), next to its true reward drop and the best synchronous
configuration the benchmark judged: how much of the async lever nonInferiority would ship, by how
fast one-step-off runs really learn (docs/tuner.md 'The reward gate on the winner').

Writes the raw counts to out/bench-gates.json. About a minute on one core with the defaults.
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import math
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np

from bench.confirm import QualityTrials, confirmation_run, stored_summary
from bench.jobs import jobs as bench_jobs
from bench.paths import RESULTS, ROOT
from rltune.api.metrics import StepRecord
from rltune.api.models import Budget, RLConfig, RLTuningJobSpec
from rltune.tuner import baseline_record, records, summarize
from rltune.tuner import gates as quality_gates
from rltune.twin.efficiency import Efficiency

BUDGETS = ((4, 1), (6, 1), (11, 1))
DROPS = tuple(k / 4 for k in range(1, 17))  # 0.25 .. 4 x tolerance
TABLE_DROPS = (0.5, 1.0, 1.5, 2.0)
MISMATCH = (0.9, 1.05, 1.1, 1.25)
RULES = ("before", "after", "combined", "ni")
RULE_NAMES = {
    "before": "before",
    "after": "after",
    "combined": "sig. drop & not NI",
    "ni": "non-inferiority",
}
GOAL_CATCH, GOAL_FALSE = 0.95, 0.05
# The twin's quality model stretches the learning curve's time constant by Efficiency.lag_penalty per
# step of lag (measured: bench/lag_penalty.py) and by Efficiency.fp8_tau_stretch for an fp8 rollout
# (twin/simulate.py::_quality). The grey-zone table re-draws the same trials at other lag penalties
# (QualityTrials.trial's lag_penalty), up to FORMER_LAG_PENALTY, the twin's unsourced value before 0.3.8;
# --check verifies that the twin's own penalty reproduces simulate_trial exactly.
TWIN_LAG_PENALTY = Efficiency.lag_penalty
FORMER_LAG_PENALTY = 0.35
PENALTIES = tuple(sorted({0.0, TWIN_LAG_PENALTY, 0.2, FORMER_LAG_PENALTY}))


# ------------------------------------------------------------------------------ the previous gate


def legacy_welch(cand: list[float], base: list[float], tol: float) -> float:
    """The previous reward gate's p-value (one-sided Welch, H1: mean_c < mean_b - tol*|mean_b|)."""

    def mv(xs):
        m = sum(xs) / len(xs)
        return m, (sum((x - m) ** 2 for x in xs) / (len(xs) - 1) if len(xs) > 1 else 0.0)

    mc, vc = mv(cand)
    mb, vb = mv(base)
    thr = mb - tol * abs(mb)
    se2 = vc / len(cand) + vb / len(base)
    if se2 <= 0 or len(cand) < 2 or len(base) < 2:
        return 0.0 if mc < thr else 1.0
    t = (mc - thr) / math.sqrt(se2)
    den = (vc / len(cand)) ** 2 / (len(cand) - 1) + (vb / len(base)) ** 2 / (len(base) - 1)
    df = se2**2 / den if den > 0 else float(len(cand) + len(base) - 2)
    return quality_gates.t_cdf(t, df)


def legacy_reward_reject(cand: list[float], base: list[float], tol: float, alpha: float) -> bool:
    p = legacy_welch(cand, base, tol)
    return not (p >= alpha)  # NaN p (NaN rewards) failed the old gate too


# ------------------------------------------------------------------------------ injections


def injections(
    qt: QualityTrials, cand: list[StepRecord], seed: int, spec: RLTuningJobSpec, mu_base: Optional[float] = None
):
    """(regression, size, records) for every injected variant of one healthy candidate trial. A reward
    drop of k x tol is k * tol * |mu_base| per step (default: the trial's own noiseless mean)."""
    c = spec.constraints
    steady = [i for i, s in enumerate(cand) if not s.warmup]
    mu = qt.mu_reward if mu_base is None else mu_base
    yield "healthy", 0.0, cand
    for k in DROPS:
        d = k * c.reward_tolerance * abs(mu)
        recs = [copy.copy(s) for s in cand]
        for s in recs:
            s.reward -= d
        yield "reward drop", k, recs
    for f in MISMATCH:
        scale = f * c.max_logprob_mismatch / qt.mu_mismatch
        recs = [copy.copy(s) for s in cand]
        for s in recs:
            s.logprob_mismatch *= scale
        yield "mismatch", f, recs
    pick = np.random.default_rng([seed, 7919])
    recs = [copy.copy(s) for s in cand]
    recs[steady[int(pick.integers(len(steady)))]].reward = float("nan")
    yield "nan burst", 1.0, recs
    recs = [copy.copy(s) for s in cand]
    recs[steady[int(pick.integers(len(steady)))]].staleness = float(c.max_staleness + 1)
    yield "staleness", float(c.max_staleness + 1), recs


def judge(summary, base_summary, spec: RLTuningJobSpec) -> dict[str, set[str]]:
    """Rule -> the set of failed gates, for the three reward rules."""
    c = spec.constraints
    g = quality_gates.evaluate(summary, base_summary, c)
    others = {n for n, r in g.items() if not r.passed and n != "reward"}
    out = {"after": others | ({"reward"} if "reward" in g and not g["reward"].passed else set())}
    rw, bw = summary.rewards, base_summary.rewards
    if not rw or "reward" not in g:
        out["before"] = out["combined"] = out["ni"] = set(out["after"])
        return out
    finite = all(math.isfinite(x) for x in rw + bw)
    out["before"] = others | (
        {"reward"} if legacy_reward_reject(rw, bw, c.reward_tolerance, c.reward_test_alpha) else set()
    )
    if finite:
        rt = quality_gates.reward_test(rw, bw, c.reward_tolerance, c.reward_test_alpha)
        margin = c.reward_tolerance if abs(rt.mean_b) > 1e-12 else 0.0
        ni = rt.hi > margin + 1e-12
        comb = ni and rt.lo > 1e-12
    else:
        ni = comb = True
    out["ni"] = others | ({"reward"} if ni else set())
    out["combined"] = others | ({"reward"} if comb else set())
    return out


# ------------------------------------------------------------------------------ the run


def run_job(job: dict, job_index: int, budgets, seeds: int, check: bool) -> dict:
    spec = RLTuningJobSpec.model_validate(job["spec"])
    name = job["metadata"]["name"]
    cfg = baseline_record(spec).config
    out = {}
    for bi, (steps, warmup) in enumerate(budgets):
        qt = QualityTrials(spec, cfg, steps, warmup)
        if check and bi == 0:
            qt.check(name)
        cells: dict[str, dict] = {}
        for s in range(seeds):
            seed_b = job_index * 1_000_000 + bi * 100_000 + s
            base = stored_summary(summarize(qt.trial(seed_b)))
            cand = qt.trial(seed_b + 50_000)
            for reg, size, recs in injections(qt, cand, seed_b, spec):
                verdicts = judge(summarize(recs), base, spec)
                cell = cells.setdefault(f"{reg}|{size:g}", {"regression": reg, "size": size, "n": 0})
                cell["n"] += 1
                for rule, failed in verdicts.items():
                    r = cell.setdefault(rule, {"rejected": 0, "gates": {}})
                    r["rejected"] += bool(failed)
                    for gname in failed:
                        r["gates"][gname] = r["gates"].get(gname, 0) + 1
        out[f"{steps}/{warmup}"] = {
            "steps_per_trial": steps,
            "warmup_steps": warmup,
            "scored_steps": steps - warmup,
            "mu_reward": qt.mu_reward,
            "reward_noise": qt.plan.eff.reward_noise,
            "mu_mismatch": qt.mu_mismatch,
            "cells": cells,
        }
    return {"job": name, "constraints": spec.constraints.model_dump(by_alias=True), "budgets": out}


def run_shipped(job: dict, job_index: int, shipped: tuple[int, int, int], seeds: int) -> dict:
    """The reward gate as the lifecycle runs it, per injected regression and per constraints.rewardGate:
    each candidate is screened by one trial of stepsPerTrial steps (gates.evaluate) and, if it passes,
    its confirmation run of confirmSteps steps is judged again: by the same screening test
    (rewardGate screen, baseline of stepsPerTrial steps) or by non-inferiority (nonInferiority,
    gates.evaluate(confirmation=True), baseline of max(stepsPerTrial, confirmSteps) steps:
    records.baseline_steps). The regression is injected into both runs of the candidate (the same
    configuration twice), sized on the baseline's noiseless mean."""
    steps, warmup, confirm = shipped
    spec = RLTuningJobSpec.model_validate(job["spec"])
    spec.budget.steps_per_trial, spec.budget.warmup_steps, spec.budget.confirm_steps = steps, warmup, confirm
    cfg = baseline_record(spec).config
    c = spec.constraints
    qs = QualityTrials(spec, cfg, steps, warmup)
    qc = qs if confirm == steps else QualityTrials(spec, cfg, confirm, warmup)
    out = {}
    for mode in ("screen", "nonInferiority"):
        spec.constraints.reward_gate = mode
        nb = records.baseline_steps(spec)
        qb = qs if nb == steps else qc if nb == confirm else QualityTrials(spec, cfg, nb, warmup)
        cells: dict[str, dict] = {}
        for s in range(seeds):
            seed_b = job_index * 1_000_000 + 900_000 + s
            base = stored_summary(summarize(qb.trial(seed_b)))
            screen = injections(qs, qs.trial(seed_b + 50_000), seed_b, spec, qb.mu_reward)
            conf = injections(qc, qc.trial(seed_b + 60_000), seed_b + 1, spec, qb.mu_reward)
            for (reg, size, rs), (_, _, rc) in zip(screen, conf, strict=True):
                cell = cells.setdefault(f"{reg}|{size:g}", {"regression": reg, "size": size, "n": 0})
                cell["n"] += 1
                s_ok = quality_gates.passed(quality_gates.evaluate(summarize(rs), base, c))
                run = confirmation_run(rc, base, spec) if s_ok else None
                c_ok = run is not None and run.passed
                cell["screen"] = cell.get("screen", 0) + (not s_ok)
                cell["confirm"] = cell.get("confirm", 0) + (s_ok and not c_ok)
                cell["blocked"] = cell.get("blocked", 0) + (not c_ok)
                cell["confirm_steps"] = cell.get("confirm_steps", 0) + (run.steps if run else 0)
        out[mode] = {"baseline_steps": nb, "cells": cells}
    return {"job": job["metadata"]["name"], "modes": out}


def judged_configs(job_name: str, results: Path) -> Optional[dict]:
    """The job's oracle configuration and its best synchronous (staleness 0) one among every
    configuration the benchmark judged (its yardstick: the oracle's shortlist and every method's
    picks), with their speed-ups on the yardstick; None if the job is not in `results`."""
    rows = {r["job"]: r for r in json.loads(results.read_text())} if results.exists() else {}
    r = rows.get(job_name)
    if r is None:
        return None
    sync = [
        v[0]
        for k, v in r["yardstick"].items()
        if v is not None and dict(ast.literal_eval(k)).get("async.staleness") == 0
    ]
    return {
        "oracle": RLConfig.model_validate(r["oracle_config"]),
        "oracle_speedup": r["oracle_speedup"],
        "best_sync_speedup": r["baseline"] / min(sync) if sync else None,
    }


def run_grey_zone(
    job: dict, job_index: int, shipped: tuple[int, int, int], seeds: int, judged: dict, check: bool
) -> dict:
    """How often the job's oracle (a healthy configuration the twin slows by its lag, never an
    injected regression) is shipped under each constraints.rewardGate, at each lag penalty in
    PENALTIES: a screening trial of stepsPerTrial steps, then a confirmation of confirmSteps steps,
    judged as run_shipped judges them (confirmation_run); and its true reward drop over the confirmation's scored
    steps against the baseline (noiseless, relative to the baseline's mean reward)."""
    steps, warmup, confirm = shipped
    spec = RLTuningJobSpec.model_validate(job["spec"])
    spec.budget.steps_per_trial, spec.budget.warmup_steps, spec.budget.confirm_steps = steps, warmup, confirm
    c = spec.constraints
    base_cfg, orc = baseline_record(spec).config, judged["oracle"]
    qs, qc = QualityTrials(spec, orc, steps, warmup), QualityTrials(spec, orc, confirm, warmup)
    if check:
        qc.check(job["metadata"]["name"] + " (oracle)")
        a, b = qc.trial(11), qc.trial(11, TWIN_LAG_PENALTY)
        if any(not math.isclose(x.reward, y.reward, rel_tol=1e-12, abs_tol=1e-15) for x, y in zip(a, b, strict=True)):
            raise SystemExit("grey zone: the twin's own lag penalty does not reproduce its rewards")
    modes = ("screen", "nonInferiority")
    profile_steps = {}  # rewardGate -> the baseline's profile length (records.baseline_steps)
    for mode in modes:
        spec.constraints.reward_gate = mode
        profile_steps[mode] = records.baseline_steps(spec)
    qbs = {n: QualityTrials(spec, base_cfg, n, warmup) for n in set(profile_steps.values())}
    seed_of = [job_index * 1_000_000 + 700_000 + sd for sd in range(seeds)]
    # the baselines do not depend on the penalty: summarised once per seed and profile length
    bases = {n: [stored_summary(summarize(qb.trial(sb))) for sb in seed_of] for n, qb in qbs.items()}
    mu_b = qbs[profile_steps["nonInferiority"]].mu_reward
    out = {"job": job["metadata"]["name"], "lag": max(t.staleness for t in qc.template), "penalties": {}}
    out |= {k: judged[k] for k in ("oracle_speedup", "best_sync_speedup")}
    for pen in PENALTIES:
        conf = [r.reward for r in qc.trial(None, pen) if not r.warmup]
        cell = {"true_drop": 1.0 - (sum(conf) / len(conf)) / mu_b, "n": 0} | dict.fromkeys(modes, 0)
        for i, seed_b in enumerate(seed_of):
            cand_s, cand_c = summarize(qs.trial(seed_b + 50_000, pen)), qc.trial(seed_b + 60_000, pen)
            cell["n"] += 1
            for mode in modes:
                base = bases[profile_steps[mode]][i]
                spec.constraints.reward_gate = mode
                cell[mode] += (
                    quality_gates.passed(quality_gates.evaluate(cand_s, base, c))
                    and confirmation_run(cand_c, base, spec).passed
                )
        out["penalties"][f"{pen:g}"] = cell
    return out


def print_grey_zone(rows: list[dict], shipped: tuple[int, int, int], seeds: int) -> None:
    steps, warmup, confirm = shipped
    print(
        f"\n## The grey zone: each job's oracle (healthy, {rows[0]['lag']:g} step of lag) shipped under each "
        f"rewardGate, by the lag penalty (the twin's is {TWIN_LAG_PENALTY:g}: its learning curve stretched "
        f"{100 * TWIN_LAG_PENALTY:.0f}% per step of lag); screening {steps} steps, confirmation {confirm}, "
        f"warm-up {warmup}; {seeds} seeds\n"
    )
    pens = [f"{p:g}" for p in PENALTIES]
    print(
        "| job | oracle | best sync judged | "
        + " | ".join(f"penalty {p}: true drop, shipped screen / NI" for p in pens)
        + " |"
    )
    print("|---|---:|---:|" + "---|" * len(pens))
    for r in rows:
        cells = []
        for p in pens:
            c = r["penalties"][p]
            cells.append(
                f"{100 * c['true_drop']:.1f}%, {_share(c['screen'], c['n'])} / {_share(c['nonInferiority'], c['n'])}"
            )
        bs = f"{r['best_sync_speedup']:.2f}x" if r["best_sync_speedup"] else "-"
        print(f"| {r['job']} | {r['oracle_speedup']:.2f}x | {bs} | " + " | ".join(cells) + " |")
    for p in pens:
        ni = [r["penalties"][p]["nonInferiority"] / r["penalties"][p]["n"] for r in rows]
        print(
            f"penalty {p}: the oracle ships under nonInferiority on median {100 * float(np.median(ni)):.0f}% of seeds"
        )


def aggregate_shipped(per_job: list[dict]) -> dict:
    out = {}
    for mode in ("screen", "nonInferiority"):
        cells: dict[str, dict] = {}
        for pj in per_job:
            for k, c in pj["modes"][mode]["cells"].items():
                a = cells.setdefault(k, {"regression": c["regression"], "size": c["size"], "n": 0})
                for f in ("n", "screen", "confirm", "blocked", "confirm_steps"):
                    a[f] = a.get(f, 0) + c[f]
        fa = cells["healthy|0"]["blocked"] / cells["healthy|0"]["n"]
        at_tol = cells["reward drop|1"]["blocked"] / cells["reward drop|1"]["n"]
        h = cells["healthy|0"]
        out[mode] = {
            "baseline_steps": per_job[0]["modes"][mode]["baseline_steps"],
            # steps a screened healthy winner's confirmation ran (the interim look stops some early)
            "healthy_confirm_steps": h["confirm_steps"] / max(1, h["n"] - h["screen"]),
            "cells": cells,
            "false_alarm": fa,
            "catch_at_tolerance": at_tol,
            "goal_met": fa <= GOAL_FALSE and at_tol >= GOAL_CATCH,
        }
    return out


def print_shipped(agg: dict, shipped: tuple[int, int, int], jobs: int, seeds: int) -> None:
    steps, warmup, confirm = shipped
    for mode, a in agg.items():
        print(
            f"\n## constraints.rewardGate {mode}: screening trials of {steps} steps, the winner's confirmation of "
            f"{confirm} steps ({'non-inferiority' if mode == 'nonInferiority' else 'screened again'}), a baseline "
            f"of {a['baseline_steps']} steps (warm-up {warmup}; {jobs} jobs x {seeds} seeds)\n"
        )
        print("| regression | size | rejected by screening | then by confirmation | kept from shipping |")
        print("|---|---|---|---|---|")
        for c in a["cells"].values():
            if c["regression"] == "reward drop" and c["size"] not in TABLE_DROPS:
                continue
            n = c["n"]
            print(
                f"| {c['regression']} | {_size(c)} | {_share(c['screen'], n)} | {_share(c['confirm'], n)} "
                f"| {_share(c['blocked'], n)} |"
            )
        print(
            f"\nrewardGate {mode}: false alarms {100 * a['false_alarm']:.1f}%; caught at the tolerance "
            f"{100 * a['catch_at_tolerance']:.1f}%; goal {'met' if a['goal_met'] else 'missed'}; a healthy "
            f"winner's confirmation ran {a['healthy_confirm_steps']:.2f} of {confirm} steps on average"
        )


def aggregate(per_job: list[dict]) -> dict:
    agg: dict[str, dict] = {}
    for pj in per_job:
        for bkey, b in pj["budgets"].items():
            a = agg.setdefault(
                bkey, {k: b[k] for k in ("steps_per_trial", "warmup_steps", "scored_steps")} | {"cells": {}}
            )
            for ckey, c in b["cells"].items():
                ac = a["cells"].setdefault(ckey, {"regression": c["regression"], "size": c["size"], "n": 0})
                ac["n"] += c["n"]
                for rule in RULES:
                    r = ac.setdefault(rule, {"rejected": 0, "gates": {}})
                    r["rejected"] += c[rule]["rejected"]
                    for g, v in c[rule]["gates"].items():
                        r["gates"][g] = r["gates"].get(g, 0) + v
    for a in agg.values():
        drops = sorted((c for c in a["cells"].values() if c["regression"] == "reward drop"), key=lambda c: c["size"])
        healthy = a["cells"]["healthy|0"]
        a["detectable_drop"] = {}
        for rule in RULES:
            fa = healthy[rule]["rejected"] / healthy["n"]
            det = next((c["size"] for c in drops if c[rule]["rejected"] / c["n"] >= GOAL_CATCH), None)
            tol_cell = next(c for c in drops if c["size"] == 1.0)
            at_tol = tol_cell[rule]["rejected"] / tol_cell["n"]
            a["detectable_drop"][rule] = {
                "false_alarm": fa,
                "catch_at_tolerance": at_tol,
                "smallest_drop_caught_95pct_x_tol": det,
                "goal_met": fa <= GOAL_FALSE and at_tol >= GOAL_CATCH,
            }
    return agg


def _share(x: int, n: int) -> str:
    return f"{100.0 * x / n:5.1f}%"


def _by_gate(r: dict, n: int) -> str:
    gs = sorted(r["gates"].items(), key=lambda kv: -kv[1])
    return ", ".join(f"{g} {100.0 * v / n:.1f}%" for g, v in gs) or "-"


def _size(c: dict) -> str:
    reg, size = c["regression"], c["size"]
    if reg == "reward drop":
        return f"{size:g} x tol"
    if reg == "mismatch":
        return f"{size:g} x limit"
    if reg == "staleness":
        return f"lag {size:g}"
    if reg == "nan burst":
        return "1 step"
    return "-"


def print_tables(agg: dict, jobs: int, seeds: int, constraints: dict) -> None:
    print(
        f"\nconstraints: rewardTolerance {constraints['rewardTolerance']:g}, rewardTestAlpha "
        f"{constraints['rewardTestAlpha']:g}, maxLogprobMismatch {constraints['maxLogprobMismatch']:g}, "
        f"maxStaleness {constraints['maxStaleness']}; {jobs} jobs x {seeds} seeds per cell"
    )
    for a in agg.values():
        print(
            f"\n## {a['scored_steps']} scored steps "
            f"(stepsPerTrial {a['steps_per_trial']}, warmupSteps {a['warmup_steps']})\n"
        )
        print(
            "| regression | size | before: rejected (by gate) | after: rejected (by gate) "
            "| sig. drop & not NI | non-inferiority |"
        )
        print("|---|---|---|---|---|---|")
        for c in a["cells"].values():
            if c["regression"] == "reward drop" and c["size"] not in TABLE_DROPS:
                continue
            n = c["n"]
            cols = [f"{_share(c[r]['rejected'], n)} ({_by_gate(c[r], n)})" for r in ("before", "after")]
            alt = f"{_share(c['combined']['rejected'], n)} | {_share(c['ni']['rejected'], n)}"
            print(f"| {c['regression']} | {_size(c)} | {cols[0]} | {cols[1]} | {alt} |")
        h = a["cells"]["healthy|0"]
        print()
        for rule in RULES:
            d = a["detectable_drop"][rule]
            gates_fa = {g: v / h["n"] for g, v in h[rule]["gates"].items()}
            det = d["smallest_drop_caught_95pct_x_tol"]
            print(
                f"{RULE_NAMES[rule]:>21}: false alarms {100 * d['false_alarm']:.1f}% "
                f"(per gate: {', '.join(f'{g} {100 * v:.1f}%' for g, v in gates_fa.items()) or 'none'}); "
                f"catch at the tolerance {100 * d['catch_at_tolerance']:.1f}%; "
                f"95% caught from a drop of {'> 4' if det is None else f'{det:g}'} x tol; "
                f"goal {'met' if d['goal_met'] else 'missed'}"
            )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=200, help="trial pairs per job, budget and cell")
    ap.add_argument("--jobs", default=None, help="comma-separated benchmark job names (default: all)")
    ap.add_argument("--budgets", default=",".join(f"{s}/{w}" for s, w in BUDGETS), help="stepsPerTrial/warmupSteps,...")
    ap.add_argument(
        "--shipped",
        default="{0.steps_per_trial}/{0.warmup_steps}/{0.confirm_steps}".format(Budget()),
        help="stepsPerTrial/warmupSteps/confirmSteps of the shipped-gate tables (default: the CRD's defaults, "
        "6/1/12; confirmSteps 12 is what nonInferiority needs at the twin's reward noise, the per-budget tables)",
    )
    ap.add_argument("--no-check", action="store_true", help="skip the check against simulate_trial")
    ap.add_argument(
        "--results",
        default=str(RESULTS / "results.json"),
        help="the benchmark's seed-set results, whose oracles the grey-zone table ships (skipped if absent)",
    )
    ap.add_argument("--out", default=str(ROOT / "out" / "bench-gates.json"))
    a = ap.parse_args(argv)
    budgets = [tuple(int(x) for x in b.split("/")) for b in a.budgets.split(",")]
    shipped = tuple(int(x) for x in a.shipped.split("/"))
    if len(shipped) != 3:
        ap.error("--shipped takes stepsPerTrial/warmupSteps/confirmSteps")
    js = bench_jobs()
    if a.jobs:
        want = set(a.jobs.split(","))
        js = [j for j in js if j["metadata"]["name"] in want]
    t0 = time.time()
    per_job, per_job_shipped, grey = [], [], []
    for i, j in enumerate(js):
        per_job.append(run_job(j, i, budgets, a.seeds, check=not a.no_check))
        per_job_shipped.append(run_shipped(j, i, shipped, a.seeds))
        judged = judged_configs(j["metadata"]["name"], Path(a.results))
        if judged is not None:
            grey.append(run_grey_zone(j, i, shipped, a.seeds, judged, check=not a.no_check))
        print(f"{j['metadata']['name']}: done ({time.time() - t0:.0f}s)", file=sys.stderr)
    agg = aggregate(per_job)
    agg_shipped = aggregate_shipped(per_job_shipped)
    print_tables(agg, len(js), a.seeds, per_job[0]["constraints"])
    print_shipped(agg_shipped, shipped, len(js), a.seeds)
    if grey:
        print_grey_zone(grey, shipped, a.seeds)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "seeds": a.seeds,
                "budgets": [f"{s}/{w}" for s, w in budgets],
                "goal": {"catch_at_tolerance": GOAL_CATCH, "false_alarm": GOAL_FALSE},
                "aggregate": agg,
                "jobs": per_job,
                "shipped": {"budget": "/".join(map(str, shipped)), "aggregate": agg_shipped, "jobs": per_job_shipped},
                "grey_zone": {"penalties": list(PENALTIES), "twin_penalty": TWIN_LAG_PENALTY, "jobs": grey},
                "seconds": round(time.time() - t0, 1),
            },
            indent=1,
        )
    )
    print(f"\nwrote {out} ({time.time() - t0:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
