"""The pod runner's loop: list and watch all pods, reconcile each event, and tick (time passes)."""

from __future__ import annotations

import queue
import threading
import time
import traceback
from pathlib import Path

from hack.bed.kubelet.api import ApiClient, ApiError
from hack.bed.kubelet.clock import now_iso
from hack.bed.kubelet.invoke import Invoker
from hack.bed.kubelet.kubectl_logs import KubectlLogs
from hack.bed.kubelet.log import log
from hack.bed.kubelet.probes import KINDS, ProbeEvent, Prober, ProbeSpec, Target, probe_sandbox, write_probe_hosts
from hack.bed.kubelet.process_table import Proc, ProcessTable
from hack.bed.kubelet.sandbox import PodSandboxes, SandboxError
from hack.bed.kubelet.scrape_targets import ScrapeTargets
from hack.bed.kubelet.status import (
    StatusWriter,
    container_statuses,
    final_states,
    init_status_patch,
    initialized_patch,
    pod_initializing,
    terminated,
)

MAX_GRACE = 30.0
HOSTS_EVERY = 2.0  # seconds between /etc/hosts refreshes (Services whose endpoint came up later)


def probed(c: dict) -> bool:
    """The container has a probe the runner runs."""
    return any(c.get(f"{kind}Probe") for kind in KINDS)


def gated(c: dict) -> bool:
    """The container is not ready until a probe passed (readiness or startup)."""
    return bool(c.get("readinessProbe") or c.get("startupProbe"))


def backoff(restarts: int) -> float:
    """Seconds before restarting a container that exited `restarts` times before (1, 2, ... 30)."""
    return min(30.0, 1.0 * 2 ** min(restarts, 5))


