"""One reconcile of one RLTuningJob: read -> step -> write. The lifecycle itself is the pure
`rltune.tuner.lifecycle.step`; this module only turns pods and Prometheus into its observations and
its decisions into a status write, pods and events.

Stateless between calls: everything lives in the job's status and its pods, so a restarted operator
continues exactly where the last one stopped. Safety against duplicates: a trial is first recorded
in the status (state Pending), and its pods are created only after that status write succeeded
(optimistic concurrency on resourceVersion: a conflicting write skips the tick). Pod names are
deterministic, so re-creating after a crash hits 409 AlreadyExists instead of making a second pod.
Before a trial's pods are created, the cluster is asked whether some node can hold each of them and
whether the API server would accept them (a server-side dry run): a refusal is the trial's outcome,
not a create retried every tick.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Optional, Protocol

from .. import admission
from ..adapters.registry import adapter_for
from ..api.layout import nodes_for
from ..api.models import RLTuningJobSpec
from ..api.status import ACTIVE_STATES, FailureCause, Phase, RLTuningJobStatus, TrialState, TrialStatus
from ..settings import OperatorSettings
from ..settings import current as current_settings
from ..tuner import lifecycle, records
from . import endpoints, kueue, netpol, placement, podsecurity, podspec, prom, rayjob, trialkeys
from . import pods as pod_manifests

log = logging.getLogger("rltune.controller")


NO_KUBERAY = (
    "{} trials run as KubeRay RayJobs, and the ray.io/v1 RayJob kind is not installed: install the KubeRay "
    "operator (https://docs.ray.io/en/latest/cluster/kubernetes/getting-started/kuberay-operator-installation.html); "
    "the job starts by itself once it is there"
)


def is_terminating(obj: Optional[dict]) -> bool:
    """A pod or RayJob that is being deleted (None: none exists, nothing to delete)."""
    return obj is None or bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def next_tick(body: dict, interval: float, idle_interval: float) -> Optional[float]:
    """Seconds until a job must be reconciled again with no event about it, None: only on events.
    Active trials are scored from Prometheus and timed (trialTimeout, scheduleTimeout), which no
    watch reports: every `interval`. A finished job (Succeeded/Failed for its current generation)
    waits for events alone. Anything else (a job waiting for KubeRay, ...) every `idle_interval`."""
    status = body.get("status") or {}
    gen = int((body.get("metadata") or {}).get("generation") or 1)
    trials = status.get("trials") or []
    if any(t.get("state") in ACTIVE_STATES for t in trials):
        return interval
    if status.get("phase") in (Phase.SUCCEEDED, Phase.FAILED) and status.get("observedGeneration") == gen:
        return None
    return idle_interval


def disruption(pods: list[dict], lost: bool = False) -> str:
    """Why the cluster took a trial's pods away ("" = it did not): a pod's DisruptionTarget condition
    (evicted, its node tainted NoExecute or gone, preempted, node pressure:
    https://kubernetes.io/docs/concepts/workloads/pods/disruptions/#pod-disruption-conditions), or
    `lost`: a running trial's rank-0 pod is gone, which the operator never deletes itself. Not the
    configuration's fault: the lifecycle re-runs the trial once (TrialState.PREEMPTED)."""
    for p in pods:
        for c in (p.get("status") or {}).get("conditions") or []:
            if c.get("type") == "DisruptionTarget" and c.get("status") == "True":
                why = ": ".join(x for x in (c.get("reason"), c.get("message")) if x)
                return f"pod {p['metadata']['name']} disrupted: {why or 'DisruptionTarget'}"[:300]
    return "its rank-0 pod was deleted while it ran (node lost?)" if lost else ""


class Conflict(Exception):
    """The job changed since it was read; retry on the next tick."""


@dataclass(frozen=True)
class Refusal:
    """The API server would not create a trial object. `permanent`: invalid or forbidden by policy
    (the same spec would be refused again); otherwise (a namespace quota that is full) it may pass
    later."""

    message: str
    permanent: bool


# the namespace's quota is full: no refusal of the spec, the trial's pods are created later
QUOTA_FULL = lifecycle.Refusal(FailureCause.POD_REJECTED, "quota full")


class Cluster(Protocol):
    def get_job(self, namespace: str, name: str) -> Optional[dict]: ...
    def write_status(self, job: dict, status: dict) -> dict: ...  # raises Conflict
    def list_trial_pods(self, namespace: str, job: str) -> list[dict]: ...
    def create(self, manifest: dict) -> bool: ...  # True if created, False if it already existed
    def list_nodes(self) -> list[dict]: ...  # the cluster's nodes (may be a few seconds old)
    def refusal(self, manifest: dict) -> Optional[Refusal]: ...  # server-side dry run of a create
    def delete_trial(self, namespace: str, job: str, trial: str, uid: str) -> None: ...  # only what job `uid` owns
    def serves(self, kind: str) -> bool: ...  # an optional kind is installed (rayjob.KIND, kueue.LOCALQUEUE_KIND)
    def list_rayjobs(self, namespace: str, job: str) -> list[dict]: ...


class Metrics(Protocol):
    """A trial's signed metrics (`key`: the trial's signing key); `timeout`: what is left of the tick's
    time for metrics, in seconds."""

    def steps(
        self, prom_url: str, namespace: str, job: str, trial: str, key: str, overrides: Optional[dict], timeout: float
    ) -> prom.TrialSteps: ...
    def reason(
        self, prom_url: str, namespace: str, job: str, trial: str, key: str, overrides: Optional[dict], timeout: float
    ) -> Optional[str]: ...


class PromMetrics:
    def steps(self, prom_url, namespace, job, trial, key, overrides, timeout):
        return prom.query_trial(prom_url, namespace, job, trial, key, overrides, timeout=timeout)

    def reason(self, prom_url, namespace, job, trial, key, overrides, timeout):
        return prom.trial_reason(prom_url, namespace, job, trial, key, overrides, timeout=timeout)


# Seconds one tick of one job may spend on Prometheus in all (each query gets what is left, at most
# QUERY_TIMEOUT_S): a slow or dripping server delays that job's scoring, never a worker for long.
METRICS_BUDGET_S = 15.0
QUERY_TIMEOUT_S = 10.0


# A spec the operator will not run; `reason` is the SpecValid condition's reason (admission.Refused).
InvalidSpec = admission.Refused


def validate_spec(raw: dict) -> RLTuningJobSpec:
    """admission.parse: pydantic, the CEL-equivalent cross-field rules and the command read as the baseline."""
    return admission.parse(raw)


def preflight(spec: RLTuningJobSpec, settings: OperatorSettings) -> None:
    """What the operator refuses before any pod exists: a spec that contradicts itself (layouts,
    the model, the search space: tuner.validation), a twin scenario of the wrong shape, and pods
    (the podTemplate, merged into the trial pods, the job's tolerations and priority class) that ask
    for more than the cluster admin allows (podsecurity.check_job). (A verl/OpenRLHF command that
    does not load is refused in `validate_spec`, when its baseline is read.)"""
    problems = endpoints.problems(spec.metrics.prometheus_url, spec.metrics.pushgateway_url, settings)
    if problems:  # before anything else: no request is ever made to an endpoint the admin did not list
        raise InvalidSpec("; ".join(problems), "EndpointNotAllowed")
    problems = admission.problems(spec)  # the same check as `rltune plan`
    if problems:
        raise InvalidSpec("; ".join(problems[:4]))
    try:  # the podTemplate, the job's tolerations and priority class, and the trial pods it makes
        bad = podsecurity.check_job(spec, settings)
    except podspec.PodTemplateError as e:
        raise InvalidSpec(str(e), "InvalidPodTemplate") from None
    if bad:
        raise InvalidSpec("; ".join(f"{v.field}: {v.message}" for v in bad[:4]), "PodSecurityViolation")


class Reconciler:
    def __init__(
        self,
        cluster: Cluster,
        metrics: Optional[Metrics] = None,
        emit: Optional[Callable[[dict, str, str, str], None]] = None,
        on_trial_started: Optional[Callable[[str], None]] = None,
        on_trial_finished: Optional[Callable[[str], None]] = None,
        clock: Callable[[], float] = time.time,
        settings: Optional[OperatorSettings] = None,
    ):
        self.cluster = cluster
        self.settings = settings or current_settings()
        self.metrics = metrics or PromMetrics()
        self.emit = emit or (lambda body, type_, reason, message: None)
        self.on_trial_started = on_trial_started or (lambda kind: None)
        self.on_trial_finished = on_trial_finished or (lambda state: None)
        self.clock = clock
        # (namespace, name) -> {resourceVersion a status write replaced: the job that write returned}
        self._written: dict[tuple[str, str], dict[str, dict]] = {}
        # (namespace, name, trial) -> unsigned steps already warned about
        self._forged: dict[tuple[str, str, str], int] = {}

    def _warn_forged(self, body: dict, trial: str, n: int) -> None:
        """Series under a trial's key that its pods did not sign: ignored, and said (never scored)."""
        msg = (
            f"trial {trial}: {n} step(s) in Prometheus under this trial's labels carry no valid signature and were "
            "ignored (pushed by a pod other than the trial's own?)"
        )
        log.warning("%s/%s: %s", body["metadata"]["namespace"], body["metadata"]["name"], msg)
        try:
            self.emit(body, "Warning", "UnsignedMetrics", msg)
        except Exception as err:  # noqa: BLE001
            log.debug("event not posted: %s", err)

    def _fresher(self, body: dict) -> dict:
        """`body`, or the job as this reconciler's own status writes left it when `body` is the basis
        of one of them (the watch has not delivered them yet). The writes carry the resourceVersion
        they replace, so they form one chain with nobody else's write in between: a watched
        resourceVersion outside the chain is newer than all of it. Versions are only compared for
        equality, never ordered."""
        md = body["metadata"]
        key = (md.get("namespace"), md.get("name"))
        chain = self._written.get(key)
        rv = md.get("resourceVersion")
        if not chain or rv not in chain:
            self._written.pop(key, None)  # the watch caught up (or someone else wrote): its body is newest
            return body
        used = set()
        while rv in chain and rv not in used:
            used.add(rv)
            body = chain[rv]
            rv = body["metadata"].get("resourceVersion")
        self._written[key] = {k: v for k, v in chain.items() if k in used}  # older bases are past
        return body

    def reconcile(
        self,
        namespace: str,
        name: str,
        body: Optional[dict] = None,
        pods: Optional[list[dict]] = None,
        rayjobs: Optional[list[dict]] = None,
    ) -> Optional[str]:
        """One tick. Returns the job's phase after it (None if the job is gone).

        `body`, `pods`, `rayjobs`: the job, its trial pods and its trial RayJobs as the caller's watch
        (the operator's kopf watches and indexes) last saw them; each one not given is read from the
        API server. With all three given, a tick that changes nothing makes no API request. A body
        older than this reconciler's own last status write of the job (the watch has not delivered
        that write yet) is replaced by the written one; a stale body otherwise only costs a Conflict."""
        if body is None:
            body = self.cluster.get_job(namespace, name)
        else:
            body = self._fresher(body)
        if body is None or body["metadata"].get("deletionTimestamp"):
            self._written.pop((namespace, name), None)
            self._forged = {k: n for k, n in self._forged.items() if k[:2] != (namespace, name)}
            return None
        gen = int(body["metadata"].get("generation") or 1)
        now = self.clock()
        status = RLTuningJobStatus.model_validate(body.get("status") or {})
        try:
            spec = validate_spec(body.get("spec") or {})
            preflight(spec, self.settings)
        except InvalidSpec as e:
            d = lifecycle.refuse_spec(status, e.reason, str(e), gen, now)
            self._commit(body, status, d, [], spec=None)
            return d.status.phase
        on_ray = adapter_for(spec.workload.framework) is not None
        if on_ray and not self.cluster.serves(rayjob.KIND):
            d = lifecycle.wait_for(
                status, "RayAvailable", "KubeRayMissing", NO_KUBERAY.format(spec.workload.framework), gen, now
            )
            self._commit(body, status, d, [], spec)
            return d.status.phase
        queue = kueue.queue_for(spec, self.settings)
        if queue and not self.cluster.serves(kueue.LOCALQUEUE_KIND):
            d = lifecycle.wait_for(status, "QueueAvailable", "KueueMissing", kueue.NO_KUEUE.format(queue), gen, now)
            self._commit(body, status, d, [], spec)
            return d.status.phase
        if queue:
            msg = f"trials are admitted through the Kueue LocalQueue {queue}"
            lifecycle.set_condition(status, "QueueAvailable", "True", "Kueue", msg, gen, now)
        pods_by_trial: dict[str, list[dict]] = defaultdict(list)
        for p in self.cluster.list_trial_pods(namespace, name) if pods is None else pods:
            pods_by_trial[p["metadata"]["labels"].get(podspec.LABEL_TRIAL, "")].append(p)
        if not on_ray:
            rayjobs = []
        elif rayjobs is None:
            rayjobs = self.cluster.list_rayjobs(namespace, name)
        rayjobs = {r["metadata"]["labels"].get(podspec.LABEL_TRIAL, ""): r for r in rayjobs}
        if on_ray:
            lifecycle.set_condition(
                status, "RayAvailable", "True", "KubeRay", "trials run as KubeRay RayJobs", gen, now
            )
        observations = self._observe(spec, status, pods_by_trial, body, rayjobs)
        # the tick's time budget for the search (docs/operator.md 'Bounded work per job'), shared by its steps
        tick_end = time.monotonic() + self.settings.tick_budget_seconds
        d = lifecycle.step(spec, status, observations, now, gen, self.settings.tick_budget_seconds)
        # pods of trials that are no longer active (and leftovers of a crash after a status write)
        active = {t.id for t in d.status.trials if t.state.is_active}
        # (a trial whose pods and RayJob are all being deleted already is not torn down again)
        d.teardown.extend(
            tid
            for tid in {**pods_by_trial, **rayjobs}
            if tid not in active and not all(is_terminating(o) for o in [*pods_by_trial.get(tid, []), rayjobs.get(tid)])
        )
        # pods of Pending trials that have none yet, once the cluster says they can exist
        create: list[dict] = []
        for _ in range(3):  # a refused trial may make the search start another one: check it too
            refused: dict[str, lifecycle.Observation] = {}
            create = []
            for t in d.status.trials:
                missing = (
                    t.id not in rayjobs
                    if on_ray
                    else len(pods_by_trial.get(t.id, []))
                    < nodes_for(t.gpus or 1, records.spec_of_trial(spec, t).resources.gpus_per_node)
                )
                if t.state == TrialState.PENDING and missing:
                    tspec = records.spec_of_trial(spec, t)  # a pool trial runs in its pool
                    manifests = self._manifests(body, tspec, t)
                    r = self._refusal(manifests, tspec.resources.gpus_per_node)
                    if r is None:
                        create.extend(manifests)
                    elif r is not QUOTA_FULL:  # a full quota: stays Pending, scheduleTimeoutSeconds applies
                        refused[t.id] = lifecycle.Observation(refused=r)
            if not refused:
                break
            d = d.then(lifecycle.step(spec, d.status, refused, now, gen, max(0.0, tick_end - time.monotonic())))
        self._commit(body, status, d, create, spec)
        return d.status.phase

    # ------------------------------------------------------------------ observe

    def _observe(
        self,
        spec: RLTuningJobSpec,
        status: RLTuningJobStatus,
        pods_by_trial: dict[str, list[dict]],
        body: dict,
        rayjobs: dict[str, dict],
    ) -> dict[str, lifecycle.Observation]:
        """What the pods and Prometheus say of each active trial. Metrics are read only where the
        lifecycle needs them: trials being scored, finishing, search trials (candidates for early stop) and
        confirmations (the interim look)."""
        try:
            prom_url, no_prom = prom.prometheus_url(spec.metrics.prometheus_url), ""
        except prom.MetricsError as e:  # nothing can be scored: trials end MetricsUnavailable, saying why
            prom_url, no_prom = "", str(e)
        md = body["metadata"]
        namespace, name, uid = md["namespace"], md["name"], md.get("uid", "")
        names = spec.metrics.names
        deadline = time.monotonic() + METRICS_BUDGET_S

        def left() -> float:
            return min(QUERY_TIMEOUT_S, deadline - time.monotonic())

        out: dict[str, lifecycle.Observation] = {}
        for t in status.trials:
            if not t.state.is_active:
                continue
            key = trialkeys.key_for(self.settings, namespace, uid, t.id)
            pods = pods_by_trial.get(t.id, [])
            n = nodes_for(t.gpus or 1, records.spec_of_trial(spec, t).resources.gpus_per_node)
            if t.id in rayjobs or adapter_for(spec.workload.framework) is not None:
                # a RayJob: the head and workers hold the GPUs; the Ray job's status says how it ended
                pods = [p for p in pods if p["metadata"]["labels"].get(podspec.LABEL_RANK) != "submitter"]
                ok, why = rayjob.outcome(rayjobs.get(t.id))
                failed = [p for p in pods if pod_manifests.pod_phase(p) == "Failed"]
                placed = len(pods) >= n and all(pod_manifests.is_scheduled(p) for p in pods)
                done = t.state != TrialState.PENDING and ok
                failure = why or (pod_manifests.failure_reason(failed[0]) if failed else "")
                lost = False  # KubeRay re-creates lost Ray pods itself
            else:
                rank0 = next((p for p in pods if p["metadata"]["labels"].get(podspec.LABEL_RANK) == "0"), None)
                failed = [p for p in pods if pod_manifests.pod_phase(p) == "Failed"]
                placed = len(pods) >= n and all(pod_manifests.is_scheduled(p) for p in pods)
                done = t.state != TrialState.PENDING and (
                    rank0 is None or pod_manifests.pod_phase(rank0) == "Succeeded"
                )
                failure = pod_manifests.failure_reason(failed[0]) if failed else ""
                lost = t.state == TrialState.RUNNING and rank0 is None
            exported = None
            if failure and prom_url and left() > 0:
                exported = self.metrics.reason(prom_url, namespace, name, t.id, key, names, left())
            steps, err = None, ""
            if not failure and (
                t.state == TrialState.SCORING
                or (t.state == TrialState.RUNNING and (done or t.kind in ("search", "confirm")))
            ):
                try:
                    if not prom_url:
                        steps, err = [], no_prom
                    elif left() <= 0:
                        steps, err = [], f"this tick's {METRICS_BUDGET_S:g} s for Prometheus ran out; read next tick"
                    else:
                        got = self.metrics.steps(prom_url, namespace, name, t.id, key, names, left())
                        steps = got.steps
                        if got.forged > self._forged.get((namespace, name, t.id), 0):
                            self._forged[(namespace, name, t.id)] = got.forged
                            self._warn_forged(body, t.id, got.forged)
                except prom.MetricsError as e:
                    steps, err = [], str(e)
            out[t.id] = lifecycle.Observation(
                placed=placed,
                pods=n,
                done=done,
                failure=failure,
                exit_code=pod_manifests.exit_code(failed[0]) if failed else None,
                exported_reason=exported,
                pending_reason=next(
                    (pod_manifests.unschedulable_message(p) for p in pods if pod_manifests.unschedulable_message(p)), ""
                ),
                steps=steps,
                metrics_error=err,
                preempted=disruption(pods, lost)
                or kueue.evicted(pods, rayjobs.get(t.id), t.state == TrialState.RUNNING),
                gated=kueue.gated(pods, rayjobs.get(t.id)),
            )
        return out

    def _manifests(self, body: dict, spec: RLTuningJobSpec, t: TrialStatus) -> list[dict]:
        md = body["metadata"]
        owner = {
            "apiVersion": body.get("apiVersion", "rltune.io/v1alpha1"),
            "kind": body.get("kind", "RLTuningJob"),
            "name": md["name"],
            "uid": md["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
        config = records.config_from_diff(spec.baseline, t.config)
        key = trialkeys.key_for(self.settings, md["namespace"], md["uid"], t.id)
        # the trial's NetworkPolicy first: its pods never run unfenced (controller/netpol.py)
        policy = netpol.trial_policy(md["namespace"], md["name"], t.id, owner, self.settings.network_policy)
        fence = [policy] if policy else []
        if adapter_for(spec.workload.framework) is not None:
            pgw = prom.pushgateway_url(spec.metrics.pushgateway_url)
            return fence + [
                rayjob.rayjob_manifest(
                    md["namespace"], md["name"], owner, spec, t.id, config, t.steps, pgw, self.settings, metrics_key=key
                )
            ]
        pods, svc = pod_manifests.trial_manifests(
            md["namespace"],
            md["name"],
            owner,
            spec,
            t.id,
            records.config_from_diff(spec.baseline, t.config),
            t.steps,
            spec.budget.warmup_steps,
            prom.pushgateway_url(spec.metrics.pushgateway_url),
            settings=self.settings,
            metrics_key=key,
        )
        return fence + ([svc] if svc else []) + pods

    def _refusal(self, manifests: list[dict], gpus_per_node: int) -> Optional[lifecycle.Refusal]:
        """Why the trial cannot get its pods: no node can hold one (each pod is checked against the
        cluster's nodes), or the API server refuses one (asked as a server-side dry run: validation,
        strict field checks, admission and Pod Security). A full quota is no refusal: it may pass later."""
        # first whether the pods are valid at all (an invalid toleration would otherwise show up as
        # a node it cannot tolerate), then whether the cluster has a node of the job's size for each
        # a RayJob's pods are created by KubeRay: their templates are dry-run as pods here (Pod
        # Security admission, quotas), so that a refusal is this trial's outcome, not a RayCluster
        # that never gets its pods
        for m in manifests + [p for rj in manifests for p in rayjob.pods_of(rj)]:
            r = self.cluster.refusal(m)
            if r is not None and r.permanent:
                return lifecycle.Refusal(
                    FailureCause.POD_REJECTED, f"trial {m['kind'].lower()} {m['metadata']['name']} refused: {r.message}"
                )
            if r is not None:
                return QUOTA_FULL
        trial_pods = [m for m in manifests if m["kind"] == "Pod"] + [p for rj in manifests for p in rayjob.pods_of(rj)]
        nodes = self.cluster.list_nodes() if trial_pods else []
        for m in trial_pods:
            why = placement.check_gpus_per_node(nodes, m["spec"], gpus_per_node) or placement.check_pool(
                nodes, m["spec"]
            )
            if why:
                return lifecycle.Refusal(FailureCause.NO_MATCHING_NODES, why)
        return None

    # ------------------------------------------------------------------ write

    def _commit(
        self,
        body: dict,
        before: RLTuningJobStatus,
        d: lifecycle.Decisions,
        create: list[dict],
        spec: Optional[RLTuningJobSpec],
    ) -> None:
        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
        after = d.status.dump()
        if after != before.dump():
            basis = body["metadata"].get("resourceVersion")
            for attempt in range(2):
                try:
                    written = self.cluster.write_status(body, after)
                    if isinstance(written, dict) and (written.get("metadata") or {}).get("resourceVersion"):
                        # what a watch copy of `basis` (or of the fresh job written over) has become
                        for rv in {basis, body["metadata"].get("resourceVersion")}:
                            self._written.setdefault((ns, name), {})[rv] = written
                    break
                except Conflict:
                    # A user's edit (labels, spec) meanwhile leaves the status this tick started from in
                    # place: write once more over the fresh job, or frequent edits would starve the
                    # operator (observedGeneration still names the spec this tick used). A status that
                    # someone else wrote meanwhile skips the tick.
                    fresh = self.cluster.get_job(ns, name) if attempt == 0 else None
                    if (
                        fresh is None
                        or fresh["metadata"].get("deletionTimestamp")
                        or (fresh.get("status") or {}) != (body.get("status") or {})
                    ):
                        log.info("%s/%s changed meanwhile; next tick", ns, name)
                        return
                    body = fresh
        # finished trials' pods go first: the GPUs a new trial was given are theirs, and created first
        # the new pods would hold them alongside for a moment (over gpuBudget until the delete lands)
        for trial in dict.fromkeys(d.teardown):
            self.cluster.delete_trial(ns, name, trial, body["metadata"].get("uid", ""))
        unfenced: set[str] = set()  # trials whose NetworkPolicy was not created: no pods for them this tick
        for m in create:
            trial = (m["metadata"].get("labels") or {}).get(podspec.LABEL_TRIAL, "")
            if trial in unfenced:
                continue
            try:
                self.cluster.create(m)
            except Exception as e:  # noqa: BLE001 - reported, retried next tick
                log.warning("creating %s %s failed: %s", m["kind"], m["metadata"]["name"], e)
                if m["kind"] == netpol.KIND:
                    unfenced.add(trial)
        for _ in d.started:
            self.on_trial_started("trial")
        for state in d.finished:
            self.on_trial_finished(str(state))
        for e in d.events:
            try:
                self.emit(body, e.type, e.reason, e.message)
            except Exception as err:  # noqa: BLE001
                log.debug("event not posted: %s", err)
