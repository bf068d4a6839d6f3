"""One reconcile of one RLTuningJob: read status + pods, advance trials, ask the tuner, write status,
create pods. Stateless between calls: everything lives in the job's status and its pods, so a
restarted operator continues exactly where the last one stopped.

Safety against duplicates: a trial is first recorded in the status (state Pending), and its pods
are created only after that status write succeeded (optimistic concurrency on resourceVersion: a
conflicting write skips the tick). Pod names are deterministic, so re-creating after a crash hits
409 AlreadyExists instead of making a second pod.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Optional, Protocol

from pydantic import ValidationError

from ..api.models import RLConfig, RLTuningJobSpec
from ..api.status import ACTIVE_STATES, BaselineStatus, BestStatus, Condition, RLTuningJobStatus, TrialStatus
from ..settings import OperatorSettings
from ..settings import current as current_settings
from . import placement, podsecurity, prom
from . import pods as P
from . import tunerport as tp
from .render import render_overrides

log = logging.getLogger("rltune.controller")

TERMINAL_PHASES = ("Succeeded", "Failed")
FAILED_STATES = ("Failed", "Unschedulable", "MetricsUnavailable", "TimedOut")


class Conflict(Exception):
    """The job changed since it was read; retry on the next tick."""


@dataclass(frozen=True)
class Refusal:
    """The API server would not create a trial object. `permanent`: invalid or forbidden by policy
    (the same spec would be refused again); otherwise (a namespace quota that is full) it may pass
    later."""

    message: str
    permanent: bool


class Cluster(Protocol):
    def get_job(self, namespace: str, name: str) -> Optional[dict]: ...
    def write_status(self, job: dict, status: dict) -> dict: ...  # raises Conflict
    def list_trial_pods(self, namespace: str, job: str) -> list[dict]: ...
    def create(self, manifest: dict) -> bool: ...  # True if created, False if it already existed
    def list_nodes(self) -> list[dict]: ...  # the cluster's nodes (may be a few seconds old)
    def refusal(self, manifest: dict) -> Optional["Refusal"]: ...  # server-side dry run of a create
    def delete_trial(self, namespace: str, job: str, trial: str) -> None: ...


class Metrics(Protocol):
    def steps(self, prom_url: str, namespace: str, job: str, trial: str, overrides: Optional[dict]) -> list: ...


class PromMetrics:
    def steps(self, prom_url, namespace, job, trial, overrides):
        return prom.query_trial(prom_url, namespace, job, trial, overrides)

    def reason(self, prom_url, namespace, job, trial, overrides):
        return prom.trial_reason(prom_url, namespace, job, trial, overrides)


REASON_GRACE_SECONDS = 5.0  # how long a failed trial's exported reason may take to reach Prometheus


def now_iso(t: Optional[float] = None) -> str:
    return datetime.fromtimestamp(t if t is not None else time.time(), timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_iso(s: Optional[str]) -> Optional[float]:
    if not s:
        return None
    return datetime.strptime(s, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()


class InvalidSpec(ValueError):
    """A spec the operator will not run; `reason` is the SpecValid condition's reason."""

    def __init__(self, message: str, reason: str = "InvalidSpec"):
        super().__init__(message)
        self.reason = reason


def validate_spec(raw: dict) -> RLTuningJobSpec:
    """pydantic validation plus the cross-field rules the CRD checks with CEL; the message names the field."""
    try:
        spec = RLTuningJobSpec.model_validate(raw or {})
    except ValidationError as e:
        errs = []
        for err in e.errors()[:3]:
            loc = ".".join(str(x) for x in err["loc"])
            msg = err["msg"].removeprefix("Value error, ")
            errs.append(f"spec.{loc}: {msg}" if loc else f"spec: {msg}")
        raise InvalidSpec("; ".join(errs)) from None
    b = spec.baseline
    if b.placement == "disaggregated" and b.trainer_gpus is not None and b.trainer_gpus >= tp.gpus_of(spec, b):
        raise InvalidSpec("spec.baseline.trainerGpus must be fewer than baseline.gpus when placement is disaggregated")
    return spec


