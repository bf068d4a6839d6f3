"""The Tuner: propose, judge, stop. Pure, and reconstructable from (spec, baseline, history).

The operator stores the baseline TrialRecord and the list of trial TrialRecords in the resource
status (JSON) and rebuilds a Tuner from them on every reconcile; the forecaster re-fits its
corrections each time (a few small Bayesian linear regressions: milliseconds).
"""

from __future__ import annotations

import math
import statistics
from typing import Optional

import numpy as np
from pydantic import Field

from ..api.metrics import StepRecord
from ..api.models import RLConfig, RLTuningJobSpec
from ..api.status import FailureCause, TrialState
from . import gates as quality_gates
from . import headroom, physics
from .forecast import ALL_FEATS, NOISE_SD, Forecaster, Prediction, features
from .profile import Profile, profile
from .records import config_changes, objective_of
from .search import Candidate, Deadline, Space, candidates, expected_improvement, explicit, flat_key, noisy_trial_value
from .summary import ROBUST_MIN_STEPS, TrialSummary, TunerModel, summarize

TERMINAL = tuple(s for s in TrialState if s.is_terminal)

MIN_TRIALS_BEFORE_GAIN_STOP = 3
# A running trial is stopped once its measured steps put it this many standard deviations of step
# noise (at least NOISE_SD per step) beyond the incumbent: after one step, ~16% slower.
EARLY_STOP_Z = 2.0
# The forecaster's stated sd is rescaled by its realized errors on this job (uncertainty_scale).
SCALE_RANGE = (0.3, 3.0)


class TrialRecord(TunerModel):
    """One trial (or the baseline) as the tuner remembers it. JSON-serialisable (status.trials[])."""

    id: str
    config: RLConfig
    gpus: int = Field(0, description="GPUs the configuration uses.")
    predicted: Optional[float] = Field(None, description="Forecast seconds per step when proposed.")
    predicted_std: Optional[float] = Field(None, description="Forecast standard deviation, seconds.")
    summary: Optional[TrialSummary] = None
    objective: Optional[float] = Field(None, description="Measured objective (seconds or GPU-seconds per step).")
    state: TrialState = TrialState.PENDING
    reason: str = ""
    gates: dict[str, quality_gates.GateResult] = Field(default_factory=dict, description="Quality gate -> verdict.")
    cause: Optional[FailureCause] = Field(None, description="Why a failed trial failed.")
    bottleneck: Optional[str] = Field(None, description="Bottleneck the proposal addressed.")
    rationale: Optional[str] = None

    @property
    def step_time(self) -> Optional[float]:
        return self.summary.step_time if self.summary and not self.summary.failed else None


class Proposal(TunerModel):
    config: RLConfig
    gpus: int
    predicted: float = Field(description="Forecast seconds per step.")
    std: float = Field(description="Forecast standard deviation, seconds.")
    predicted_objective: float
    changes: dict[str, list] = Field(default_factory=dict, description="Knob path -> [baseline, proposed].")
    bottleneck: str = Field(description="Bottleneck this configuration addresses.")
    rationale: str = ""
    acquisition: float = 0.0
    fit_probability: float = Field(1.0, description="Probability that it fits in memory (memfit).")
    extrapolation: str = Field("", description="What the forecast rests on that no trial has measured.")

    @property
    def predicted_std(self) -> float:
        return self.std


def baseline_record(spec: RLTuningJobSpec, summary: Optional[TrialSummary] = None, id: str = "baseline") -> TrialRecord:
    """The baseline as a TrialRecord; pass the measured summary once the baseline trial ran."""
    cfg = explicit(spec.baseline, spec.resources.gpu_budget, spec.resources.gpus_per_node)
    rec = TrialRecord(id=id, config=cfg, gpus=spec.layout().gpus, state=TrialState.PENDING)
    if summary is not None:
        rec = Tuner(spec, rec, []).judge(rec, summary)
    return rec


def trial_noise_sd(per_step: float, steps: int) -> float:
    """Relative sd of a trial's scored step time over `steps` steady steps of per-step relative sd
    `per_step`: x sqrt(pi/2) when it is scored by the median (summary.ROBUST_MIN_STEPS)."""
    n = max(1, steps)
    return per_step * math.sqrt((math.pi / 2 if n >= ROBUST_MIN_STEPS else 1.0) / n)


