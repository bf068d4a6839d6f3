"""rltune.tuner: the pure tuning core (no Kubernetes, never the twin).

summarize(steps) -> TrialSummary
profile(spec, baseline_summary) -> Profile
Tuner(spec, baseline: TrialRecord, history: list[TrialRecord])
    .judge(record, summary) -> TrialRecord        .forecast_error() -> float | None
    .forecast_trials() -> list[TrialRecord]      (the trials forecast_error is measured on)
    .proposer.propose(n, gpus_free) -> list[Proposal]   .proposer.rank(limit) (`rltune plan`)
    .pruner.early_stop(partial_steps, gpus=None) -> bool
    .terminator.done() -> (bool, reason)          .terminator.trials_left() (the one budget count)
    .picker.best() -> TrialRecord | None
    .picker.best_estimate() -> TrialRecord | None (what is deployed: measurements weighed against forecasts)
baseline_record(spec, summary=None) -> TrialRecord
"""

from .backend import TrialBackend, TrialObservation
from .core import Tuner, baseline_record
from .forecast import Forecaster, Prediction, is_oom
from .profile import Profile, profile
from .summary import TrialSummary, summarize
from .values import TERMINAL, Proposal, TrialRecord

__all__ = [
    "summarize",
    "TrialSummary",
    "profile",
    "Profile",
    "Tuner",
    "TrialRecord",
    "Proposal",
    "baseline_record",
    "Forecaster",
    "Prediction",
    "TrialBackend",
    "TrialObservation",
    "TERMINAL",
    "is_oom",
]
