"""CPU cost of the digital twin per simulated RL step (issues 3 and 14: <= 50 ms per DAPO step and
per agentic step, on 2 cores).

    PYTHONPATH=operator python3 -m bench.twin_speed [--steps 5] [--no-interpreted]

Measures process CPU time of `simulate_one_step` (fresh length samples each step, noise on) for a
DAPO math step (512 prompts x 16 samples, 20,480 max response, B300) under several configurations,
and for an agentic-coding step. With numba installed the engine event loop runs compiled
(twin/replica_loop.py); the same steps are also timed with it interpreted, side by side in the same
run, and the ratio is printed (the outputs are bit-identical; the step seconds column shows it).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from rltune.api.models import ModelSpec, RLConfig, TaskSpec
from rltune.twin import replica_loop
from rltune.twin.simulate import make_plan, simulate_one_step

DAPO = TaskSpec(kind="math", promptsPerStep=512, samplesPerPrompt=16, maxPromptTokens=1024, maxResponseTokens=20480)
CODING = TaskSpec(
    kind="agentic-coding",
    promptsPerStep=64,
    samplesPerPrompt=8,
    maxPromptTokens=8192,
    maxResponseTokens=65536,
    turns=20,
    toolLatencySeconds=20,
    sandboxes=512,
)

CASES = [
    (
        "dapo seed-27b-dense 64xB300 colocated rollout tp2 (default knobs)",
        "seed-27b-dense",
        DAPO,
        dict(gpus=64, rollout=dict(tp=2, gpuMemoryUtilization=0.6), trainer=dict(tp=4)),
    ),
    (
        "dapo seed-27b-dense 64xB300 rollout tp1 (8192 reqs on 64 replicas)",
        "seed-27b-dense",
        DAPO,
        dict(gpus=64, rollout=dict(tp=1, gpuMemoryUtilization=0.6), trainer=dict(tp=4)),
    ),
    (
        "dapo seed-27b-dense 16xB300 KV-tight, maxNumSeqs 512 (preemptions)",
        "seed-27b-dense",
        DAPO,
        dict(gpus=16, rollout=dict(tp=1, gpuMemoryUtilization=0.4, maxNumSeqs=512), trainer=dict(tp=4)),
    ),
    (
        "dapo seed-35b-a3b 64xB300 disaggregated async + partial rollout (3 batches simulated)",
        "seed-35b-a3b",
        DAPO,
        dict(
            gpus=64,
            placement="disaggregated",
            trainerGpus=32,
            rollout=dict(tp=1, gpuMemoryUtilization=0.8),
            trainer=dict(tp=1, ep=8),
            **{"async": dict(staleness=1, partialRollout=True)},
        ),
    ),
    (
        "coding deepseek-flash 56xB300 colocated (512 episodes x ~20 turns)",
        "deepseek-flash",
        CODING,
        dict(gpus=56, rollout=dict(tp=8, gpuMemoryUtilization=0.6), trainer=dict(tp=2, ep=4, pp=2, recompute="full")),
    ),
]


def measure(model: str, task: TaskSpec, cfg: dict, steps: int) -> tuple[list[float], float]:
    m = ModelSpec(preset=model).resolved()
    plan = make_plan(m, task, "B300", 8, RLConfig.model_validate(cfg))
    simulate_one_step(plan, np.random.default_rng(0))  # warm caches
    ms = []
    dur = 0.0
    for i in range(steps):
        rng = np.random.default_rng([1, i])
        t0 = time.process_time()
        r = simulate_one_step(plan, rng)
        ms.append((time.process_time() - t0) * 1000)
        dur = r.duration
    return ms, dur


def measure_interpreted(model: str, task: TaskSpec, cfg: dict, steps: int) -> tuple[list[float], float]:
    """measure() with the engine event loop interpreted (as where numba is not installed)."""
    compiled = replica_loop.compiled_replica_loop
    replica_loop.compiled_replica_loop = None
    try:
        return measure(model, task, cfg, steps)
    finally:
        replica_loop.compiled_replica_loop = compiled


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--no-interpreted", action="store_true", help="skip the interpreted-loop comparison")
    a = ap.parse_args(argv)
    side = replica_loop.compiled_replica_loop is not None and not a.no_interpreted
    mode = "compiled" if replica_loop.compiled_replica_loop is not None else "interpreted"
    print(f"engine event loop: {mode} (numba {'installed' if mode == 'compiled' else 'not installed'})")
    head = f"{'case':86s} {'median ms':>9s} {'max ms':>8s} {'sim step s':>10s}"
    print(head + (f" {'interp. ms':>10s} {'speed-up':>8s}" if side else ""))
    worst = {"dapo": 0.0, "agentic": 0.0}
    for name, model, task, cfg in CASES:
        ms, dur = measure(model, task, cfg, a.steps)
        med = statistics.median(ms)
        if task.kind == "math" and "3 batches" not in name:
            worst["dapo"] = max(worst["dapo"], med)
        elif task.kind != "math":
            worst["agentic"] = max(worst["agentic"], med)
        line = f"{name:86s} {med:9.1f} {max(ms):8.1f} {dur:10.1f}"
        if side:
            ms_i, dur_i = measure_interpreted(model, task, cfg, a.steps)
            med_i = statistics.median(ms_i)
            line += f" {med_i:10.1f} {med_i / med:7.1f}x" + ("" if dur_i == dur else "  OUTPUT DIFFERS")
        print(line)
    print(f"\nworst median CPU per synchronous DAPO step: {worst['dapo']:.1f} ms (requirement <= 50 ms)")
    print(f"worst median CPU per agentic step: {worst['agentic']:.1f} ms (requirement <= 50 ms)")
    return 0 if max(worst.values()) <= 50 else 1


if __name__ == "__main__":
    raise SystemExit(main())
