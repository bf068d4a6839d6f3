"""kopf handlers: thin. One timer per RLTuningJob drives rltune.controller.reconcile; deletion
cleans the job's Pushgateway groups (its pods and services go by garbage collection: they carry an
owner reference to the job).

Run: `rltune operator` (rltune.controller.run), or
`kopf run -m rltune.controller.handlers --all-namespaces --standalone`.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any

import kopf

from .. import settings as operator_settings
from ..api.crdgen import GROUP, PLURAL, VERSION
from ..api.status import Phase
from . import prom, selfmetrics
from .reconcile import Reconciler

log = logging.getLogger("rltune.controller")
INTERVAL = (
    operator_settings.current().reconcile_interval
)  # read when the handlers are registered (after start-up set it)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """kopf's settings, and what the handlers share, kept in kopf's memo (no module globals)."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="rltune.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="rltune.io")
    settings.persistence.finalizer = "rltune.io/operator"
    settings.posting.level = logging.INFO
    settings.posting.reporting_component = "rltune"  # events read "from rltune", not "from kopf"
    settings.execution.max_workers = operator_settings.current().workers
    settings.watching.server_timeout = 60
    settings.networking.request_timeout = 30

    from .kube import KubeCluster

    def emit(body: dict, type_: str, reason: str, message: str) -> None:
        (kopf.info if type_ == "Normal" else kopf.warn)(body, reason=reason, message=message)

    memo.reconciler = Reconciler(
        KubeCluster(),
        emit=emit,
        settings=operator_settings.current(),
        on_trial_started=lambda kind: selfmetrics.TRIALS_STARTED.inc(),
        on_trial_finished=lambda state: selfmetrics.TRIALS_FINISHED.labels(state).inc(),
    )
    memo.phases = {}  # (namespace, name) -> phase, for the rltune_operator_jobs gauge


@kopf.timer(GROUP, VERSION, PLURAL, interval=INTERVAL, sharp=False)
def reconcile_job(namespace: str, name: str, memo: kopf.Memo, **_: Any) -> None:
    """Drive the job one step. Errors are counted and logged; the next tick retries."""
    t0 = time.monotonic()
    try:
        phase = memo.reconciler.reconcile(namespace, name)
        if phase:
            memo.phases[(namespace, name)] = phase
    except Exception:  # noqa: BLE001 - a tick must never kill the timer
        selfmetrics.RECONCILE_ERRORS.inc()
        log.exception("reconcile of %s/%s failed", namespace, name)
    finally:
        selfmetrics.RECONCILE_SECONDS.observe(time.monotonic() - t0)
        counts = Counter(memo.phases.values())
        for p in Phase:
            selfmetrics.JOBS.labels(p).set(counts.get(p, 0))


@kopf.on.delete(GROUP, VERSION, PLURAL, optional=True)
def cleanup_job(namespace: str, name: str, spec: dict, status: dict, memo: kopf.Memo, **_: Any) -> None:
    """Pods and services go with the job (owner references); the metrics groups are deleted here."""
    memo.phases.pop((namespace, name), None)
    pgw = prom.pushgateway_url((spec.get("metrics") or {}).get("pushgatewayUrl"))
    trials = [t.get("id") for t in (status or {}).get("trials") or [] if t.get("id")] if pgw else []
    for trial in trials:
        prom.delete_group(pgw, namespace, name, trial)
    log.info("deleted %d Pushgateway groups of %s/%s", len(trials), namespace, name)
