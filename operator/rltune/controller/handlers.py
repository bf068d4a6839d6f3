"""kopf handlers: thin. Reconciling is event-driven (docs/operator.md, "How reconciling is triggered"):

- kopf watches RLTuningJobs, trial pods (label rltune.io/job) and, where KubeRay is installed,
  trial RayJobs. The pods and RayJobs are kept in kopf indexes keyed by (namespace, job).
- One asyncio daemon per RLTuningJob runs `Reconciler.reconcile` (in a thread) when woken by an event
  of the job or of one of its pods/RayJobs, handing it the job and its pods/RayJobs as the watches last
  saw them: a tick that changes nothing makes no API request. Without events it ticks every
  reconcileInterval while the job has active trials (Prometheus and timeouts are no watch), every
  IDLE_INTERVAL while it waits for anything else, and never once it is finished.
- Deleting a job (any phase) deletes its trial pods, Services and RayJobs at once (on.delete), then
  kopf removes the finalizer; the Pushgateway groups of its trials go too.

Run: `rltune operator` (rltune.controller.run), or
`kopf run -m rltune.controller.handlers --all-namespaces --standalone`.
"""

from __future__ import annotations

import asyncio
import contextvars
import copy
import logging
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

import kopf

from .. import settings as operator_settings
from ..api.crdgen import GROUP, PLURAL, VERSION
from ..api.status import ACTIVE_STATES, Phase
from . import endpoints, podspec, prom, rayjob, selfmetrics
from .reconcile import Reconciler, next_tick

log = logging.getLogger("rltune.controller")
IDLE_INTERVAL = 60.0  # a job that is neither finished nor running trials (e.g. waiting for KubeRay)
DEBOUNCE = 0.05  # after a wake-up: let a burst of events (a trial's pods) arrive before the tick
DELETE_WAIT = 30.0  # on.delete waits this long at most for the job's tick in flight


Key = tuple[str, str]


def snapshot(body: Any) -> dict:
    """A pod or RayJob as kept in the index: a copy without metadata.managedFields (the biggest part
    of a pod, and read by nobody)."""
    out = copy.deepcopy(dict(body))
    md = out.get("metadata")
    if isinstance(md, dict):
        md.pop("managedFields", None)
    return out


def job_key(namespace: Optional[str], labels: Any) -> Optional[Key]:
    job = (labels or {}).get(podspec.LABEL_JOB)
    return (namespace, job) if namespace and job else None


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
    # a daemon that does not exit at once is re-checked after this long (kopf's default is 60 s,
    # which held a deleted job, and so its trial pods, for a minute)
    settings.background.cancellation_polling = 1.0
    settings.background.instant_exit_timeout = 0.5

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
    memo.wakes = {}  # (namespace, name) -> asyncio.Event of the job's daemon
    memo.locks = {}  # (namespace, name) -> threading.Lock held by a tick and by the deletion
    memo.deleting = set()  # jobs whose deletion began: no tick acts on them any more
    memo.pool = ThreadPoolExecutor(operator_settings.current().workers, thread_name_prefix="rltune-reconcile")


@kopf.on.cleanup()
def shutdown(memo: kopf.Memo, **_: Any) -> None:
    """The daemons are stopped by now; a tick still running in a worker thread finishes on its own."""
    memo.pool.shutdown(wait=False, cancel_futures=True)


# ------------------------------------------------------------------ what the watches keep


@kopf.index("v1", "pods", labels={podspec.LABEL_JOB: kopf.PRESENT})
async def trial_pods(namespace: str, labels: dict, body: kopf.Body, **_: Any) -> Optional[dict]:
    key = job_key(namespace, labels)
    return {key: snapshot(body)} if key else None


@kopf.index(rayjob.GROUP, rayjob.VERSION, rayjob.PLURAL, labels={podspec.LABEL_JOB: kopf.PRESENT})
async def trial_rayjobs(namespace: str, labels: dict, body: kopf.Body, **_: Any) -> Optional[dict]:
    key = job_key(namespace, labels)
    return {key: snapshot(body)} if key else None


def _wake(memo: kopf.Memo, key: Optional[Key]) -> None:
    ev = memo.wakes.get(key) if key else None
    if ev is not None:
        ev.set()


@kopf.on.event("v1", "pods", labels={podspec.LABEL_JOB: kopf.PRESENT})
async def pod_event(namespace: str, labels: dict, memo: kopf.Memo, **_: Any) -> None:
    _wake(memo, job_key(namespace, labels))


@kopf.on.event(rayjob.GROUP, rayjob.VERSION, rayjob.PLURAL, labels={podspec.LABEL_JOB: kopf.PRESENT})
async def rayjob_event(namespace: str, labels: dict, memo: kopf.Memo, **_: Any) -> None:
    _wake(memo, job_key(namespace, labels))


@kopf.on.event(GROUP, VERSION, PLURAL)
async def job_event(namespace: str, name: str, memo: kopf.Memo, **_: Any) -> None:
    _wake(memo, (namespace, name))


# ------------------------------------------------------------------ one daemon per job


