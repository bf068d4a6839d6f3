#!/usr/bin/env python3
"""The test bed's stand-in for verl's trainer main (`python3 hack/verl-standin/main_ppo.py <overrides>`).

There are no GPUs on the bed, so nothing trains. What stays real: the overrides are composed by
verl 0.9.1's own Hydra config (a key or value verl would refuse fails here the same way, exit 1),
and the console output is a recorded verl 0.9.1 log (tests/fixtures/logs/verl-0.9.1.log, verl's
exact format) replayed through hack/replaylog.py. Only its timings are rescaled: to the digital
twin's step time for the configuration the overrides select (read back with rltune's verl adapter,
model preset from env RLTUNE_STANDIN_MODEL (default qwen2.5-7b), GPU type from RLTUNE_STANDIN_GPU), so trials of
different configurations differ the way the twin says. It prints `trainer.total_training_steps`
steps (at most the recording's 6).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
RECORDED = REPO / "tests/fixtures/logs/verl-0.9.1.log"


def main(argv: list[str]) -> int:
    from rltune.adapters.verl import verl
    from rltune.adapters.verl_loader import compose
    from rltune.api.models import ModelSpec, RLConfig, TaskSpec, TrialSpec
    from rltune.twin import simulate_trial

    command = ["python3", str(Path(__file__).name), *argv]
    try:
        cfg = compose(command)
    except Exception as e:  # noqa: BLE001 - what verl's own @hydra.main would print and exit with
        print(f"Error composing verl's config: {e}", file=sys.stderr)
        return 1
    knobs = verl.read(command)
    nodes, per_node = int(cfg.trainer.nnodes), int(cfg.trainer.n_gpus_per_node)
    config = RLConfig().with_knobs(
        {k: v for k, v in knobs.items() if not k.startswith("cpu")} | {"gpus": nodes * per_node}
    )
    steps = min(int(cfg.trainer.total_training_steps or 6), 6)
    task = TaskSpec(
        promptsPerStep=int(cfg.data.train_batch_size),
        samplesPerPrompt=int(cfg.actor_rollout_ref.rollout.n),
        maxPromptTokens=int(cfg.data.max_prompt_length),
        maxResponseTokens=int(cfg.data.max_response_length),
    )
    trial = TrialSpec(
        model=ModelSpec(preset=os.environ.get("RLTUNE_STANDIN_MODEL", "qwen2.5-7b")),
        task=task,
        gpu_type=os.environ.get("RLTUNE_STANDIN_GPU", "B300"),
        gpus_per_node=per_node,
        config=config,
        steps=steps,
        warmup_steps=0,
        seed=0,
    )
    twin = [r.duration for r in simulate_trial(trial, noise=False)]
    recorded = _recorded_step_seconds()[:steps]
    scale = (sum(twin) / len(twin)) / (sum(recorded) / len(recorded))
    print(f"verl stand-in: {nodes}x{per_node} GPUs, {steps} steps, twin {twin[-1]:.1f} s/step (scale {scale:.3f})")
    sys.stdout.flush()
    return subprocess.call(
        [
            sys.executable,
            str(REPO / "hack/replaylog.py"),
            str(RECORDED),
            "--scale",
            f"{scale:.6f}",
            "--steps",
            str(steps),
        ]
    )


def _recorded_step_seconds() -> list[float]:
    out = []
    for line in RECORDED.read_text().splitlines():
        if "timing_s/step:" in line:
            out.append(float(line.split("timing_s/step:")[1].split()[0]))
    return out


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
