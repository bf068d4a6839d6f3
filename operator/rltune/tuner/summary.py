"""Summaries of a trial's measured steps (what scoring and profiling see)."""

from __future__ import annotations

import math
import statistics

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from ..api.metrics import PHASES, StepRecord

ROBUST_MIN_STEPS = 3  # fewer steps have no middle that a single outlier cannot move


class TunerModel(BaseModel):
    """Base of the tuner's JSON models: camelCase on the wire (resource status), snake_case in Python;
    unknown fields are ignored so a newer status still loads after a downgrade."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    def dump(self) -> dict:
        return self.model_dump(by_alias=True, mode="json")


class TrialSummary(TunerModel):
    """Steady-state statistics of one trial's exported steps (JSON-serialisable)."""

    steps: int = Field(0, description="Steady-state (non-warm-up) steps measured.")
    total_steps: int = Field(0, description="All steps reported, warm-up included.")
    step_time_mean: float = Field(0.0, description="Mean seconds per steady-state step.")
    step_time_std: float = Field(0.0, description="Sample standard deviation of steady-state step time.")
    step_time_median: float = Field(0.0, description="Median seconds per steady-state step.")
    seconds_total: float = Field(
        0.0, description="Seconds of all reported steps, warm-up included: the step time the trial's GPUs spent."
    )
    phases: dict[str, float] = Field(default_factory=dict, description="Mean seconds per phase.")
    generated_tokens: float = Field(0.0, description="Mean tokens generated per step.")
    trained_tokens: float = Field(0.0, description="Mean tokens trained per step.")
    max_staleness: float = Field(0.0, description="Largest observed policy-version lag.")
    max_logprob_mismatch: float = 0.0
    mean_logprob_mismatch: float = 0.0
    kv_usage_max: float = 0.0
    kv_usage_mean: float = 0.0
    preemptions_mean: float = 0.0
    trainer_memory_max: float = Field(
        0.0, description="Largest peak trainer memory / GPU memory of any step, warm-up included (0: not measured)."
    )
    longest_sequence_max: float = Field(
        0.0, description="Tokens of the longest sequence any step trained, warm-up included (0: not measured)."
    )
    rewards: list[float] = Field(default_factory=list, description="Per-step mean reward (steady-state steps).")
    nan: bool = Field(False, description="A NaN/inf was reported in any scored value.")
    failed: bool = Field(False, description="No steady-state step was measured.")

    @property
    def step_time(self) -> float:
        """The step time a trial is scored by: its median steady step once ROBUST_MIN_STEPS were
        measured, else the mean. One step slowed by a straggling node moves a three-step mean by
        several percent, more than separates the best configurations; the median ignores it.
        (Summaries stored before the median existed fall back to the mean.)"""
        if self.steps >= ROBUST_MIN_STEPS and self.step_time_median > 0:
            return self.step_time_median
        return self.step_time_mean

    @property
    def has_phases(self) -> bool:
        """Whether any phase time was measured (a log or series may carry only the step time)."""
        return any(v > 0 for v in self.phases.values())

    @property
    def seconds_spent(self) -> float:
        """Step seconds the trial ran, warm-up included (what its GPUs were busy with). A first
        step that captures CUDA graphs or fills the pipeline is slower than a steady one, so steady
        mean x steps undercounts; summaries stored before seconds_total fall back to it."""
        if self.seconds_total > 0:
            return self.seconds_total
        return self.step_time_mean * self.total_steps


def _finite(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def summarize(steps: list[StepRecord]) -> TrialSummary:
    """Summarise steady-state steps. Warm-up steps are excluded; if every step is flagged warm-up,
    nothing is scored and `failed` is set."""
    steady = [s for s in steps if not s.warmup]
    nan = any(
        not _finite(v)
        for s in steps
        for v in [s.duration, s.reward, s.logprob_mismatch, s.staleness, *s.phases.values()]
    )
    spent = sum(s.duration for s in steps if _finite(s.duration) and s.duration > 0)
    if not steady:
        return TrialSummary(steps=0, total_steps=len(steps), seconds_total=spent, nan=nan, failed=True)
    n = len(steady)
    d = [s.duration for s in steady]
    mean = sum(d) / n
    std = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1)) if n > 1 else 0.0
    names = [p for p in PHASES] + sorted({k for s in steady for k in s.phases} - set(PHASES))
    phases = {}
    for p in names:
        vals = [s.phases.get(p, 0.0) for s in steady]
        if any(v for v in vals):
            phases[p] = sum(vals) / n
    mm = [s.logprob_mismatch for s in steady]
    kv = [s.kv_usage for s in steady]
    return TrialSummary(
        steps=n,
        total_steps=len(steps),
        step_time_mean=mean,
        step_time_std=std,
        step_time_median=statistics.median(d),
        seconds_total=spent,
        phases=phases,
        generated_tokens=sum(s.generated_tokens for s in steady) / n,
        trained_tokens=sum(s.trained_tokens for s in steady) / n,
        max_staleness=max(s.staleness for s in steps),
        max_logprob_mismatch=max(mm),
        mean_logprob_mismatch=sum(mm) / n,
        kv_usage_max=max(kv),
        kv_usage_mean=sum(kv) / n,
        preemptions_mean=sum(s.preemptions for s in steady) / n,
        trainer_memory_max=max((s.trainer_memory for s in steps if _finite(s.trainer_memory)), default=0.0),
        longest_sequence_max=max((s.longest_sequence for s in steps if _finite(s.longest_sequence)), default=0.0),
        rewards=[s.reward for s in steady],
        nan=nan,
        failed=False,
    )
