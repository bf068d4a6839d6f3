"""bench.lag_penalty's fit: the twin's learning curve recovered from reward curves, the lag penalty and
the confirmation-window drop of paired runs, and the saved runs read back."""

import json

import numpy as np
import pytest

from bench import lag_penalty


def _curve(tau, steps=30, a=0.5, g=0.35):
    t = np.arange(steps, dtype=float)
    return a + g * (1.0 - np.exp(-(t + 1.0) / tau))


def test_the_fit_recovers_the_twins_learning_curve():
    f = lag_penalty.fit_curve(_curve(12.3))
    assert f.tau == pytest.approx(12.3, abs=0.05)
    assert f.start == pytest.approx(0.5, abs=1e-3) and f.gain == pytest.approx(0.35, abs=1e-3)


def test_a_slower_curve_one_step_off_is_a_lag_penalty_and_a_drop_in_the_confirmation_window():
    rng = np.random.default_rng(1)
    sync = np.array([_curve(10.0) + 0.01 * rng.standard_normal(30) for _ in range(8)])
    lag1 = np.array([_curve(15.0) + 0.01 * rng.standard_normal(30) for _ in range(8)])
    r = lag_penalty.lag_penalty(sync, lag1, boot=100)
    assert r.penalty == pytest.approx(0.5, abs=0.1)
    assert r.penalty_90[0] < r.penalty < r.penalty_90[1]
    w = lag_penalty.CONFIRM_WINDOW
    expect = 1 - _curve(15.0)[w].mean() / _curve(10.0)[w].mean()
    assert r.window_drop == pytest.approx(expect, abs=0.01) and r.window_drop > 0.03
    assert len(r.per_seed_window_drop) == 8
    same = lag_penalty.lag_penalty(sync, sync.copy(), boot=20)
    assert same.penalty == pytest.approx(0.0, abs=1e-9) and same.window_drop == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="paired runs"):
        lag_penalty.lag_penalty(sync[:, :10], lag1[:, :10])


def test_saved_runs_are_paired_by_seed_and_cut_to_the_shortest(tmp_path):
    def write(stale, seed, rewards):
        lines = [
            json.dumps({"step": i, "reward": r, "staleness": float(stale and i > 0)}) for i, r in enumerate(rewards)
        ]
        (tmp_path / f"s{stale}-{seed}.jsonl").write_text("\n".join(lines) + "\n")

    write(0, 1, [0.1, 0.2, 0.3, 0.4])
    write(1, 1, [0.1, 0.15, 0.2])
    write(0, 2, [0.2, 0.3, 0.4])
    write(1, 2, [0.2, 0.25, 0.3, 0.35])
    write(0, 3, [0.5, 0.5, 0.5])  # no lag-1 partner: left out
    sync, lag1, seeds = lag_penalty.read_runs(tmp_path)
    assert seeds == [1, 2] and sync.shape == lag1.shape == (2, 3)
    assert sync[1].tolist() == [0.2, 0.3, 0.4] and lag1[0].tolist() == [0.1, 0.15, 0.2]
    with pytest.raises(SystemExit, match="no seed run"):
        lag_penalty.read_runs(tmp_path / "empty")
