"""The digital twin: a simulator of one RL training step on a GPU cluster (docs/twin.md).

Public API:
    simulate_trial(spec, noise=True) -> list[StepRecord]        all steps of a trial, warm-up flagged
    simulate_step_time(model, task, gpu_type, gpus_per_node, config, scenario=None) -> float
                                                                 noiseless steady-state step seconds
    simulate_step_breakdown(...) -> dict                         same, with phases
    Infeasible                                                   raised for configs that cannot run
    TWIN_VERSION                                                 bumped whenever the model changes

The tuner must not import this package; only trials and benchmarks do. The twin is the ground truth of
the benchmarks, and a tuner that could read it would grade its own homework.
"""

from .errors import Infeasible
from .simulate import simulate_step_breakdown, simulate_step_time, simulate_trial

TWIN_VERSION = "0.3.8"

__all__ = ["simulate_trial", "simulate_step_time", "simulate_step_breakdown", "Infeasible", "TWIN_VERSION"]