def preflight(spec: RLTuningJobSpec, settings: OperatorSettings) -> None:
    """What the operator refuses before any pod exists: a framework it cannot run for real (it never
    runs the twin in its place) and a podTemplate that asks for more than the cluster admin allows."""
    why = placement.supported_framework(spec)
    if why:
        raise InvalidSpec(why, "UnsupportedFramework")
    if spec.resources.pod_template:
        bad = podsecurity.check_pod_template(spec.resources.pod_template, settings.pod_security)
        if bad:
            raise InvalidSpec("; ".join(f"{v.field}: {v.message}" for v in bad[:4]), "PodSecurityViolation")
        try:
            P.merge_pod_spec({}, spec.resources.pod_template)
        except P.PodTemplateError as e:
            raise InvalidSpec(str(e), "InvalidPodTemplate") from None


@dataclass
class Tick:
    """What one reconcile decided, applied after the status write succeeded."""

    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)
    create: list[dict] = field(default_factory=list)
    teardown: list[str] = field(default_factory=list)
    started: int = 0
    finished: list[str] = field(default_factory=list)

    def info(self, reason: str, message: str) -> None:
        self.events.append(("Normal", reason, message))

    def warn(self, reason: str, message: str) -> None:
        self.events.append(("Warning", reason, message))


