"""Init containers, run as a kubelet runs them: once kwok made the pod Running (pod IP assigned), one
after another to completion, the pod back to Pending with Initialized=False and its main containers
waiting (PodInitializing); an init container whose image the bed does not run counts as completed at
once (kwok's behaviour); a failing one restarts with back-off (restartPolicy Always/OnFailure) or
fails the pod (Never). Progress lives in the process records, so a restarted runner picks it up."""

from __future__ import annotations

import time
from collections.abc import Callable

from hack.bed.kubelet.log import log
from hack.bed.kubelet.parts import Parts, backoff
from hack.bed.kubelet.process_table import Proc
from hack.bed.kubelet.status import init_status_patch, initialized_patch, pod_initializing, terminated


class InitContainers:
    """`start(pod, c)` starts a container (the runner's), `reconcile(pod)` reconciles a pod again,
    `gated_names(pod)` names its containers whose readiness waits for a probe (readiness.py)."""

    def __init__(
        self,
        parts: Parts,
        start: Callable[[dict, dict], None],
        reconcile: Callable[[dict], None],
        gated_names: Callable[[dict], set[str]],
    ):
        self.invoker = parts.invoker
        self.procs = parts.procs
        self.status = parts.status
        self.logs = parts.logs
        self.restart_at = parts.restart_at
        self.start = start
        self.reconcile = reconcile
        self.gated_names = gated_names
        self.begun: set[str] = set()  # uids whose init phase this runner started and not ended

    def advance(self, pod: dict) -> bool:
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
                    self.status.patch(pod, init_status_patch(pod, self.states(pod)))
                    self.begun.add(uid)
                if self.invoker.image_entry(c.get("image", "")) is None:
                    # not an image the bed runs: completed at once, as kwok reports it
                    self.procs.record_done(pod, c["name"], self.logs.path(pod))
                    self.report(pod, c["name"], self.procs[key])
                    continue
                self.start(pod, c)
                return False
            if not p.rec.get("done") or p.rec.get("exitCode") != 0:
                return False  # running, or failed (on_exit restarts it or failed the pod)
        if pod_initializing(pod) or uid in self.begun:
            self.begun.discard(uid)
            starting = {c["name"] for c in self.invoker.mapped_containers(pod) if c.get("startupProbe")}
            self.status.patch(pod, initialized_patch(pod, self.gated_names(pod), starting))
            log(f"{pod['metadata']['namespace']}/{pod['metadata']['name']}: init containers completed")
        return True

    @staticmethod
    def fields(rec: dict, lost: bool = False) -> dict:
        state = terminated(rec, lost) if rec.get("done") else {"running": {"startedAt": rec["startedAt"]}}
        return {"state": state, "ready": bool(rec.get("done")), "restartCount": rec.get("restartCount", 0)}

    def states(self, pod: dict) -> dict[str, dict]:
        """Every init container's status as its process record says. A patch carries them all: the
        cached pod may be a watch event older than the runner's own last patch, and a status built
        from it would move a terminated init container back to waiting, which the API server refuses
        (422), losing the whole patch (the next container's terminated state with it)."""
        uid = pod["metadata"]["uid"]
        out = {}
        for c in self.invoker.init_containers(pod):
            p = self.procs.get(f"{uid}_{c['name']}")
            if p is not None:
                out[c["name"]] = self.fields(p.rec)
        return out

    def report(self, pod: dict, cname: str, p: Proc, lost: bool = False) -> None:
        states = self.states(pod) | {cname: self.fields(p.rec, lost)}
        self.status.patch(pod, init_status_patch(pod, states))

    def exited(self, pod: dict, proc: Proc, lost: bool, policy: str) -> None:
        """An init container ended: the next one starts (0), or it restarts with back-off
        (Always/OnFailure), or the pod failed (Never), as a kubelet handles it."""
        rec = proc.rec
        cname, n, code = rec["container"], rec.get("restartCount", 0), rec["exitCode"]
        if code == 0:
            self.report(pod, cname, proc, lost)
            self.reconcile(pod)
            return
        term = terminated(rec, lost)
        if policy in ("Always", "OnFailure"):
            self.restart_at[proc.key] = time.time() + backoff(n)
            waiting = {"waiting": {"reason": "CrashLoopBackOff"}}
            self.status.patch(
                pod,
                init_status_patch(
                    pod, self.states(pod) | {cname: {"state": waiting, "lastState": term, "restartCount": n}}
                ),
            )
            return
        self.status.patch(
            pod,
            init_status_patch(pod, self.states(pod) | {cname: {"state": term, "restartCount": n}}, phase="Failed"),
        )
        log(f"{rec['namespace']}/{rec['name']}: init container {cname} failed ({code}): pod Failed")