class Tuner:
    def __init__(
        self,
        spec: RLTuningJobSpec,
        baseline: TrialRecord,
        history: list[TrialRecord],
        deadline: Optional[Deadline] = None,
    ):
        """`deadline`: the time budget of the caller's tick (search.Deadline; None: none). The search's
        enumeration stops when it passes (`truncated`), and `done` then never ends the search."""
        self.spec = spec
        self.deadline = deadline
        self._cands: dict = {}  # exclude -> the candidates of the whole space (gpus_max filters them)
        self.baseline = baseline
        self.history = list(history)
        self.budget = spec.resources.gpu_budget
        self.gpn = spec.resources.gpus_per_node
        self.space = Space(spec)
        self._obs: list[TrialRecord] = []  # the measurements the forecaster calibrates on
        if baseline.summary is not None and not baseline.summary.failed:
            self._obs.append(baseline)
        for r in self.history:
            if (
                r.summary is not None
                and not r.summary.failed
                and not r.summary.nan  # a NaN/inf step time (stored as -1) would poison the forecaster's fit
                and r.summary.step_time_mean > 0
                and r.state in (TrialState.SUCCEEDED, TrialState.REJECTED, TrialState.STOPPED)
            ):
                self._obs.append(r)
        # out of memory, or forecast to be on the run's longest sequence (the memory gate)
        self._ooms = [(r.config, r.reason) for r in self.history if r.cause == FailureCause.OUT_OF_MEMORY] + [
            (r.config, r.gates["memory"].detail)
            for r in self.history
            if r.state == TrialState.REJECTED and "memory" in r.gates and not r.gates["memory"].passed
        ]
        self.forecaster = Forecaster(spec, [(r.config, r.summary) for r in self._obs], self._ooms)
        self.tried = {flat_key(r.config.flat(), self.budget, self.gpn) for r in self.history}
        self.tried.add(flat_key(baseline.config.flat(), self.budget, self.gpn))
        self.bans = self._bans()
        self._profile: Optional[Profile] = None
        # configurations that passed the gates (p_pass reads them once per candidate)
        self._passed = [r.config.flat() for r in [baseline] + self.history if r.state == TrialState.SUCCEEDED]

    # ------------------------------------------------------------------ helpers
    def objective_of(self, step: float, gpus: int) -> float:
        return objective_of(self.spec, step, gpus)

    def profile(self) -> Optional[Profile]:
        if self._profile is None and self.baseline.summary is not None and not self.baseline.summary.failed:
            self._profile = profile(self.spec, self.baseline.summary)
        return self._profile

    def _bans(self) -> list[tuple[str, callable]]:
        """Quality risks learned from rejected trials: knob settings that broke a gate."""
        bans = []
        for r in self.history:
            if r.state != TrialState.REJECTED:
                continue
            k = r.config.flat()
            bad = quality_gates.failed_gates(r.gates)
            st, fp8, part = k["async.staleness"], k["rollout.fp8"], k["async.partialRollout"]
            if ("mismatch" in bad or "nan" in bad) and fp8:
                bans.append((f"fp8 rollout broke {'/'.join(bad)} in {r.id}", lambda c: c["rollout.fp8"]))
            elif ("mismatch" in bad or "staleness" in bad or "reward" in bad) and st >= 1:
                bans.append(
                    (f"staleness >= {st} broke {'/'.join(bad)} in {r.id}", lambda c, st=st: c["async.staleness"] >= st)
                )
            if "reward" in bad and part:
                bans.append((f"partial rollout broke reward in {r.id}", lambda c: c["async.partialRollout"]))
            if "reward" in bad and fp8:
                bans.append((f"fp8 rollout broke reward in {r.id}", lambda c: c["rollout.fp8"]))
        return bans

    def p_pass(self, k: dict) -> float:
        """Prior probability that a configuration passes the quality gates. Knobs that change the
        numerics (FP8 rollout) or the policy lag (staleness, partial rollout) carry a risk until a
        trial with at least that setting has passed; banned settings are excluded elsewhere."""
        passed = self._passed
        p = 1.0
        if k["rollout.fp8"] and not any(c["rollout.fp8"] for c in passed):
            p *= 0.5
        st = k["async.staleness"]
        if st >= 1 and not any(c["async.staleness"] >= st for c in passed):
            p *= 0.85
        if physics.streams(k) and not any(physics.streams(c) for c in passed):  # a drained one says nothing
            p *= 0.9
        return p

    def _excluded(self, k: dict) -> bool:
        if flat_key(k, self.budget, self.gpn) in self.tried:
            return True
        return any(f(k) for _, f in self.bans)

    def incumbent(self) -> Optional[float]:
        vals = [
            r.objective
            for r in [self.baseline] + self.history
            if r.state == TrialState.SUCCEEDED and r.objective is not None
        ]
        return min(vals) if vals else None

    def uncertainty_scale(self) -> float:
        """How the forecaster's stated sd compares with its realized errors on this job: the root
        mean squared z-score of the trials it forecast, shrunk towards 1 by one pseudo-trial.
        The search multiplies the sd by it: a forecaster that has been right explores less, one
        that has missed explores more (the stated sd is the physics prior's, ~30% per unmeasured
        knob value, while the measured error is often a few percent). A trial's measured mean
        misses the truth by its own noise too (trial_noise_sd), which noisy_trial_value adds
        separately, so its expected square is taken out of each squared error: otherwise, where
        the forecaster is within a trial's noise, the scale would count that noise twice and the
        search would value re-drawing it."""
        per_step = self.step_noise_sd()
        z2 = [
            ((r.summary.step_time - r.predicted) ** 2 - (trial_noise_sd(per_step, r.summary.steps) * r.predicted) ** 2)
            / r.predicted_std**2
            for r in self.forecast_trials()
            if r.predicted_std and r.predicted_std > 0
        ]
        s = math.sqrt(max(0.0, (1.0 + sum(z2)) / (1.0 + len(z2))))
        return min(max(s, SCALE_RANGE[0]), SCALE_RANGE[1])

    def _candidates(self, exclude=None, gpus_max: Optional[int] = None) -> list[Candidate]:
        """The search's candidates, their objective sd rescaled by uncertainty_scale(). The space is
        enumerated once per Tuner (`done` and `propose` of one tick share it): the candidates within
        `gpus_max` GPUs are the whole space's that use no more (a context's halves do not depend on
        which other contexts are enumerated)."""
        if exclude not in self._cands:
            cands = candidates(self.space, self.forecaster, exclude=exclude, deadline=self.deadline)
            s = self.uncertainty_scale()
            for c in cands:
                c.objective_std *= s
            self._cands[exclude] = cands
        cands = self._cands[exclude]
        return list(cands) if gpus_max is None else [c for c in cands if c.k["gpus"] <= gpus_max]

    @property
    def truncated(self) -> Optional[str]:
        """Why the search's enumeration stopped short of the space this tick (None: it did not)."""
        return "; ".join(self.deadline.truncated) if self.deadline is not None and self.deadline.truncated else None

    def expected_value(self, cands: list[Candidate]) -> np.ndarray:
        """What running each candidate is worth, in objective units summed over the planned run:
        the expected improvement its trial can bring (noisy_trial_value), weighted by the chances
        it passes the gates and fits in memory, times budget.plannedSteps, minus what its own trial
        costs (its forecast objective for trial_steps() steps: stepsPerTrial and the measured warm-up)."""
        b = self.spec.budget
        ei = self.constrained_ei(self.incumbent(), noisy_trial_value(cands, self.measurement_sd()))
        return ei * b.planned_steps - np.array([c.objective for c in cands]) * self.trial_steps()

    def measurement_sd(self) -> float:
        """Relative standard deviation of one trial's scored objective on this job: step_noise_sd()
        over the steady steps a trial scores (trial_noise_sd)."""
        b = self.spec.budget
        return trial_noise_sd(self.step_noise_sd(), max(1, b.steps_per_trial - b.warmup_steps))

    def step_noise_sd(self) -> float:
        """Relative standard deviation of one steady step on this job: the per-step spread of the
        steady steps measured so far (variances pooled over every measured trial, with NOISE_SD as
        one prior trial of stepsPerTrial steps)."""
        b = self.spec.budget
        n = max(1, b.steps_per_trial - b.warmup_steps)
        prior_df = float(max(1, n - 1))  # one prior trial's degrees of freedom
        df, ss = prior_df, prior_df * NOISE_SD**2
        for r in [self.baseline] + self.history:
            s = r.summary
            if s is not None and not s.failed and not s.nan and s.steps >= 2 and s.step_time_mean > 0:
                df += s.steps - 1
                ss += (s.steps - 1) * (s.step_time_std / s.step_time_mean) ** 2
        return math.sqrt(ss / df)

    def trial_steps(self) -> float:
        """What one trial costs, in steady steps: budget.stepsPerTrial plus how much longer than a
        steady step its warm-up runs (CUDA-graph capture, a slower first training pass, an empty
        pipeline), the median over the trials measured so far; stepsPerTrial before any."""
        extra = [
            s.seconds_total / s.step_time_mean - s.total_steps
            for r in [self.baseline] + self.history
            for s in [r.summary]
            if s is not None and not s.failed and s.seconds_total > 0 and s.step_time_mean > 0
        ]
        return self.spec.budget.steps_per_trial + (max(0.0, statistics.median(extra)) if extra else 0.0)

    def constrained_ei(self, inc: float, cands: list[Candidate]) -> np.ndarray:
        """Expected improvement that counts only if the candidate passes the quality gates and
        fits in memory: EI x p_pass x p_fit (what propose ranks by and done weighs)."""
        return expected_improvement(inc, cands) * np.array([self.p_pass(c.k) * c.p_fit for c in cands])

    def _base_pred(self) -> Prediction:
        return self.forecaster.predict(self.baseline.config)

    def _addresses(self, k: dict, phases: dict, base_phases: dict) -> tuple[str, str]:
        """The bottleneck a candidate addresses: the phase group its forecast shrinks most."""

        def grp(ph):
            gen = ph.get("generation", 0.0)
            tail = ph.get("generation_tail", 0.0)
            return {
                "rollout-long-tail": tail,
                "rollout-throughput": gen - tail,
                "trainer-bound": ph.get("training", 0.0) + ph.get("old_logprob", 0.0) + ph.get("ref_logprob", 0.0),
                "weight-sync-bound": ph.get("weight_sync", 0.0),
                "imbalance": ph.get("waiting", 0.0) + ph.get("rollout_idle", 0.0),
            }

        a, b = grp(phases), grp(base_phases)
        gains = {g: b[g] - a[g] for g in a}
        best = max(gains, key=gains.get) if gains else "rollout-throughput"
        prof = self.profile()
        if best == "rollout-throughput" and prof is not None and prof.bottleneck == "kv-bound":
            best = "kv-bound"
        parts = [f"{g} {b[g]:.0f}->{a[g]:.0f}s" for g in a if abs(gains[g]) > 0.02 * max(sum(b.values()), 1e-9)]
        return best, ("forecast " + ", ".join(parts)) if parts else "forecast: small changes"

    # ------------------------------------------------------------------ the API
    def rank(self, limit: int = 20, gpus_free: Optional[int] = None, exclude_tried: bool = True) -> list[Proposal]:
        """Forecast-only ranking of the space (used by `rltune plan`)."""
        cands = self._candidates(exclude=self._excluded if exclude_tried else None, gpus_max=gpus_free)
        cands.sort(key=lambda c: c.objective)
        # list distinct alternatives: skip near-duplicates (within 1% and one knob value apart)
        picked: list[Candidate] = []
        for c in cands:
            if len(picked) >= limit:
                break
            if any(
                abs(c.objective - q.objective) <= 0.01 * q.objective
                and sum(1 for kk in c.k if c.k[kk] != q.k.get(kk)) <= 1
                for q in picked
            ):
                continue
            picked.append(c)
        return [self._proposal(c, 0.0) for c in picked]

    def _proposal(self, c: Candidate, acq: float) -> Proposal:
        bp = self._base_pred()
        bneck, why = self._addresses(c.k, c.phases, bp.phases if bp.feasible else {})
        config = self.space.config(c.k)
        ch = {k: list(v) for k, v in config_changes(self.baseline.config, config, self.budget).items()}
        return Proposal(
            config=config,
            gpus=c.gpus,
            predicted=c.step,
            std=c.std,
            predicted_objective=c.objective,
            changes=ch,
            bottleneck=bneck,
            rationale=why,
            acquisition=acq,
            fit_probability=round(c.p_fit, 3),
            extrapolation=c.extrapolation,
        )

    def propose(self, n: int, gpus_free: int) -> list[Proposal]:
        """Up to n new configurations, none tried before, together within gpus_free GPUs (running
        trials never hold more than the budget); ranked by expected improvement over the
        incumbent, picked with local penalisation for diversity."""
        if n <= 0:
            return []
        cands = self._candidates(exclude=self._excluded, gpus_max=gpus_free)
        if not cands:
            return []
        inc = self.incumbent()
        if inc is None:  # no measurement yet: best forecast first
            acq = -np.array([c.objective for c in cands])
        else:
            acq = self.constrained_ei(inc, cands)
        F = None
        out: list[Proposal] = []
        acq = acq.astype(float).copy()
        gpus = np.array([c.gpus for c in cands])
        free = gpus_free
        for _ in range(min(n, len(cands))):
            acq = np.where(gpus > free, -np.inf, acq)
            i = int(np.argmax(acq))
            if not np.isfinite(acq[i]) or acq[i] == -np.inf:
                break
            out.append(self._proposal(cands[i], float(acq[i])))
            free -= int(gpus[i])
            if F is None:
                F = np.array(
                    [[features(c.k, *physics.split(c.k, self.budget, self.gpn))[x] for x in ALL_FEATS] for c in cands]
                )
            d2 = ((F - F[i]) ** 2).sum(1)
            pen = 1.0 - np.exp(-0.5 * d2 / 1.0)
            if inc is None:
                acq = np.where(pen < 1e-6, -np.inf, acq - (1.0 - pen) * np.abs(acq) * 0.5)
            else:
                acq = acq * pen
            acq[i] = -np.inf
        return out

    def judge(
        self, record: TrialRecord, summary: TrialSummary, confirmation: bool = False, alpha: Optional[float] = None
    ) -> TrialRecord:
        """Score a finished trial: objective and quality gates -> succeeded or rejected.
        `confirmation`: the winner's confirmation run (reward judged by non-inferiority); `alpha`: the
        reward test's level at this look of it (gates.confirmation_looks)."""
        rec = record.model_copy(deep=True)
        rec.summary = summary
        is_base = record.id == self.baseline.id
        base_sum = None if is_base else self.baseline.summary
        rec.gates = quality_gates.evaluate(
            summary, base_sum, self.spec.constraints, confirmation=confirmation, alpha=alpha
        )
        if not is_base and "steps" in rec.gates and rec.gates["steps"].passed:
            rec.gates["memory"] = headroom.gate(self.spec, rec.config, summary)
        if rec.gpus == 0:
            rec.gpus = self.spec.layout(rec.config).gpus
        if summary.failed or summary.steps == 0:
            rec.state, rec.objective = TrialState.FAILED, None
            rec.reason = rec.reason or "no steady-state step was measured"
            return rec
        rec.objective = self.objective_of(summary.step_time, rec.gpus)
        if quality_gates.passed(rec.gates):
            rec.state = TrialState.SUCCEEDED
            if not rec.reason:
                b = self.baseline.objective
                rec.reason = f"{summary.step_time:.1f} s/step" + (
                    f", {b / rec.objective:.2f}x baseline" if b and not is_base else ""
                )
        else:
            rec.state = TrialState.REJECTED
            bad = quality_gates.failed_gates(rec.gates)
            rec.reason = "quality gate failed: " + "; ".join(str(rec.gates[g]) for g in bad)
        return rec

    def early_stop(self, partial_steps: list[StepRecord], gpus: Optional[int] = None) -> bool:
        """True when a running trial cannot plausibly beat the incumbent: even EARLY_STOP_Z sd of
        step noise below its measured mean it is slower. Its steps still calibrate the forecaster."""
        inc = self.incumbent()
        if inc is None:
            return False
        s = summarize(partial_steps)
        if s.failed or s.steps < 1:
            return False
        g = gpus or self.budget
        rel = max(NOISE_SD, s.step_time_std / s.step_time_mean if s.steps >= 2 and s.step_time_mean > 0 else 0.0)
        lo = s.step_time * (1.0 - EARLY_STOP_Z * rel / math.sqrt(s.steps))
        return self.objective_of(lo, g) > inc

    def done(self) -> tuple[bool, str]:
        trials = [r for r in self.history if r.id != self.baseline.id]
        finished = [r for r in trials if r.state in TERMINAL]
        failed = [r for r in trials if r.state.is_failure]
        if self.baseline.state in (TrialState.FAILED, TrialState.UNSCHEDULABLE, TrialState.REJECTED):
            return True, f"baseline {self.baseline.state}: {self.baseline.reason}"
        if len(failed) >= self.spec.budget.max_failed_trials:
            return True, f"{len(failed)} trials failed (budget.maxFailedTrials {self.spec.budget.max_failed_trials})"
        if len(trials) >= self.spec.budget.max_trials:
            return True, f"trial budget spent ({len(trials)}/{self.spec.budget.max_trials})"
        running = [r for r in trials if r.state.is_active]
        if running:
            return False, f"{len(running)} trials running"
        cands = self._candidates(exclude=self._excluded)
        if self.truncated:  # only part of the space was weighed: it says nothing of the rest
            return False, f"search truncated: {self.truncated}"
        if not cands:
            return True, "search space exhausted"
        inc = self.incumbent()
        if inc is not None and len(finished) >= MIN_TRIALS_BEFORE_GAIN_STOP:
            val = self.expected_value(cands)
            i = int(np.argmax(val))
            if val[i] <= 0.0:
                b = self.spec.budget
                cost = cands[i].objective * self.trial_steps()
                return True, (
                    f"no trial pays for itself: the best expected saving over budget.plannedSteps "
                    f"{b.planned_steps} ({float(val[i]) + cost:.0f}) is below the cost of its own "
                    f"{b.steps_per_trial}-step trial ({cost:.0f}, objective units, its warm-up as measured); "
                    f"a trial measures to +-{self.measurement_sd():.1%} here, more steady steps per trial "
                    f"would measure finer"
                )
        return False, "searching"

    def _succeeded(self) -> list[TrialRecord]:
        """The records a pick chooses from: the baseline and every trial that passed, with an objective."""
        recs = [self.baseline] + self.history
        return [r for r in recs if r.state == TrialState.SUCCEEDED and r.objective is not None]

    def best(self) -> Optional[TrialRecord]:
        """The succeeded record with the lowest objective (the baseline if nothing beat it)."""
        ok = self._succeeded()
        return min(ok, key=lambda r: r.objective) if ok else None

    def best_estimate(self) -> Optional[TrialRecord]:
        """The succeeded record with the lowest *estimated* objective (shrunk_objectives): among
        near-tied layouts the lowest of several noisy measurements is biased low (the winner's
        curse), so each measurement is weighed against what the other trials forecast for it."""
        ok = self._succeeded()
        if len(ok) < 2:
            return ok[0] if ok else None
        est = self.shrunk_objectives(ok)
        return min(ok, key=lambda r: est[r.id])

    def shrunk_objectives(self, recs: list[TrialRecord]) -> dict[str, float]:
        """Record id -> the precision-weighted mean of its measured objective (relative sd
        measurement_sd()) and the forecast for its configuration calibrated on every *other*
        measurement (sd as the search states it, x uncertainty_scale()): the posterior mean of a
        normal prior and a normal measurement. A record the others cannot forecast keeps its measurement."""
        sd_m, scale = self.measurement_sd(), self.uncertainty_scale()
        out = {}
        for r in recs:
            others = [(o.config, o.summary) for o in self._obs if o.id != r.id]
            fc = Forecaster(self.spec, others, self._ooms)
            p = fc.predict(r.config)
            if not fc.calibrated or not p.feasible or not p.std > 0:
                out[r.id] = r.objective
                continue
            f = self.objective_of(p.step, r.gpus)
            var_f = (self.objective_of(p.std, r.gpus) * scale) ** 2
            var_m = (sd_m * r.objective) ** 2
            out[r.id] = (r.objective * var_f + f * var_m) / (var_f + var_m)
        return out

    def speedup(self, rec: TrialRecord) -> Optional[float]:
        if rec.objective and self.baseline.objective:
            return self.baseline.objective / rec.objective
        return None

    def forecast_trials(self) -> list[TrialRecord]:
        """The trials the forecast error is measured on: forecast before they ran, then measured
        (not the baseline, which calibrates the forecaster). Early-stopped trials count: their
        steps are measurements like any other, only fewer."""
        return [
            r
            for r in self.history
            if r.id != self.baseline.id
            and r.predicted
            and r.summary is not None
            and not r.summary.failed
            and r.summary.steps > 0
            and r.state in (TrialState.SUCCEEDED, TrialState.REJECTED, TrialState.STOPPED)
        ]

    def forecast_error(self) -> Optional[float]:
        """Median |predicted - measured| / measured step time over forecast_trials()."""
        errs = [abs(r.predicted - r.summary.step_time) / r.summary.step_time for r in self.forecast_trials()]
        return statistics.median(errs) if errs else None

    def record_for(self, trial_id: str, p: Proposal) -> TrialRecord:
        """A pending TrialRecord for a proposal."""
        return TrialRecord(
            id=trial_id,
            config=p.config,
            gpus=p.gpus,
            predicted=p.predicted,
            predicted_std=p.std,
            state=TrialState.PENDING,
            bottleneck=p.bottleneck,
            rationale=p.rationale,
        )
