"""A winner's confirmation run in the benchmarks, on the twin's quality path (bench.run's
JobTrials.confirms, bench.gate_rates): the baseline's summary as the status keeps it, the lifecycle's looks
judged by the quality gates, and trials of one configuration built from the twin's quality model.

Twin trials through the quality path: simulate_trial costs 0.3-0.8 s per trial on these jobs (the
rollout of every step is simulated), too slow for thousands of pairs on one core. A trial's reward,
log-prob mismatch and staleness come from the twin's `_quality(plan, step, lag, rng)`; the speed
simulation only supplies the lag (0 on every benchmark baseline: colocated, synchronous) and the
step times (irrelevant to the gates). So trials are built from the noiseless steps of the plan plus
`_quality` with the same per-step generator simulate_trial seeds (np.random.default_rng([seed,
step])); the noise draws differ from simulate_trial's (whose generator first feeds the rollout)
but have the same distribution. bench.gate_rates' `--check` (on by default) verifies the path: for every job the
noiseless records equal simulate_trial(noise=False) exactly.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from bench.oracle import job_plan
from rltune import twin
from rltune.api.metrics import StepRecord
from rltune.api.models import RLTuningJobSpec, trial_spec_for
from rltune.tuner import gates as quality_gates
from rltune.tuner import records, summarize
from rltune.twin.simulate import _quality, simulate_one_step


@dataclass(frozen=True)
class Confirmation:
    """A pick's confirmation run in the benchmark: passed or not, and the steps it ran (fewer than
    budget.confirmSteps when the interim look confirmed it)."""

    passed: bool
    steps: int


def stored_summary(summary):
    """A baseline's summary as the resource status keeps it and the tuner reads it back (rounded,
    per-step rewards kept): what every confirmation is judged against."""
    return records.unflatten_summary(records.flatten_summary(summary, keep_rewards=True))


def confirmation_run(recs: list[StepRecord], base, spec: RLTuningJobSpec) -> Confirmation:
    """A winner's confirmation as the lifecycle judges it: at each of gates.confirmation_looks the
    steps so far go through gates.evaluate (non-inferiority under rewardGate nonInferiority, at the
    look's level); the first look that passes confirms it after that look's steps, none rejects it
    after the full run."""
    b, c = spec.budget, spec.constraints
    ni = c.reward_gate == "nonInferiority"
    for look in quality_gates.confirmation_looks(b, c):
        if quality_gates.passed(
            quality_gates.evaluate(summarize(recs[: look.steps]), base, c, confirmation=ni, alpha=look.alpha)
        ):
            return Confirmation(True, look.steps)
    return Confirmation(False, len(recs))


class QualityTrials:
    """Trials of one configuration through the twin's quality path (module docstring)."""

    def __init__(self, spec: RLTuningJobSpec, cfg, steps: int, warmup: int):
        self.spec, self.cfg, self.steps, self.warmup = spec, cfg, steps, warmup
        self.plan = job_plan(spec, cfg)
        warm = simulate_one_step(self.plan, None, warmup=True)
        steady = simulate_one_step(self.plan, None, warmup=False)
        self.template = []
        for i in range(steps):
            r = warm if i == 0 else steady
            self.template.append(
                StepRecord(
                    step=i,
                    duration=r.duration,
                    phases=dict(r.phases),
                    generated_tokens=r.generated,
                    trained_tokens=r.trained,
                    staleness=r.staleness,
                    kv_usage=r.kv_usage,
                    preemptions=r.preemptions,
                    warmup=i < warmup,
                )
            )
        self.noiseless = self.trial(None)
        scored = [s for s in self.noiseless if not s.warmup]
        self.mu_reward = sum(s.reward for s in scored) / len(scored)
        self.mu_mismatch = sum(s.logprob_mismatch for s in scored) / len(scored)

    def trial(self, seed: Optional[int], lag_penalty: Optional[float] = None) -> list[StepRecord]:
        """One trial's records (seed None: noiseless). `lag_penalty`: learn as if each step of lag
        stretched the learning curve by this much instead of the twin's Efficiency.lag_penalty (the same
        noise draws; only reward_tau is rescaled for the steps that lag)."""
        out = []
        for t in self.template:
            rng = None if seed is None else np.random.default_rng([seed, t.step])
            plan = self.plan
            if lag_penalty is not None and t.staleness > 0:
                f = plan.eff.fp8_tau_stretch if plan.cfg.rollout.fp8 else 0.0
                scale = (1.0 + lag_penalty * t.staleness + f) / (1.0 + plan.eff.lag_penalty * t.staleness + f)
                plan = dataclasses.replace(
                    plan, eff=dataclasses.replace(plan.eff, reward_tau=plan.eff.reward_tau * scale)
                )
            reward, mismatch = _quality(plan, t.step, t.staleness, rng)
            s = copy.copy(t)
            s.phases = dict(t.phases)
            s.reward, s.logprob_mismatch = reward, mismatch
            out.append(s)
        return out

    def check(self, name: str) -> None:
        """The quality path's noiseless records equal simulate_trial(noise=False)'s."""
        ts = trial_spec_for("bench", name, "check", self.spec, self.cfg, self.steps, self.warmup, seed=0)
        ref = twin.simulate_trial(ts, noise=False)
        for a, b in zip(ref, self.noiseless, strict=True):
            for f in ("reward", "logprob_mismatch", "staleness", "duration", "warmup"):
                va, vb = getattr(a, f), getattr(b, f)
                if not (va == vb or (isinstance(va, float) and math.isclose(va, vb, rel_tol=1e-9, abs_tol=1e-12))):
                    raise SystemExit(
                        f"{name}: quality path differs from simulate_trial at step {a.step} {f}: {va} != {vb}"
                    )
