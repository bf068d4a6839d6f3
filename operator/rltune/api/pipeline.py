"""The asynchronous trainer-rollout pipeline of a disaggregated RL loop, with a bounded run-ahead.

A law of the loop's structure, not of any cluster (no efficiency factor in it): shared by the twin
(rltune.twin.simulate) and the forecaster (rltune.tuner.physics) like the GPU catalog.

Why a small simulation and not `max(generation, training)`: how much the two sides overlap depends
on how far the rollout may run ahead of the trainer, and that bound is what staleness settings
change. With perfect overlap every fractional staleness threshold gives the same step, and the
trainer never waits; published fully-async runs improve as the threshold grows and their trainer
still waits for samples (docs/twin.md, 'Async pipeline').

The model (fluid production, mini-batch consumption):

- the rollout pool produces a step's batch in `gen` seconds at a steady rate when streaming (partial
  rollout); without partial rollout a batch is delivered whole when its last sample finishes;
- the trainer consumes a batch in `units` pieces (PPO mini-batches, or verl fully-async's
  `require_batches` fetches), each taking `train / units`, and can start a piece once it exists;
- after each step the weights are synchronised: the trainer is busy `sync_trainer` seconds and the
  rollout pauses `sync_rollout` seconds;
- run-ahead: while the rollout holds policy version k it may produce at most `k + 1 + ahead`
  batches in total. `ahead` is the staleness fraction where the framework bounds the stale share of
  a batch (verl fully-async's `staleness_threshold`: 0 = it produces only the batch of the current
  step, then waits for the next sync), or the integer staleness bound otherwise.

The steady-state step, the trainer's wait and the rollout's idle time emerge from the recurrence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class PipelineStep:
    duration: float  # steady-state seconds per trainer step
    trainer_wait: float  # seconds per step the trainer waits for samples
    rollout_idle: float  # seconds per step the rollout is blocked by the run-ahead bound or a sync


def pipeline_step(
    gen: float,
    train: float,
    sync_trainer: float,
    sync_rollout: float,
    ahead: float,
    units: int,
    streaming: bool,
    steps: int = 8,
) -> PipelineStep:
    """Steady state of the two-stage pipeline over `steps` steps (the last half is averaged)."""
    run = _streaming if streaming else _whole_batches
    ends, waits, busy = run(gen, train, sync_trainer, sync_rollout, ahead, max(1, int(units)), steps)
    half = steps // 2
    span = (ends[-1] - ends[half - 1]) / (steps - half)
    wait = sum(waits[half:]) / (steps - half)
    return PipelineStep(duration=span, trainer_wait=wait, rollout_idle=max(0.0, span - busy))


def _streaming(gen, train, sync_t, sync_r, ahead, units, steps):
    """Partial rollout: samples stream out at a steady rate; the trainer takes them piece by piece."""
    piece = train / units
    produced = 0.0  # batches produced so far (fluid)
    t_roll = 0.0  # the rollout has produced `produced` batches at this time
    t_free = 0.0  # the trainer's next free moment
    ends, waits = [], []
    for k in range(steps):
        wait = 0.0
        for j in range(1, units + 1):
            avail = t_roll + max(0.0, k + j / units - produced) * gen
            wait += max(0.0, avail - t_free)
            t_free = max(t_free, avail) + piece
        end = t_free
        # it produces until its run-ahead cap, then idles; the sync pauses it at the step's end (a
        # rollout of no duration, the lower end of a forecast's spread, is at its cap at once)
        produced = k + 1 + ahead if gen <= 0.0 else min(k + 1 + ahead, produced + (end - t_roll) / gen)
        t_roll = end + sync_r
        t_free = end + sync_t
        ends.append(t_free)
        waits.append(wait)
    return ends, waits, gen


def _whole_batches(gen, train, sync_t, sync_r, ahead, units, steps):
    """No partial rollout: a batch exists when its last sample finishes (one-step-off)."""
    version_at = {0: -sync_r}  # when the trainer released policy version v
    done: dict[int, float] = {}
    roll_free = 0.0
    loaded = 0  # the version the rollout holds: loading a newer one pauses it `sync_r`
    t_free = 0.0
    ends, waits = [], []
    for k in range(steps):
        for b in range(len(done), k + 1):
            # batch b may be generated with version v once b + 1 <= v + 1 + ahead batches exist
            v = min(k, max(0, math.ceil(b - ahead - 1e-9)))
            start = max(roll_free, version_at[v]) + sync_r if v > loaded else roll_free
            loaded = max(loaded, v)
            done[b] = roll_free = start + gen
        waits.append(max(0.0, done[k] - t_free))
        end = max(t_free, done[k]) + train
        version_at[k + 1] = end
        t_free = end + sync_t
        ends.append(t_free)
    return ends, waits, gen
