"""Proposing: which configurations the next trials run (the role of an Optuna sampler).

The Proposer enumerates the space once per Tuner (search.candidates with the job's forecaster),
values each candidate by its expected improvement over the incumbent, weighted by the chances it
passes the quality gates and fits in memory, and picks a diverse batch within the free GPUs.
`rltune plan`'s forecast-only ranking is `rank`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import numpy as np

from ..api.layout import layout_of
from . import physics
from .forecast import ALL_FEATS, Prediction, features
from .records import config_changes
from .search import Candidate, candidates, expected_improvement, noisy_trial_value
from .values import Proposal

if TYPE_CHECKING:  # the Tuner owns its Proposer; only the annotation names it
    from .core import Tuner


class Proposer:
    """The Tuner's proposals: candidates, their value, `propose` and `rank`."""

    def __init__(self, tuner: "Tuner"):
        self.tuner = tuner
        self._cands: dict = {}  # exclude -> the candidates of the whole space (gpus_max filters them)

    def candidates(self, exclude=None, gpus_max: Optional[int] = None) -> list[Candidate]:
        """The search's candidates, their objective sd rescaled by uncertainty_scale(). The space is
        enumerated once per Tuner (`done` and `propose` of one tick share it): the candidates within
        `gpus_max` GPUs are the whole space's that use no more (a context's halves do not depend on
        which other contexts are enumerated)."""
        if exclude not in self._cands:
            cands = candidates(self.tuner.space, self.tuner.forecaster, exclude=exclude, deadline=self.tuner.deadline)
            s = self.tuner.uncertainty_scale()
            for c in cands:
                c.objective_std *= s
            self._cands[exclude] = cands
        cands = self._cands[exclude]
        return list(cands) if gpus_max is None else [c for c in cands if c.k["gpus"] <= gpus_max]

    @property
    def truncated(self) -> Optional[str]:
        """Why the search's enumeration stopped short of the space this tick (None: it did not)."""
        return (
            "; ".join(self.tuner.deadline.truncated)
            if self.tuner.deadline is not None and self.tuner.deadline.truncated
            else None
        )

    def p_pass(self, k: dict) -> float:
        """Prior probability that a configuration passes the quality gates. Knobs that change the
        numerics (FP8 rollout) or the policy lag (staleness, partial rollout) carry a risk until a
        trial with at least that setting has passed; banned settings are excluded elsewhere."""
        passed = self.tuner._passed
        p = 1.0
        if k["rollout.fp8"] and not any(c["rollout.fp8"] for c in passed):
            p *= 0.5
        st = k["async.staleness"]
        if st >= 1 and not any(c["async.staleness"] >= st for c in passed):
            p *= 0.85
        if physics.AsyncKnobs.of(k).streams and not any(
            physics.AsyncKnobs.of(c).streams for c in passed
        ):  # a drained one says nothing
            p *= 0.9
        return p

    def expected_value(self, cands: list[Candidate]) -> np.ndarray:
        """What running each candidate is worth, in objective units summed over the planned run:
        the expected improvement its trial can bring (noisy_trial_value), weighted by the chances
        it passes the gates and fits in memory, times budget.plannedSteps, minus what its own trial
        costs (its forecast objective for trial_steps() steps: stepsPerTrial and the measured warm-up)."""
        b = self.tuner.spec.budget
        ei = self.constrained_ei(self.tuner.incumbent(), noisy_trial_value(cands, self.tuner.measurement_sd()))
        return ei * b.planned_steps - np.array([c.objective for c in cands]) * self.tuner.trial_steps()

    def constrained_ei(self, inc: float, cands: list[Candidate]) -> np.ndarray:
        """Expected improvement that counts only if the candidate passes the quality gates and
        fits in memory: EI x p_pass x p_fit (what propose ranks by and done weighs)."""
        return expected_improvement(inc, cands) * np.array([self.p_pass(c.k) * c.p_fit for c in cands])

    def _base_pred(self) -> Prediction:
        return self.tuner.forecaster.predict(self.tuner.baseline.config)

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
        prof = self.tuner.profile()
        if best == "rollout-throughput" and prof is not None and prof.bottleneck == "kv-bound":
            best = "kv-bound"
        parts = [f"{g} {b[g]:.0f}->{a[g]:.0f}s" for g in a if abs(gains[g]) > 0.02 * max(sum(b.values()), 1e-9)]
        return best, ("forecast " + ", ".join(parts)) if parts else "forecast: small changes"

    def rank(self, limit: int = 20, gpus_free: Optional[int] = None, exclude_tried: bool = True) -> list[Proposal]:
        """Forecast-only ranking of the space (used by `rltune plan`)."""
        cands = self.candidates(exclude=self.tuner.excluded if exclude_tried else None, gpus_max=gpus_free)
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
        config = self.tuner.space.config(c.k)
        ch = {k: list(v) for k, v in config_changes(self.tuner.baseline.config, config, self.tuner.budget).items()}
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
        cands = self.candidates(exclude=self.tuner.excluded, gpus_max=gpus_free)
        if not cands:
            return []
        inc = self.tuner.incumbent()
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
                    [
                        [features(c.k, *layout_of(c.k, self.tuner.budget, self.tuner.gpn).parts)[x] for x in ALL_FEATS]
                        for c in cands
                    ]
                )
            d2 = ((F - F[i]) ** 2).sum(1)
            pen = 1.0 - np.exp(-0.5 * d2 / 1.0)
            if inc is None:
                acq = np.where(pen < 1e-6, -np.inf, acq - (1.0 - pen) * np.abs(acq) * 0.5)
            else:
                acq = acq * pen
            acq[i] = -np.inf
        return out
