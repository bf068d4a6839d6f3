"""The twin's engine event loop compiled with numba gives exactly what the interpreted loop gives.

twin/replica_loop.py is one function run two ways: compiled (numba installed, the fast path every
benchmark uses) and interpreted (no numba: the trial image). A difference in any bit would
make the benchmark's oracle and yardstick depend on whether numba is installed, so the results
are compared for equality, on replicas that exercise every branch of the loop.
"""

import random
from dataclasses import asdict

import numpy as np
import pytest

from rltune.api.models import ModelSpec, RLConfig, TaskSpec
from rltune.twin import replica_loop
from rltune.twin.rollout import simulate_replica
from rltune.twin.simulate import make_plan
from rltune.twin.workload import sample_episodes

pytest.importorskip("numba")

DAPO = TaskSpec(kind="math", promptsPerStep=64, samplesPerPrompt=16, maxPromptTokens=1024, maxResponseTokens=20480)
CODING = TaskSpec(
    kind="agentic-coding",
    promptsPerStep=32,
    samplesPerPrompt=8,
    maxPromptTokens=8192,
    maxResponseTokens=65536,
    turns=12,
    toolLatencySeconds=20,
)


def _run_both(monkeypatch, preset: str, task: TaskSpec, cfg: dict, gpus: int, seed: int, **kw):
    """(compiled, interpreted) ReplicaResult of replica 0 of a rollout pool of `gpus` GPUs."""
    plan = make_plan(ModelSpec(preset=preset).resolved(), task, "B300", 8, RLConfig.model_validate(cfg))
    ep = sample_episodes(task, plan.eff, np.random.default_rng(seed))
    replicas = max(1, gpus // plan.cfg.rollout.tp)
    idx = list(range(0, len(ep), replicas))
    compiled = simulate_replica(plan.rc, ep, idx, plan.cfg, **kw)
    monkeypatch.setattr(replica_loop, "compiled_replica_loop", None)
    interpreted = simulate_replica(plan.rc, ep, idx, plan.cfg, **kw)
    monkeypatch.undo()
    return compiled, interpreted


def _same(a, b) -> bool:
    """Two ReplicaResults equal in every field, finish times bit for bit."""
    da, db = asdict(a), asdict(b)
    fa, fb = da.pop("finish"), db.pop("finish")
    return da == db and fa.dtype == fb.dtype and np.array_equal(fa, fb)


def test_the_compiled_loop_is_in_use_where_numba_is_installed():
    assert replica_loop.compiled_replica_loop is not None


@pytest.mark.parametrize("speed", [1.0, 1.37])
def test_single_turn_replica_is_bit_identical(monkeypatch, speed):
    cfg = dict(gpus=16, rollout=dict(tp=2, gpuMemoryUtilization=0.6), trainer=dict(tp=4))
    a, b = _run_both(monkeypatch, "seed-27b-dense", DAPO, cfg, 16, 5, speed=speed)
    assert _same(a, b)
    assert a.generated > 0 and len(a.finish) == 128


def test_kv_thrashing_replica_with_preemptions_is_bit_identical(monkeypatch):
    cfg = dict(gpus=16, rollout=dict(tp=1, gpuMemoryUtilization=0.4, maxNumSeqs=512), trainer=dict(tp=4))
    a, b = _run_both(monkeypatch, "seed-27b-dense", DAPO, cfg, 2, 7)
    assert a.preemptions > 100  # the overflow / re-admission branches ran
    assert _same(a, b)


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_multi_turn_replica_with_few_sandboxes_is_bit_identical(monkeypatch, prefix_caching):
    cfg = dict(gpus=8, rollout=dict(tp=4, gpuMemoryUtilization=0.6), trainer=dict(tp=2))
    a, b = _run_both(monkeypatch, "qwen2.5-7b", CODING, cfg, 8, 3, sandboxes=40, prefix_caching=prefix_caching)
    assert _same(a, b)
    # episodes waited for a sandbox: the last ones finished long after the first wave
    assert a.tool_idle > 0 and max(a.finish) > 2 * sorted(a.finish)[len(a.finish) // 4]


def test_epoch_sum_is_bit_identical_where_memory_and_compute_lines_cross():
    rng = random.Random(0)
    crossed = 0
    for _ in range(2000):
        m0, f0 = rng.uniform(1e-3, 2e-2), rng.uniform(0, 1e-3)
        m1, c_tok, c1 = rng.uniform(1e-9, 1e-7), rng.uniform(1e-6, 1e-4), rng.uniform(1e-9, 1e-7)
        b, k0, n = rng.randint(1, 1024), rng.uniform(0, 1e6), rng.randint(0, 5000)
        args = (m0, f0, m1, c_tok, c1, b, k0, n)
        am, ac = m0 + m1 * k0, c_tok * b + c1 * k0
        crossed += (am - ac) * (m1 - c1) < 0
        assert replica_loop._epoch(*args) == replica_loop._epoch.py_func(*args)
    assert crossed > 100  # the split-at-the-crossing branch was exercised
