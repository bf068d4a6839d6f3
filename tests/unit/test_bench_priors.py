"""bench.priors recovers the per-knob prior sds that generated a set of jobs' residuals."""

import numpy as np

from bench.priors import fit_side, upper_bound


def _jobs(sd: dict[str, float], n_jobs: int = 12, rows: int = 60, noise: float = 0.05, seed: int = 0) -> list[dict]:
    """Synthetic regressions shaped like the forecaster's: per job an intercept, one indicator
    column per non-baseline knob value (two values per knob), a correction per column drawn from
    N(0, sd[knob]^2), and noisy targets."""
    rng = np.random.default_rng(seed)
    knobs = [k for k in sd for _ in range(2)]
    out = []
    for _ in range(n_jobs):
        X = np.zeros((rows, len(knobs) + 1))
        X[:, 0] = 1.0
        for j in range(0, len(knobs), 2):  # each row sets the knob to baseline or one of two values
            v = rng.integers(0, 3, rows)
            X[v == 1, j + 1] = 1.0
            X[v == 2, j + 2] = 1.0
        w = np.concatenate([[rng.normal(0, 0.5)], [rng.normal(0, sd[k]) for k in knobs]])
        y = X @ w + rng.normal(0, noise, rows)
        out.append({"X": X, "y": y, "knob": knobs, "noise": np.full(rows, noise)})
    return out


def test_fit_separates_a_knob_the_physics_knows_from_one_it_does_not():
    regs = _jobs({"known": 0.0, "unknown": 0.4})
    fitted = fit_side(regs, {"known": 0.3, "unknown": 0.3}, sd0=1.0)
    assert fitted["known"] < 0.05
    assert 0.25 < fitted["unknown"] < 0.65


def test_upper_bound_is_above_the_fit_and_tighter_with_more_jobs():
    few = _jobs({"known": 0.0, "unknown": 0.4}, n_jobs=4, seed=1)
    many = _jobs({"known": 0.0, "unknown": 0.4}, n_jobs=40, seed=1)
    f_few = fit_side(few, {"known": 0.3, "unknown": 0.3}, sd0=1.0)
    f_many = fit_side(many, {"known": 0.3, "unknown": 0.3}, sd0=1.0)
    ub_few = upper_bound(few, f_few, 1.0, "known")
    ub_many = upper_bound(many, f_many, 1.0, "known")
    assert ub_few >= f_few["known"] and ub_many >= f_many["known"]
    assert ub_many < ub_few