def _tick(memo: kopf.Memo, key: Key, body: dict, pods: list[dict], rayjobs: list[dict]) -> Optional[float]:
    """One reconcile (in a worker thread). Returns the seconds until the next one without events."""
    namespace, name = key
    interval = memo.reconciler.settings.reconcile_interval
    t0 = time.monotonic()
    lock = memo.locks.setdefault(key, threading.Lock())
    try:
        with lock:
            if key in memo.deleting:
                return None
            phase = memo.reconciler.reconcile(namespace, name, body=body, pods=pods, rayjobs=rayjobs)
        if phase:
            memo.phases[key] = phase
        return next_tick(body, interval, IDLE_INTERVAL)
    except Exception:  # noqa: BLE001 - a tick must never kill the daemon; retried after the interval
        selfmetrics.RECONCILE_ERRORS.inc()
        log.exception("reconcile of %s/%s failed", namespace, name)
        return interval
    finally:
        selfmetrics.RECONCILE_SECONDS.observe(time.monotonic() - t0)
        counts = Counter(memo.phases.values())
        for p in Phase:
            selfmetrics.JOBS.labels(p).set(counts.get(p, 0))


async def _sleep(wake: asyncio.Event, stopped: Any, timeout: Optional[float]) -> None:
    """Until an event woke the job, the daemon is stopped, or `timeout` seconds passed (None: never)."""
    waits = {asyncio.ensure_future(wake.wait()), asyncio.ensure_future(stopped.wait())}
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=1.0)
async def drive_job(
    namespace: str,
    name: str,
    body: kopf.Body,
    memo: kopf.Memo,
    stopped: Any,
    trial_pods: kopf.Index,
    trial_rayjobs: kopf.Index,
    **_: Any,
) -> None:
    """Reconcile the job whenever it or one of its pods/RayJobs changes, and on its timer (next_tick).
    `body` is kopf's live view of the job; it and the indexes are copied here, in the event loop,
    before the tick runs in a worker thread."""
    key: Key = (namespace, name)
    wake = memo.wakes[key] = asyncio.Event()
    loop = asyncio.get_running_loop()
    try:
        while not stopped:
            wake.clear()
            job = copy.deepcopy(dict(body))
            pods = list(trial_pods.get(key, ()))
            rayjobs = list(trial_rayjobs.get(key, ()))
            # in the daemon's context: kopf.info/warn find kopf's event queue in context variables
            ctx = contextvars.copy_context()
            timeout = await loop.run_in_executor(memo.pool, ctx.run, _tick, memo, key, job, pods, rayjobs)
            await _sleep(wake, stopped, timeout)
            if wake.is_set() and not stopped:
                await asyncio.sleep(DEBOUNCE)
    finally:
        if memo.wakes.get(key) is wake:
            del memo.wakes[key]


# ------------------------------------------------------------------ deletion


def _delete_trials(memo: kopf.Memo, key: Key, uid: str, trials: list[str]) -> None:
    """Waits for the job's tick in flight (so that it creates no pod after this), then deletes every
    trial's RayJob, pods, Service and NetworkPolicy that the job (UID `uid`) owns."""
    namespace, name = key
    lock = memo.locks.setdefault(key, threading.Lock())
    got = lock.acquire(timeout=DELETE_WAIT)
    try:
        for trial in trials:
            memo.reconciler.cluster.delete_trial(namespace, name, trial, uid)
    finally:
        if got:
            lock.release()


@kopf.on.delete(GROUP, VERSION, PLURAL)
async def cleanup_job(
    namespace: str,
    name: str,
    uid: str,
    spec: dict,
    status: dict,
    memo: kopf.Memo,
    trial_pods: kopf.Index,
    trial_rayjobs: kopf.Index,
    **_: Any,
) -> None:
    """Any phase: the trial pods, Services and RayJobs are deleted now (not by garbage collection once
    the job is gone: they hold GPUs), then the trials' Pushgateway groups."""
    key: Key = (namespace, name)
    memo.deleting.add(key)
    memo.phases.pop(key, None)
    status = status or {}
    trials = [t.get("id") for t in status.get("trials") or [] if t.get("id")]
    active = [t.get("id") for t in status.get("trials") or [] if t.get("id") and t.get("state") in ACTIVE_STATES]
    seen = {(o.get("metadata") or {}).get("labels", {}).get(podspec.LABEL_TRIAL) for o in trial_pods.get(key, ())}
    seen |= {(o.get("metadata") or {}).get("labels", {}).get(podspec.LABEL_TRIAL) for o in trial_rayjobs.get(key, ())}
    doomed = list(dict.fromkeys([*active, *sorted(t for t in seen if t)]))
    t0 = time.monotonic()
    try:
        await asyncio.get_running_loop().run_in_executor(memo.pool, _delete_trials, memo, key, uid, doomed)
    finally:
        memo.locks.pop(key, None)
    log.info(
        "deleted %d trials' pods/services/RayJobs of %s/%s in %.1fs",
        len(doomed),
        namespace,
        name,
        time.monotonic() - t0,
    )
    named = (spec.get("metrics") or {}).get("pushgatewayUrl")
    if endpoints.problem(endpoints.PUSHGATEWAY, named, memo.reconciler.settings):
        named = None  # never a DELETE to an endpoint the admin did not list (the job never ran with it)
    pgw = prom.pushgateway_url(named)
    groups = trials if pgw else []
    if groups:
        await asyncio.get_running_loop().run_in_executor(
            memo.pool, lambda: [prom.delete_group(pgw, namespace, name, t) for t in groups]
        )
    log.info("deleted %d Pushgateway groups of %s/%s", len(groups), namespace, name)
    memo.deleting.discard(key)  # a job of the same name created later is a new job