class Runner:
    def __init__(self, kubeconfig: str, state: Path):
        self.state = state
        self.api = ApiClient(kubeconfig, state / "pki")
        self.procs = ProcessTable(state / "runner")  # "<uid>_<container>" -> Proc
        self.logs = KubectlLogs(self.api.request, state / "pods")
        self.targets = ScrapeTargets(state / "prometheus" / "targets")
        self.status = StatusWriter(self.api.patch_status)
        self.invoker = Invoker(self.api.read_data, state)
        self.sandboxes = PodSandboxes(state, self.api.request, *self.api.address, log)
        self.pods: dict[str, dict] = {}  # uid -> latest pod object (mapped pods only)
        self.restart_at: dict[str, float] = {}  # container key -> when to restart
        self.unreported: dict[str, tuple[Proc, bool, float]] = {}  # failed exit reports -> retry until
        self.finalizing: set[str] = set()  # uids whose deletion we finalized
        self.hosts_at = 0.0  # next /etc/hosts refresh
        self.init_begun: set[str] = set()  # uids whose init phase this runner started and not ended
        self.prober = Prober(log)  # probes of running main containers
        self.events: queue.Queue = queue.Queue()
        self.stop = threading.Event()

    # ------------------------------------------------------------------ reconcile (one pod event)
    def reconcile(self, pod: dict, deleted: bool = False) -> None:
        mapped = self.invoker.mapped_containers(pod)
        if not mapped:
            return
        if deleted:
            self._deleted(pod)
            return
        md = pod["metadata"]
        self.pods[md["uid"]] = pod
        if md.get("deletionTimestamp"):
            self._deleting(pod)
            return
        st = pod.get("status") or {}
        if not pod["spec"].get("nodeName") or not st.get("podIP"):
            return  # wait for kwok to make it Running (pod IP assigned)
        if st.get("phase") != "Running" and not (st.get("phase") == "Pending" and pod_initializing(pod)):
            return
        if not self.run_init_containers(pod):
            return
        self.targets.write(pod)
        statuses = container_statuses(pod)
        self._unmapped_ready(pod, statuses)
        for c in mapped:
            key = f"{md['uid']}_{c['name']}"
            if key in self.procs:
                if probed(c) and key not in self.prober and not self.procs[key].rec.get("done"):
                    # re-adopted after a runner restart: probe again, from the readiness last reported
                    self._probe(pod, c, self.procs[key], ready=bool((statuses.get(c["name"]) or {}).get("ready")))
                continue
            if "terminated" in ((statuses.get(c["name"]) or {}).get("state") or {}):
                continue  # already ran (e.g. before a runner restart whose records were wiped)
            self.start_container(pod, c)

    def run_init_containers(self, pod: dict) -> bool:
        """Advance the pod's init containers, in order; True once all completed (and the pod was
        reported Initialized). Progress lives in the process records, so a restarted runner picks
        up where it was; a pod whose main containers already ran is past its init phase."""
        inits = self.invoker.init_containers(pod)
        if not inits:
            return True
        uid = pod["metadata"]["uid"]
        if any(f"{uid}_{c['name']}" in self.procs for c in self.invoker.mapped_containers(pod)):
            return True
        for i, c in enumerate(inits):
            key = f"{uid}_{c['name']}"
            p = self.procs.get(key)
            if p is None:
                if i == 0 or not pod_initializing(pod):
                    self.status.patch(pod, init_status_patch(pod, self._init_states(pod)))
                    self.init_begun.add(uid)
                if self.invoker.image_entry(c.get("image", "")) is None:
                    # not an image the bed runs: completed at once, as kwok reports it
                    self.procs.record_done(pod, c["name"], self.logs.path(pod))
                    self._init_state(pod, c["name"], self.procs[key])
                    continue
                self.start_container(pod, c)
                return False
            if not p.rec.get("done") or p.rec.get("exitCode") != 0:
                return False  # running, or failed (on_exit restarts it or failed the pod)
        if pod_initializing(pod) or uid in self.init_begun:
            self.init_begun.discard(uid)
            starting = {c["name"] for c in self.invoker.mapped_containers(pod) if c.get("startupProbe")}
            self.status.patch(pod, initialized_patch(pod, self._probed(pod), starting))
            log(f"{pod['metadata']['namespace']}/{pod['metadata']['name']}: init containers completed")
        return True

    @staticmethod
    def _init_fields(rec: dict, lost: bool = False) -> dict:
        state = terminated(rec, lost) if rec.get("done") else {"running": {"startedAt": rec["startedAt"]}}
        return {"state": state, "ready": bool(rec.get("done")), "restartCount": rec.get("restartCount", 0)}

    def _init_states(self, pod: dict) -> dict[str, dict]:
        """Every init container's status as its process record says. A patch carries them all: the
        cached pod may be a watch event older than the runner's own last patch, and a status built
        from it would move a terminated init container back to waiting, which the API server refuses
        (422), losing the whole patch (the next container's terminated state with it)."""
        uid = pod["metadata"]["uid"]
        out = {}
        for c in self.invoker.init_containers(pod):
            p = self.procs.get(f"{uid}_{c['name']}")
            if p is not None:
                out[c["name"]] = self._init_fields(p.rec)
        return out

    def _init_state(self, pod: dict, cname: str, p: Proc, lost: bool = False) -> None:
        states = self._init_states(pod) | {cname: self._init_fields(p.rec, lost)}
        self.status.patch(pod, init_status_patch(pod, states))

    def _deleted(self, pod: dict) -> None:
        """The pod object is gone: stop what is left of it at once."""
        self.pods.pop(pod["metadata"]["uid"], None)
        self.targets.remove(pod)
        for key, p in self.procs.of_pod(pod["metadata"]["uid"]):
            if p.is_alive():
                self.procs.terminate(p, grace=2.0)
            else:
                self.forget(key)

    def _deleting(self, pod: dict) -> None:
        """deletionTimestamp set: SIGTERM with the pod's grace period, finalize once nothing runs."""
        md = pod["metadata"]
        grace = md.get("deletionGracePeriodSeconds")
        grace = MAX_GRACE if grace is None else min(float(grace), MAX_GRACE)
        self.targets.remove(pod)
        live = False
        for key, p in self.procs.of_pod(md["uid"]):
            if p.is_alive():
                live = True
                if p.kill_at is None:
                    self.procs.terminate(p, grace)
            self.restart_at.pop(key, None)
        if not live:
            self._finalize(pod)

    def _finalize(self, pod: dict) -> None:
        uid = pod["metadata"]["uid"]
        if uid not in self.finalizing:
            self.finalizing.add(uid)
            if pod["metadata"].get("finalizers"):
                self._terminal_phase(pod)
            self.api.delete_now(pod)

    def _terminal_phase(self, pod: dict) -> None:
        """A deleted pod whose object a finalizer keeps (e.g. Kueue's kueue.x-k8s.io/managed) gets a
        terminal phase first, as a kubelet gives every deleted pod: the finalizer's owner waits for it."""
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            return
        uid = pod["metadata"]["uid"]
        recs = {}
        for c in self.invoker.mapped_containers(pod):
            p = self.procs.get(f"{uid}_{c['name']}")
            if p is not None and p.rec.get("done"):
                recs[c["name"]] = p.rec
        try:
            if not recs:
                self.status.patch(pod, {"phase": "Failed", "reason": "Terminated", "message": "deleted before it ran"})
                return
            phase, states = final_states(pod, recs, max(r["finishedAt"] for r in recs.values()))
            name = next(iter(recs))
            self.status.patch_container(pod, name, states[name], ready=False, phase=phase, all_states=states)
        except ApiError as e:  # gone meanwhile: nothing left to report
            log(f"{pod['metadata']['namespace']}/{pod['metadata']['name']}: terminal phase not written: {e}")

    def start_container(self, pod: dict, c: dict, restart_count: int = 0) -> None:
        md = pod["metadata"]
        is_init = any(ic["name"] == c["name"] for ic in self.invoker.init_containers(pod))
        try:
            sb = self.sandboxes.prepare(pod, c, self.invoker.image_entry(c.get("image", "")))
        except (SandboxError, ApiError) as e:
            # what a kubelet reports when a volume cannot be set up; retried on the next event
            log(f"{md['namespace']}/{md['name']} [{c['name']}]: {e}")
            if is_init:
                waiting = {"waiting": {"reason": "CreateContainerConfigError", "message": str(e)[:500]}}
                self.status.patch(pod, init_status_patch(pod, self._init_states(pod) | {c["name"]: {"state": waiting}}))
                return
            self.status.patch_container(
                pod,
                c["name"],
                {"waiting": {"reason": "CreateContainerConfigError", "message": str(e)[:500]}},
                ready=False,
            )
            return
        inv = self.invoker.invocation(pod, c, sb.env)
        logfile = self.logs.path(pod)
        p = self.procs.start(pod, c["name"], restart_count, inv.argv, inv.env, inv.cwd, logfile, sb)
        self.logs.wire(pod, logfile)
        if is_init:
            self._init_state(pod, c["name"], p)
            return
        self._probe(pod, c, p, ready=False, env=inv.env, cwd=inv.cwd, sandbox=sb)
        if restart_count:
            self.status.patch_container(
                pod,
                c["name"],
                {"running": {"startedAt": p.rec["startedAt"]}},
                ready=not gated(c),
                restart_count=restart_count,
                started=not c.get("startupProbe"),
            )

    # ------------------------------------------------------------------ readiness (probes.py)
    def _probed(self, pod: dict) -> set[str]:
        """Names of the pod's containers whose readiness waits for a probe (the ones the runner runs)."""
        return {c["name"] for c in self.invoker.mapped_containers(pod) if gated(c)}

    def _probe(self, pod: dict, c: dict, p: Proc, ready: bool, env=None, cwd=None, sandbox=None) -> None:
        """Start the probes of container `c` (its process `p`); `ready`: what its status says now
        (False for a container just started; a re-adopted one keeps what was last reported)."""
        if not probed(c):
            return
        md, ip = pod["metadata"], (pod.get("status") or {}).get("podIP") or ""
        hosts = None
        if (self.invoker.image_entry(c.get("image", "")) or {}).get("podNetwork"):
            base = self.state / "volumes" / md["uid"]
            hosts = write_probe_hosts(base / f"probe-hosts-{c['name']}", ip, base / "etc-hosts")
        if env is None:  # re-adopted: no sandbox record; the pod's env as the container got it
            inv = self.invoker.invocation(pod, c, {})
            env, cwd = inv.env, inv.cwd
        ports = {q["name"]: int(q["containerPort"]) for q in c.get("ports") or [] if q.get("name")}
        for kind in KINDS:
            probe = c.get(f"{kind}Probe")
            if not probe:
                continue
            spec = ProbeSpec.of(probe)
            # re-adopted and ready: its startup passed and its initial delays are long past
            started = time.time() - (spec.initial_delay_s if ready else 0.0)
            t = Target(
                key=p.key,
                spec=spec,
                kind=kind,
                pod_ip=ip,
                ports=ports,
                started=started,
                env=env,
                cwd=cwd or "/",
                sandbox=probe_sandbox(sandbox, hosts),
                ready=ready,
            )
            self.prober.add(t)

    def _probe_events(self) -> None:
        """Act on what the probes changed since the last tick."""
        for ev in self.prober.tick():
            p = self.procs.get(ev.target.key)
            pod = self.pods.get(p.rec["uid"]) if p is not None else None
            if pod is None or p.rec.get("done") or pod["metadata"].get("deletionTimestamp"):
                self.prober.remove(ev.target.key)
                continue
            try:
                self._probe_event(pod, p, ev)
            except ApiError as e:  # written again when the probe flips next; pods gone meanwhile are dropped
                log(f"{p.rec['namespace']}/{p.rec['name']}: probe result not written: {e}")

    def _probe_event(self, pod: dict, p: Proc, ev: ProbeEvent) -> None:
        cname, kind = p.rec["container"], ev.target.kind
        c = next((c for c in pod["spec"]["containers"] if c["name"] == cname), {})
        if ev.what == "kill":
            self.api.event(pod, "Unhealthy", f"{kind.capitalize()} probe failed: {ev.why}", "Warning", cname)
            self.api.event(pod, "Killing", f"Container {cname} failed {kind} probe, will be restarted", "Normal", cname)
            grace = ev.target.spec.grace_s
            if grace is None:
                grace = pod["spec"].get("terminationGracePeriodSeconds", MAX_GRACE)
            p.rec["killedBy"] = kind
            self.procs.save(p.rec)
            with open(p.rec["log"], "ab") as lf:
                lf.write(f"==== {now_iso()} container {cname} failed its {kind} probe: killed\n".encode())
            self.procs.terminate(p, min(float(grace), MAX_GRACE))
            return
        if ev.what == "unready":
            self.api.event(pod, "Unhealthy", f"Readiness probe failed: {ev.why}", "Warning", cname)
        # startup passed: started now; ready too unless a readiness probe decides that from now on
        ready = ev.what == "ready" or (ev.what == "started" and not c.get("readinessProbe"))
        self.status.patch_container(
            pod,
            cname,
            {"running": {"startedAt": p.rec["startedAt"]}},
            ready=ready,
            restart_count=p.rec.get("restartCount", 0),
            started=not self.prober.starting(p.key),
        )

    def _unmapped_ready(self, pod: dict, statuses: dict) -> None:
        """A probed container the bed does not run has no process to probe: ready at once, as kwok
        reports every container (kwok's stage left it not ready because it has a probe)."""
        mapped = {c["name"] for c in self.invoker.mapped_containers(pod)}
        for c in pod["spec"]["containers"]:
            s = statuses.get(c["name"]) or {}
            if c["name"] not in mapped and gated(c) and "running" in (s.get("state") or {}):
                if not s.get("ready"):
                    self.status.patch_container(pod, c["name"], s["state"], ready=True)

    def forget(self, key: str) -> None:
        self.prober.remove(key)
        p = self.procs.forget(key)
        if p is not None and not self.procs.of_pod(p.rec["uid"]):
            self.sandboxes.forget(p.rec["uid"])
        self.restart_at.pop(key, None)

    # ------------------------------------------------------------------ tick (time passes)
    def tick(self) -> None:
        t = time.time()
        self.logs.pump(self.pods)
        self._refresh_tokens()
        if t >= self.hosts_at:
            self.hosts_at = t + HOSTS_EVERY
            live = {p.rec["uid"] for p in self.procs.values() if not p.rec.get("done")}
            self.sandboxes.refresh_hosts([pod for uid, pod in self.pods.items() if uid in live], self.state / "hosts")
        for key, p in list(self.procs.items()):
            if p.rec.get("done"):
                continue
            if p.is_alive():
                self.procs.kill_escalate(p, t)
            elif p.kill_at is not None and p.rec.get("killedBy") and not self._being_deleted(p):
                self.procs.sweep(p)
                p.kill_at = None
                self.on_exit(p)  # restarts as restartPolicy says, like any other end
            elif p.kill_at is not None:
                self._terminated(key, p)
            else:
                self.on_exit(p)
        for key, (p, lost, until) in list(self.unreported.items()):  # a kubelet retries its status updates too
            self.unreported.pop(key)
            self._report_exit(p, lost, until)
        self._restart_due(t)
        self._probe_events()

    def _refresh_tokens(self) -> None:
        for p in list(self.procs.values()):
            pod = self.pods.get(p.rec["uid"])
            if pod is None or p.sandbox is None or not p.sandbox.token_files or p.rec.get("done"):
                continue
            try:
                self.sandboxes.refresh_tokens(p.sandbox, pod)
            except Exception as e:  # noqa: BLE001 - retried next tick, like a kubelet
                log(f"token refresh for {p.rec['namespace']}/{p.rec['name']} failed: {e}")

    def _being_deleted(self, p: Proc) -> bool:
        pod = self.pods.get(p.rec["uid"])
        return pod is None or bool(pod["metadata"].get("deletionTimestamp"))

    def _terminated(self, key: str, p: Proc) -> None:
        """A container stopped for its pod's deletion ended: finalize once the pod's last one did."""
        self.procs.sweep(p)
        uid = p.rec["uid"]
        self.forget(key)
        pod = self.pods.get(uid)
        if pod is not None and not any(q.is_alive() for _, q in self.procs.of_pod(uid)):
            self._finalize(pod)

    def _restart_due(self, t: float) -> None:
        for key, when in list(self.restart_at.items()):
            if t < when:
                continue
            self.restart_at.pop(key)
            p = self.procs.get(key)
            pod = self.pods.get(p.rec["uid"]) if p is not None else None
            if pod is None or pod["metadata"].get("deletionTimestamp"):
                continue
            specs = list(pod["spec"]["containers"]) + self.invoker.init_containers(pod)
            c = next((c for c in specs if c["name"] == p.rec["container"]), None)
            if c is not None:
                self.procs.pop(key, None)
                self.start_container(pod, c, restart_count=p.rec.get("restartCount", 0) + 1)

    def on_exit(self, proc: Proc) -> None:
        """A container's process ended on its own: restart it (restartPolicy) or report it, and the
        pod's phase once all its mapped containers are done."""
        lost = self.procs.finish(proc)
        self.prober.remove(proc.key)
        self.logs.pump(self.pods, final={proc.rec["uid"]})
        self._report_exit(proc, lost)

    def _report_exit(self, proc: Proc, lost: bool, until: float | None = None) -> None:
        """on_exit's status write; one that fails (the API server restarting) is retried every tick
        for up to 2 minutes, or the pod would stay Running forever."""
        try:
            self._exit_status(proc, lost)
        except Exception as e:  # noqa: BLE001
            if until is None:
                log(f"{proc.rec['namespace']}/{proc.rec['name']}: reporting the exit failed ({e}); retrying")
                until = time.time() + 120
            if time.time() < until:
                self.unreported[proc.key] = (proc, lost, until)
            else:
                log(f"{proc.rec['namespace']}/{proc.rec['name']}: reporting the exit failed for good: {e}")

    def _exit_status(self, proc: Proc, lost: bool) -> None:
        rec = proc.rec
        pod = self.pods.get(rec["uid"])
        if pod is None or pod["metadata"].get("deletionTimestamp"):
            return
        cname, n, code = rec["container"], rec.get("restartCount", 0), rec["exitCode"]
        term = terminated(rec, lost)
        policy = pod["spec"].get("restartPolicy", "Always")
        if any(c["name"] == cname for c in self.invoker.init_containers(pod)):
            self._init_exited(pod, proc, lost, policy)
            return
        if policy == "Always" or (policy == "OnFailure" and code != 0):
            self.restart_at[proc.key] = time.time() + backoff(n)
            self.status.patch_container(
                pod,
                cname,
                {"waiting": {"reason": "CrashLoopBackOff" if code else "Completed"}},
                ready=False,
                restart_count=n,
                last_state=term,
            )
            return
        mapped = {c["name"]: self.procs.get(f"{rec['uid']}_{c['name']}") for c in self.invoker.mapped_containers(pod)}
        if not all(p is not None and p.rec.get("done") for p in mapped.values()):
            self.status.patch_container(pod, cname, term, ready=False, restart_count=n)
            return
        phase, states = final_states(pod, {k: p.rec for k, p in mapped.items()}, rec["finishedAt"])
        self.status.patch_container(pod, cname, term, ready=False, restart_count=n, phase=phase, all_states=states)
        self.targets.remove(pod)

    def _init_exited(self, pod: dict, proc: Proc, lost: bool, policy: str) -> None:
        """An init container ended: the next one starts (0), or it restarts with back-off
        (Always/OnFailure), or the pod failed (Never), as a kubelet handles it."""
        rec = proc.rec
        cname, n, code = rec["container"], rec.get("restartCount", 0), rec["exitCode"]
        if code == 0:
            self._init_state(pod, cname, proc, lost)
            self.safe_reconcile(pod)
            return
        term = terminated(rec, lost)
        if policy in ("Always", "OnFailure"):
            self.restart_at[proc.key] = time.time() + backoff(n)
            waiting = {"waiting": {"reason": "CrashLoopBackOff"}}
            self.status.patch(
                pod,
                init_status_patch(
                    pod, self._init_states(pod) | {cname: {"state": waiting, "lastState": term, "restartCount": n}}
                ),
            )
            return
        self.status.patch(
            pod,
            init_status_patch(
                pod, self._init_states(pod) | {cname: {"state": term, "restartCount": n}}, phase="Failed"
            ),
        )
        log(f"{rec['namespace']}/{rec['name']}: init container {cname} failed ({code}): pod Failed")

    # ------------------------------------------------------------------ startup / watch
    def adopt(self, pods: list[dict]) -> None:
        for p in self.procs.adopt({pod["metadata"]["uid"] for pod in pods}):
            self.logs.follow(p.rec["uid"], Path(p.rec["log"]))

    def watch(self, rv: str) -> None:
        for ev in self.api.watch_pods(rv, self.stop):
            self.events.put(ev)

    def run(self) -> None:
        items, rv = self.api.list_pods()
        self.adopt(items)
        for p in items:
            self.safe_reconcile(p)
        threading.Thread(target=self.watch, args=(rv,), daemon=True).start()
        log(f"running: {len(items)} pods listed, {len(self.procs)} records adopted")
        while not self.stop.is_set():
            try:
                kind, obj = self.events.get(timeout=0.2)
                if kind == "RELIST":
                    self.relist(obj)
                else:
                    self.safe_reconcile(obj, deleted=(kind == "DELETED"))
            except queue.Empty:
                pass
            try:
                self.tick()
            except Exception:  # noqa: BLE001
                log("tick failed:\n" + traceback.format_exc())

    def relist(self, items: list[dict]) -> None:
        """After a watch expired: pods missing from the fresh list were deleted meanwhile."""
        live = {p["metadata"]["uid"] for p in items}
        for uid in list(self.pods):
            if uid not in live:
                self.safe_reconcile(self.pods[uid], deleted=True)
        for p in items:
            self.safe_reconcile(p)

    def safe_reconcile(self, pod: dict, deleted: bool = False) -> None:
        try:
            self.reconcile(pod, deleted)
        except Exception:  # noqa: BLE001 - one bad pod must not stop the runner
            md = pod.get("metadata", {})
            log(f"reconcile {md.get('namespace')}/{md.get('name')} failed:\n{traceback.format_exc()}")
