"""rltune's reference GRPO loop (real mode): vLLM rollouts + torch training of a small Qwen2-shaped model.

    from rltune import grpo
    grpo.run(spec, emit)            # spec: TrialSpec; emit(StepRecord) once per step

Importing this package is cheap: torch and vLLM load inside run() (and, for vLLM, only in the
spawned rollout process). See docs/real-mode.md.
"""

from __future__ import annotations

from typing import Callable, Optional

__all__ = ["run"]


def run(spec, emit: Callable, info: Optional[dict] = None) -> None:
    """Run spec.steps GRPO steps and emit one rltune.api.metrics.StepRecord per step; raise on failure."""
    from .loop import run as _run

    _run(spec, emit, info)
