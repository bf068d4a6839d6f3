"""The RLTuningJob status, as pydantic models (the CRD's status schema is generated from these).

The operator keeps ALL of a job's tuning state here (and in the trial pods), so a restarted
operator continues where the last one stopped. Everything the operator writes is declared, because
the API server's structural pruning silently drops undeclared fields.

The status stays bounded: at most `budget.maxTrials` (<= 200) search trials plus the baseline and a
few confirmation runs, each a compact record (configuration as the knobs that differ from the
baseline, a flat numeric summary), well under the 1 MiB etcd object limit (tests/unit/test_crd.py
checks the size at 200 trials).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal, Optional

from pydantic import Field

from .models import CamelModel


class Phase(StrEnum):
    """Where a tuning job is. The one vocabulary of the status, the lifecycle and the local loop."""

    PENDING = "Pending"
    VALIDATING = "Validating"
    PROFILING = "Profiling"
    SEARCHING = "Searching"
    CONFIRMING = "Confirming"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"

    @property
    def is_terminal(self) -> bool:
        return self in (Phase.SUCCEEDED, Phase.FAILED)


class TrialState(StrEnum):
    """Where a trial is. Active: Pending (recorded, pods being created), Running (pods placed),
    Scoring (rank 0 finished, waiting for its metrics). Terminal: the rest."""

    PENDING = "Pending"
    RUNNING = "Running"
    SCORING = "Scoring"
    SUCCEEDED = "Succeeded"
    REJECTED = "Rejected"  # measured, but failed a quality gate or the constraints
    FAILED = "Failed"
    UNSCHEDULABLE = "Unschedulable"
    METRICS_UNAVAILABLE = "MetricsUnavailable"
    TIMED_OUT = "TimedOut"
    STOPPED = "Stopped"  # early-stopped or torn down by the job
    PREEMPTED = "Preempted"  # evicted by Kueue (or preempted): retried once with the same configuration

    @property
    def is_active(self) -> bool:
        return self in (TrialState.PENDING, TrialState.RUNNING, TrialState.SCORING)

    @property
    def is_terminal(self) -> bool:
        return not self.is_active

    @property
    def is_failure(self) -> bool:
        """Counts against budget.maxFailedTrials (a rejected trial measured fine: not a failure)."""
        return self in (
            TrialState.FAILED,
            TrialState.UNSCHEDULABLE,
            TrialState.METRICS_UNAVAILABLE,
            TrialState.TIMED_OUT,
        )


class FailureCause(StrEnum):
    """Why a trial failed, as data (never parsed back out of a message)."""

    OUT_OF_MEMORY = "OutOfMemory"
    CRASHED = "Crashed"
    UNSCHEDULABLE = "Unschedulable"
    NO_MATCHING_NODES = "NoMatchingNodes"
    POD_REJECTED = "PodRejected"
    TIMED_OUT = "TimedOut"
    METRICS_UNAVAILABLE = "MetricsUnavailable"
    NO_STEADY_STATE = "NoSteadyState"
    PREEMPTED = "Preempted"  # not the configuration's failure: Kueue evicted or preempted its pods


PHASES = tuple(Phase)
ACTIVE_STATES = tuple(s for s in TrialState if s.is_active)


class Condition(CamelModel):
    """A metav1.Condition."""

    type: str = Field(description="Condition type: SpecValid, Progressing, Complete or Failed.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(description="One CamelCase word: why the condition is in this state.")
    message: str = Field("", description="Human-readable detail.")
    last_transition_time: str = Field(description="When the status last changed (RFC 3339).")
    observed_generation: Optional[int] = Field(
        None, ge=0, description="metadata.generation the condition was computed for."
    )


class BaselineStatus(CamelModel):
    """What profiling the user's current configuration measured."""

    state: TrialState = Field(TrialState.PENDING, description="State of the baseline trial.")
    step_seconds: Optional[float] = Field(None, description="Mean measured seconds per RL step (warm-up excluded).")
    gpu_seconds_per_step: Optional[float] = Field(None, description="GPUs x seconds per step.")
    gpus: Optional[int] = Field(None, description="GPUs the baseline uses.")
    breakdown: Optional[dict[str, float]] = Field(
        None, description="Mean seconds per step phase (generation, training, weight_sync, ...)."
    )
    bottleneck: Optional[str] = Field(None, description="The phase or resource that limits the step.")
    evidence: Optional[list[str]] = Field(
        None, max_length=16, description="Short measured facts behind the bottleneck verdict."
    )
    reason: Optional[str] = Field(None, description="Why the baseline failed, if it did.")


# Every id tuner/lifecycle/ makes: baseline, t<n> (search), c<n> (confirm), p<n> (pool), each once
# with -retry (a preempted trial's re-run). Trial ids become object names and label values
# (`<job>-<trial>`): the CRD holds the status to these.
TRIAL_ID_PATTERN = r"^(baseline|[tcp][1-9][0-9]{0,4})(-retry)?$"


