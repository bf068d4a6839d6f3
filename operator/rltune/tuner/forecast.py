"""The forecaster: physics prior (rltune.tuner.physics) + corrections learned from measurements.

Calibration. For every measured configuration (the baseline first, then each scored trial,
rejected ones included: their timing is real) and every work phase p, the log ratio
r_p = log(measured_p / physics_p) is a residual. A small Gaussian process per phase (squared-
exponential kernel over the knobs that phase depends on, in log2 units; constant mean fitted
by generalised least squares) predicts the residual of any configuration: near a measured one
the correction is that measurement's, far away it falls back to the average correction. The
composed step time gets one more GP residual over all knobs, which absorbs what the overlap
model gets wrong. Uncertainty is the GP posterior standard deviation, propagated through the
phase sum. Everything is re-fitted from the observation list each time (n <= a few dozen).

Memory. A configuration is infeasible when the physics memory model says so, or when it is at
least as memory-hungry as a configuration that failed with an out-of-memory error (learned OOM
fence: trainer-side, rollout-side, or both when the failure does not say which).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Optional

import numpy as np

from ..api.models import RLConfig, RLTuningJobSpec
from . import physics as P
from .summary import TrialSummary

ROLLOUT_FEATS = ("lgr", "rtp", "rep", "gmu", "mns", "mnbt", "graphs", "fp8", "stale", "partial")
TRAINER_FEATS = ("lgt", "ttp", "tpp", "tcp", "tep", "mbt", "rec", "off")
SYNC_FEATS = ("place", "ws_ce", "ws_disk", "rtp", "lgt", "lgr")
PHASE_FEATS = {
    "generation_bulk": ROLLOUT_FEATS, "generation_tail": ROLLOUT_FEATS,
    "old_logprob": TRAINER_FEATS, "ref_logprob": TRAINER_FEATS, "training": TRAINER_FEATS,
    "weight_sync": SYNC_FEATS,
}
# Calibrated quantities: the rollout is split into its bulk (generation minus the tail) and the
# long tail, which respond differently to the knobs; `generation` = bulk + tail.
CAL_PHASES = ("generation_bulk", "generation_tail", "old_logprob", "ref_logprob", "training", "weight_sync")


def cal_value(phases: dict, p: str) -> float:
    if p == "generation_bulk":
        return max(0.0, phases.get("generation", 0.0) - phases.get("generation_tail", 0.0))
    return phases.get(p, 0.0)


ALL_FEATS = tuple(dict.fromkeys(ROLLOUT_FEATS + TRAINER_FEATS + SYNC_FEATS))

PRIOR_SD = 0.25  # log-space prior deviation of a phase correction away from measured configs
STEP_PRIOR_SD = 0.06
LENGTH = 2.0  # kernel length scale in feature units (log2 of a knob, ~one doubling = 1)
NOISE_SD = 0.03  # measurement noise of a trial's phase means (log space)
UNCALIBRATED_SD = 0.30  # relative uncertainty of the physics prior with no measurement at all


def features(k: dict, gpus: int, gt: int, gr: int) -> dict[str, float]:
    rec = {"none": 0.0, "selective": 1.0, "full": 2.0}[k["trainer.recompute"]]
    return {
        "lgr": math.log2(max(gr, 1)), "lgt": math.log2(max(gt, 1)),
        "place": 2.0 if k["placement"] == "disaggregated" else 0.0,
        "rtp": math.log2(k["rollout.tp"]), "rep": 1.5 * bool(k["rollout.expertParallel"]),
        "gmu": 5.0 * k["rollout.gpuMemoryUtilization"], "mns": math.log2(k["rollout.maxNumSeqs"]),
        "mnbt": math.log2(k["rollout.maxNumBatchedTokens"]), "graphs": 2.0 * bool(k["rollout.cudaGraphs"]),
        "fp8": 2.0 * bool(k["rollout.fp8"]), "stale": 1.5 * k["async.staleness"],
        "partial": 2.0 * bool(k["async.partialRollout"] and k["async.staleness"] >= 1),
        "ttp": math.log2(k["trainer.tp"]), "tpp": math.log2(k["trainer.pp"]), "tcp": math.log2(k["trainer.cp"]),
        "tep": math.log2(k["trainer.ep"]), "mbt": math.log2(k["trainer.microBatchTokens"]), "rec": rec,
        "off": 2.0 * bool(k["trainer.offload"]),
        "ws_ce": 2.0 * (k["weightSync"] == "checkpoint-engine"), "ws_disk": 2.0 * (k["weightSync"] == "disk"),
    }


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


class _GP:
    """Zero-dimensional-noise SE-kernel GP with a GLS constant mean, on a fixed feature subset."""

    def __init__(self, X: np.ndarray, y: np.ndarray, sd: float, noise: float = NOISE_SD, length: float = LENGTH):
        self.X, self.sd, self.length = X, sd, length
        n = len(y)
        K = self._k(X, X) + (noise ** 2 + 1e-9) * np.eye(n)
        self.L = np.linalg.cholesky(K)
        ones = np.ones(n)
        Ki1 = self._solve(ones)
        self.mu = float(ones @ self._solve(y) / (ones @ Ki1))
        self.alpha = self._solve(y - self.mu)
        self.Ki1 = Ki1
        self.denom = float(ones @ Ki1)

    def _solve(self, b):
        return np.linalg.solve(self.L.T, np.linalg.solve(self.L, b))

    def _k(self, A, B):
        d2 = ((A[:, None, :] - B[None, :, :]) ** 2).sum(-1)
        return self.sd ** 2 * np.exp(-0.5 * d2 / self.length ** 2)

    def predict(self, Xs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ks = self._k(Xs, self.X)
        mean = self.mu + ks @ self.alpha
        v = np.linalg.solve(self.L, ks.T)
        var = self.sd ** 2 - (v * v).sum(0)
        # uncertainty of the fitted constant mean
        u = 1.0 - ks @ self.Ki1
        var = var + u * u / self.denom
        return mean, np.sqrt(np.maximum(var, 1e-8))


class Forecaster:
    """Physics forecaster of one job, calibrated on (config, summary) observations."""

    def __init__(self, spec: RLTuningJobSpec, observations: Iterable[tuple[RLConfig, TrialSummary]] = (),
                 oom_failures: Iterable[tuple[RLConfig, str]] = ()):
        self.spec = spec
        self.model = spec.workload.model.resolved()
        self.task = spec.workload.task
        self.gpu_type = spec.resources.gpu_type
        self.gpn = spec.resources.gpus_per_node
        self.budget = spec.resources.gpu_budget
        self.obs = [(c, s) for c, s in observations if s is not None and not s.failed and s.steps > 0]
        self.calibrated = bool(self.obs)
        self.absent: set[str] = set()
        self.additive: dict[str, float] = {}
        self._fences: list[tuple[str, float, float]] = []
        for cfg, reason in oom_failures:
            bd = self.raw(cfg.flat())
            side = _oom_side(reason)
            self._fences.append((side, bd.trainer_mem_frac, bd.rollout_free_frac))
        self._fit()

    # ------------------------------------------------------------------ physics
    def raw(self, k: dict) -> P.Breakdown:
        return P.breakdown(self.model, self.task, self.gpu_type, self.gpn, k, self.budget)

    def _fenced(self, bd: P.Breakdown) -> Optional[str]:
        for side, tm, rf in self._fences:
            t_hit = bd.trainer_mem_frac >= tm - 1e-9
            r_hit = bd.rollout_free_frac <= rf + 1e-9
            if (side == "trainer" and t_hit) or (side == "rollout" and r_hit) or (side == "both" and t_hit and r_hit):
                return f"at least as memory-hungry as a configuration that ran out of memory ({side})"
        return None

    # ------------------------------------------------------------------ calibration
    def _fit(self) -> None:
        self.gps: dict[str, _GP] = {}
        self.eps: dict[str, float] = {}
        self.step_gp: Optional[_GP] = None
        if not self.obs:
            return
        rows = []
        for cfg, s in self.obs:
            k = cfg.flat()
            bd = self.raw(k)
            if not bd.feasible:  # physics thinks it cannot run but it did: use a neutral prior
                continue
            gpus, gt, gr = P.split(k, self.budget, self.gpn)
            rows.append((k, s, bd, features(k, gpus, gt, gr)))
        if not rows:
            return
        base_s = rows[0][1]
        scale = max(base_s.step_time_mean, 1e-6)
        for p in CAL_PHASES:
            meas = [cal_value(r[1].phases, p) for r in rows]
            pred = [cal_value(r[2].phases, p) for r in rows]
            if all(m < 1e-4 * scale for m in meas):
                self.absent.add(p)
                continue
            if all(x < 1e-4 * scale for x in pred):
                self.additive[p] = float(np.mean(meas))
                continue
            eps = 0.02 * max(max(meas), 1e-9)
            self.eps[p] = eps
            y = np.array([math.log((m + eps) / (x + eps)) for m, x in zip(meas, pred)])
            X = np.array([[r[3][f] for f in PHASE_FEATS[p]] for r in rows])
            self.gps[p] = _GP(X, y, PRIOR_SD)
        # step-level residual of the composition
        ys, Xs = [], []
        for k, s, bd, f in rows:
            step, _ = self._compose_calibrated(k, bd, f)
            ys.append(math.log(s.step_time_mean / max(step, 1e-9)))
            Xs.append([f[x] for x in ALL_FEATS])
        self.step_gp = _GP(np.array(Xs), np.array(ys), STEP_PRIOR_SD, length=LENGTH * 1.5)

    def _phase_factors(self, feats: list[dict]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        out = {}
        for p, gp in self.gps.items():
            X = np.array([[f[x] for x in PHASE_FEATS[p]] for f in feats])
            out[p] = gp.predict(X)
        return out

    def _apply(self, p: str, raw: float, logf: float) -> float:
        e = self.eps.get(p, 0.0)
        return max(0.0, (raw + e) * math.exp(logf) - e)

    def _compose_calibrated(self, k, bd, f, factors=None, i=0):
        phases = {}
        for p in CAL_PHASES:
            raw = cal_value(bd.phases, p)
            if p in self.absent:
                phases[p] = 0.0
            elif p in self.additive:
                phases[p] = self.additive[p]
            elif factors is not None and p in factors:
                phases[p] = self._apply(p, raw, factors[p][0][i])
            elif factors is None and p in self.gps:
                m, _ = self.gps[p].predict(np.array([[f[x] for x in PHASE_FEATS[p]]]))
                phases[p] = self._apply(p, raw, m[0])
            else:
                phases[p] = raw
        bulk = phases.pop("generation_bulk")
        phases["generation"] = bulk + phases["generation_tail"]
        raw_bulk = cal_value(bd.phases, "generation_bulk")
        phases["tool"] = bd.phases.get("tool", 0.0) * (bulk / raw_bulk if raw_bulk > 0 else 1.0)
        return P.compose(phases, k)

    # ------------------------------------------------------------------ prediction
    def predict(self, cfg: RLConfig | dict) -> Prediction:
        return self.predict_many([cfg])[0]

    def predict_many(self, cfgs: list) -> list[Prediction]:
        ks = [c.flat() if isinstance(c, RLConfig) else c for c in cfgs]
        out: list[Optional[Prediction]] = [None] * len(ks)
        live, feats, bds = [], [], []
        for i, k in enumerate(ks):
            bd = self.raw(k)
            gpus, gt, gr = P.split(k, self.budget, self.gpn)
            if bd.feasible:
                fence = self._fenced(bd)
                if fence:
                    bd.feasible, bd.reason = False, fence
            if not bd.feasible:
                out[i] = Prediction(math.inf, math.inf, {}, False, bd.reason, gpus, bd.trainer_mem_frac,
                                    bd.rollout_free_frac, bd.kv_pressure)
                continue
            live.append((i, k, gpus))
            feats.append(features(k, gpus, gt, gr))
            bds.append(bd)
        if not live:
            return out  # type: ignore[return-value]
        factors = self._phase_factors(feats) if self.gps else {}
        if self.step_gp is not None:
            sm, ss = self.step_gp.predict(np.array([[f[x] for x in ALL_FEATS] for f in feats]))
        for j, (i, k, gpus) in enumerate(live):
            bd, f = bds[j], feats[j]
            step, phases = self._compose_calibrated(k, bd, f, factors, j)
            if self.calibrated and self.step_gp is not None:
                var = 0.0
                for p, (m, s) in factors.items():
                    v = phases.get(p, 0.0) if p != "generation_bulk" else phases["generation"] - phases["generation_tail"]
                    var += (v * s[j]) ** 2
                step *= math.exp(sm[j])
                rel = math.sqrt(var) / max(step, 1e-9)
                std = step * math.sqrt(rel ** 2 + ss[j] ** 2)
            else:
                std = step * UNCALIBRATED_SD
            out[i] = Prediction(step, std, phases, True, "", gpus, bd.trainer_mem_frac, bd.rollout_free_frac,
                                bd.kv_pressure)
        return out  # type: ignore[return-value]


def _oom_side(reason: str) -> str:
    r = (reason or "").lower()
    if any(w in r for w in ("rollout", "vllm", "kv", "engine")):
        return "rollout"
    if any(w in r for w in ("trainer", "train", "optimizer", "activation", "megatron", "fsdp")):
        return "trainer"
    return "both"


def is_oom(reason: str, exit_code: Optional[int] = None) -> bool:
    r = (reason or "").lower()
    return exit_code == 137 or "out of memory" in r or "oom" in r.split() or "outofmemory" in r.replace(" ", "") \
        or "out-of-memory" in r
