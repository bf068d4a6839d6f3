"""Readiness, liveness and startup as the runner reports them: it starts each probed container's
probes (probes.py runs them), writes what their results change (ready, unready, started) and kills a
container whose liveness or startup probe failed, which then restarts as its restartPolicy says."""

from __future__ import annotations

import time

from hack.bed.kubelet.api import ApiError
from hack.bed.kubelet.clock import now_iso
from hack.bed.kubelet.log import log
from hack.bed.kubelet.parts import MAX_GRACE, Parts
from hack.bed.kubelet.probes import KINDS, ProbeEvent, ProbeSpec, Target, probe_sandbox, write_probe_hosts
from hack.bed.kubelet.process_table import Proc


def probed(c: dict) -> bool:
    """The container has a probe the runner runs."""
    return any(c.get(f"{kind}Probe") for kind in KINDS)


def gated(c: dict) -> bool:
    """The container is not ready until a probe passed (readiness or startup)."""
    return bool(c.get("readinessProbe") or c.get("startupProbe"))


class Readiness:
    def __init__(self, parts: Parts):
        self.state = parts.state
        self.api = parts.api
        self.invoker = parts.invoker
        self.procs = parts.procs
        self.status = parts.status
        self.prober = parts.prober
        self.pods = parts.pods

    def gated_names(self, pod: dict) -> set[str]:
        """Names of the pod's containers whose readiness waits for a probe (the ones the runner runs)."""
        return {c["name"] for c in self.invoker.mapped_containers(pod) if gated(c)}

    def start(self, pod: dict, c: dict, p: Proc, ready: bool, env=None, cwd=None, sandbox=None) -> None:
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

    def tick(self) -> None:
        """Act on what the probes changed since the last tick."""
        for ev in self.prober.tick():
            p = self.procs.get(ev.target.key)
            pod = self.pods.get(p.rec["uid"]) if p is not None else None
            if pod is None or p.rec.get("done") or pod["metadata"].get("deletionTimestamp"):
                self.prober.remove(ev.target.key)
                continue
            try:
                self._act(pod, p, ev)
            except ApiError as e:  # written again when the probe flips next; pods gone meanwhile are dropped
                log(f"{p.rec['namespace']}/{p.rec['name']}: probe result not written: {e}")

    def _act(self, pod: dict, p: Proc, ev: ProbeEvent) -> None:
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

    def unmapped_ready(self, pod: dict, statuses: dict) -> None:
        """A probed container the bed does not run has no process to probe: ready at once, as kwok
        reports every container (kwok's stage left it not ready because it has a probe)."""
        mapped = {c["name"] for c in self.invoker.mapped_containers(pod)}
        for c in pod["spec"]["containers"]:
            s = statuses.get(c["name"]) or {}
            if c["name"] not in mapped and gated(c) and "running" in (s.get("state") or {}):
                if not s.get("ready"):
                    self.status.patch_container(pod, c["name"], s["state"], ready=True)
