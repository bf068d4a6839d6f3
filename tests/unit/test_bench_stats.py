"""The benchmark's headline forecast error and tuning cost come with their seed-sampling intervals."""

import json

from bench.paths import RESULTS
from bench.run import median_of_medians_interval


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


def test_the_cost_headline_carries_its_interval_from_the_per_seed_costs():
    import copy
    import re

    from bench.run import _int_keys, render

    path = RESULTS / "results-generated.json"
    stored = _int_keys(json.loads(path.read_text()))
    text = "\n".join(render(stored, [4, 8, 16], 10, "generated"))
    m = re.search(r"Tuning cost: median ([0-9.]+)% \(90% seed-bootstrap interval ([0-9.]+)%-([0-9.]+)%\)", text)
    assert m, text[-600:]
    point, lo, hi = map(float, m.groups())
    assert lo <= point <= hi and lo < hi
    # without per-seed costs (JSONs written before they were kept) the line has no interval
    old = copy.deepcopy(stored)
    for r in old:
        r["methods"]["rltune"].pop("costs")
    cost_line = "\n".join(render(old, [4, 8, 16], 10, "generated")).split("Tuning cost: median")[1]
    assert "seed-bootstrap interval" not in cost_line.split("\n")[0]
