"""What the forecaster learns about the task from the trials, beyond its per-knob corrections: the
token counts of the first measurement (`measured_task`), an agentic task's tool latency when the
spec leaves it out (`tool_latency`), and the trainer's memory as the trials measured it
(`trainer_memory`). Each returns new physics.TaskFacts; what it learned is noted in
`Forecaster.learned` (a status the user reads)."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

import numpy as np

from ..api.models import RLTuningJobSpec
from . import physics

if TYPE_CHECKING:  # the Forecaster calls these while it is being built; only the annotation names it
    from .forecast import Forecaster

# the measured / physics trainer activations a trial can teach (trainer_memory) stay within this
# factor either way: beyond it the measurement is more likely wrong than the physics
ACT_SCALE_MAX = 8.0


def measured_task(task, obs, framework: str = "twin", backend: str = "") -> physics.TaskFacts:
    """The task as the first measurement saw it: the mean response length the spec declares is a
    guess (truncation at the context limit, early stops); the generated tokens per step are not.
    An agentic episode ends when its prompt, turns and tool observations fill the context: the
    measured observation tokens per generated token (from trained / generated tokens) say where,
    so the longest episode, and with it the long tail, is cut there (physics.truncated_at), not at
    max_response_tokens, and they size the live context that bounds the KV cache's batch. A
    single-turn task has no such cut: its declared mean was simply off.
    (The tool wait per generated token stays the declared turn's: truncation drops whole turns.)
    `framework` carries its offload semantics (physics.offload_swaps), `backend` its trainer's sharding."""
    tf = physics.job_task_facts(task, framework, backend)
    mean = obs[0][1].generated_tokens / tf.n_seq if obs else 0.0
    if not 0.05 * tf.mean_len <= mean <= tf.max_len:
        return tf
    s = obs[0][1]
    if tf.agentic and s.trained_tokens > s.generated_tokens > 0:
        # an episode's context (trained tokens) = prompt + (1 + rho) x generated: rho observation
        # tokens per generated token bound the longest episode the context holds
        rho = max(0.0, (s.trained_tokens / tf.n_seq - tf.prompt) / mean - 1.0)
        cap = (task.max_prompt_tokens + task.max_response_tokens - tf.prompt) / (1.0 + rho)
        return dataclasses.replace(physics.truncated_at(tf, mean, cap), obs_per_token=rho)
    return dataclasses.replace(tf, mean_len=mean)


def tool_latency(fc: "Forecaster", spec: RLTuningJobSpec, tf: physics.TaskFacts) -> physics.TaskFacts:
    """An agentic task whose spec gives no toolLatencySeconds: the physics' default is a guess,
    the first measurement's engine idle time waiting for tools is not. Solve for the latency
    that makes the physics' tool wait match it (secant; the wait grows monotonically with it)."""
    task = spec.workload.task
    if not tf.agentic or task.tool_latency_seconds is not None or not fc.obs:
        return tf
    cfg, s = fc.obs[0]
    k = physics.Knobs.of(cfg.flat())
    measured = s.phases.get("tool", 0.0)
    if measured <= 0.0 or tf.tool_s <= 0.0 or k.async_.streams:
        return tf  # a streaming rollout does not drain: its tool idle says little about the latency

    def tool_at(lat: float) -> tuple[physics.TaskFacts, float]:
        t2 = dataclasses.replace(tf, tool_s=lat, tool_per_token=tf.tool_per_token * lat / tf.tool_s)
        bd = physics.breakdown(fc.model, t2, fc.gpu_type, fc.gpn, k, fc.budget, physics.DEFAULT_LIMITS)
        return t2, bd.phases.get("tool", 0.0)

    x0, (_, y0) = tf.tool_s, tool_at(tf.tool_s)
    if y0 <= 0.0:
        return tf
    x1 = max(0.1, x0 * measured / y0)
    t1, y1 = tool_at(x1)
    for _ in range(4):
        if abs(y1 - measured) <= 0.02 * measured or abs(y1 - y0) < 1e-9:
            break
        x0, y0, x1 = x1, y1, max(0.1, x1 + (measured - y1) * (x1 - x0) / (y1 - y0))
        t1, y1 = tool_at(x1)
    fc.learned["toolLatencySeconds"] = round(x1, 2)
    return t1


def trainer_memory(fc: "Forecaster", tf: physics.TaskFacts) -> physics.TaskFacts:
    """The trainer's memory as the trials measured it. The physics sizes activations for one
    micro-batch, but a sequence is never split, so a trial's peak follows the longest sequence
    it trained (an agentic episode that fills the context every step): size every layout for
    the longest the trials saw. And the physics' per-token activation and logit coefficients
    are estimates (docs/benchmark-history.md 'Sizing trainer memory by the longest sequence'): scale
    them, per recompute mode, by what the trials of that mode measured (their peak less the
    physics' model state and working reserve), so that a layout is judged by the same measure
    that ran: the baseline's forecast is its measured peak. A mode no trial ran keeps the
    physics' coefficients, at the measured length."""
    seen = max((s.longest_sequence_max for _, s in fc.obs), default=0.0)
    if seen <= 0.0:
        return tf
    logs: dict[str, list[float]] = {}
    for cfg, s in fc.obs:
        if s.trainer_memory_max <= 0.0 or s.longest_sequence_max <= 0.0:
            continue
        k = physics.Knobs.of(cfg.flat())
        at = physics.trainer_memory_at(fc.model, tf, fc.gpu_type, fc.gpn, k, fc.budget, s.longest_sequence_max)
        if at is None or at.activations <= 0.0:
            continue
        grown = s.trainer_memory_max - (at.total - at.activations)
        if grown > 0.0:
            logs.setdefault(k.trainer.recompute, []).append(math.log(grown / at.activations))
    scales = tuple(
        sorted(
            (mode, round(min(max(math.exp(float(np.mean(v))), 1 / ACT_SCALE_MAX), ACT_SCALE_MAX), 3))
            for mode, v in logs.items()
        )
    )
    for mode, x in scales:
        fc.learned[f"activationScale.{mode}"] = x
    fc.learned["trainedSequenceTokens"] = round(seen)
    return dataclasses.replace(tf, train_seq=float(seen), activation_scale=scales)
