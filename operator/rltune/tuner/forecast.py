"""The forecaster: physics prior (rltune.tuner.physics) + corrections learned from measurements.

Calibration. For every measured configuration (the baseline first, then each scored trial,
rejected and early-stopped ones included: their timing is real) and every calibrated quantity p
(rollout bulk, long tail, log-prob passes, training, weight sync), the log ratio
r_p = log(measured_p / physics_p) is a residual. A Bayesian linear model per quantity explains
it as an intercept (the cluster's overall efficiency against the physics prior: wide prior,
learned from the baseline alone) plus one correction per knob value that differs from the
baseline (prior sd 0.3 in log space, i.e. "the physics misjudges this knob by ~30%"), over the
knobs that quantity depends on. Every trial thus teaches per-knob multiplicative corrections
that transfer to untried combinations; a knob value never measured keeps the physics' view and
its prior uncertainty. The composed step time gets one more such model over all knobs (tighter
prior) that absorbs what the overlap model gets wrong. Uncertainty is the posterior predictive
sd, propagated through the composition (step_variance: a side hidden behind the other adds
little). Each observation is weighted by its own precision (its steps' spread: a trial with a
straggling step teaches less). Re-fitted from the observation list on every call.

Memory. Whether a configuration fits is a probability (rltune.tuner.memfit): the physics memory
model's limits are uncertain, and measured fits and out-of-memory failures (trainer-side,
rollout-side, colocated, or both when the failure does not say which) move them for every layout
that shares the side. A configuration at least as hungry as a failure on its side does not fit.

Extrapolation. A prediction says which knob values it rests on that no measurement has shown
(the corrections keep the physics' view there, with the prior's uncertainty) and when it lies
beyond the memory limits any trial has proven.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Optional

import numpy as np

from ..adapters.registry import trainer_backend
from ..api.layout import layout_of
from ..api.models import RLConfig, RLTuningJobSpec
from . import physics, task_learning
from .knobs import BY_PATH, CATALOG, calibrated, feature_names
from .memfit import P_FIT_MIN, MemoryFit
from .summary import TrialSummary

# Calibrated quantities. The rollout is calibrated as a whole: how a workload splits it into bulk
# and tail shifts with the knobs (partial rollout moves the tail into the next step's bulk), so
# the split is informational and scales with the calibrated total.
CAL_PHASES = ("generation", "old_logprob", "ref_logprob", "training", "weight_sync")


def cal_value(phases: dict, p: str) -> float:
    if p == "generation_bulk":
        return max(0.0, phases.get("generation", 0.0) - phases.get("generation_tail", 0.0))
    return phases.get(p, 0.0)


# The features of a configuration, in a fixed order (batch diversity sums squared differences
# over it): the rollout GPUs and knobs, the trainer GPUs and knobs, then placement and sync.
ALL_FEATS = ("lgr",) + feature_names("rollout", "async") + ("lgt",) + feature_names("trainer", "placement", "sync")

PRIOR_SD = 0.30  # log-space prior sd of one knob value's correction to the physics (default)
# Which side of the step each calibrated quantity belongs to (the knobs' priors are per side).
SIDE = {
    "generation": "rollout",
    "old_logprob": "trainer",
    "ref_logprob": "trainer",
    "training": "trainer",
    "weight_sync": "sync",
}
# Mechanism terms (names "m:..."): continuous regressors, the log of the slowdown one uncertain
# mechanism of the physics adds to a configuration (RolloutPart.preempt_log: preemption under KV
# over-subscription). Its coefficient scales the mechanism wherever it acts: 0 = the physics is right,
# -1 = the mechanism costs nothing here, +1 = twice its log cost. A knob-value correction cannot do
# this: learned where the mechanism dominates (a KV-starved baseline) it would be carried to every
# configuration sharing the knob value, starved or not.
MECHANISM_SD = 1.0
# Rows whose rollout the preemption term slows by more than this (log) do not set the bulk/tail split.
PREEMPT_SPLIT_MAX = 0.05
# Besides the knobs, the corrections see quantities derived from several knobs: the rollout and
# trainer GPU counts (c:gr, c:gt), whether partial rollout streams (c:partial: it needs staleness
# >= 1) and the GPU count (c:gpus). Their priors per side:
DERIVED_SD = {
    "rollout": {"c:gr": 0.3, "c:partial": 0.5, "m:preempt": MECHANISM_SD},
    "trainer": {"c:gt": 0.2},
    "sync": {"c:gt": 0.2, "c:gr": 0.2},
}
# How much the physics prior is trusted per knob (a trial that moves several knobs at once
# attributes its surprise mostly to the knobs the physics knows least: partial rollout, EP, TP):
# the catalog's priors, plus the derived quantities'.
KNOB_SD = {p: {k: BY_PATH[k].prior_sd[side] for k in calibrated(side)} | DERIVED_SD[side] for p, side in SIDE.items()}
INTERCEPT_SD = 1.0  # log-space prior sd of the overall correction (the cluster's efficiency)
STEP_PRIOR_SD = 0.06
STEP_INTERCEPT_SD = 0.15
# Noise of a trial's phase means (log space) beyond what its own steps' spread shows: the same
# configuration scatters ~4% between runs although three steps' s/sqrt(n) says ~2% (a straggler's
# rate is not visible in three steps), plus 2-6% of configuration-dependent offset the physics
# cannot know (how many nodes a straggler can hit). docs/tuner.md "Calibration" has the numbers.
NOISE_SD = 0.07

# The columns of each side's correction, in a fixed order (the fit's column order).
ROLLOUT_KNOBS_C = ("c:gr",) + calibrated("rollout") + ("c:partial", "m:preempt")
TRAINER_KNOBS_C = ("c:gt",) + calibrated("trainer")
SYNC_KNOBS_C = calibrated("sync") + ("c:gt", "c:gr")
PHASE_KNOBS = {
    p: {"rollout": ROLLOUT_KNOBS_C, "trainer": TRAINER_KNOBS_C, "sync": SYNC_KNOBS_C}[side] for p, side in SIDE.items()
}
ALL_KNOBS_C = tuple(
    kn
    for kn in dict.fromkeys(ROLLOUT_KNOBS_C + TRAINER_KNOBS_C + SYNC_KNOBS_C + ("async.partialRollout", "c:gpus"))
    if not kn.startswith("m:")
)
UNCALIBRATED_SD = 0.30  # relative uncertainty of the physics prior with no measurement at all
# Relative uncertainty a forecast gains when the calibration had only a step time (no phase times):
# the phase split is the physics' own, unmeasured, so every change it predicts is that much less
# certain. A round prior (docs/tuner.md "Calibrating on the step alone").
STEP_ONLY_SD = 0.15

# Relative uncertainty a forecast gains when the job's calibration is carried to another GPU type:
# the corrections measured here (how this framework and workload deviate from the physics) are
# assumed to hold there, and the physics' GPU-to-GPU ratio is what is left unmeasured. Prior, checked
# against the twin in tests/unit/test_pools.py (docs/tuner.md "Other GPU pools").
TRANSFER_SD = 0.12


def features(k: dict, gpus: int, gt: int, gr: int, preempt: float = 0.0) -> dict[str, float]:
    """A configuration (flat knobs, its GPU split) as the forecaster sees it: the catalog's feature
    encodings (ALL_FEATS), the knob values its corrections read, the derived quantities and the
    mechanism terms (`preempt`: the physics' RolloutPart.preempt_log)."""
    partial = physics.AsyncKnobs.of(k).streams
    eff = k | {"async.partialRollout": partial}
    enc = {f: fn(eff[kn.path]) for kn in CATALOG for f, fn in kn.features.items()}
    return (
        {"lgr": math.log2(max(gr, 1)), "lgt": math.log2(max(gt, 1))}
        | enc
        | {c: (k.get(c) if not c.startswith("c:") else None) for c in ALL_KNOBS_C}
        | {
            "c:gr": gr,
            "c:gt": gt,
            "c:gpus": gpus,
            "c:partial": partial,
            "m:preempt": preempt,
        }
    )


def step_variance(k: dict, phases: dict[str, float], rel_sd: dict[str, float]) -> float:
    """Variance (seconds^2) of the composed step from its calibrated phases' relative sds.

    Where the composition adds the phases (synchronous, colocated) it is the sum of their
    variances. Where one side overlaps the other (disaggregated with staleness >= 1) a side hidden
    behind the other barely moves the step, so each side counts by how much the step moves when
    that side moves by one sd: the secant of physics.compose through -1 and +1 sd (through a kink,
    where the sides balance, a secant counts the side that may become the longer one, which a
    derivative at the point would not)."""
    sds = {p: phases.get(p, 0.0) * rel_sd.get(p, 0.0) for p in rel_sd}
    kn = physics.Knobs.of(k)
    if not kn.overlapped:
        return sum(v * v for v in sds.values())
    var = 0.0
    for side in physics.STEP_SIDES:
        total = sum(phases.get(p, 0.0) for p in side)
        sd = math.sqrt(sum(sds.get(p, 0.0) ** 2 for p in side))
        if total <= 0.0 or sd <= 0.0:
            continue
        moved = []
        for sign in (-1.0, 1.0):
            f = max(0.0, 1.0 + sign * sd / total)
            moved.append(physics.compose(phases | {p: phases.get(p, 0.0) * f for p in side}, kn)[0])
        var += (0.5 * (moved[1] - moved[0])) ** 2
    return var


@dataclass
class Prediction:
    step: float  # seconds per step
    std: float  # seconds, one standard deviation
    phases: dict[str, float] = field(default_factory=dict)
    feasible: bool = True
    reason: str = ""
    gpus: int = 0
    trainer_mem_frac: float = 0.0
    rollout_free_frac: float = 0.0
    kv_pressure: float = 0.0
    p_fit: float = 1.0  # probability that it fits in memory (rltune.tuner.memfit)
    extrapolation: str = ""  # what the forecast rests on that no measurement has shown


class _BLR:
    """Bayesian linear regression of a log residual on knob-value indicators (see module doc)."""

    def __init__(
        self,
        rows: list[dict],
        y: np.ndarray,
        knobs: tuple,
        base: dict,
        sd: float,
        sd0: float,
        noise: "float | np.ndarray" = NOISE_SD,
    ):
        self.knobs, self.base = knobs, base
        # a mechanism term is one continuous column, present whether or not a row has shown it
        cols = [(kn, None) for kn in knobs if kn.startswith("m:")]
        for f in rows:
            for kn in knobs:
                v = f.get(kn)
                if not kn.startswith("m:") and v != base.get(kn) and (kn, v) not in cols:
                    cols.append((kn, v))
        self.cols = cols
        self.index = {c: i + 1 for i, c in enumerate(cols)}
        X = self._x(rows)
        self.sds = sds = sd if isinstance(sd, dict) else {}
        self.sd = sd if not isinstance(sd, dict) else PRIOR_SD
        prior = np.array([sd0**2] + [sds.get(c[0], self.sd) ** 2 for c in cols])
        prec = np.broadcast_to(1.0 / np.asarray(noise, dtype=float) ** 2, (len(rows),))
        A = (X.T * prec) @ X + np.diag(1.0 / prior)
        self.cov = np.linalg.inv(A)
        self.w = self.cov @ (X.T * prec) @ y

    def _x(self, rows: list[dict]) -> np.ndarray:
        X = np.zeros((len(rows), len(self.cols) + 1))
        X[:, 0] = 1.0
        for r, f in enumerate(rows):
            for kn in self.knobs:
                v = f.get(kn)
                if kn.startswith("m:"):
                    X[r, self.index[(kn, None)]] = float(v or 0.0)
                elif v != self.base.get(kn):
                    i = self.index.get((kn, v))
                    if i is not None:
                        X[r, i] = 1.0
        return X

    def predict(self, rows: list[dict]) -> tuple[np.ndarray, np.ndarray]:
        X = self._x(rows)
        mean = X @ self.w
        var = np.einsum("ij,jk,ik->i", X, self.cov, X)
        unseen = np.array(
            [
                sum(
                    self.sds.get(kn, self.sd) ** 2
                    for kn in self.knobs
                    if not kn.startswith("m:") and f.get(kn) != self.base.get(kn) and (kn, f.get(kn)) not in self.index
                )
                for f in rows
            ],
            dtype=float,
        )
        return mean, np.sqrt(var + unseen)


class Forecaster:
    """Physics forecaster of one job, calibrated on (config, summary) observations."""

    def __init__(
        self,
        spec: RLTuningJobSpec,
        observations: Iterable[tuple[RLConfig, TrialSummary]] = (),
        oom_failures: Iterable[tuple[RLConfig, str]] = (),
    ):
        self.spec = spec
        self.model = spec.workload.model.resolved()
        self.task = spec.workload.task
        self.gpu_type = spec.resources.gpu_type
        self.gpn = spec.resources.gpus_per_node
        self.budget = spec.resources.gpu_budget
        self.obs = [(c, s) for c, s in observations if s is not None and not s.failed and s.steps > 0]
        self.task = task_learning.measured_task(self.task, self.obs, spec.workload.framework, trainer_backend(spec))
        self.calibrated = bool(self.obs)
        self.absent: set[str] = set()
        self.additive: dict[str, float] = {}
        self.limits = physics.DEFAULT_LIMITS
        self.learned: dict[str, float] = {}  # task facts the spec left out, learned from measurements
        self.task = task_learning.tool_latency(self, spec, self.task)
        self.task = task_learning.trainer_memory(self, self.task)
        # a measurement with a step time but no phase times (a log that prints only the step, series
        # without phases): its phases are the physics' own split scaled to the measured step
        self.step_only = any(not s.has_phases for _, s in self.obs)
        self.obs = [(c, s if s.has_phases else self._scaled_phases(c, s)) for c, s in self.obs]
        # what ran proves it fits: widen the memory limits to every measured configuration
        lim = dict(
            trainer_max=physics.DEFAULT_LIMITS.trainer_max,
            rollout_min_free=physics.DEFAULT_LIMITS.rollout_min_free,
            colocated_max=physics.DEFAULT_LIMITS.colocated_max,
        )
        # (the memory fractions do not depend on the limits: one breakdown per measurement serves both)
        # (a configuration that ran but will run out of memory on a longer sequence is no proof of fit)
        oom_failures = list(oom_failures)
        short = [cfg.flat() for cfg, _ in oom_failures]
        fits = [self.raw(k) for k in (cfg.flat() for cfg, _ in self.obs) if k not in short]
        for bd in fits:
            lim["trainer_max"] = max(lim["trainer_max"], bd.trainer_mem_frac)
            lim["rollout_min_free"] = min(lim["rollout_min_free"], bd.rollout_free_frac)
            lim["colocated_max"] = max(lim["colocated_max"], bd.colocated_frac)
        self.limits = physics.MemLimits(**lim)
        self.memory = MemoryFit.learn(
            physics.DEFAULT_LIMITS,
            fits,
            [(_oom_side(reason), self.raw(cfg.flat())) for cfg, reason in oom_failures],
        )
        self.seen = {(kn, f.get(kn)) for cfg, _ in self.obs for f in [self._feats(cfg.flat())] for kn in ALL_KNOBS_C}
        self.transfer_sd = 0.0
        self._fit()

    def _scaled_phases(self, cfg: RLConfig, s: TrialSummary) -> TrialSummary:
        """`s` with the physics' phases of `cfg` scaled so that they compose to its measured step."""
        k = cfg.flat()
        bd = self.raw(k)
        step, _ = physics.compose(bd.phases, physics.Knobs.of(k)) if bd.feasible else (0.0, {})
        if step <= 0.0 or s.step_time <= 0.0:
            return s
        f = s.step_time / step
        return s.model_copy(update={"phases": {p: v * f for p, v in bd.phases.items()}})

    def on_pool(self, spec: RLTuningJobSpec) -> "Forecaster":
        """This job's forecaster carried to the GPUs of `spec` (rltune.api.models.pool_spec): the same
        fitted corrections over the other hardware's physics, the physics' own memory limits (what
        fits here says little about another HBM size) and TRANSFER_SD more uncertainty."""
        other = object.__new__(Forecaster)
        other.__dict__.update(self.__dict__)
        other.spec = spec
        other.gpu_type = spec.resources.gpu_type
        other.gpn = spec.resources.gpus_per_node
        other.budget = spec.resources.gpu_budget
        other.limits = physics.DEFAULT_LIMITS
        other.memory = MemoryFit.learn(physics.DEFAULT_LIMITS, [], [])
        other.transfer_sd = TRANSFER_SD
        return other

    def _feats(self, k: dict) -> dict:
        gpus, gt, gr = layout_of(k, self.budget, self.gpn).parts
        return features(k, gpus, gt, gr)

    # ------------------------------------------------------------------ physics
    def raw(self, k: dict) -> physics.Breakdown:
        return physics.breakdown(
            self.model, self.task, self.gpu_type, self.gpn, physics.Knobs.of(k), self.budget, self.limits
        )

    # ------------------------------------------------------------------ calibration
    def _fit(self) -> None:
        self.corrections: dict[str, _BLR] = {}  # calibrated quantity -> its log-ratio regression
        self.f_bulk = self.f_tail = 1.0
        self.eps: dict[str, float] = {}
        self.step_correction: Optional[_BLR] = None
        if not self.obs:
            return
        rows = []
        for cfg, s in self.obs:
            k = cfg.flat()
            bd = self.raw(k)
            if not bd.feasible:  # physics thinks it cannot run but it did: use a neutral prior
                continue
            gpus, gt, gr = layout_of(k, self.budget, self.gpn).parts
            rows.append((k, s, bd, features(k, gpus, gt, gr, bd.preempt_log)))
        if not rows:
            return
        # a trial's own step-to-step spread sets how far its means are trusted: a straggling node
        # in one of three steps moves that trial's mean by several percent
        noise = np.array(
            [
                math.hypot(NOISE_SD, s_.step_time_std / math.sqrt(max(s_.steps, 1)) / max(s_.step_time_mean, 1e-9))
                for _, s_, _, _ in rows
            ]
        )
        base_s = rows[0][1]
        base_f = rows[0][3]
        scale = max(base_s.step_time_mean, 1e-6)
        # Stage 1 for the rollout: the measured split into bulk and long tail of the configurations
        # without partial rollout (where the tail is a stable quantity) rescales the physics' bulk
        # and tail separately, so a knob that cuts the tail is credited with the tail actually seen.
        lb, lt = [], []
        for _k, s_, bd, f in rows:
            if f["c:partial"] or f["m:preempt"] > PREEMPT_SPLIT_MAX:
                continue  # (under preemption the split is the mechanism term's to explain)
            mb, mt = cal_value(s_.phases, "generation_bulk"), s_.phases.get("generation_tail", 0.0)
            pb, pt = cal_value(bd.phases, "generation_bulk"), bd.phases.get("generation_tail", 0.0)
            if mb > 0 and pb > 0 and mt > 0 and pt > 0:
                lb.append(math.log(mb / pb))
                lt.append(math.log(mt / pt))
        if lb:
            self.f_bulk, self.f_tail = math.exp(float(np.mean(lb))), math.exp(float(np.mean(lt)))
        for p in CAL_PHASES:
            meas = [cal_value(r[1].phases, p) for r in rows]
            pred = [self._raw_value(r[2].phases, p) for r in rows]
            if all(m < 1e-4 * scale for m in meas):
                self.absent.add(p)
                continue
            if all(x < 1e-4 * scale for x in pred):
                self.additive[p] = float(np.mean(meas))
                continue
            eps = 0.02 * max(max(meas), 1e-9)
            self.eps[p] = eps
            y = np.array([math.log((m + eps) / (x + eps)) for m, x in zip(meas, pred)])
            self.corrections[p] = _BLR(
                [r[3] for r in rows], y, PHASE_KNOBS[p], base_f, KNOB_SD.get(p, PRIOR_SD), INTERCEPT_SD, noise
            )
        # step-level residual of the composition
        ys, Xs = [], []
        for k, s, bd, f in rows:
            step, _ = self._compose_calibrated(k, bd, f)
            ys.append(math.log(s.step_time / max(step, 1e-9)))
            Xs.append(f)
        self.step_correction = _BLR(Xs, np.array(ys), ALL_KNOBS_C, base_f, STEP_PRIOR_SD, STEP_INTERCEPT_SD, noise)

    def _phase_factors(self, feats: list[dict]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        return {p: c.predict(feats) for p, c in self.corrections.items()}

    def calibrated_total(
        self, phases: tuple[str, ...], raws: list[dict[str, float]], feats: list[dict], z: float = 0.0
    ) -> np.ndarray:
        """Calibrated sum of `phases` for many configurations at once, from their physics values
        (`raws`, stage-1 rollout already applied) and features: the search ranks the rollout and
        trainer halves of a space with it before composing whole configurations. `z` > 0 gives the
        optimistic bound instead of the median: each phase's correction `z` sds below its mean, so a
        half whose knob values no trial has measured (the prior's wide sd) can rank by what it might be."""
        tot = np.zeros(len(raws))
        for p in phases:
            if p in self.absent:
                continue
            vals = np.array([r.get(p, 0.0) for r in raws])
            if p in self.additive:
                tot += self.additive[p]
            elif p in self.corrections:
                m, sd = self.corrections[p].predict(feats)
                e = self.eps.get(p, 0.0)
                tot += np.maximum(0.0, (vals + e) * np.exp(m - z * sd) - e)
            else:
                tot += vals
        return tot

    def gen_raw(self, bulk: float, tail: float) -> float:
        """Stage-1 rollout estimate from the physics' bulk and tail. The factors are measured on
        rollouts that drain a batch; a streaming (partial) rollout has no drain and keeps the
        physics' estimate until a streaming trial calibrates it (the c:partial correction)."""
        if tail <= 0.0:
            return bulk
        return self.f_bulk * bulk + self.f_tail * tail

    def _raw_value(self, phases: dict, p: str) -> float:
        if p == "generation":
            return self.gen_raw(cal_value(phases, "generation_bulk"), phases.get("generation_tail", 0.0))
        return cal_value(phases, p)

    def _apply(self, p: str, raw: float, logf: float) -> float:
        e = self.eps.get(p, 0.0)
        return max(0.0, (raw + e) * math.exp(logf) - e)

    def _compose_calibrated(self, k, bd, f, factors=None, i=0):
        phases = {}
        for p in CAL_PHASES:
            raw = self._raw_value(bd.phases, p)
            if p in self.absent:
                phases[p] = 0.0
            elif p in self.additive:
                phases[p] = self.additive[p]
            elif factors is not None and p in factors:
                phases[p] = self._apply(p, raw, factors[p][0][i])
            elif factors is None and p in self.corrections:
                m, _ = self.corrections[p].predict([f])
                phases[p] = self._apply(p, raw, m[0])
            else:
                phases[p] = raw
        raw_gen = self._raw_value(bd.phases, "generation")
        scale = phases["generation"] / raw_gen if raw_gen > 0 else 1.0
        # the parts of `generation` as its calibration scaled them (gen_raw): the tail by f_tail, the
        # rest of it (the tool time among it) by f_bulk; a rollout without a tail was not split
        tail = bd.phases.get("generation_tail", 0.0)
        f_tail, f_bulk = (self.f_tail, self.f_bulk) if tail > 0.0 else (1.0, 1.0)
        phases["generation_tail"] = tail * f_tail * scale
        phases["tool"] = bd.phases.get("tool", 0.0) * f_bulk * scale
        return physics.compose(phases, physics.Knobs.of(k))

    # ------------------------------------------------------------------ prediction
    def predict(self, cfg: RLConfig | dict) -> Prediction:
        return self.predict_many([cfg])[0]

    def predict_many(self, cfgs: list) -> list[Prediction]:
        ks = [c.flat() if isinstance(c, RLConfig) else c for c in cfgs]
        out: list[Optional[Prediction]] = [None] * len(ks)
        live, feats, bds = [], [], []
        for i, k in enumerate(ks):
            bd = self.raw(k)
            gpus, gt, gr = layout_of(k, self.budget, self.gpn).parts
            p_fit = 0.0
            if bd.feasible or bd.memory:
                fence = self.memory.fenced(bd)
                p_fit = 0.0 if fence else self.memory.p_fit(bd)
                if fence:
                    bd.feasible, bd.reason = False, fence
                elif p_fit >= P_FIT_MIN:
                    bd.feasible = True  # beyond the physics' limit is a risk, not a verdict
                elif bd.feasible:
                    bd.feasible, bd.reason = False, "beyond the memory limits trials have shown"
            if not bd.feasible:
                out[i] = Prediction(
                    math.inf,
                    math.inf,
                    {},
                    False,
                    bd.reason,
                    gpus,
                    bd.trainer_mem_frac,
                    bd.rollout_free_frac,
                    bd.kv_pressure,
                    p_fit=0.0,
                )
                continue
            live.append((i, k, gpus, p_fit))
            feats.append(features(k, gpus, gt, gr, bd.preempt_log))
            bds.append(bd)
        if not live:
            return out  # type: ignore[return-value]
        factors = self._phase_factors(feats) if self.corrections else {}
        if self.step_correction is not None:
            sm, ss = self.step_correction.predict(feats)
        for j, (i, k, gpus, p_fit) in enumerate(live):
            bd, f = bds[j], feats[j]
            step, phases = self._compose_calibrated(k, bd, f, factors, j)
            if self.calibrated and self.step_correction is not None:
                var = step_variance(k, phases, {p: s[j] for p, (_m, s) in factors.items()})
                step *= math.exp(sm[j])
                rel = math.sqrt(var) / max(step, 1e-9)
                std = step * math.sqrt(rel**2 + ss[j] ** 2)
            else:
                std = step * UNCALIBRATED_SD
            std = math.hypot(std, step * self.transfer_sd, step * (STEP_ONLY_SD if self.step_only else 0.0))
            out[i] = Prediction(
                step,
                std,
                phases,
                True,
                "",
                gpus,
                bd.trainer_mem_frac,
                bd.rollout_free_frac,
                bd.kv_pressure,
                p_fit,
                self.extrapolation(f, p_fit),
            )
        return out  # type: ignore[return-value]

    def extrapolation(self, f: dict, p_fit: float = 1.0) -> str:
        """What a forecast rests on that no measurement has shown: knob values never measured
        (their corrections are the prior's), a streaming rollout when none has been measured (what
        a draining baseline teaches does not carry over to a stream: docs/benchmark-history.md 'What the
        first streaming forecast misses'), and memory beyond what any trial proved."""
        if not self.obs:
            return "no measurement yet"
        new = [f"{kn}={f[kn]}" for kn in ALL_KNOBS_C if not kn.startswith("c:") and (kn, f.get(kn)) not in self.seen]
        if f.get("c:partial") and ("c:partial", True) not in self.seen:
            new.append("streaming rollout (partial rollout with staleness >= 1)")
        if p_fit < 1.0:
            # (a probability that rounds to 1 still says the fit is not proven)
            new.append(f"memory fit p={p_fit:.2f}" if p_fit < 0.995 else "memory fit p>0.99")
        return ", ".join(new)


def _oom_side(reason: str) -> str:
    r = (reason or "").lower()
    if "colocated" in r:
        return "colocated"
    if any(w in r for w in ("rollout", "vllm", "kv", "engine")):
        return "rollout"
    if any(w in r for w in ("trainer", "train", "optimizer", "activation", "megatron", "fsdp")):
        return "trainer"
    return "both"


def is_oom(reason: str, exit_code: Optional[int] = None) -> bool:
    r = (reason or "").lower()
    return (
        exit_code == 137
        or "out of memory" in r
        or "oom" in r.split()
        or "outofmemory" in r.replace(" ", "")
        or "out-of-memory" in r
    )
