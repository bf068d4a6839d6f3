"""The pod runner's loop: list and watch all pods, reconcile each event, and tick (time passes).

A pod's parts of life are its collaborators: init_containers, readiness, exits and deletion, over
the clients and tables they share (parts.py).
"""

from __future__ import annotations

import queue
import threading
import time
import traceback
from pathlib import Path

from hack.bed.kubelet.api import ApiError
from hack.bed.kubelet.deletion import Deletion
from hack.bed.kubelet.exits import Exits
from hack.bed.kubelet.init_containers import InitContainers
from hack.bed.kubelet.log import log
from hack.bed.kubelet.parts import Parts
from hack.bed.kubelet.readiness import Readiness, gated, probed
from hack.bed.kubelet.sandbox import SandboxError
from hack.bed.kubelet.status import container_statuses, init_status_patch, pod_initializing

HOSTS_EVERY = 2.0  # seconds between /etc/hosts refreshes (Services whose endpoint came up later)


class Runner:
    def __init__(self, kubeconfig: str, state: Path):
        self.parts = parts = Parts.build(kubeconfig, state)
        self.state = parts.state
        self.api = parts.api
        self.procs = parts.procs
        self.logs = parts.logs
        self.targets = parts.targets
        self.status = parts.status
        self.invoker = parts.invoker
        self.sandboxes = parts.sandboxes
        self.prober = parts.prober
        self.pods = parts.pods
        self.restart_at = parts.restart_at
        self.readiness = Readiness(parts)
        self.inits = InitContainers(parts, self.start_container, self.safe_reconcile, self.readiness.gated_names)
        self.exits = Exits(parts, self.inits)
        self.deletion = Deletion(parts)
        self.hosts_at = 0.0  # next /etc/hosts refresh
        self.events: queue.Queue = queue.Queue()
        self.stop = threading.Event()

    # ------------------------------------------------------------------ reconcile (one pod event)
    def reconcile(self, pod: dict, deleted: bool = False) -> None:
        mapped = self.invoker.mapped_containers(pod)
        if not mapped:
            return
        if deleted:
            self.deletion.deleted(pod)
            return
        md = pod["metadata"]
        self.pods[md["uid"]] = pod
        if md.get("deletionTimestamp"):
            self.deletion.deleting(pod)
            return
        st = pod.get("status") or {}
        if not pod["spec"].get("nodeName") or not st.get("podIP"):
            return  # wait for kwok to make it Running (pod IP assigned)
        if st.get("phase") != "Running" and not (st.get("phase") == "Pending" and pod_initializing(pod)):
            return
        if not self.inits.advance(pod):
            return
        self.targets.write(pod)
        statuses = container_statuses(pod)
        self.readiness.unmapped_ready(pod, statuses)
        for c in mapped:
            key = f"{md['uid']}_{c['name']}"
            if key in self.procs:
                if probed(c) and key not in self.prober and not self.procs[key].rec.get("done"):
                    # re-adopted after a runner restart: probe again, from the readiness last reported
                    self.readiness.start(
                        pod, c, self.procs[key], ready=bool((statuses.get(c["name"]) or {}).get("ready"))
                    )
                continue
            if "terminated" in ((statuses.get(c["name"]) or {}).get("state") or {}):
                continue  # already ran (e.g. before a runner restart whose records were wiped)
            self.start_container(pod, c)

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
                self.status.patch(pod, init_status_patch(pod, self.inits.states(pod) | {c["name"]: {"state": waiting}}))
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
            self.inits.report(pod, c["name"], p)
            return
        self.readiness.start(pod, c, p, ready=False, env=inv.env, cwd=inv.cwd, sandbox=sb)
        if restart_count:
            self.status.patch_container(
                pod,
                c["name"],
                {"running": {"startedAt": p.rec["startedAt"]}},
                ready=not gated(c),
                restart_count=restart_count,
                started=not c.get("startupProbe"),
            )

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
            elif p.kill_at is not None and p.rec.get("killedBy") and not self.parts.being_deleted(p):
                self.procs.sweep(p)
                p.kill_at = None
                self.exits.on_exit(p)  # restarts as restartPolicy says, like any other end
            elif p.kill_at is not None:
                self.deletion.terminated(key, p)
            else:
                self.exits.on_exit(p)
        self.exits.retry()
        self._restart_due(t)
        self.readiness.tick()

    def _refresh_tokens(self) -> None:
        for p in list(self.procs.values()):
            pod = self.pods.get(p.rec["uid"])
            if pod is None or p.sandbox is None or not p.sandbox.token_files or p.rec.get("done"):
                continue
            try:
                self.sandboxes.refresh_tokens(p.sandbox, pod)
            except Exception as e:  # noqa: BLE001 - retried next tick, like a kubelet
                log(f"token refresh for {p.rec['namespace']}/{p.rec['name']} failed: {e}")

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
