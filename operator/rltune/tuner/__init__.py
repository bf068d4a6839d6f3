"""rltune.tuner: the pure tuning core (no Kubernetes, never the twin).

summarize(steps) -> TrialSummary
profile(spec, baseline_summary) -> Profile
Tuner(spec, baseline: TrialRecord, history: list[TrialRecord])
    .propose(n, gpus_free) -> list[Proposal]     .judge(record, summary) -> TrialRecord
    .early_stop(partial_steps, gpus=None) -> bool .done() -> (bool, reason)
    .best() -> TrialRecord | None                 .forecast_error() -> float | None
    .best_estimate() -> TrialRecord | None        (what is deployed: measurements weighed against forecasts)
    .forecast_trials() -> list[TrialRecord]      (the trials forecast_error is measured on)
baseline_record(spec, summary=None) -> TrialRecord
"""

from .backend import TrialBackend, TrialObservation
from .core import TERMINAL, Proposal, TrialRecord, Tuner, baseline_record
from .forecast import Forecaster, Prediction, is_oom
from .profile import Profile, profile
from .summary import TrialSummary, summarize

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
