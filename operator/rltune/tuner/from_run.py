"""A baseline measured by the team's own run: the console log of the configuration they run today,
read by the same parsers the metrics bridge uses (rltune.adapters.logs) and summarised as the
operator summarises a baseline trial, so the forecaster calibrates on it exactly as it calibrates
on a trial it ran itself. The cheapest first step: the run is paid for already.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..adapters.logs import parser_for
from ..api.hardware import gpu as gpu_spec
from ..api.metrics import PHASES, StepRecord
from ..api.models import RLTuningJobSpec
from .records import flatten_summary, unflatten_summary
from .summary import TrialSummary, summarize

LOG_FRAMEWORKS = ("verl", "openrlhf")


@dataclass(frozen=True)
class RunBaseline:
    """The measured baseline of a run and what its log did not say."""

    summary: TrialSummary
    steps: int  # completed steps the logs hold
    warmup: int  # leading steps excluded from scoring
    missing: tuple[str, ...]  # contract fields (phases by name) no step of the logs reported

    @property
    def phases_missing(self) -> bool:
        return all(p in self.missing for p in ("generation", "training"))

    def fallbacks(self) -> list[str]:
        """What the plan does without what the log lacks, one line each."""
        out = []
        if self.phases_missing:
            out.append(
                "no phase times (generation, training, ...): the forecaster calibrates on the step alone, "
                "the physics' own phase split scaled to it, with wider intervals"
            )
        if "step_reward_mean" in self.missing:
            out.append("no reward: the quality gates have no baseline reward from this run")
        if "step_trainer_memory_ratio" in self.missing:
            out.append("no trainer memory: the memory model stays on its physics for the trainer")
        return out


def from_logs(spec: RLTuningJobSpec, texts: list[str]) -> RunBaseline:
    """The baseline of `spec` measured by its run's console logs (in order; several files are one
    run's pieces). Raises ValueError naming what is wrong: a framework without a log parser, or no
    completed step."""
    fw = spec.workload.framework
    if fw not in LOG_FRAMEWORKS:
        raise ValueError(f"--log reads {' and '.join(LOG_FRAMEWORKS)} console logs; spec.workload.framework is {fw!r}")
    gib = gpu_spec(spec.resources.gpu_type).hbm_bytes / 2**30
    records: list[StepRecord] = []
    lacking: list[frozenset[str]] = []
    for text in texts:
        parser = parser_for(fw, gib)
        records += parser.feed_text(text)
        lacking += list(parser.missing_by_step.values())
    if not records:
        raise ValueError(
            f"no completed {fw} step in the log(s): a step line carries its step time "
            f"({'timing_s/step' if fw == 'verl' else 'timing/step_total'}); pass the console log of the run"
        )
    warmup = min(spec.budget.warmup_steps, len(records) - 1)
    marked = [dataclasses.replace(r, warmup=i < warmup) for i, r in enumerate(records)]
    missing = frozenset.intersection(*lacking) if lacking else frozenset()
    missing |= {p for p in PHASES if not any(r.phases.get(p, 0.0) > 0 for r in records)}
    # stored and read back as the operator stores a baseline trial's summary in the status
    summary = unflatten_summary(flatten_summary(summarize(marked), keep_rewards=True))
    return RunBaseline(summary, len(records), warmup, tuple(sorted(missing)))