class Reconciler:
    def __init__(self, cluster: Cluster, metrics: Optional[Metrics] = None,
                 emit: Optional[Callable[[dict, str, str, str], None]] = None,
                 on_trial_started: Optional[Callable[[str], None]] = None,
                 on_trial_finished: Optional[Callable[[str], None]] = None,
                 clock: Callable[[], float] = time.time, settings: Optional[OperatorSettings] = None):
        self.cluster = cluster
        self.settings = settings or current_settings()
        self.metrics = metrics or PromMetrics()
        self.emit = emit or (lambda body, type_, reason, message: None)
        self.on_trial_started = on_trial_started or (lambda kind: None)
        self.on_trial_finished = on_trial_finished or (lambda state: None)
        self.clock = clock

    # ------------------------------------------------------------------ entry point

    def reconcile(self, namespace: str, name: str) -> Optional[str]:
        """Returns the job's phase after the tick (None if the job is gone)."""
        body = self.cluster.get_job(namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return None
        gen = int(body["metadata"].get("generation") or 1)
        now = self.clock()
        tick = Tick()
        status = RLTuningJobStatus.model_validate(body.get("status") or {})
        before = status.dump()
        if status.started_at is None:
            status.started_at = now_iso(now)

        try:
            spec = validate_spec(body.get("spec") or {})
            preflight(spec, self.settings)
        except InvalidSpec as e:
            if status.observed_generation != gen or status.phase != "Failed":
                tick.warn(e.reason, str(e))
            status.observed_generation = gen
            self._set_phase(status, "Failed", str(e), gen, now, failure=(e.reason, str(e)))
            self._set_condition(status, "SpecValid", "False", e.reason, str(e), gen, now)
            self._commit(body, before, status, tick)
            return status.phase
        self._set_condition(status, "SpecValid", "True", "Valid", "the spec passed validation", gen, now)

        if status.phase in TERMINAL_PHASES and status.observed_generation == gen:
            pods = self.cluster.list_trial_pods(namespace, name)
            for trial in {p["metadata"]["labels"].get(P.LABEL_TRIAL) for p in pods}:
                tick.teardown.append(trial)  # leftovers of a crash between status write and cleanup
            self._commit(body, before, status, tick)
            return status.phase
        if status.phase in TERMINAL_PHASES:  # the spec changed after the job ended: resume
            base = next((t for t in status.trials if t.kind == "baseline"), None)
            if base is not None and base.state == "Succeeded":
                tick.info("Resumed", f"spec changed (generation {gen}): searching again")
                status.completed_at = None
                status.best = None if status.best and not status.best.confirmed else status.best
                self._set_phase(status, "Searching", "resumed after a spec change", gen, now)
            else:  # it ended before a baseline was measured (invalid spec, no node for it): start over
                tick.info("Restarted", f"spec changed (generation {gen}): profiling the baseline again")
                status.trials = [t for t in status.trials if t.kind != "baseline"]
                status.baseline, status.completed_at = None, None
                self._set_phase(status, "Pending", "spec changed: starting over", gen, now)
        status.observed_generation = gen

        trials_by_id = {t.id: t for t in status.trials}
        pods_by_trial: dict[str, list[dict]] = defaultdict(list)
        for p in self.cluster.list_trial_pods(namespace, name):
            pods_by_trial[p["metadata"]["labels"].get(P.LABEL_TRIAL, "")].append(p)
        for trial_id in pods_by_trial:
            t = trials_by_id.get(trial_id)
            if t is None or t.state not in ACTIVE_STATES:
                tick.teardown.append(trial_id)

        ctx = _Ctx(self, body, spec, status, tick, now, namespace, name)
        if status.phase in ("Pending", "Validating"):
            ctx.start_baseline()
        for t in list(status.trials):
            if t.state in ACTIVE_STATES:
                ctx.advance(t, pods_by_trial.get(t.id, []))
        ctx.decide()

        # pods of active trials that are missing: created after the status write, and only when some
        # node of the cluster can hold each of them (else the trial would wait for its timeout)
        for t in status.trials:
            if t.state == "Pending" and len(pods_by_trial.get(t.id, [])) < P.ranks_for(t.gpus or 1, spec.resources.gpus_per_node):
                manifests = ctx.manifests(t)
                why = self._unplaceable(manifests, spec.resources.gpus_per_node)
                refused = None if why else self._refused(manifests)
                if why:
                    ctx.unplaceable(t, why)
                elif refused is not None and refused.permanent:
                    ctx.rejected(t, refused.message)
                elif refused is None:
                    tick.create.extend(manifests)
                # else: a full quota; the trial stays Pending (scheduleTimeoutSeconds still applies)
        self._sync_counters(spec, status)
        self._commit(body, before, status, tick)
        return status.phase

    # ------------------------------------------------------------------ helpers

    def _unplaceable(self, manifests: list[dict], gpus_per_node: int) -> Optional[str]:
        """Why no node of the cluster can run some pod of a trial (None: each pod fits some node)."""
        trial_pods = [m for m in manifests if m["kind"] == "Pod"]
        if not trial_pods:
            return None
        nodes = self.cluster.list_nodes()
        for m in trial_pods:
            why = placement.check_pool(nodes, m["spec"]) or \
                placement.check_gpus_per_node(nodes, m["spec"], gpus_per_node)
            if why:
                return why
        return None

    def _refused(self, manifests: list[dict]) -> Optional[Refusal]:
        """The API server's answer to creating the trial's objects, asked as a server-side dry run
        (validation, strict field checks and admission, Pod Security included): a refusal becomes
        the trial's outcome instead of a create retried every tick."""
        for m in manifests:
            r = self.cluster.refusal(m)
            if r is not None:
                kind = m["kind"]
                return Refusal(f"the API server refused {kind.lower()} {m['metadata']['name']}: {r.message}",
                               r.permanent)
        return None

    def _commit(self, body: dict, before: dict, status: RLTuningJobStatus, tick: Tick) -> None:
        after = status.dump()
        if after != before:
            try:
                self.cluster.write_status(body, after)
            except Conflict:
                log.info("%s/%s changed meanwhile; next tick", body["metadata"]["namespace"], body["metadata"]["name"])
                return
        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
        for m in tick.create:
            try:
                if self.cluster.create(m) and m["kind"] == "Pod" and m["metadata"]["labels"].get(P.LABEL_RANK) == "0":
                    pass
            except Exception as e:  # noqa: BLE001 - reported, retried next tick
                log.warning("creating %s %s failed: %s", m["kind"], m["metadata"]["name"], e)
        for trial in dict.fromkeys(tick.teardown):
            self.cluster.delete_trial(ns, name, trial)
        for _ in range(tick.started):
            self.on_trial_started("trial")
        for state in tick.finished:
            self.on_trial_finished(state)
        for type_, reason, message in tick.events:
            try:
                self.emit(body, type_, reason, message)
            except Exception as e:  # noqa: BLE001
                log.debug("event not posted: %s", e)

    @staticmethod
    def _set_condition(status: RLTuningJobStatus, type_: str, value: str, reason: str, message: str,
                       gen: int, now: float) -> None:
        for c in status.conditions:
            if c.type == type_:
                if c.status != value:
                    c.last_transition_time = now_iso(now)
                c.status, c.reason, c.message, c.observed_generation = value, reason, message[:1000], gen  # type: ignore[assignment]
                return
        status.conditions.append(Condition(type=type_, status=value, reason=reason, message=message[:1000],  # type: ignore[arg-type]
                                           last_transition_time=now_iso(now), observed_generation=gen))

    def _set_phase(self, status: RLTuningJobStatus, phase: str, message: str, gen: int, now: float,
                   failure: Optional[tuple[str, str]] = None, complete: Optional[tuple[str, str]] = None) -> None:
        status.phase = phase  # type: ignore[assignment]
        status.message = message[:500]
        # kstatus conditions (what `kubectl wait --for=condition=Ready` and GitOps health checks read)
        self._set_condition(status, "Ready", "True" if phase == "Succeeded" else "False",
                            (complete or failure or (phase, ""))[0], message, gen, now)
        self._set_condition(status, "Reconciling", "False" if phase in TERMINAL_PHASES else "True",
                            phase, message, gen, now)
        self._set_condition(status, "Stalled", "True" if phase == "Failed" else "False",
                            (failure or (phase, ""))[0], message, gen, now)
        if phase in TERMINAL_PHASES:
            status.completed_at = status.completed_at or now_iso(now)
            self._set_condition(status, "Progressing", "False", phase, message, gen, now)
        else:
            self._set_condition(status, "Progressing", "True", phase, message, gen, now)
        if failure:
            self._set_condition(status, "Failed", "True", failure[0], failure[1], gen, now)
            self._set_condition(status, "Complete", "False", "Failed", failure[1], gen, now)
        elif complete:
            self._set_condition(status, "Complete", "True", complete[0], complete[1], gen, now)
            self._set_condition(status, "Failed", "False", "Succeeded", "", gen, now)
        elif phase not in TERMINAL_PHASES:
            self._set_condition(status, "Complete", "False", "InProgress", message, gen, now)
            self._set_condition(status, "Failed", "False", "InProgress", "", gen, now)

    @staticmethod
    def _sync_counters(spec: RLTuningJobSpec, status: RLTuningJobStatus) -> None:
        search = [t for t in status.trials if t.kind == "search"]
        done = sum(1 for t in search if t.state not in ACTIVE_STATES)
        status.trials_done = f"{done}/{spec.budget.max_trials}"
        status.trials_failed = sum(1 for t in search if t.state in FAILED_STATES)


class _Ctx:
    """The state of one reconcile (so the steps below read like the lifecycle they implement)."""

    def __init__(self, r: Reconciler, body: dict, spec: RLTuningJobSpec, status: RLTuningJobStatus, tick: Tick,
                 now: float, namespace: str, name: str):
        self.r, self.body, self.spec, self.status, self.tick, self.now = r, body, spec, status, tick, now
        self.ns, self.name = namespace, name
        self.gen = int(body["metadata"].get("generation") or 1)
        self.prom_url = prom.prometheus_url(spec.metrics.prometheus_url)
        self.pgw_url = prom.pushgateway_url(spec.metrics.pushgateway_url)
        self._tuner = None
        self._tuner_dirty = True

    # ---------------------------------------------------------------- tuner (rebuilt lazily)

    def tuner(self):
        if self._tuner is None or self._tuner_dirty:
            self._tuner = tp.make_tuner(self.spec, self.status.trials)
            self._tuner_dirty = False
        return self._tuner

    # ---------------------------------------------------------------- trials

    def owner(self) -> dict:
        md = self.body["metadata"]
        return {"apiVersion": self.body.get("apiVersion", "rltune.io/v1alpha1"),
                "kind": self.body.get("kind", "RLTuningJob"), "name": md["name"], "uid": md["uid"],
                "controller": True, "blockOwnerDeletion": True}

    def config_of(self, t: TrialStatus) -> RLConfig:
        return tp.config_from_diff(self.spec.baseline, t.config)

    def manifests(self, t: TrialStatus) -> list[dict]:
        pods, svc = P.trial_manifests(self.ns, self.name, self.owner(), self.spec, t.id, self.config_of(t),
                                      t.steps, self.spec.budget.warmup_steps, self.pgw_url, settings=self.r.settings)
        return ([svc] if svc else []) + pods

    def add_trial(self, trial_id: str, kind: str, config: RLConfig, steps: int, predicted=None,
                  predicted_std=None, of: Optional[str] = None) -> TrialStatus:
        t = TrialStatus(id=trial_id, kind=kind, of=of, config=tp.config_diff(self.spec.baseline, config),  # type: ignore[arg-type]
                        gpus=tp.gpus_of(self.spec, config), steps=steps,
                        predicted_seconds=None if predicted is None else round(float(predicted), 4),
                        predicted_std=None if predicted_std is None else round(float(predicted_std), 4),
                        state="Pending", created_at=now_iso(self.now))
        self.status.trials.append(t)
        self.tick.started += 1
        changed = ", ".join(f"{k}={v}" for k, v in sorted(t.config.items())) or "the baseline configuration"
        pred = f", forecast {t.predicted_seconds:.1f}s/step" if t.predicted_seconds else ""
        self.tick.info("TrialStarted", f"trial {trial_id} ({kind}, {t.gpus} GPUs, {steps} steps): {changed}{pred}")
        self._tuner_dirty = True
        return t

    def start_baseline(self) -> None:
        if not any(t.kind == "baseline" for t in self.status.trials):
            self.add_trial("baseline", "baseline", self.spec.baseline, self.spec.budget.steps_per_trial)
        self.status.baseline = self.status.baseline or BaselineStatus(state="Pending", gpus=tp.gpus_of(self.spec, self.spec.baseline))
        self.r._set_phase(self.status, "Profiling", "profiling the baseline", self.gen, self.now)

    def finish(self, t: TrialStatus, state: str, reason: str) -> None:
        t.state = state  # type: ignore[assignment]
        t.reason = reason[:300] if reason else t.reason
        t.finished_at = t.finished_at or now_iso(self.now)
        self.tick.teardown.append(t.id)
        self.tick.finished.append(state)
        self._tuner_dirty = True
        measured = f", {t.measured_seconds:.1f}s/step" if t.measured_seconds else ""
        msg = f"trial {t.id} {state}{measured}" + (f": {t.reason}" if t.reason else "")
        (self.tick.info if state in ("Succeeded", "Stopped") else self.tick.warn)(f"Trial{state}", msg)

    def unplaceable(self, t: TrialStatus, why: str) -> None:
        """No node can hold a pod of `t`: the trial ends now; for the baseline, so does the job."""
        self.finish(t, "Unschedulable", why)
        if t.kind == "baseline":
            if self.status.baseline is not None:
                self.status.baseline.state, self.status.baseline.reason = "Unschedulable", why[:300]  # type: ignore[assignment]
            self.r._set_condition(self.status, "PodsSchedulable", "False", "NoMatchingNodes", why, self.gen, self.now)
            self.r._set_phase(self.status, "Failed", f"no node can run the baseline: {why}", self.gen, self.now,
                              failure=("NoMatchingNodes", why))

    def rejected(self, t: TrialStatus, why: str) -> None:
        """The API server refuses the trial's pods (invalid or against policy): the spec is at fault,
        so the job fails with the server's message instead of retrying every tick."""
        self.finish(t, "Failed", why)
        for other in self.active():
            self.finish(other, "Stopped", "the job's pods are refused by the API server")
        self.r._set_condition(self.status, "SpecValid", "False", "PodRejected", why, self.gen, self.now)
        self.r._set_phase(self.status, "Failed", why, self.gen, self.now, failure=("PodRejected", why))

    def advance(self, t: TrialStatus, pods: list[dict]) -> None:
        n = P.ranks_for(t.gpus or 1, self.spec.resources.gpus_per_node)
        budget = self.spec.budget
        created = tp_parse(t.created_at) or self.now
        if t.state == "Pending":
            if len(pods) >= n and all(P.is_scheduled(p) for p in pods):
                t.state = "Running"
                t.started_at = now_iso(self.now)
            elif self.now - created > budget.schedule_timeout_seconds:
                why = next((P.unschedulable_message(p) for p in pods if P.unschedulable_message(p)), "")
                self.finish(t, "Unschedulable", f"not all {n} pods scheduled within "
                                                f"{budget.schedule_timeout_seconds}s" + (f": {why}" if why else ""))
                return
            else:
                return
        if t.state == "Running":
            failed = [p for p in pods if P.pod_phase(p) == "Failed"]
            rank0 = next((p for p in pods if p["metadata"]["labels"].get(P.LABEL_RANK) == "0"), None)
            started = tp_parse(t.started_at) or self.now
            if failed:
                # the trial's own one-line reason (exported before it exited) beats the exit code
                get_reason = getattr(self.r.metrics, "reason", None)
                exported = get_reason(self.prom_url, self.ns, self.name, t.id, self.spec.metrics.names) \
                    if get_reason else None
                first_seen = tp_parse(t.finished_at)
                if exported is None and get_reason and (first_seen is None or
                                                        self.now - first_seen < REASON_GRACE_SECONDS):
                    t.finished_at = t.finished_at or now_iso(self.now)
                    return
                why = P.failure_reason(failed[0])
                if exported:
                    why = f"{exported} ({why})"
                elif "exit code 137" in why and "out of memory" not in why:
                    why += ": out of memory"
                self.finish(t, "Failed", why)
                return
            if rank0 is None or P.pod_phase(rank0) == "Succeeded":
                t.state = "Scoring"
                t.finished_at = now_iso(self.now)
            elif self.now - started > budget.trial_timeout_seconds:
                self.finish(t, "TimedOut", f"ran longer than budget.trialTimeoutSeconds={budget.trial_timeout_seconds}")
                return
            elif t.kind == "search":
                self.maybe_early_stop(t)
                return
            else:
                return
        if t.state == "Scoring":
            self.score(t)

    def maybe_early_stop(self, t: TrialStatus) -> None:
        tuner_early = getattr(self.tuner(), "early_stop", None)
        if tuner_early is None:
            return
        try:
            steps = self.r.metrics.steps(self.prom_url, self.ns, self.name, t.id, self.spec.metrics.names)
        except prom.MetricsError:
            return
        if len([s for s in steps if not s.warmup]) < 1:
            return
        try:
            stop = bool(tuner_early(steps, gpus=t.gpus))
        except Exception as e:  # noqa: BLE001
            log.warning("early_stop failed: %s", e)
            return
        if stop:
            from ..tuner.summary import summarize

            summary = summarize(steps)
            t.summary = tp.flatten_summary(summary, keep_rewards=False)
            t.measured_seconds = round(summary.step_time_mean, 4) if summary.steps else None
            t.objective = tp.objective_of(self.spec, summary.step_time_mean, t.gpus) if summary.steps else None
            self.finish(t, "Stopped", f"early-stopped after {len(steps)} steps: cannot beat the best so far")

    def score(self, t: TrialStatus) -> None:
        from ..tuner.summary import summarize

        budget = self.spec.budget
        try:
            steps = self.r.metrics.steps(self.prom_url, self.ns, self.name, t.id, self.spec.metrics.names)
        except prom.MetricsError as e:
            steps, err = [], str(e)
        else:
            err = ""
        finished = tp_parse(t.finished_at) or self.now
        if len(steps) < t.steps:
            if self.now - finished > budget.metrics_timeout_seconds:
                self.finish(t, "MetricsUnavailable",
                            f"{len(steps)} of {t.steps} steps reported within {budget.metrics_timeout_seconds}s"
                            + (f" ({err})" if err else ""))
            return
        summary = summarize(steps)
        if t.kind == "baseline":
            t.summary = tp.flatten_summary(summary, keep_rewards=True)
            t.measured_seconds = round(summary.step_time_mean, 4) if summary.steps else None
            t.objective = tp.objective_of(self.spec, summary.step_time_mean, t.gpus) if summary.steps else None
            if summary.failed or not summary.steps:
                self.finish(t, "Failed", "the baseline reported no steady-state step")
            else:
                self.finish(t, "Succeeded", "")
            return
        record = tp.to_record(self.spec, t)
        judged = self.tuner().judge(record, summary)
        tp.apply_judgement(t, judged, keep_rewards=False)
        if t.objective is None and summary.steps:
            t.objective = tp.objective_of(self.spec, summary.step_time_mean, t.gpus)
        self.finish(t, t.state, t.reason or "")

    # ---------------------------------------------------------------- the lifecycle

    def active(self, kind: Optional[str] = None) -> list[TrialStatus]:
        return [t for t in self.status.trials if t.state in ACTIVE_STATES and (kind is None or t.kind == kind)]

    def teardown_all(self) -> None:
        for t in self.active():
            self.finish(t, "Stopped", f"job {self.status.phase.lower()}")

    def decide(self) -> None:
        st = self.status
        if st.phase == "Profiling":
            self.after_profiling()
        if st.phase == "Searching":
            self.search()
        if st.phase == "Confirming":
            self.after_confirming()
        fe = None
        if st.phase not in ("Pending", "Profiling") and any(t.kind == "search" for t in st.trials):
            try:
                fe = self.tuner().forecast_error()
            except Exception as e:  # noqa: BLE001
                log.debug("forecast_error: %s", e)
        if fe is not None and fe == fe:
            st.forecast_error = round(float(fe), 4)

    def after_profiling(self) -> None:
        base = next(t for t in self.status.trials if t.kind == "baseline")
        if base.state in ACTIVE_STATES:
            return
        bs = self.status.baseline or BaselineStatus()
        bs.state, bs.gpus, bs.reason = base.state, base.gpus, base.reason
        if base.state != "Succeeded":
            self.status.baseline = bs
            self.r._set_phase(self.status, "Failed", f"the baseline failed: {base.reason}", self.gen, self.now,
                              failure=("BaselineFailed", f"baseline trial {base.state}: {base.reason}"))
            return
        from ..tuner.profile import profile

        summary = tp.unflatten_summary(base.summary)
        prof = profile(self.spec, summary)
        bs.step_seconds = round(summary.step_time_mean, 4)
        bs.gpu_seconds_per_step = round(summary.step_time_mean * base.gpus, 2)
        bs.breakdown = {k: round(v, 4) for k, v in summary.phases.items()}
        bs.bottleneck = prof.bottleneck
        ev = prof.evidence if isinstance(prof.evidence, list) else [e.strip() for e in str(prof.evidence).split(";") if e.strip()]
        bs.evidence = [e[:200] for e in ev][:16] or None
        self.status.baseline = bs
        self.tick.info("Profiled", f"baseline {bs.step_seconds:.1f}s/step on {base.gpus} GPUs, "
                                   f"bottleneck {bs.bottleneck}: {'; '.join(bs.evidence or [])}"[:1000])
        self.r._set_phase(self.status, "Searching", f"baseline {bs.step_seconds:.1f}s/step, bottleneck "
                                                    f"{bs.bottleneck}: searching", self.gen, self.now)

    def search(self) -> None:
        st, budget = self.status, self.spec.budget
        search = [t for t in st.trials if t.kind == "search"]
        failed = sum(1 for t in search if t.state in FAILED_STATES)
        if failed >= budget.max_failed_trials:
            self.teardown_all()
            self.r._set_phase(st, "Failed", f"{failed} trials failed (budget.maxFailedTrials={budget.max_failed_trials})",
                              self.gen, self.now, failure=("TooManyFailedTrials",
                                                           f"{failed} failed trials; last: {search[-1].reason}"))
            return
        active = self.active("search")
        done = len(search) - len(active)
        left = budget.max_trials - done - len(active)
        tuner_done, why = False, ""
        if left > 0:
            res = self.tuner().done()
            tuner_done, why = (res if isinstance(res, tuple) else (bool(res), ""))
        if left > 0 and not tuner_done:
            slots = min(budget.parallel_trials - len(active), left)
            gpus_free = self.spec.resources.gpu_budget - sum(t.gpus for t in self.active())
            if slots > 0 and gpus_free > 0:
                proposals = self.tuner().propose(slots, gpus_free)
                for p in proposals:
                    cfg = p.config if isinstance(p.config, RLConfig) else RLConfig.model_validate(p.config)
                    g = tp.gpus_of(self.spec, cfg)
                    if g > gpus_free:
                        continue
                    gpus_free -= g
                    self.add_trial(f"t{st.next_trial}", "search", cfg, budget.steps_per_trial,
                                   getattr(p, "predicted", None), getattr(p, "predicted_std", None))
                    st.next_trial += 1
                if not proposals and not active and not self.active():
                    tuner_done, why = True, "the search space is exhausted"
        if active or self.active("search"):
            return
        if left > 0 and not tuner_done:
            return
        self.conclude(why or f"{done} of {budget.max_trials} trials done")

    def conclude(self, why: str) -> None:
        st = self.status
        base = st.baseline
        best = self.tuner().best()
        base_obj = next(t.objective for t in st.trials if t.kind == "baseline")
        if best is None or best.objective is None or base_obj is None or best.objective >= base_obj:
            msg = f"nothing beats the baseline ({why}); keep the current configuration"
            st.best, st.speedup = None, "1.00x"
            self.tick.info("NoImprovement", msg)
            self.r._set_phase(st, "Succeeded", msg, self.gen, self.now, complete=("NoImprovement", msg))
            return
        bt = next(t for t in st.trials if t.id == best.id)
        if self.spec.budget.confirm_steps > 0:
            cid = f"c{st.next_trial}"
            st.next_trial += 1
            self.add_trial(cid, "confirm", self.config_of(bt), self.spec.budget.confirm_steps,
                           bt.predicted_seconds, bt.predicted_std, of=bt.id)
            self.r._set_phase(st, "Confirming", f"confirming {bt.id} with {self.spec.budget.confirm_steps} steps",
                              self.gen, self.now)
            return
        self.set_best(bt, confirmed=False)
        self.succeed(why)

    def set_best(self, t: TrialStatus, confirmed: bool, of: Optional[TrialStatus] = None) -> None:
        base = self.status.baseline
        src = of or t
        step = t.measured_seconds or 0.0
        speed = (base.step_seconds / step) if base and base.step_seconds and step else 1.0
        self.status.best = BestStatus(trial=src.id, config=dict(src.config), step_seconds=round(step, 3),
                                      speedup=round(speed, 3), gpus=t.gpus,
                                      gpu_seconds_per_step=round(step * t.gpus, 2), confirmed=confirmed,
                                      overrides=render_overrides(self.spec.workload.framework, src.config))
        self.status.speedup = f"{speed:.2f}x"

    def succeed(self, why: str) -> None:
        b = self.status.best
        msg = (f"best {b.trial}: {b.step_seconds:.1f}s/step, {self.status.speedup} faster than the baseline on "
               f"{b.gpus} GPUs ({why})")
        self.tick.info("Succeeded", msg)
        self.r._set_phase(self.status, "Succeeded", msg, self.gen, self.now, complete=("Improved", msg))

    def after_confirming(self) -> None:
        conf = [t for t in self.status.trials if t.kind == "confirm"]
        c = conf[-1] if conf else None
        if c is None:
            self.r._set_phase(self.status, "Searching", "no confirmation run found", self.gen, self.now)
            return
        if c.state in ACTIVE_STATES:
            return
        orig = next(t for t in self.status.trials if t.id == c.of)
        base = self.status.baseline
        if c.state == "Succeeded" and c.measured_seconds and base and base.step_seconds and \
                c.measured_seconds < base.step_seconds:
            self.set_best(c, confirmed=True, of=orig)
            self.succeed(f"confirmed over {c.steps} steps")
            return
        orig.state = "Rejected"
        orig.reason = f"confirmation run {c.id} {c.state}: {c.reason or 'not faster than the baseline'}"[:300]
        self._tuner_dirty = True
        self.tick.warn("ConfirmationFailed", orig.reason)
        self.r._set_phase(self.status, "Searching", f"{orig.id} did not confirm; picking the next best",
                          self.gen, self.now)
        self.search()


def tp_parse(s: Optional[str]) -> Optional[float]:
    return parse_iso(s)
