"""Will the trainer's memory last the whole run? A trial's measured peak, carried to the longest
sequence of the planned run.

A trial runs a handful of steps; the run it stands for runs hundreds. Token-budget micro-batching
never splits a sequence, so the largest micro-batch of a step holds its longest sequence whenever
that is longer than microBatchTokens, and the trainer's peak memory follows the longest sequence
the step happened to draw. A layout that peaked at 97% of the GPU on a 19k-token sequence in its
trial runs out of memory on the step, hundreds of steps later, that draws a 21.5k-token one.

So when a workload reports the trainer's peak memory and the longest sequence of each step (the
metrics contract's step_trainer_memory_ratio and step_longest_sequence_tokens; verl logs both),
the peak is carried from the longest sequence the trial saw to the longest the planned run will
see, by the more cautious of two readings of the physics' memory picture for that layout: (a) the
whole peak scales as the physics' total does between the two lengths; (b) the model state
(weights, gradients, optimizer: the parameter count times the optimizer's bytes per parameter)
stays, and the rest of the measured peak grows as the physics' activations and logits do. (a)
alone forecast up to 40% too low on rltune's own trainer on an H200, whose per-token share the
physics underrates; (b) alone, up to 20% too low where the physics overrates the state (an MoE
whose experts Megatron also splits by tensor parallelism). Where either is right the larger is
(docs/real-mode.md "Trainer memory on a GPU"); a gate that misses costs a crash hours into a run.
The run's longest sequence: an agentic episode runs until its context fills (max prompt + max
response); a single-turn response is the quantile 1 - 1/(sequences over budget.plannedSteps) of the
task's length distribution, capped at max response, after the longest prompt. A trial whose
forecast peak exceeds MEMORY_CEILING fails the `memory` gate: it is not deployed, and the search
learns it as an out-of-memory failure of its side (rltune.tuner.memfit).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..adapters.registry import trainer_backend
from ..api.models import RLConfig, RLTuningJobSpec, TaskSpec
from . import physics
from .gates import GateResult
from .summary import TrialSummary

# peak memory in use / the GPU's memory beyond which a step fails: the CUDA context and the
# driver's own allocations (~0.5-1 GB) are outside what the allocator reports
MEMORY_CEILING = 0.99


@dataclass(frozen=True)
class RunPeak:
    """A trial's measured trainer peak and its forecast at the run's longest sequence."""

    measured: float  # peak / GPU memory in the trial
    seen_tokens: float  # the longest sequence the trial trained
    run_tokens: float  # the longest sequence the planned run will train
    forecast: float  # peak / GPU memory at run_tokens

    @property
    def fits(self) -> bool:
        return self.forecast <= MEMORY_CEILING

    def detail(self) -> str:
        head = (
            f"trainer memory peaked at {self.measured:.1%} of the GPU on a {self.seen_tokens:,.0f}-token "
            f"sequence; at the planned run's longest ({self.run_tokens:,.0f} tokens) {self.forecast:.1%}"
        )
        if self.fits:
            return f"{head} <= {MEMORY_CEILING:.0%}"
        return (
            f"{head} > {MEMORY_CEILING:.0%}: the run would run out of trainer memory on a long sequence; "
            "raise trainer tp/pp/cp, recompute or offload"
        )


def longest_in_run(task: TaskSpec, steps: int) -> float:
    """Tokens of the longest sequence a run of `steps` steps is expected to train."""
    cap = float(task.max_prompt_tokens + task.max_response_tokens)
    if task.kind == "agentic-coding":
        return cap  # an episode runs until its turns, observations and generations fill the context
    tf = physics.task_facts_cached(task)
    return float(task.max_prompt_tokens) + physics.longest_response(tf, tf.n_seq * max(steps, 1))


def run_peak(spec: RLTuningJobSpec, config: RLConfig, summary: TrialSummary) -> Optional[RunPeak]:
    """The trial's trainer peak carried to the planned run's longest sequence; None when the
    workload did not measure its peak memory or its sequences."""
    measured, seen = summary.trainer_memory_max, summary.longest_sequence_max
    if measured <= 0.0 or seen <= 0.0:
        return None
    run = max(seen, longest_in_run(spec.workload.task, spec.budget.planned_steps))
    return RunPeak(measured, seen, run, carry(spec, config, measured, seen, run))


def carry(spec: RLTuningJobSpec, config: RLConfig, measured: float, seen: float, run: float) -> float:
    """A peak (share of the GPU) measured with a `seen`-token longest sequence, at a `run`-token one:
    the larger of the peak scaled as the physics' total and the state-anchored growth (the module's
    docstring says why). No physics picture for the layout: the measurement stands."""
    if run <= seen:
        return measured
    k = physics.Knobs.of(config.flat())
    model, r = spec.workload.model.resolved(), spec.resources
    task = physics.job_task_facts(spec.workload.task, spec.workload.framework, trainer_backend(spec))
    at_seen = physics.trainer_memory_at(model, task, r.gpu_type, r.gpus_per_node, k, r.gpu_budget, seen)
    at_run = physics.trainer_memory_at(model, task, r.gpu_type, r.gpus_per_node, k, r.gpu_budget, run)
    if at_seen is None or at_run is None or at_seen.total <= 0:
        return measured
    scaled = measured * at_run.total / at_seen.total
    if measured > at_seen.state and at_seen.activations > 0:
        anchored = at_seen.state + (measured - at_seen.state) * at_run.activations / at_seen.activations
        return max(scaled, anchored)
    return scaled


def gate(spec: RLTuningJobSpec, config: RLConfig, summary: TrialSummary) -> GateResult:
    """The `memory` gate: the trial's trainer peak, carried to the run's longest sequence, fits."""
    peak = run_peak(spec, config, summary)
    if peak is None:
        return GateResult(
            passed=True,
            detail="not checked: the workload reports no trainer peak memory or longest sequence "
            "(step_trainer_memory_ratio, step_longest_sequence_tokens)",
        )
    return GateResult(passed=peak.fits, detail=peak.detail())