class TrialStatus(CamelModel):
    """One trial, compact: its configuration is stored as the knobs that differ from the baseline."""

    id: str = Field(
        pattern=TRIAL_ID_PATTERN,
        description="Trial id (baseline, t1, t2, ..., c1 for confirmation runs, p1 for pool trials, <id>-retry for "
        "the re-run of a preempted trial); part of the names and labels of its objects.",
    )
    kind: Literal["baseline", "search", "confirm", "pool"] = Field(
        "search", description="Why the trial ran (pool: the winner's cheapest forecast on another GPU pool)."
    )
    of: Optional[str] = Field(None, description="Confirmation runs: the id of the trial being confirmed.")
    pool: Optional[str] = Field(None, description="Pool trials: the spec.resources.pools entry it ran in.")
    config: dict[str, Any] = Field(
        default_factory=dict,
        description="Knob path -> value for every knob that differs from the baseline (empty = the baseline).",
    )
    gpus: int = Field(0, ge=0, description="GPUs the configuration uses.")
    steps: int = Field(0, ge=0, description="RL steps the trial runs (warm-up included).")
    predicted_seconds: Optional[float] = Field(None, description="Forecast seconds per step before the trial ran.")
    predicted_std: Optional[float] = Field(None, description="Forecast standard deviation, seconds.")
    measured_seconds: Optional[float] = Field(None, description="Measured mean seconds per step (warm-up excluded).")
    objective: Optional[float] = Field(None, description="Measured objective value (seconds or GPU-seconds per step).")
    state: TrialState = Field(
        TrialState.PENDING, description="Pending, Running, Scoring, Succeeded, Rejected, Failed, ..."
    )
    reason: Optional[str] = Field(None, description="Why the trial ended as it did (failure reason, failed gate).")
    cause: Optional[FailureCause] = Field(None, description="Why a failed trial failed, as one word.")
    gates: Optional[dict[str, bool]] = Field(None, description="Quality gate name -> passed.")
    summary: Optional[dict[str, float]] = Field(
        None, description="Flat numeric summary of the measured steps (the tuner's TrialSummary)."
    )
    created_at: Optional[str] = Field(None, description="When the operator recorded the trial (RFC 3339).")
    started_at: Optional[str] = Field(None, description="When all of its pods were first seen scheduled (RFC 3339).")
    finished_at: Optional[str] = Field(None, description="When its rank-0 pod finished or it was torn down (RFC 3339).")
    retry_of: Optional[str] = Field(
        None, description="A re-run of a preempted trial: that trial's id (same configuration; retried once)."
    )
    queue: Optional[str] = Field(None, description="Kueue: the LocalQueue the trial waited in for admission.")
    admitted_at: Optional[str] = Field(
        None,
        description="Kueue: when its pods were first seen admitted (scheduleTimeoutSeconds counts from then).",
    )

    @property
    def superseded(self) -> bool:
        """A preempted first attempt: its retry stands in for it (not counted against the budget)."""
        return self.state == TrialState.PREEMPTED and self.retry_of is None


class BestStatus(CamelModel):
    """The winning configuration."""

    trial: str = Field(description="Id of the winning trial.")
    config: dict[str, Any] = Field(default_factory=dict, description="Knob path -> value changed from the baseline.")
    step_seconds: float = Field(description="Measured seconds per RL step (the confirmation run, when there is one).")
    speedup: float = Field(description="Baseline step time / best step time.")
    gpus: int = Field(description="GPUs the winning configuration uses.")
    gpu_seconds_per_step: float = Field(description="GPUs x seconds per step.")
    confirmed: bool = Field(False, description="Whether a longer confirmation run reproduced the result.")
    overrides: list[str] = Field(
        default_factory=list, description="The winning knobs rendered as key=value overrides for the framework."
    )
    command: Optional[list[str]] = Field(
        None,
        description="verl/OpenRLHF: the full command to run the winner (its mode's entry point and every "
        "override, the user's own included).",
    )
    mode: Optional[str] = Field(None, description="verl/OpenRLHF: the framework mode the winner runs in.")


class TuningCostStatus(CamelModel):
    """What the tuning cost against what its pick saves over budget.plannedSteps (rltune.tuner.payback)."""

    trial_gpu_hours: float = Field(
        description="GPU-hours of every trial's steps, warm-up included (search, confirmation and pool "
        "trials; not the baseline's profile, nor pod start-up), in this pool's GPUs: a trial in another "
        "pool counts at its price (its GPU-hours x its pricePerGpuHour / resources.pricePerGpuHour)."
    )
    pool_trial_gpu_hours: Optional[float] = Field(
        None, description="GPU-hours the trials in other pools ran there, on their own GPUs (absent: none ran)."
    )
    saved_gpu_hours: float = Field(
        description="GPU-hours the winner saves over budget.plannedSteps against the baseline (0 when none)."
    )
    planned_steps: int = Field(description="budget.plannedSteps the saving is counted over.")
    share: Optional[float] = Field(None, description="trialGpuHours / savedGpuHours (absent when nothing is saved).")
    payback_steps: Optional[float] = Field(
        None, description="Steps of the planned run after which the winner has saved what the trials cost."
    )


