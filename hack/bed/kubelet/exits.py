"""A container's end: its exit recorded, then a restart scheduled (restartPolicy, with back-off) or
its terminated state reported, and the pod's phase once all its mapped containers are done. A
report that fails (the API server restarting) is retried every tick for up to 2 minutes."""

from __future__ import annotations

import time

from hack.bed.kubelet.init_containers import InitContainers
from hack.bed.kubelet.log import log
from hack.bed.kubelet.parts import Parts, backoff
from hack.bed.kubelet.process_table import Proc
from hack.bed.kubelet.status import final_states, terminated


class Exits:
    def __init__(self, parts: Parts, inits: InitContainers):
        self.procs = parts.procs
        self.prober = parts.prober
        self.logs = parts.logs
        self.pods = parts.pods
        self.invoker = parts.invoker
        self.status = parts.status
        self.targets = parts.targets
        self.restart_at = parts.restart_at
        self.inits = inits
        self.unreported: dict[str, tuple[Proc, bool, float]] = {}  # failed exit reports -> retry until

    def on_exit(self, proc: Proc) -> None:
        """A container's process ended on its own: restart it (restartPolicy) or report it, and the
        pod's phase once all its mapped containers are done."""
        lost = self.procs.finish(proc)
        self.prober.remove(proc.key)
        self.logs.pump(self.pods, final={proc.rec["uid"]})
        self.report(proc, lost)

    def report(self, proc: Proc, lost: bool, until: float | None = None) -> None:
        """on_exit's status write; one that fails (the API server restarting) is retried every tick
        for up to 2 minutes, or the pod would stay Running forever."""
        try:
            self._write(proc, lost)
        except Exception as e:  # noqa: BLE001
            if until is None:
                log(f"{proc.rec['namespace']}/{proc.rec['name']}: reporting the exit failed ({e}); retrying")
                until = time.time() + 120
            if time.time() < until:
                self.unreported[proc.key] = (proc, lost, until)
            else:
                log(f"{proc.rec['namespace']}/{proc.rec['name']}: reporting the exit failed for good: {e}")

    def _write(self, proc: Proc, lost: bool) -> None:
        rec = proc.rec
        pod = self.pods.get(rec["uid"])
        if pod is None or pod["metadata"].get("deletionTimestamp"):
            return
        cname, n, code = rec["container"], rec.get("restartCount", 0), rec["exitCode"]
        term = terminated(rec, lost)
        policy = pod["spec"].get("restartPolicy", "Always")
        if any(c["name"] == cname for c in self.invoker.init_containers(pod)):
            self.inits.exited(pod, proc, lost, policy)
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

    def retry(self) -> None:
        """Write the exit reports that failed again (a kubelet retries its status updates too)."""
        for key, (p, lost, until) in list(self.unreported.items()):
            self.unreported.pop(key)
            self.report(p, lost, until)
