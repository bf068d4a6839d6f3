"""Candidate generation over a job's search space.

The space is the product of the knob values the job allows (searchSpace.knobs, else the
catalog's default range plus the baseline value; searchSpace.frozen and MoE-only knobs on dense
models pin a knob to the baseline), minus invalid configurations (divisibility by heads and
GPUs per node, GPU budget, staleness <= constraints.maxStaleness) and configurations that
certainly do not fit in memory (fit probability below memfit.P_FIT_MIN).

The product is large (millions for a MoE job with the default catalog), but a step's time is
monotone non-decreasing in every phase, and the rollout phases depend only on (rollout GPUs,
rollout knobs, staleness/partial rollout) while the trainer phases depend only on (trainer GPUs,
trainer knobs). So, per outer context (GPU count, placement and split, staleness, partial
rollout, weight sync) the search keeps the `top` best rollout halves and the `top` best trainer
halves under the calibrated forecaster (plus the baseline's own halves) and scores their full
product. The best-predicted configuration of the whole space is always among the candidates;
uncertainty-driven exploration sees the `top`x`top` neighbourhood of each context's optimum.
Ranking halves by the forecast's median alone would hide a knob value no trial has measured
behind many measured near-copies (the physics ranking rollout TP 1 12% below TP 4 keeps every
TP 1 half out of a 7B job's candidates, although its correction is the prior's +-40%): each
context also keeps the EXPLORE best halves by their optimistic bound (EXPLORE_Z sds below the
median), and expected improvement decides whether a trial there is worth it.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from typing import Iterable, Optional

import numpy as np

from ..adapters.registry import adapter_for, coverage
from ..adapters.registry import problems as framework_problems
from ..api.models import ModelArch, RLConfig, RLTuningJobSpec, TrainerKnobs
from . import physics
from .forecast import Forecaster, features
from .knobs import BY_PATH, CATALOG, CPU_KNOBS, MAX_REPLICA_NODES, ROLLOUT_KNOBS, TRAINER_KNOBS
from .memfit import P_FIT_MIN
from .records import objective_of

# Halves kept per context beyond the `top` best medians: the best by the optimistic bound, EXPLORE_Z
# sds of the calibrated correction below the median (module docstring).
EXPLORE, EXPLORE_Z = 2, 1.0


def _hopeful(kept: np.ndarray, hope: np.ndarray) -> list[int]:
    """Indices of the EXPLORE rows best by their optimistic bound `hope` among those not `kept`
    (the `top` best by the median)."""
    held = set(kept.tolist())
    return [int(i) for i in np.argsort(hope) if int(i) not in held][:EXPLORE]


def _uniq(xs: Iterable) -> list:
    out = []
    for x in xs:
        if x not in out:
            out.append(x)
    return out


class Space:
    """The job's search space: per-knob candidate values and the validity rules."""

    def __init__(self, spec: RLTuningJobSpec):
        self.spec = spec
        self.model: ModelArch = spec.workload.model.resolved()
        self.base = spec.baseline.flat()
        self.budget = spec.resources.gpu_budget
        self.gpn = spec.resources.gpus_per_node
        ss = spec.search_space
        listed = ss.knobs or {}
        frozen = set(ss.frozen or [])
        unknown = [p for p in list(listed) + list(frozen) if p not in BY_PATH and p not in ("gpus",)]
        if unknown:
            raise ValueError(f"searchSpace names unknown knobs {unknown}: known are {sorted(BY_PATH)} and gpus")
        # what the job's framework can express (rltune.adapters): dropped knobs stay at the
        # baseline, restricted ones keep only values the framework can run
        self.coverage = coverage(spec)
        self.values: dict[str, list] = {}
        for k in CATALOG:
            if k.path == "trainerGpus":
                continue
            b = self.base.get(k.path)
            runnable = self.coverage.values.get(k.path)
            if k.path in frozen or (k.moe_only and not self.model.is_moe) or self.coverage.is_dropped(k.path):
                vals = [b]
            elif k.path in listed:
                vals = list(listed[k.path]) or [b]
            else:
                default = list(k.values(spec, self.model))
                vals = _uniq([b] + (default if default or runnable is None else list(runnable)))
            if runnable is not None:
                vals = [v for v in vals if v == b or v in runnable] or [b]
            self.values[k.path] = vals
        # staleness never above the limit (the baseline's own value is allowed as given)
        ms = spec.constraints.max_staleness
        self.values["async.staleness"] = [s for s in self.values["async.staleness"] if s <= ms] or [
            self.base["async.staleness"]
        ]
        base_gpus = self.base.get("gpus") or self.budget
        if "gpus" in listed and listed["gpus"]:
            gl = [g for g in listed["gpus"] if g <= self.budget]
        elif "gpus" in frozen:
            gl = [base_gpus]
        elif ss.allow_fewer_gpus or spec.objective in ("gpuSecondsPerStep", "costPerStep"):
            lo = ss.min_gpus or max(self.gpn, self.budget // 2)
            gl = [g for g in range(self.gpn, self.budget + 1, self.gpn) if g >= lo]
            gl = _uniq([base_gpus] + gl)
        else:
            gl = [base_gpus]
        self.gpus = sorted(set(gl))
        self.trainer_gpus_listed = listed.get("trainerGpus")
        self.frozen = frozen

    # ------------------------------------------------------------------ validity
    def trainer_splits(self, gpus: int) -> list[Optional[int]]:
        if self.trainer_gpus_listed:
            return [t for t in self.trainer_gpus_listed if 0 < t < gpus]
        if "trainerGpus" in self.frozen and self.base.get("trainerGpus"):
            return [self.base["trainerGpus"]] if self.base["trainerGpus"] < gpus else []
        out = []
        for f in (0.25, 0.375, 0.5, 0.625, 0.75):
            t = int(round(gpus * f / self.gpn)) * self.gpn
            if self.gpn <= t <= gpus - self.gpn and t not in out:
                out.append(t)
        if (
            self.base["placement"] == "disaggregated"
            and self.base.get("trainerGpus")
            and (self.base.get("gpus") or self.budget) == gpus
            and self.base["trainerGpus"] not in out
        ):
            out.append(self.base["trainerGpus"])
        return out

    def rollout_valid(self, r: dict, gr: int) -> Optional[str]:
        tp = r["rollout.tp"]
        if tp > self.gpn and tp % self.gpn:
            return "rollout TP spans part of a node"
        if tp > MAX_REPLICA_NODES * self.gpn:
            return "rollout TP spans too many nodes"
        if self.model.heads % tp:
            return f"rollout TP {tp} does not divide {self.model.heads} heads"
        if gr % tp:
            return f"rollout TP {tp} does not divide {gr} rollout GPUs"
        if r["rollout.expertParallel"] and not self.model.is_moe:
            return "expert parallel on a dense model"
        return None

    def trainer_valid(self, t: dict, gt: int) -> Optional[str]:
        tp, pp, cp, ep = t["trainer.tp"], t["trainer.pp"], t["trainer.cp"], t["trainer.ep"]
        if tp > self.gpn:
            return "trainer TP spans nodes"
        if self.model.heads % tp:
            return f"trainer TP {tp} does not divide {self.model.heads} heads"
        if pp > max(1, self.model.layers // 4):
            return f"trainer PP {pp} too deep for {self.model.layers} layers"
        if gt % (tp * pp * cp):
            return f"tp*pp*cp={tp * pp * cp} does not divide {gt} trainer GPUs"
        etp = t.get("trainer.etp")
        if self.model.is_moe:
            etp = physics.expert_tp(t)
            if self.model.experts % ep:
                return f"EP {ep} does not divide {self.model.experts} experts"
            if (gt // pp) % ep:
                return f"EP {ep} does not divide {gt // pp} GPUs per stage"
            if (gt // pp) % (ep * etp):
                return f"EP*ETP {ep * etp} does not divide {gt // pp} GPUs per stage"
            if etp > self.gpn:
                return "trainer expert TP spans nodes"
            if self.model.expert_ffn % etp:
                return f"ETP {etp} does not divide the expert width {self.model.expert_ffn}"
        elif ep != 1:
            return "expert parallel on a dense model"
        elif etp is not None and etp != tp:
            return "expert tensor parallel on a dense model"
        return None

    def outer(self) -> list[dict]:
        out = []
        for gpus in self.gpus:
            for place in self.values["placement"]:
                splits = [None] if place == "colocated" else self.trainer_splits(gpus)
                for tg in splits:
                    for st, pr, sf in itertools.product(
                        self.values["async.staleness"],
                        self.values["async.partialRollout"],
                        self.values["async.staleFraction"],
                    ):
                        if (pr or sf) and st < 1:
                            continue
                        for ws in self.values["weightSync"]:
                            for cpu in self.halves(CPU_KNOBS):
                                out.append(
                                    {
                                        "gpus": gpus,
                                        "placement": place,
                                        "trainerGpus": tg,
                                        "async.staleness": st,
                                        "async.partialRollout": pr,
                                        "async.staleFraction": sf,
                                        "weightSync": ws,
                                    }
                                    | cpu
                                )
        return out

    def framework_problem(self, k: dict) -> Optional[str]:
        """The first constraint of the job's framework a full flat configuration violates."""
        if adapter_for(self.spec.workload.framework) is None:
            return None
        found = framework_problems(self.spec, self.config(k))
        return found[0] if found else None

    def halves(self, names: tuple[str, ...]) -> list[dict]:
        """Every combination of the named knobs' values, each in its canonical form (`canonical`),
        once: two spellings of one layout would be forecast and tried as two configurations."""
        return _uniq(
            canonical(dict(zip(names, combo))) for combo in itertools.product(*(self.values[n] for n in names))
        )

    def size(self) -> int:
        """Configurations in the (unpruned) product, for display."""
        r = math.prod(len(self.values[k]) for k in ROLLOUT_KNOBS)
        t = math.prod(len(self.values[k]) for k in TRAINER_KNOBS)
        return len(self.outer()) * r * t

    def config_key(self, k: dict) -> str:
        """Identity of a configuration of this space (see `flat_key`)."""
        return flat_key(k, self.budget, self.gpn)

    def config(self, k: dict) -> RLConfig:
        """An explicit RLConfig from a flat knob dict: gpus always set, and the trainer split when
        disaggregated (a trial must not depend on a workload's own default split)."""
        return explicit(
            self.spec.baseline.with_knobs(
                {p: v for p, v in k.items() if p != "cpu" and not (p in CPU_KNOBS and v is None)}
            ),
            self.budget,
            self.gpn,
        )

    def all_valid(self, full: dict) -> Optional[str]:
        """Validity of a full flat config against the space (used for baseline-independent checks)."""
        gpus, gt, gr = physics.split(full, self.budget, self.gpn)
        if gpus > self.budget:
            return f"uses {gpus} GPUs, budget {self.budget}"
        if full["async.staleness"] > self.spec.constraints.max_staleness:
            return "staleness above constraints.maxStaleness"
        return self.rollout_valid(full, gr) or self.trainer_valid(full, gt)


@dataclass
class Candidate:
    k: dict  # flat knobs
    step: float
    std: float
    objective: float
    objective_std: float
    gpus: int
    phases: dict
    p_fit: float = 1.0  # probability that it fits in memory (rltune.tuner.memfit)
    extrapolation: str = ""  # what its forecast rests on that no measurement has shown


def candidates(
    space: Space, fc: Forecaster, top: int = 6, exclude=None, gpus_max: Optional[int] = None
) -> list[Candidate]:
    """Scored candidates (feasible, valid, not excluded), pruned as the module docstring explains."""
    base = space.base
    r_all = space.halves(ROLLOUT_KNOBS)
    t_all = space.halves(TRAINER_KNOBS)
    r_base = {k: base[k] for k in ROLLOUT_KNOBS}
    t_base = {k: base[k] for k in TRAINER_KNOBS}
    outer = space.outer()
    if gpus_max is not None:
        outer = [o for o in outer if o["gpus"] <= gpus_max]
    gspec = space.spec
    mf = physics.facts_cached(space.model)
    tf = fc.task  # the task as measured (response length, learned tool latency)
    gname = gspec.resources.gpu_type
    reach = physics.gpu_lookup(gname).nvlink_reach(space.gpn)

    best_r: dict[tuple, list[dict]] = {}
    best_t: dict[int, list[dict]] = {}
    out: list[Candidate] = []
    seen: set[str] = set()
    for o in outer:
        gpus = o["gpus"]
        ko = dict(base) | o
        _, gt, gr = physics.split(ko, space.budget, space.gpn)
        if gr < 1 or gt < 1:
            continue
        partial = physics.streams(o)
        rkey = (gr, o["async.staleness"], partial)
        if rkey not in best_r:
            rows, feats, raws = [], [], []
            for r in r_all:
                if space.rollout_valid(r, gr):
                    continue
                ro = physics.rollout_part(
                    mf,
                    tf,
                    gname,
                    gr,
                    r["rollout.tp"],
                    bool(r["rollout.expertParallel"] and mf.moe_layers),
                    round(r["rollout.gpuMemoryUtilization"], 4),
                    r["rollout.maxNumSeqs"],
                    r["rollout.maxNumBatchedTokens"],
                    r["rollout.cudaGraphs"],
                    r["rollout.fp8"],
                    partial,
                    reach,
                )
                if not ro.feasible or fc.memory.p_side("rollout", -ro.free_frac) < P_FIT_MIN:
                    continue
                kk = dict(ko) | r
                rows.append(r)
                feats.append(features(kk, gpus, gt, gr, ro.preempt_log))
                raws.append({"generation": fc.gen_raw(ro.bulk + ro.tool, ro.tail)})
            if rows:
                tot = fc.calibrated_total(("generation",), raws, feats)
                order = np.argsort(tot)
                pick = [rows[i] for i in order[:top]]
                hope = fc.calibrated_total(("generation",), raws, feats, z=EXPLORE_Z)
                pick += [rows[i] for i in _hopeful(order[:top], hope)]
                # keep diversity in the memory dimension (colocated memory coupling) and the baseline half
                lowmem = sorted(range(len(rows)), key=lambda i: (rows[i]["rollout.gpuMemoryUtilization"], tot[i]))[:2]
                pick += [rows[i] for i in lowmem]
                if r_base in rows:
                    pick.append(r_base)
                best_r[rkey] = _uniq(pick)
            else:
                best_r[rkey] = []
        if gt not in best_t:
            rows, feats, raws = [], [], []
            for t in t_all:
                if space.trainer_valid(t, gt):
                    continue
                tr = physics.trainer_of(mf, tf, gname, gt, t)
                if not tr.feasible or fc.memory.p_side("trainer", tr.mem_frac) < P_FIT_MIN:
                    continue
                kk = dict(ko) | t
                rows.append(t)
                feats.append(features(kk, gpus, gt, gr))
                raws.append({"old_logprob": tr.old_logprob, "ref_logprob": tr.ref_logprob, "training": tr.training})
            if rows:
                phases = ("old_logprob", "ref_logprob", "training")
                tot = fc.calibrated_total(phases, raws, feats)
                order = np.argsort(tot)
                pick = [rows[i] for i in order[:top]]
                pick += [rows[i] for i in _hopeful(order[:top], fc.calibrated_total(phases, raws, feats, z=EXPLORE_Z))]
                # smallest resident weights (colocated memory coupling)
                pick += [
                    rows[i]
                    for i in sorted(
                        range(len(rows)),
                        key=lambda i: (-rows[i]["trainer.tp"] * rows[i]["trainer.pp"] * rows[i]["trainer.ep"], tot[i]),
                    )[:2]
                ]
                if t_base in rows:
                    pick.append(t_base)
                best_t[gt] = _uniq(pick)
            else:
                best_t[gt] = []
        for r in best_r[rkey]:
            for t in best_t[gt]:
                k = dict(base) | o | r | t
                if k["placement"] == "colocated":
                    k["trainerGpus"] = None
                if space.config_key(k) in seen:
                    continue
                seen.add(space.config_key(k))
                out.append(k)
    if exclude:
        out = [k for k in out if not exclude(k)]
    if adapter_for(gspec.workload.framework) is not None:
        out = [k for k in out if space.framework_problem(k) is None]
    preds = fc.predict_many(out)
    res = []
    for k, p in zip(out, preds):
        if not p.feasible:
            continue
        res.append(
            Candidate(
                k,
                p.step,
                p.std,
                objective_of(gspec, p.step, p.gpus),
                objective_of(gspec, p.std, p.gpus),
                p.gpus,
                p.phases,
                p.p_fit,
                p.extrapolation,
            )
        )
    return res


def expected_improvement(incumbent: float, cands: list[Candidate]) -> np.ndarray:
    """Expected improvement of each candidate's objective over the incumbent's, under its forecast.

    The forecaster's uncertainty is multiplicative (log-space corrections to the physics), so the
    objective is lognormal: median `objective`, log-sd `objective_std / objective`. A wide forecast
    well above the incumbent then has little mass below it; a normal of the same sd would put much
    there (and some below zero) and rank a layout forecast 3x slower at +-85% above a sure 5% gain."""
    med = np.maximum(np.array([c.objective for c in cands]), 1e-12)
    sig = np.maximum(np.array([c.objective_std for c in cands]) / med, 1e-9)
    z = (math.log(max(incumbent, 1e-12)) - np.log(med)) / sig
    return incumbent * _ncdf(z) - med * np.exp(0.5 * sig * sig) * _ncdf(z - sig)


def noisy_trial_value(cands: list[Candidate], measurement_sd: float) -> list[Candidate]:
    """The candidates with the objective sd that a noisy trial can resolve: a trial measures the
    objective with relative sd `measurement_sd`, so the estimate it leaves moves by at most
    sd^2 / sqrt(sd^2 + noise^2) (the knowledge gradient of one noisy observation), not by the
    full forecast sd. Expected improvement under that sd is what the trial is worth: where the
    forecast is no more certain than one trial's noise, another trial mostly re-draws the noise."""
    out = []
    for c in cands:
        noise = measurement_sd * c.objective
        sd = c.objective_std**2 / math.sqrt(c.objective_std**2 + noise**2) if c.objective_std > 0 else 0.0
        out.append(replace(c, objective_std=sd))
    return out


def _ncdf(z):
    return 0.5 * (1.0 + np.vectorize(math.erf)(np.asarray(z) / math.sqrt(2.0)))


def canonical(k: dict) -> dict:
    """The flat knobs in the one form RLConfig keeps (api.models.TrainerKnobs.kept_etp): an expert TP equal
    to the dense TP is Megatron's default, unset. A search space listing trainer.etp [1] beside
    trainer.tp 1 names the unset layout: without this the search forecast it as an unmeasured knob
    value and proposed it again after every trial of it (the trial ran, and was stored, unset)."""
    etp = k.get("trainer.etp")
    kept = TrainerKnobs.kept_etp(k.get("trainer.tp"), etp)
    return k if kept == etp else k | {"trainer.etp": kept}


def flat_key(k: dict, budget: int, gpn: int) -> str:
    """Identity of a configuration (flat knobs) for de-duplication: gpus=None means the budget,
    a disaggregated split of None means the default split, colocated has no split, and the knobs
    are compared in their canonical form."""
    kk = {p: v for p, v in canonical(k).items() if p != "cpu" and not (p in CPU_KNOBS and v is None)}
    if kk.get("gpus") in (None, budget):
        kk["gpus"] = None
    if kk.get("placement") == "colocated":
        kk["trainerGpus"] = None
    elif not kk.get("trainerGpus"):
        kk["trainerGpus"] = physics.split(k, budget, gpn)[1]
    return repr(sorted(kk.items(), key=lambda x: x[0]))


def explicit(cfg: RLConfig, budget: int, gpn: int) -> RLConfig:
    """The configuration with gpus (and trainerGpus when disaggregated) filled in."""
    gpus, gt, _ = physics.split(cfg.flat(), budget, gpn)
    upd = {"gpus": gpus, "trainer_gpus": gt if cfg.placement == "disaggregated" else None}
    return cfg.model_copy(update=upd)
