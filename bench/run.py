"""Tuner benchmark: rltune vs five rivals vs the exhaustive oracle, on two job sets (docs/benchmark.md).

    python -m bench.run [--set seed|generated|both|fresh] [--jobs NAME,...] [--seeds 10] [--gen-seeds 10]

Two job sets (bench/jobs.py): the eight seed-shaped jobs and a generated set drawn with a fixed
seed from scenario families the eight do not cover; changes are chosen on both. A third, `--set
fresh`, is a confirmation draw from the generated families that no choice has looked at (reported,
never chosen on; not part of `both`). For each job, side by side:
- the yardstick: every configuration is judged by the mean of EXPECT_SAMPLES noisy steady twin
  steps with common random numbers (JobTrials.true), what a production run averages;
- baseline: the job's starting configuration on the yardstick;
- oracle: exhaustive search of the same space on the twin's noiseless simulate_step_time (bench/oracle.py;
  cached in .state/bench/oracle_cache.json, keyed by TWIN_VERSION and the job's spec), whose SHORTLIST best are
  re-judged on the yardstick together with every method's pick; the best of those is the oracle;
- rltune and the rivals (RIVALS: Optuna TPE cold and warm-started from `rltune plan`, Optuna's
  GPSampler, random search, random search over what the memory model says fits), each with the
  same trial budgets, several seeds; trials run in-process through simulate_trial (noise on) and
  are scored exactly like the operator scores them (rltune.tuner summarize + quality gates;
  rltune's losing trials stop early as the operator stops them). A method's result after k trials is
  the configuration it would deploy (the rivals: the best *measured* objective among its first k
  gated trials; rltune: Tuner.best_estimate, as the operator) once it passed the winner's
  confirmation run under the job's constraints.rewardGate (`deploy`: a pick that does not confirm
  is rejected and the method picks again, as lifecycle.after_confirming), reported at its objective
  on the yardstick: what a user would deploy and get. Trial GPU-hours include the confirmations.
The tuner never sees the twin; only this harness does.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import multiprocessing as mp
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from bench.confirm import Confirmation, QualityTrials, confirmation_run, stored_summary
from bench.jobs import fresh_jobs, generated_jobs
from bench.jobs import jobs as bench_jobs
from bench.oracle import (
    EXPECT_SAMPLES,
    SHORTLIST,
    _init,
    _true,
    enumerate_space,
    expected_steps,
    oracle,
    yardstick_id,
)
from bench.paths import RESULTS, ROOT
from rltune import twin
from rltune.api.models import RLConfig, RLTuningJobSpec, trial_spec_for
from rltune.api.status import TrialState
from rltune.backends.twin import TwinBackend
from rltune.tuner import Tuner, baseline_record, loop, payback, records, restore, summarize
from rltune.tuner.knobs import OUTER_KNOBS, ROLLOUT_KNOBS, TRAINER_KNOBS
from rltune.tuner.records import failure_cause, objective_of
from rltune.tuner.search import Space, flat_key

STEPS, WARMUP = 4, 1
CONFIRM_SEED = 600_000  # the winner's confirmation draws (JobTrials.confirm_seed)
BASELINE_SEED = 7  # the baseline's draw: every method and seed starts from the same measured baseline


# ------------------------------------------------------------------------------------ trials


class JobTrials:
    """Runs (and memoises) noisy in-process trials of one job and scores them like the operator."""

    def __init__(self, name: str, spec: RLTuningJobSpec):
        self.name, self.spec = name, spec
        self.space = Space(spec)
        self.cache: dict = {}
        _init(spec.model_dump_json(by_alias=True))
        self.truth: dict = {}
        self.configs: dict = {}
        self.known: dict = {}  # yardstick values a previous run of the same twin stored (bench_job's keep)
        self.confirmed: dict = {}  # (configuration, seed) -> Confirmation (JobTrials.confirms)
        self.quality: dict = {}  # configuration -> its confirmation's QualityTrials
        self.base = None  # the measured, judged baseline (measured_baseline sets it)
        self.stored_base = None  # its summary as the status keeps it, what confirmations are judged against

    def steps(self, cfg: RLConfig, trial: str, seed: int, n: int = STEPS):
        """All n steps of a noisy twin trial (warm-up first), or None and the twin's refusal."""
        ts = trial_spec_for("bench", self.name, trial, self.spec, cfg, n, WARMUP, seed=seed)
        try:
            return twin.simulate_trial(ts), ""
        except twin.Infeasible as e:
            return None, str(e)

    def run(self, cfg: RLConfig, trial: str, seed: int, n: int = STEPS):
        steps, err = self.steps(cfg, trial, seed, n)
        return (summarize(steps) if steps is not None else None), err

    def confirm_seed(self, seed: int, attempt: int) -> int:
        """The draw of a tuning run's attempt-th confirmation: the same for every method on a job and
        seed (common random numbers), a fresh one for a retry (a rejected pick's bad luck is not its
        successor's), and independent across jobs (their quality models are alike, so a shared draw
        would fail every job's confirmation on the same seed at once)."""
        job = int(hashlib.sha256(self.name.encode()).hexdigest()[:6], 16)
        return CONFIRM_SEED + job * 1_000_000 + 1000 * seed + attempt

    def confirms(self, cfg: RLConfig, seed: int) -> Confirmation:
        """Whether a pick passes the winner's confirmation as the lifecycle runs it (after_confirming),
        and the steps it ran: budget.confirmSteps steps judged at gates.confirmation_looks (under
        nonInferiority an interim look half-way may confirm early) by the quality gates under the job's
        constraints.rewardGate against the baseline's summary as the status keeps it, and better than
        the baseline on the objective (judged on the yardstick: a confirmation's steps measure close to
        it). The rewards come from the twin's quality path (bench.confirm.QualityTrials: _quality over
        noiseless steps, the same distribution as simulate_trial's), because a full simulate_trial of
        every pick would multiply the benchmark's time. Memoised on (configuration, seed): every method
        that picks a configuration on a seed meets the same draw (common random numbers)."""
        b = self.spec.budget
        if b.confirm_steps == 0:
            return Confirmation(True, 0)
        k = (flat_key(cfg.flat(), self.space.budget, self.space.gpn), seed)
        if k not in self.confirmed:
            t, tb = self.true(cfg), self.true(self.base.config)
            self.confirmed[k] = Confirmation(False, b.confirm_steps)
            if t is not None and tb is not None and t[0] < tb[0]:
                if k[0] not in self.quality:
                    self.quality[k[0]] = QualityTrials(self.spec, cfg, b.confirm_steps, b.warmup_steps)
                recs = self.quality[k[0]].trial(seed)
                self.confirmed[k] = confirmation_run(recs, self.stored_base, self.spec)
        return self.confirmed[k]

    def true(self, cfg: RLConfig):
        """(objective, step seconds) of a configuration on the yardstick: the mean of the twin's
        noisy steady steps (EXPECT_SAMPLES), memoised; None if the twin refuses it."""
        k = flat_key(cfg.flat(), self.space.budget, self.space.gpn)
        if k not in self.truth and k in self.known:  # judged by an earlier run of this twin (--merge)
            self.truth[k] = tuple(self.known[k]) if self.known[k] is not None else None
            if self.truth[k] is not None:
                self.configs[k] = cfg
        if k not in self.truth:
            steps = expected_steps(self.spec, cfg)
            if not steps:
                self.truth[k] = None
            else:
                mean = statistics.fmean(steps)
                self.truth[k] = (objective_of(self.spec, mean, cfg.gpus or self.space.budget), mean)
                self.configs[k] = cfg
        return self.truth[k]

    def noiseless(self, cfg: RLConfig):
        """(objective, step seconds) on the twin's noiseless step (the exhaustive search's measure)."""
        return _true(cfg.flat())

    def best_judged(self) -> tuple[float, RLConfig]:
        """The best configuration judged so far on the yardstick: (objective, config)."""
        k = min((k for k, t in self.truth.items() if t is not None), key=lambda k: self.truth[k][0])
        return self.truth[k][0], self.configs[k]


