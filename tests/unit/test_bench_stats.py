"""The benchmark's headline forecast error comes with its seed-sampling interval."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.run import median_of_medians_interval  # noqa: E402


def test_interval_brackets_the_median_and_narrows_with_more_seeds():
    import numpy as np

    rng = np.random.default_rng(1)
    few = [list(0.05 * np.exp(0.4 * rng.standard_normal(10))) for _ in range(8)]
    many = [list(0.05 * np.exp(0.4 * rng.standard_normal(80))) for _ in range(8)]
    lo, hi = median_of_medians_interval(few)
    point = float(np.median([np.median(v) for v in few]))
    assert lo < point < hi
    lo2, hi2 = median_of_medians_interval(many)
    assert hi2 - lo2 < 0.6 * (hi - lo)
    assert lo2 < 0.05 < hi2


def test_identical_seeds_give_a_point_interval():
    lo, hi = median_of_medians_interval([[0.04] * 10, [0.06] * 10, [0.05] * 10])
    assert lo == hi == 0.05
