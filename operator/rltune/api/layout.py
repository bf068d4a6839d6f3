"""Where a configuration's GPUs go: the one rule for the trainer-rollout split and the node count.

Physics, the twin, the trial pods, the RayJobs and every adapter read a configuration's GPUs
through `layout`, so none of them can disagree on a default. A configuration that leaves `gpus`
out uses the budget; a disaggregated one that leaves `trainerGpus` out gets `default_trainer_gpus`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional


def nodes_for(gpus: int, gpus_per_node: int) -> int:
    """Nodes (pods of one rank each) that `gpus` GPUs span at `gpus_per_node` a node."""
    return max(1, -(-gpus // gpus_per_node))


def default_trainer_gpus(gpus: int, gpus_per_node: int) -> int:
    """The trainer's share of a disaggregated configuration that does not name one: half, in whole
    nodes when the configuration spans two or more (a pool that splits a node would share it with
    the other pool's ranks), else half of the one node's GPUs (at least one)."""
    if gpus >= 2 * gpus_per_node:
        return max(gpus_per_node, (gpus // 2) // gpus_per_node * gpus_per_node)
    return max(1, gpus // 2)


@dataclass(frozen=True)
class Layout:
    """A configuration's GPUs: in all, the trainer's, the rollout's (colocated: both are all of them,
    time-shared) and the nodes its pods span. `rollout` may be below 1 for a split that leaves the
    rollout nothing: callers that need a runnable layout check `runnable`."""

    gpus: int
    trainer: int
    rollout: int
    nodes: int
    colocated: bool

    @property
    def runnable(self) -> bool:
        return self.trainer >= 1 and self.rollout >= 1

    @property
    def parts(self) -> tuple[int, int, int]:
        """(gpus, trainer, rollout)."""
        return self.gpus, self.trainer, self.rollout


def layout(gpus: Optional[int], placement: str, trainer_gpus: Optional[int], budget: int, gpus_per_node: int) -> Layout:
    """The layout of a configuration given as its parts (`gpus` None: the budget)."""
    g = gpus or budget
    n = nodes_for(g, gpus_per_node)
    if placement == "colocated":
        return Layout(g, g, g, n, True)
    t = trainer_gpus or default_trainer_gpus(g, gpus_per_node)
    return Layout(g, t, g - t, n, False)


def layout_of(k: Mapping[str, Any], budget: int, gpus_per_node: int) -> Layout:
    """The layout of a configuration given as its flat knobs (RLConfig.flat(), or the search's
    outer half): only `gpus`, `placement` and `trainerGpus` are read."""
    return layout(k.get("gpus"), k["placement"], k.get("trainerGpus"), budget, gpus_per_node)