def run_rltune(rn: JobTrials, base, budget: int, seed: int) -> dict:
    """rltune tuning the job with budget.maxTrials=`budget`, as the operator tunes it: the product's
    own loop (tuner.loop.run, the lifecycle's phases, parallel trials, early stops, the winner's
    confirmation and the stop rule) over the in-process twin backend on a virtual clock. Its trials
    draw the noise the old harness gave them (TwinBackend's seed_of: the baseline the fixed draw
    every method starts from, trial tN seed*1000+N, confirmation runs JobTrials.confirm_seed)."""
    spec = rn.spec.model_copy(deep=True)
    spec.budget.max_trials = budget
    confirms: list[str] = []

    def seed_of(trial: str, _ts) -> int:
        if trial == "baseline":
            return BASELINE_SEED
        if trial.startswith("c"):
            confirms.append(trial)
            return rn.confirm_seed(seed, len(confirms))
        return seed * 1000 + int(trial[1:].split("-")[0])  # tN (pN, tN-retry: N's draw)

    backend = TwinBackend(seed_of=seed_of)
    t0 = time.time()
    res = loop.run(spec, backend, job=rn.name, namespace="bench", clock=backend.clock, wait=backend.wait)
    tuner = restore.make_tuner(spec, res.status.trials)
    of_kind = lambda kind: [t for t in res.status.trials if t.kind == kind and not t.superseded]  # noqa: E731
    search = [restore.to_record(spec, t) for t in of_kind("search")]
    confirm = of_kind("confirm")
    cost = res.status.tuning_cost
    return {
        "history": search,
        "pick": res.best or base,
        "trial_gpu_h": cost.trial_gpu_hours if cost is not None else _gpu_h(search),
        "confirm_gpu_h": _gpu_h([restore.to_record(spec, t) for t in confirm]),
        "first_failed": bool(confirm) and confirm[0].state != TrialState.SUCCEEDED,
        "confirmations": len(confirm),
        "forecast_error": res.forecast_error,
        "forecast_trials": tuner.forecast_trials(),
        "seconds": time.time() - t0,
        "stop": res.status.message or "",
        "phase": res.status.phase.value,
    }


def _gpu_h(recs: list) -> float:
    """GPU-hours of trials' steps as they ran (warm-up included; a stopped trial's steps so far)."""
    return sum(r.summary.seconds_spent * r.gpus for r in recs if r.summary is not None) / 3600


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


RIVALS = ("tpe", "tpe-warm", "gp", "random", "random-fit")
METHODS = ("rltune",) + RIVALS
WARM_K = 4  # TPE's warm start: `rltune plan`'s top-k, as many as TPE's own start-up trials


def _sampler(method: str, seed: int):
    import optuna

    if method == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=4)
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=4)


def _params(ch: dict, k: dict) -> dict:
    """A flat configuration as the rivals' categorical parameters (a colocated configuration's
    trainerGpus is irrelevant: any value stands for it)."""
    return {p: json.dumps(k[p] if k.get(p) in vals else vals[0]) for p, vals in ch.items()}


def _nearest(pool: list[dict], ch: dict, cand: dict, tried: set, space: Space, rng: random.Random):
    """The untried valid configuration closest to an invalid proposal (fewest differing knobs)."""
    best, best_d = [], None
    for k in pool:
        if flat_key(k, space.budget, space.gpn) in tried:
            continue
        d = sum(1 for p in ch if p != "trainerGpus" and k.get(p) != cand.get(p))
        if best_d is None or d < best_d:
            best, best_d = [k], d
        elif d == best_d:
            best.append(k)
    return rng.choice(best) if best else None


