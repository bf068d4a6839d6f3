"""The Tuner: what one job's tuning knows, and its four roles. Pure, and reconstructable from
(spec, baseline, history).

As Optuna splits a study's roles, the Tuner holds the state (the baseline, the trials, the
forecaster calibrated on them) and the judging of a finished trial; `proposer` (proposing.py)
chooses the next trials, `pruner` (pruning.py) stops a losing one, `terminator` (terminating.py)
says when the search is over and counts its budget, and `picker` (picking.py) chooses what to
deploy. The operator stores the baseline and the trials in the resource status (JSON) and rebuilds
a Tuner from them on every reconcile; the forecaster re-fits its corrections each time (a few
small Bayesian linear regressions: milliseconds).
"""

from __future__ import annotations

import math
import statistics
from typing import Optional

from ..api.models import RLTuningJobSpec
from ..api.status import FailureCause, TrialState
from . import gates as quality_gates
from . import headroom
from .forecast import NOISE_SD, Forecaster
from .picking import Picker
from .profile import Profile, profile
from .proposing import Proposer
from .pruning import Pruner
from .records import objective_of
from .search import Deadline, Space, explicit, flat_key
from .summary import ROBUST_MIN_STEPS, TrialSummary
from .terminating import Terminator
from .values import TERMINAL, Proposal, TrialRecord

# The forecaster's stated sd is rescaled by its realized errors on this job (uncertainty_scale).
SCALE_RANGE = (0.3, 3.0)

__all__ = ["TERMINAL", "Proposal", "TrialRecord", "Tuner", "baseline_record", "trial_noise_sd"]


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
        self.proposer, self.pruner = Proposer(self), Pruner(self)
        self.terminator, self.picker = Terminator(self), Picker(self)

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

    def excluded(self, k: dict) -> bool:
        """Tried already, or banned by a quality gate a trial broke."""
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

    # ------------------------------------------------------------------ the API
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