class PoolOfferStatus(CamelModel):
    """Another GPU pool against the winner here, in cost per step (spec.resources.pools)."""

    pool: str = Field(description="The pool's name in spec.resources.pools.")
    gpu_type: str = Field(description="The pool's GPU type.")
    config: dict[str, Any] = Field(
        default_factory=dict, description="Knob path -> value of its cheapest forecast configuration (vs the baseline)."
    )
    gpus: int = Field(description="GPUs that configuration uses there.")
    forecast_seconds: float = Field(description="Forecast seconds per step there (before its trial ran).")
    forecast_cost_per_step: float = Field(description="Forecast cost per step there, at its price.")
    home_cost_per_step: float = Field(description="Measured cost per step of the winner in this pool.")
    trial: Optional[str] = Field(None, description="The trial that measured it there (none: not worth a trial).")
    measured_seconds: Optional[float] = Field(None, description="Measured seconds per step there.")
    measured_cost_per_step: Optional[float] = Field(None, description="Measured cost per step there.")
    saving: Optional[float] = Field(
        None, description="Measured share of the cost per step saved by moving (negative: dearer)."
    )
    cost_to_planned_steps: Optional[float] = Field(
        None, description="Measured cost per step there x budget.plannedSteps (the production run's cost)."
    )
    recommended: bool = Field(False, description="Measured cheaper there: moving is recommended.")
    message: str = Field("", description="The verdict in one line.")


class DroppedKnob(CamelModel):
    """A knob the job's framework cannot express: pinned to the baseline, never searched."""

    knob: str = Field(description="Canonical knob path, e.g. async.staleFraction.")
    reason: str = Field(description="Why the framework cannot run it.")


class NarrowedKnob(CamelModel):
    """A knob whose default range rltune thinned to keep the search within its bounds."""

    knob: str = Field(description="Canonical knob path, e.g. rollout.gpuMemoryUtilization.")
    left_out: list[str] = Field(description="The default values not searched (list them in spec.searchSpace to).")


class RLTuningJobStatus(CamelModel):
    observed_generation: Optional[int] = Field(None, description="metadata.generation the operator last acted on.")
    phase: Phase = Field(
        Phase.PENDING, description="Pending, Validating, Profiling, Searching, Confirming, Succeeded or Failed."
    )
    message: Optional[str] = Field(None, description="One line on what the job is doing or how it ended.")
    conditions: list[Condition] = Field(default_factory=list, description="metav1.Conditions of the job.")
    baseline: Optional[BaselineStatus] = Field(None, description="The measured baseline profile.")
    trials: list[TrialStatus] = Field(
        default_factory=list, max_length=512, description="Every trial, compact, in order."
    )
    best: Optional[BestStatus] = Field(None, description="The winning configuration, once there is one.")
    forecast_error: Optional[float] = Field(
        None, description="Median relative error of the step-time forecasts of finished trials."
    )
    framework: Optional[str] = Field(
        None, description="verl/OpenRLHF: the adapter used: framework, the version it was checked against, backend."
    )
    tuning_cost: Optional[TuningCostStatus] = Field(
        None, description="GPU-hours the trials used against what the winner saves; set when the job concludes."
    )
    pool_offer: Optional[PoolOfferStatus] = Field(
        None, description="spec.resources.pools: the cheapest other pool for the winner, forecast and measured."
    )
    dropped_knobs: Optional[list[DroppedKnob]] = Field(
        None, description="Knobs the framework cannot express (pinned to the baseline), with the reason."
    )
    narrowed_knobs: Optional[list[NarrowedKnob]] = Field(
        None,
        description="Knobs whose default ranges were thinned to keep the search space within the operator's "
        "bounds (a job of many GPUs), with the values left out.",
    )
    trials_done: str = Field("0/0", description="Finished search trials / budget.maxTrials, e.g. 5/12.")
    trials_failed: int = Field(0, ge=0, description="Search trials that failed (not merely rejected).")
    speedup: Optional[str] = Field(None, description="Best speed-up over the baseline, for display, e.g. 2.31x.")
    next_trial: int = Field(1, ge=1, description="Sequence number of the next trial id.")
    started_at: Optional[str] = Field(None, description="When the operator first acted on the job (RFC 3339).")
    completed_at: Optional[str] = Field(None, description="When the job reached Succeeded or Failed (RFC 3339).")
