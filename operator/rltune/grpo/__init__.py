"""rltune's reference GRPO loop (real mode): vLLM rollouts + torch training of a small Qwen2-shaped model.

    from rltune import grpo
    grpo.run(spec, emit)            # spec: TrialSpec; emit(StepRecord) once per step

Importing this package is cheap: torch and vLLM load inside run() (and, for vLLM, only in the
spawned rollout process). See docs/real-mode.md.
"""

from __future__ import annotations

import os
from typing import Callable, Optional

# Rollout and trainer share the cores and take turns: OpenMP workers that spin-wait after a parallel
# region steal the other side's cores (measured: 2-4 s steps instead of 0.65 s with 2+2 threads on
# 2 cores). libgomp reads this once, when torch loads, so it is set here, before torch is imported
# (the rollout process sets it for itself). An explicit OMP_WAIT_POLICY wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__all__ = ["run"]


def run(spec, emit: Callable, info: Optional[dict] = None) -> None:
    """Run spec.steps GRPO steps and emit one rltune.api.metrics.StepRecord per step; raise on failure."""
    from .loop import run as _run

    _run(spec, emit, info)
