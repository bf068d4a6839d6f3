"""Trial bookkeeping: a trial recorded Pending, a trial finished, every active one torn down."""

from __future__ import annotations

from typing import Optional

from ...api.models import RLConfig
from ...api.status import FailureCause, TrialState, TrialStatus
from .. import records
from .conditions import now_iso
from .context import StepContext


def add_trial(
    ctx,
    trial_id: str,
    kind: str,
    config: RLConfig,
    steps: int,
    predicted=None,
    predicted_std=None,
    of: Optional[str] = None,
    pool: Optional[str] = None,
) -> TrialStatus:
    t = TrialStatus(
        id=trial_id,
        kind=kind,
        of=of,
        pool=pool,
        config=records.config_diff(ctx.spec.baseline, config),  # type: ignore[arg-type]
        gpus=records.gpus_of(ctx.spec, config),
        steps=steps,
        predicted_seconds=None if predicted is None else round(float(predicted), 4),
        predicted_std=None if predicted_std is None else round(float(predicted_std), 4),
        state=TrialState.PENDING,
        created_at=now_iso(ctx.now),
    )
    ctx.status.trials.append(t)
    ctx.decisions.started.append(trial_id)
    changed = ", ".join(f"{k}={v}" for k, v in sorted(t.config.items())) or "the baseline configuration"
    pred = f", forecast {t.predicted_seconds:.1f}s/step" if t.predicted_seconds else ""
    ctx.info("TrialStarted", f"trial {trial_id} ({kind}, {t.gpus} GPUs, {steps} steps): {changed}{pred}", trial_id)
    ctx.forget_tuner()
    return t


def finish(
    ctx: StepContext, t: TrialStatus, state: TrialState, reason: str, cause: Optional[FailureCause] = None
) -> None:
    t.state = state
    t.reason = reason[:300] if reason else t.reason
    t.cause = cause if cause is not None else t.cause
    t.finished_at = t.finished_at or now_iso(ctx.now)
    ctx.decisions.teardown.append(t.id)
    ctx.decisions.finished.append(state)
    ctx.forget_tuner()
    measured = f", {t.measured_seconds:.1f}s/step" if t.measured_seconds else ""
    msg = f"trial {t.id} {state}{measured}" + (f": {t.reason}" if t.reason else "")
    (ctx.info if state in (TrialState.SUCCEEDED, TrialState.STOPPED) else ctx.warn)(f"Trial{state}", msg, t.id)


def teardown_all(ctx: StepContext) -> None:
    for t in ctx.active():
        finish(ctx, t, TrialState.STOPPED, f"job {ctx.status.phase.lower()}")


def beats_baseline(ctx: StepContext, objective: Optional[float]) -> bool:
    """Better than the baseline on the job's objective, the one the search ranked by (with
    gpuSecondsPerStep or costPerStep a layout on fewer GPUs may be slower per step and still better)."""
    base = records.baseline_trial(ctx.status.trials).objective
    return objective is not None and base is not None and objective < base