def fits_memory(spec: RLTuningJobSpec, k: dict) -> bool:
    """The physics memory model's verdict (no trial, default limits): what a user filtering a
    random search by a memory calculator would keep."""
    from rltune.tuner import physics

    bd = physics.breakdown(
        spec.workload.model.resolved(),
        spec.workload.task,
        spec.resources.gpu_type,
        spec.resources.gpus_per_node,
        physics.Knobs.of(k),
        spec.resources.gpu_budget,
    )
    return bd.feasible


def run_baseline_search(rn: JobTrials, base, budget: int, seed: int, method: str, judge_tuner: Tuner) -> dict:
    """A rival over the same space, validity rules known (docs/benchmark.md "Rivals"):
    tpe: Optuna TPE, cold (4 random start-up trials); invalid proposals are told as failed asks.
    tpe-warm: the same TPE, its first trials enqueued from `rltune plan`'s top WARM_K.
    gp: Optuna's GPSampler; an invalid proposal is repaired to the nearest valid configuration,
        which is what runs and what the sampler is told.
    random: uniform over the valid configurations.
    random-fit: uniform over the valid configurations the physics memory model says fit."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = rn.space
    ch = _choices(space)
    rng = random.Random(seed)
    dists = {k: optuna.distributions.CategoricalDistribution([json.dumps(v) for v in vals]) for k, vals in ch.items()}
    study = None
    if method in ("tpe", "tpe-warm", "gp"):
        study = optuna.create_study(direction="minimize", sampler=_sampler(method, seed))
    tried = {flat_key(base.config.flat(), space.budget, space.gpn)}
    if method == "tpe-warm":
        for p in judge_tuner.proposer.rank(limit=WARM_K):
            study.enqueue_trial(_params(ch, p.config.flat()))
    hist = []
    penalty = (base.objective or 1.0) * 1.5
    pool = None
    if method in ("random", "random-fit", "gp"):
        pool = enumerate_space(space)
        if method == "random-fit":
            pool = [k for k in pool if fits_memory(rn.spec, k)]
        rng.shuffle(pool)
    while len(hist) < budget:
        k, tr = None, None
        if method in ("tpe", "tpe-warm"):
            for _ in range(200):
                tr = study.ask(dists)
                cand = dict(space.base) | {p: json.loads(tr.params[p]) for p in ch}
                if _valid(space, cand) and flat_key(cand, space.budget, space.gpn) not in tried:
                    k = cand
                    break
                study.tell(tr, state=optuna.trial.TrialState.FAIL)  # not a trial: a static rule says no
                tr = None
        elif method == "gp":
            tr = study.ask(dists)
            cand = dict(space.base) | {p: json.loads(tr.params[p]) for p in ch}
            if _valid(space, cand) and flat_key(cand, space.budget, space.gpn) not in tried:
                k = cand
            else:
                study.tell(tr, state=optuna.trial.TrialState.FAIL)
                tr = None
                k = _nearest(pool, ch, cand, tried, space, rng)
        else:
            while pool:
                cand = pool.pop()
                if flat_key(cand, space.budget, space.gpn) not in tried:
                    k = cand
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
        if study is not None:
            val = rec.objective if rec.state == TrialState.SUCCEEDED else penalty
            if tr is not None:
                study.tell(tr, val)
            else:  # the repaired configuration is what ran: the sampler learns from it
                study.add_trial(optuna.trial.create_trial(params=_params(ch, k), distributions=dists, value=val))
    return {"history": hist}


class _FakeProp:
    def __init__(self, cfg):
        self.config, self.gpus = cfg, cfg.gpus
        self.predicted = None
        self.std = None
        self.bottleneck = None
        self.rationale = None


TIE = 0.005  # "not behind": within 0.5% of the best rival


def not_behind(me: float, best_rival: float) -> bool:
    """rltune's speed-up within TIE of the best rival's (the tables' "not behind any")."""
    return me >= best_rival * (1.0 - TIE)


def headline_budget(budgets: list[int]) -> int:
    """The trial budget the headline compares methods at (8 when it is run)."""
    return 8 if 8 in budgets else budgets[len(budgets) // 2]


def spent(hist: list, k: int) -> float:
    """Trial GPU-hours of a method's first k trials, every step as it ran (confirmations not included)."""
    return sum(r.summary.seconds_spent * r.gpus for r in hist[:k] if r.summary is not None) / 3600


def matched_trials(hist: list, target_gpu_h: float) -> int:
    """How many of a method's trials cost the GPU-hours closest to `target_gpu_h` (rltune's trial
    GPU-hours on the same seed): the rival's budget in the equal-cost comparison (fewer on a tie;
    0 = it deploys the baseline)."""
    return min(range(len(hist) + 1), key=lambda k: (abs(spent(hist, k) - target_gpu_h), k))


def best_after(rn: JobTrials, base, hist, k: int, pick=None) -> tuple[float, float, float]:
    """(objective, trial GPU-hours, GPU-seconds per step) of a method's pick after its first k
    trials (`pick`: the record it deploys, pick_after's by default), objective and GPU-seconds on
    the yardstick (JobTrials.true)."""
    gpu_h = spent(hist, k)
    pick = pick_after(base, hist, k) if pick is None else pick
    t = rn.true(pick.config)
    if t is None:  # a gated trial the yardstick refuses: cannot happen unless the twin changed
        pick, t = base, rn.true(base.config)
    return t[0], gpu_h, t[1] * (pick.config.gpus or rn.space.budget)


def pick_after(base, hist, k: int):
    """The record a method would deploy after its first k trials: its best measured gated trial,
    or the baseline when nothing it measured beat the baseline (what Optuna's best_trial gives)."""
    ok = [r for r in hist[:k] if r.state == TrialState.SUCCEEDED and r.objective is not None]
    if not ok:
        return base
    return or_baseline(base, min(ok, key=lambda r: r.objective))


def or_baseline(base, pick):
    """The pick, or the baseline when the pick does not beat the baseline's measured objective (the
    lifecycle's 'nothing beats the baseline; keep the current configuration')."""
    obj = pick.objective if pick.objective is not None else math.inf
    return base if base.objective is not None and obj >= base.objective else pick


@dataclass
class Deployed:
    """What a method ships after k trials: its first pick that passed the confirmation (or the
    baseline), the confirmation runs it took and their GPU-hours."""

    record: object
    attempts: int  # confirmation runs (0: nothing beat the baseline)
    confirm_gpu_h: float
    first_failed: bool  # the method's first pick did not confirm


def deploy(rn: JobTrials, method: str, base, hist: list, k: int, seed: int) -> Deployed:
    """A rival's end, as a user of the rival would end it: its pick after k trials (its best
    measured trial) is re-run as the winner's confirmation (JobTrials.confirms); a pick that does not
    confirm is rejected and the next best measured trial is picked, until one confirms or nothing
    left beats the baseline. (rltune's own end is its lifecycle's: run_rltune.)"""
    rejected: set = set()
    attempts, gpu_h, first_failed = 0, 0.0, False
    while True:
        hk = [r.model_copy(update={"state": TrialState.REJECTED}) if r.id in rejected else r for r in hist[:k]]
        pick = pick_after(base, hk, k)
        if pick is base or pick.id == base.id:
            return Deployed(base, attempts, gpu_h, first_failed)
        attempts += 1
        t = rn.true(pick.config)
        ran = rn.confirms(pick.config, rn.confirm_seed(seed, attempts))
        if t is not None:
            gpu_h += ran.steps * t[1] * (pick.config.gpus or rn.space.budget) / 3600
        if ran.passed:
            return Deployed(pick, attempts, gpu_h, first_failed)
        first_failed = first_failed or attempts == 1
        rejected.add(pick.id)


RUN_STEPS = 500  # the production run the tuning cost is weighed against


def tuning_cost(trial_gpu_h: float, base_gpu_s: float, pick_gpu_s: float) -> dict:
    """What tuning cost against what it saves: trial GPU-hours, GPU-hours saved over RUN_STEPS
    steps, their ratio, and the step at which the savings pay the trials back."""
    c = payback.tuning_cost(trial_gpu_h * 3600, base_gpu_s, pick_gpu_s, RUN_STEPS)
    return {
        "trial_gpu_h": c.trial_gpu_hours,
        "saved_gpu_h": c.saved_gpu_hours,
        "share": c.share,
        "payback_steps": c.payback_steps,
    }


def measured_baseline(name: str, spec: RLTuningJobSpec) -> tuple["JobTrials", object]:
    """The job's trial runner and its baseline, measured once (fixed seed) and judged: every method
    and every seed starts from the same measured baseline, as a tuning run on a cluster would."""
    rn = JobTrials(name, spec)
    b0 = baseline_record(spec)
    s, err = rn.run(b0.config, "baseline", BASELINE_SEED, max(STEPS, records.baseline_steps(spec)))
    if s is None:
        raise RuntimeError(f"{name}: baseline infeasible: {err}")
    rn.base = Tuner(spec, b0, []).judge(b0, s)
    rn.stored_base = stored_summary(rn.base.summary)
    return rn, rn.base


@dataclass
class SeedOutcome:
    """One method on one seed: per budget k (objective on the yardstick, trial GPU-hours with the
    confirmations, the configuration deployed, whether its first pick failed to confirm), and the
    figures of its longest run."""

    per_k: dict
    used: int  # search trials of the longest run
    own_gpu_h: float  # search trials' GPU-hours within the headline budget
    cost: dict
    forecast_error: Optional[float] = None
    stop: str = ""
    matched: Optional[tuple[float, int]] = None  # a rival at rltune's trial GPU-hours: (objective, trials)


def _rltune_seed(rn: JobTrials, base, budgets: list[int], seed: int, k8: int, base_gpu_s: float) -> SeedOutcome:
    """rltune on one seed: one tuning run of the product's loop per budget (budget.maxTrials=k),
    each deploying what its lifecycle concluded (a confirmed winner, or the baseline)."""
    runs = {k: run_rltune(rn, base, k, seed) for k in budgets}
    deployed = {k: _judged_pick(rn, base, r["pick"]) for k, r in runs.items()}
    per_k = {
        k: (deployed[k][1][0], r["trial_gpu_h"], deployed[k][0].config.dump(), r["first_failed"])
        for k, r in runs.items()
    }
    top = runs[max(budgets)]
    pick, (_, pick_step) = deployed[max(budgets)]
    pick_gpu_s = pick_step * (pick.config.gpus or rn.space.budget)
    return SeedOutcome(
        per_k,
        len(top["history"]),
        _gpu_h(runs[k8]["history"]),
        tuning_cost(top["trial_gpu_h"], base_gpu_s, pick_gpu_s) | {"confirm_gpu_h": top["confirm_gpu_h"]},
        top["forecast_error"],
        top["stop"],
    )


def _judged_pick(rn: JobTrials, base, pick) -> tuple:
    """(the record deployed, its (objective, step seconds) on the yardstick): the pick, or the baseline
    for a confirmed winner the yardstick refuses (cannot happen unless the twin changed)."""
    t = rn.true(pick.config)
    return (pick, t) if t is not None else (base, rn.true(base.config))


def _rival_seed(
    rn: JobTrials, method: str, base, budgets: list[int], seed: int, k8: int, base_gpu_s: float, judge_tuner, target
) -> SeedOutcome:
    """A rival on one seed: one search of max(budgets) trials, deployed after its first k (`deploy`);
    `target` (rltune's trial GPU-hours per seed) adds its pick at equal cost."""
    hist = run_baseline_search(rn, base, max(budgets), seed, method, judge_tuner)["history"]
    chosen = {k: deploy(rn, method, base, hist, k, seed) for k in set(budgets) | {len(hist)}}
    per_k = {}
    for k in budgets:
        v, g, _ = best_after(rn, base, hist, k, chosen[k].record)
        per_k[k] = (v, g + chosen[k].confirm_gpu_h, chosen[k].record.config.dump(), chosen[k].first_failed)
    matched = None
    if target is not None:
        km = matched_trials(hist, target[seed])
        dep = chosen[km] if km in chosen else deploy(rn, method, base, hist, km, seed)
        matched = (best_after(rn, base, hist, km, dep.record)[0], km)
    last = chosen[len(hist)]
    _, g, pick_gpu_s = best_after(rn, base, hist, len(hist), last.record)
    cost = tuning_cost(g + last.confirm_gpu_h, base_gpu_s, pick_gpu_s) | {"confirm_gpu_h": last.confirm_gpu_h}
    return SeedOutcome(per_k, len(hist), spent(hist, min(k8, len(hist))), cost, matched=matched)


def bench_job(
    job: dict,
    seeds: int,
    budgets: list[int],
    log=print,
    oracle_procs: int = 2,
    methods: tuple = METHODS,
    keep: Optional[dict] = None,
) -> dict:
    """One job: its oracle, baseline and every method in `methods` over `seeds` seeds at each budget.

    `keep`: this job's previous result, whose methods not in `methods` are carried over unrun
    (`--merge`). Their picks are re-judged on the yardstick so the oracle is what a full run would
    find; a previous result whose baseline no longer matches (the twin or the job changed) is refused."""
    name = job["metadata"]["name"]
    spec = RLTuningJobSpec.model_validate(job["spec"])
    t0 = time.time()
    orc = oracle(name, spec, procs=oracle_procs)
    log(f"{name}: oracle {orc['objective']:.1f} over {orc['feasible']}/{orc['configs']} configs ({orc['seconds']} s)")
    rn, base = measured_baseline(name, spec)
    if keep is not None and keep.get("yardstick_id") == yardstick_id(spec):
        rn.known = keep.get("yardstick", {})
    base_true = rn.true(base.config)[0]
    judge_tuner = Tuner(spec, base, [])
    prof = judge_tuner.profile()
    for c in orc["shortlist"]:  # the oracle's candidates on the yardstick (rn.best_judged below)
        rn.true(RLConfig.model_validate(c))
    base_noiseless = rn.noiseless(base.config)[0]
    res = {
        "job": name,
        "baseline": base_true,
        "baseline_noiseless": base_noiseless,
        "oracle_noiseless_speedup": base_noiseless / orc["objective"],
        "configs": orc["configs"],
        "bottleneck": prof.bottleneck if prof else "",
        "objective": spec.objective,
        "methods": {},
    }
    base_gpu_s = rn.true(base.config)[1] * (base.config.gpus or spec.resources.gpu_budget)

    if keep is not None and abs(keep["baseline"] / base_true - 1) > 1e-9:
        raise ValueError(
            f"{name}: the previous result's baseline {keep['baseline']:.2f} s is not this run's "
            f"{base_true:.2f} s (the twin or the job changed): rerun every method, without --merge"
        )
    for method, m in (keep["methods"] if keep else {}).items():
        if method in methods:
            continue
        if "picks" not in m:
            raise ValueError(f"{name}: the previous {method} result has no picks to re-judge: rerun it")
        for cfgs in m["picks"].values():
            for c in cfgs:
                rn.true(RLConfig.model_validate(c))
        res["methods"][method] = m
        log(f"  {method:7s} kept from the previous run")
    for method in methods:
        per_k = {k: [] for k in budgets}
        gpuh = {k: [] for k in budgets}
        ferr, used, stops, costs = [], [], [], []
        picks = {k: [] for k in budgets}
        first_failed = {k: 0 for k in budgets}
        # equal cost: rltune's trial GPU-hours at the headline budget per seed; each rival deploys after
        # the number of its own trials that cost closest to that (matched_trials)
        k8 = headline_budget(budgets)
        own_gpu_h, matched, matched_k = [], [], []
        target = res["methods"].get("rltune", {}).get("trial_gpu_h_at_headline") if method != "rltune" else None
        for sd in range(seeds):
            if method == "rltune":
                out = _rltune_seed(rn, base, budgets, sd, k8, base_gpu_s)
                if out.forecast_error is not None:
                    ferr.append(out.forecast_error)
                stops.append(out.stop)
            else:
                out = _rival_seed(rn, method, base, budgets, sd, k8, base_gpu_s, judge_tuner, target)
            used.append(out.used)
            for k in budgets:
                v, g, pick, failed = out.per_k[k]
                per_k[k].append(base_true / v)
                gpuh[k].append(g)
                picks[k].append(pick)
                first_failed[k] += failed
            own_gpu_h.append(out.own_gpu_h)
            costs.append(out.cost)
            if out.matched is not None:
                matched.append(base_true / out.matched[0])
                matched_k.append(out.matched[1])
        res["methods"][method] = {
            "speedup": {k: statistics.median(v) for k, v in per_k.items()},
            "speedup_mean": {k: statistics.fmean(v) for k, v in per_k.items()},
            "speedup_all": {k: v for k, v in per_k.items()},
            "gpu_hours": {k: statistics.median(v) for k, v in gpuh.items()},
            "trials_used": statistics.median(used),
            "forecast_error": statistics.median(ferr) if ferr else None,
            "forecast_errors": ferr,  # per seed: the headline's sampling spread comes from these
            "stops": stops,
            "cost": _median_cost(costs),
            "costs": costs,  # per seed: the cost headline's sampling spread comes from these
            "picks": picks,  # per k, per seed: the confirmed configuration judged (rescoring needs no rerun)
            "first_pick_failed": first_failed,  # per k: seeds whose first pick did not confirm
            "trial_gpu_h_at_headline": own_gpu_h,  # per seed: its trials' GPU-hours within the headline budget
        }
        if matched:  # a rival at rltune's trial GPU-hours (per seed), and the trials that took
            res["methods"][method]["matched"] = {
                "speedup": statistics.median(matched),
                "speedup_all": matched,
                "trials": statistics.median(matched_k),
            }
        m = res["methods"][method]
        log(
            f"  {method:7s} "
            + "  ".join(f"@{k}: {m['speedup'][k]:.2f}x" for k in budgets)
            + (f"  ferr {m['forecast_error']:.1%}" if m["forecast_error"] is not None else "")
            + f"  trials {m['trials_used']}"
        )
    res["methods"] = {m: res["methods"][m] for m in METHODS if m in res["methods"]}
    # The oracle on the yardstick: the best expectation over the exhaustive search's shortlist and
    # every configuration a method picked, so no method can beat it by the yardstick's own noise.
    best, cfg = rn.best_judged()
    res["oracle"], res["oracle_speedup"], res["oracle_config"] = best, base_true / best, cfg.dump()
    res["yardstick_id"], res["yardstick"] = yardstick_id(spec), rn.truth  # what --merge may reuse
    res["seconds"] = round(time.time() - t0, 1)
    log(
        f"  oracle {res['oracle_speedup']:.2f}x (noiseless search {res['oracle_noiseless_speedup']:.2f}x); "
        f"{res['seconds']} s"
    )
    return res


def _median_cost(costs: list[dict]) -> dict:
    """Median over seeds of each tuning-cost figure (a seed that saved nothing has no share)."""
    out = {}
    for key in ("trial_gpu_h", "confirm_gpu_h", "saved_gpu_h", "share", "payback_steps"):
        vals = [c[key] for c in costs if c.get(key) is not None]
        out[key] = statistics.median(vals) if vals else None
    return out


def _bench_job_quiet(job, seeds, budgets, methods, keep=None):
    lines: list[str] = []

    def log(s):
        lines.append(s)
        print(s, flush=True)

    try:
        r = bench_job(job, seeds, budgets, log=log, oracle_procs=1, methods=methods, keep=keep)
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

    rng = np.random.default_rng(seed)
    arrs = [np.asarray(v, dtype=float) for v in per_job if len(v)]
    stats = np.empty(reps)
    for i in range(reps):
        stats[i] = np.median([np.median(a[rng.integers(0, len(a), len(a))]) for a in arrs])
    lo, hi = np.quantile(stats, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def _pct(x) -> str:
    return "-" if x is None else f"{x:.1%}"


def render(results: list[dict], budgets: list[int], seeds: int, title: str) -> list[str]:
    """One job set's tables (quality against every rival, then tuning cost) and summary lines."""
    k8 = headline_budget(budgets)
    methods = [m for m in METHODS if all(m in r["methods"] for r in results)]
    rivals = [m for m in methods if m != "rltune"]
    lines = [
        f"**{title}** ({len(results)} jobs, {seeds} seeds; cells: median speed-up at "
        + "/".join(map(str, budgets))
        + " trials)",
        "",
    ]
    head = (
        ["job", "bottleneck", "configs", "baseline", "oracle"]
        + methods
        + [f"%oracle@{k8}", f"ahead@{k8}", "forecast err"]
    )
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    fracs, ferrs, ahead, behind_free = [], [], [], []
    beats = {m: [0, 0] for m in rivals}  # [by median, by mean] at k8
    # at equal cost: every rival's pick after the trials that cost what rltune's did on the same seed
    equal = bool(rivals) and all("matched" in r["methods"][x] for r in results for x in rivals)
    eq_ahead, eq_not_behind, eq_trials = [], [], []
    for r in results:
        m = r["methods"]
        unit = "GPU·s" if r["objective"] == "gpuSecondsPerStep" else "s"
        frac = m["rltune"]["speedup"][k8] / r["oracle_speedup"]
        fracs.append(frac)
        me = m["rltune"]["speedup"][k8]
        best_rival = max(m[x]["speedup"][k8] for x in rivals) if rivals else 0.0
        ahead.append(me > best_rival)
        behind_free.append(not_behind(me, best_rival))
        if equal:
            best_eq = max(m[x]["matched"]["speedup"] for x in rivals)
            eq_ahead.append(me > best_eq)
            eq_not_behind.append(not_behind(me, best_eq))
            eq_trials += [m[x]["matched"]["trials"] for x in rivals]
        for x in rivals:
            beats[x][0] += me > m[x]["speedup"][k8]
            beats[x][1] += m["rltune"]["speedup_mean"][k8] > m[x]["speedup_mean"][k8]
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
        row += ["/".join(f"{m[x]['speedup'][k]:.2f}" for k in budgets) for x in methods]
        row += [f"{frac:.0%}", "yes" if ahead[-1] else ("tie" if behind_free[-1] else "no"), _pct(fe)]
        lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        "| job | rltune trials | trial GPU-h (confirmation) | GPU-h saved over 500 steps | cost / saved | payback step "
        f"| first pick not confirmed @{k8} |",
        "|---|---|---|---|---|---|---|",
    ]
    shares, paybacks = [], []
    for r in results:
        c = r["methods"]["rltune"].get("cost") or {}
        if c.get("share") is not None:
            shares.append(c["share"])
        if c.get("payback_steps") is not None:
            paybacks.append(c["payback_steps"])
        ff = r["methods"]["rltune"].get("first_pick_failed", {}).get(k8)
        lines.append(
            f"| {r['job'].replace('bench-', '')} | {r['methods']['rltune']['trials_used']:g} | "
            f"{c.get('trial_gpu_h') or 0:.0f} ({c.get('confirm_gpu_h') or 0:.0f}) | {c.get('saved_gpu_h') or 0:.0f} | "
            f"{_pct(c.get('share'))} | "
            + (f"{c['payback_steps']:.0f}" if c.get("payback_steps") is not None else "-")
            + (f" | {ff}/{seeds} |" if ff is not None else " | - |")
        )
    per_seed = [r["methods"]["rltune"].get("forecast_errors") for r in results]
    ferr_ci = ""
    if per_seed and all(per_seed):
        lo, hi = median_of_medians_interval(per_seed)
        ferr_ci = f"; 90% seed-bootstrap interval {lo:.1%}-{hi:.1%}"
    cost_ci = {"share": "", "payback_steps": ""}
    seed_costs = [r["methods"]["rltune"].get("costs") for r in results]
    if seed_costs and all(seed_costs):
        for key, fmt in (("share", "{:.1%}"), ("payback_steps", "{:.0f}")):
            vals = [[c[key] for c in cs if c.get(key) is not None] for cs in seed_costs]
            if all(vals):
                lo, hi = median_of_medians_interval(vals)
                cost_ci[key] = f" (90% seed-bootstrap interval {fmt.format(lo)}-{fmt.format(hi)})"
    n = len(results)
    lines += [
        "",
        f"Median over jobs: rltune reaches {statistics.median(fracs):.0%} of the oracle speed-up within {k8} trials "
        f"(worst job {min(fracs):.0%}); ahead of every rival at {k8} trials on {sum(ahead)}/{n} jobs by the median "
        f"over seeds, not behind any (within 0.5%) on {sum(behind_free)}/{n}. Per rival (rltune ahead at {k8}, by "
        "median / by mean over seeds): "
        + ", ".join(f"{x} {beats[x][0]}/{n} / {beats[x][1]}/{n}" for x in rivals)
        + f". Forecaster median |error| {statistics.median(ferrs):.1%} (median over jobs of each job's median over "
        f"its trials{ferr_ci}). Tuning cost: median {_pct(statistics.median(shares)) if shares else '-'}"
        f"{cost_ci['share']} of the GPU-hours the pick saves over 500 steps, paid back after a median "
        + (f"{statistics.median(paybacks):.0f}{cost_ci['payback_steps']} steps." if paybacks else "- steps."),
    ]
    if equal:
        lines.append(
            f"At equal cost (each rival's pick after as many of its trials as cost closest to rltune's trial "
            f"GPU-hours at {k8} trials on the same seed; median {min(eq_trials):g}-{max(eq_trials):g} trials per "
            f"rival and job): rltune is ahead of every rival on {sum(eq_ahead)}/{n} jobs and not behind any "
            f"(within 0.5%) on {sum(eq_not_behind)}/{n}."
        )
    return lines


def write_markdown(
    results: list[dict], budgets: list[int], seeds: int, path: Path, marker: str = "results", title: str = ""
) -> None:
    lines = render(results, budgets, seeds, title or "The eight seed-shaped jobs")
    lines.append(
        f"Speed-ups are medians over {seeds} seeds unless marked mean; each is the objective of the configuration "
        f"the method would deploy after k trials (its best pick that passed the winner's confirmation under the "
        f"job's rewardGate; trial GPU-hours include the confirmations), relative to the baseline's, both judged by "
        f"the mean of "
        f"{EXPECT_SAMPLES} noisy twin steps (common random numbers). The oracle is the best on that yardstick over "
        f"the exhaustive noiseless search's {SHORTLIST} best and every method's pick."
    )
    text = path.read_text() if path.exists() else ""
    start, end = f"<!-- bench:{marker}:start -->", f"<!-- bench:{marker}:end -->"
    block = start + "\n" + "\n".join(lines) + "\n" + end
    if start in text and end in text:
        text = text[: text.index(start)] + block + text[text.index(end) + len(end) :]
    else:
        text = text + "\n" + block + "\n"
    path.write_text(text)


def select_jobs(names: Optional[str], job_set: str = "seed") -> list[dict]:
    """The jobs of a set ("seed": the eight seed-shaped jobs; "generated": bench.jobs.generated_jobs;
    "fresh": bench.jobs.fresh_jobs) that a comma-separated --jobs value names (with or without the
    "bench-" prefix); all when empty."""
    sel = set(names.split(",")) if names else None
    pool = {"seed": bench_jobs, "generated": generated_jobs, "fresh": fresh_jobs}[job_set]()
    return [
        j for j in pool if not sel or j["metadata"]["name"] in sel or j["metadata"]["name"].replace("bench-", "") in sel
    ]


def _int_keys(res: list[dict]) -> list[dict]:
    for r in res:
        for m in r["methods"].values():
            for key in ("speedup", "gpu_hours", "speedup_mean", "speedup_all", "picks", "first_pick_failed"):
                if key in m:
                    m[key] = {int(k): v for k, v in m[key].items()}
    return res


def run_set(
    todo: list[dict], seeds: int, budgets: list[int], methods: tuple, procs: int, keep: Optional[dict] = None
) -> list[dict]:
    """Benchmark jobs, `procs` at a time (one job per process, slowest first; each job's oracle
    then runs single-process); results in the jobs' order. `keep`: previous results by job name,
    whose other methods are carried over (bench_job)."""
    keep = keep or {}
    if procs > 1 and len(todo) > 1:
        order = {j["metadata"]["name"]: i for i, j in enumerate(todo)}
        todo = sorted(todo, key=lambda j: j["spec"]["workload"]["task"]["kind"] != "agentic-coding")
        ctx = mp.get_context("fork")
        with ctx.Pool(procs) as pool:
            args = [(j, seeds, budgets, methods, keep.get(j["metadata"]["name"])) for j in todo]
            res = pool.starmap(_bench_job_quiet, args)
        results = sorted(res, key=lambda r: order[r["job"]])
        print("\n---- per job ----")
        for r in results:
            print("\n".join(r.pop("log")))
        return [r for r in results if "error" not in r]
    log = lambda s: print(s, flush=True)  # noqa: E731
    return [bench_job(j, seeds, budgets, log=log, methods=methods, keep=keep.get(j["metadata"]["name"])) for j in todo]


def merge_set(path: Path, todo: list[dict], seeds: int, budgets: list[int], methods: tuple, procs: int) -> list[dict]:
    """Rerun `methods` on the jobs in `todo` and merge them into the results stored at `path`
    (every other method and job kept; see bench_job's `keep`). Refuses, writing nothing, when a job
    is missing from the file, was run with other seeds or budgets, or fails now."""
    old = {r["job"]: r for r in _int_keys(json.loads(path.read_text()))}
    for j in todo:
        r = old.get(j["metadata"]["name"])
        if r is None:
            raise SystemExit(f"--merge: {j['metadata']['name']} is not in {path}; run it without --merge")
        for m in r["methods"].values():
            if sorted(m["speedup_all"]) != sorted(budgets) or any(len(v) != seeds for v in m["speedup_all"].values()):
                raise SystemExit(f"--merge: {r['job']} in {path} was run with other budgets or seeds")
    print(f"==== merging {', '.join(methods)} into {path} ({len(todo)} jobs, {seeds} seeds)", flush=True)
    new = run_set(todo, seeds, budgets, methods, procs, keep=old)
    if len(new) != len(todo):
        raise SystemExit(f"--merge: {len(todo) - len(new)} jobs failed (above); {path} is left as it was")
    old.update({r["job"]: r for r in new})
    return list(old.values())


SETS = {
    "seed": ("results", "The eight seed-shaped jobs", "results.json"),
    "generated": ("generated", "Generated jobs (bench.jobs.generated_jobs, fixed seed)", "results-generated.json"),
    "fresh": (
        "fresh",
        "Fresh generated jobs (bench.jobs.fresh_jobs: a confirmation draw, never chosen on)",
        "results-fresh.json",
    ),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    ap.add_argument(
        "--set",
        choices=["seed", "generated", "both", "fresh"],
        default="both",
        help="which job set(s); both = seed + generated, the sets changes are chosen on",
    )
    ap.add_argument("--jobs", help="comma-separated job names (default: the whole set)")
    ap.add_argument("--seeds", type=int, default=10, help="seeds per job of the seed-shaped set")
    ap.add_argument("--gen-seeds", type=int, default=10, help="seeds per job of the generated and fresh sets")
    ap.add_argument("--budgets", default="4,8,16")
    ap.add_argument("--no-write", action="store_true", help="do not update docs/benchmark.md")
    ap.add_argument("--json-dir", default=str(RESULTS))
    ap.add_argument("--procs", type=int, default=2, help="jobs benchmarked in parallel (processes)")
    ap.add_argument("--from-json", action="store_true", help="only re-render docs/benchmark.md from the JSONs")
    ap.add_argument("--methods", default=",".join(METHODS), help="methods to run (a subset is not written)")
    ap.add_argument(
        "--merge",
        action="store_true",
        help="rerun only --methods (and --jobs) and keep every other method and job from the JSON in "
        "--json-dir; the oracle is re-judged over all picks, so the result is what a full run gives",
    )
    args = ap.parse_args(argv)
    budgets = [int(x) for x in args.budgets.split(",")]
    methods = tuple(args.methods.split(","))
    if unknown := set(methods) - set(METHODS):
        ap.error(f"--methods: unknown {sorted(unknown)}; choose from {', '.join(METHODS)}")
    if (set(methods) != set(METHODS) or args.jobs) and not args.merge:
        args.no_write = True
    sets = ["seed", "generated"] if args.set == "both" else [args.set]
    t0 = time.time()
    for name in sets:
        marker, title, fname = SETS[name]
        seeds = args.seeds if name == "seed" else args.gen_seeds
        path = Path(args.json_dir) / fname
        if args.from_json:
            results = _int_keys(json.loads(path.read_text()))
        elif args.merge:
            results = merge_set(path, select_jobs(args.jobs, name), seeds, budgets, methods, args.procs)
            print(f"{name}: {time.time() - t0:.0f} s so far", flush=True)
            path.write_text(json.dumps(results, indent=1, default=str))
        else:
            print(f"==== {title}: {seeds} seeds, methods {', '.join(methods)}", flush=True)
            results = run_set(select_jobs(args.jobs, name), seeds, budgets, methods, args.procs)
            print(f"{name}: {time.time() - t0:.0f} s so far", flush=True)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(results, indent=1, default=str))
        complete = bool(results) and all(set(r["methods"]) == set(METHODS) for r in results)
        if complete:
            print("\n".join(render(results, budgets, seeds, title)), flush=True)
        if not args.no_write and complete:
            write_markdown(results, budgets, seeds, ROOT / "docs" / "benchmark.md", marker, title)
    print(f"total {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
