"""Other GPU pools: would the job be cheaper per step on other GPUs, at their price?

A job may list other pools (`spec.resources.pools`: GPU type, node size, budget, price per GPU-hour).
After the search, the forecaster calibrated on this pool's trials is carried to each other pool
(`Forecaster.on_pool`: the same measured corrections over the other GPUs' physics, with TRANSFER_SD
more uncertainty), the other pool's space is searched for its cheapest configuration, and the offer
compares its forecast cost per step with the measured cost of the incumbent here. An offer is worth
one confirming trial there when the expected saving over `budget.plannedSteps` pays for that trial;
the trial's measurement, not the forecast, is what the job reports as the saving.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Optional

from ..api.models import GpuPool, RLConfig, RLTuningJobSpec, pool_spec
from .forecast import Forecaster
from .records import cost_per_step
from .search import Space, candidates


@dataclass(frozen=True)
class PoolOffer:
    """The cheapest configuration the forecaster finds in one other pool, against the incumbent here."""

    pool: GpuPool
    config: RLConfig
    gpus: int
    step_seconds: float  # forecast
    step_std: float
    cost_per_step: float  # forecast, at the pool's price
    home_cost_per_step: float  # measured: the incumbent here at this pool's price
    p_cheaper: float  # probability (forecast) that it costs less per step than the incumbent
    trial_cost: float  # what one confirming trial there costs
    expected_saving: float  # over budget.plannedSteps, minus nothing: the trial is weighed separately

    @property
    def saving(self) -> float:
        """Forecast saving per step as a share of the incumbent's cost."""
        return 1.0 - self.cost_per_step / self.home_cost_per_step

    @property
    def worth_a_trial(self) -> bool:
        return self.p_cheaper >= 0.5 and self.expected_saving > self.trial_cost


def offer_for(
    spec: RLTuningJobSpec, fc: Forecaster, pool: GpuPool, home_step: float, home_gpus: int, deadline=None
) -> Optional[PoolOffer]:
    """The cheapest forecast configuration of `pool` (None when nothing there is forecast to run);
    `deadline` (search.Deadline) bounds the enumeration of its space."""
    price = spec.resources.price_per_gpu_hour
    if price is None:
        return None
    there = pool_spec(spec, pool).model_copy(update={"objective": "costPerStep"})
    space = Space(there)
    cands = candidates(space, fc.on_pool(there), top=6, deadline=deadline)
    cands = [c for c in cands if c.p_fit >= 0.5]
    if not cands:
        return None
    best = min(cands, key=lambda c: cost_per_step(pool.price_per_gpu_hour, c.gpus, c.step))
    cost = cost_per_step(pool.price_per_gpu_hour, best.gpus, best.step)
    home = cost_per_step(price, home_gpus, home_step)
    rel = max(best.std / max(best.step, 1e-9), 1e-6)
    z = math.log(home / cost) / rel
    nd = NormalDist()
    budget = spec.budget
    # expected saving: E[max(0, home - cost)] per step over the planned run (cost lognormal)
    e_gain = home * nd.cdf(z) - cost * math.exp(rel * rel / 2) * nd.cdf(z - rel)
    return PoolOffer(
        pool=pool,
        config=space.config(best.k),
        gpus=best.gpus,
        step_seconds=best.step,
        step_std=best.std,
        cost_per_step=cost,
        home_cost_per_step=home,
        p_cheaper=nd.cdf(z),
        trial_cost=cost * budget.steps_per_trial,
        expected_saving=max(0.0, e_gain) * budget.planned_steps,
    )


def offers(spec: RLTuningJobSpec, fc: Forecaster, home_step: float, home_gpus: int, deadline=None) -> list[PoolOffer]:
    """One offer per other pool (those where something is forecast to run), cheapest first."""
    out = [offer_for(spec, fc, p, home_step, home_gpus, deadline) for p in spec.resources.pools or []]
    return sorted((o for o in out if o is not None), key=lambda o: o.cost_per_step)
