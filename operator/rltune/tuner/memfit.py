"""Memory fit as a probability, learned from what ran and from what ran out of memory.

The physics memory model (rltune.tuner.physics) puts three numbers on a configuration, each a
fraction of HBM: the trainer's peak, the KV-cache share vLLM has left after its weights (lower
is hungrier) and, colocated, vLLM's share plus the trainer's resident weights. Its limits are
estimates, not facts. A hard cut at them is a blind spot: a region just beyond a limit is never
tried, however large the gain the forecast sees there (docs/tuner.md "Memory fit").

So each side's true limit is uncertain: L ~ Normal(physics limit, MEM_SD), truncated to what the
trials showed, above the hungriest configuration that ran on that side (it fit) and below the
least hungry one that ran out of memory there (it did not). The fit probability of a
configuration is P(L > its hunger | that evidence), multiplied over the sides. One
out-of-memory failure thus lowers the fit probability of every layout that shares its side (the
cause), not only of configurations at least as hungry, and a success near the edge raises it.
The search multiplies the expected improvement by this probability: a trial at the edge is spent
only when the forecast gain beyond it is large.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Iterable, Optional

from .physics import Breakdown, MemLimits

# sd (fraction of HBM) of the physics memory model's limit: its activation, fragmentation and
# reserve terms are estimates of a few GB on a 80-288 GB GPU
MEM_SD = 0.03
# below this fit probability a configuration is not worth a trial at any gain (and is pruned)
P_FIT_MIN = 0.05

SIDES = ("trainer", "rollout", "colocated")
_ND = NormalDist()


def hungers(bd: Breakdown) -> dict[str, float]:
    """A configuration's memory hunger per side (bigger = hungrier), as fractions of HBM."""
    h = {"trainer": bd.trainer_mem_frac, "rollout": -bd.rollout_free_frac}
    if bd.colocated_frac > 0:
        h["colocated"] = bd.colocated_frac
    return h


def limit_hungers(limits: MemLimits) -> dict[str, float]:
    return {"trainer": limits.trainer_max, "rollout": -limits.rollout_min_free, "colocated": limits.colocated_max}


@dataclass
class SideFit:
    """What is known about one side's true limit: prior centre, proven fit, lowest failure."""

    centre: float
    fits_to: float = -math.inf  # the hungriest configuration that ran fits
    fails_from: float = math.inf  # the least hungry configuration that ran out of memory

    def p(self, x: float) -> float:
        if x <= self.fits_to + 1e-9:
            return 1.0
        if x >= self.fails_from - 1e-9:
            return 0.0
        cdf = lambda v: _ND.cdf((v - self.centre) / MEM_SD) if math.isfinite(v) else (1.0 if v > 0 else 0.0)
        lo, hi = cdf(self.fits_to), cdf(self.fails_from)
        if hi - lo < 1e-9:  # the evidence lies far from the prior: it replaces the prior
            if math.isfinite(self.fits_to) and math.isfinite(self.fails_from):
                return (self.fails_from - x) / (self.fails_from - self.fits_to)
            c = self.fails_from if math.isfinite(self.fails_from) else self.fits_to
            return SideFit(c, self.fits_to, self.fails_from).p(x)
        return max(0.0, min(1.0, (hi - cdf(x)) / (hi - lo)))


@dataclass
class MemoryFit:
    """Per-side limits learned from measured fits and out-of-memory failures of one job."""

    sides: dict[str, SideFit] = field(default_factory=dict)
    both: list[tuple[float, float]] = field(default_factory=list)  # OOMs that do not say which side

    @classmethod
    def learn(cls, limits: MemLimits, fits: Iterable[Breakdown], ooms: Iterable[tuple[str, Breakdown]]) -> "MemoryFit":
        centre = limit_hungers(limits)
        mf = cls({s: SideFit(centre[s]) for s in SIDES})
        for bd in fits:
            for s, x in hungers(bd).items():
                mf.sides[s].fits_to = max(mf.sides[s].fits_to, x)
        for side, bd in ooms:
            h = hungers(bd)
            if side == "both":
                mf.both.append((h["trainer"], h["rollout"]))
            elif side in h:
                mf.sides[side].fails_from = min(mf.sides[side].fails_from, h[side])
        return mf

    def p_side(self, side: str, x: float) -> float:
        return self.sides[side].p(x)

    def p_fit(self, bd: Breakdown) -> float:
        """Probability that the configuration fits in memory on every side."""
        p = 1.0
        for s, x in hungers(bd).items():
            p *= self.sides[s].p(x)
        return p

    def fenced(self, bd: Breakdown) -> Optional[str]:
        """Why the configuration certainly does not fit: at least as hungry as a failure."""
        h = hungers(bd)
        for s, x in h.items():
            if x >= self.sides[s].fails_from - 1e-9:
                return f"at least as memory-hungry as a configuration that ran out of memory ({s})"
        for t, r in self.both:
            if h["trainer"] >= t - 1e-9 and h["rollout"] >= r - 1e-9:
                return "at least as memory-hungry as a configuration that ran out of memory (both)"
        return None
