"""A pod's deletion, as a kubelet carries it out: SIGTERM with the pod's grace period (capped at
MAX_GRACE), SIGKILL after it, a terminal phase for a pod a finalizer keeps, then the deletion
finalized (grace 0) once nothing of it runs; a pod object already gone is stopped at once."""

from __future__ import annotations

from hack.bed.kubelet.api import ApiError
from hack.bed.kubelet.log import log
from hack.bed.kubelet.parts import MAX_GRACE, Parts
from hack.bed.kubelet.process_table import Proc
from hack.bed.kubelet.status import final_states


class Deletion:
    def __init__(self, parts: Parts):
        self.api = parts.api
        self.invoker = parts.invoker
        self.procs = parts.procs
        self.status = parts.status
        self.targets = parts.targets
        self.pods = parts.pods
        self.restart_at = parts.restart_at
        self.forget = parts.forget
        self.finalizing: set[str] = set()  # uids whose deletion we finalized

    def deleted(self, pod: dict) -> None:
        """The pod object is gone: stop what is left of it at once."""
        self.pods.pop(pod["metadata"]["uid"], None)
        self.targets.remove(pod)
        for key, p in self.procs.of_pod(pod["metadata"]["uid"]):
            if p.is_alive():
                self.procs.terminate(p, grace=2.0)
            else:
                self.forget(key)

    def deleting(self, pod: dict) -> None:
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
            self.finalize(pod)

    def finalize(self, pod: dict) -> None:
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

    def terminated(self, key: str, p: Proc) -> None:
        """A container stopped for its pod's deletion ended: finalize once the pod's last one did."""
        self.procs.sweep(p)
        uid = p.rec["uid"]
        self.forget(key)
        pod = self.pods.get(uid)
        if pod is not None and not any(q.is_alive() for _, q in self.procs.of_pod(uid)):
            self.finalize(pod)
