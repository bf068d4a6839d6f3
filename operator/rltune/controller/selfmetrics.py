"""The operator's own metrics (prometheus_client), served on --metrics-port (default 18080)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, start_http_server

TRIALS_STARTED = Counter("rltune_operator_trials_started_total", "Trials the operator started.")
TRIALS_FINISHED = Counter("rltune_operator_trials_finished_total", "Trials the operator finished, by state.", ["state"])
RECONCILE_ERRORS = Counter("rltune_operator_reconcile_errors_total", "Reconciles that raised an error.")
RECONCILE_SECONDS = Histogram(
    "rltune_operator_reconcile_seconds",
    "Duration of one job reconcile.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
JOBS = Gauge("rltune_operator_jobs", "RLTuningJobs seen, by phase.", ["phase"])

_started = False


def serve(port: int, addr: str = "0.0.0.0") -> None:
    global _started
    if port and not _started:
        start_http_server(port, addr=addr)
        _started = True
