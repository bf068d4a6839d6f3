"""Probes of the containers the pod runner executes (readiness, liveness, startup), run the way a
kubelet runs them.

Without them a container is Ready the moment its process starts, before it listens: a Service
sends traffic to it, and an operator that waits for Ready (KubeRay submits a RayJob's driver once
the head pod is Ready) acts too early; and a hung server is never restarted. A kubelet probes each
container after `initialDelaySeconds`, every `periodSeconds`, each try cut at `timeoutSeconds`:

* readiness: not ready until the probe passed `successThreshold` times in a row, not ready again
  after `failureThreshold` failures in a row;
* liveness: `failureThreshold` failures in a row kill the container, which then restarts as its
  pod's restartPolicy says;
* startup: until it passes, the other two do not run and the container is not ready;
  `failureThreshold` failures in a row kill the container, as liveness does.

This module keeps that state per probe and runs the probes on a small thread pool, so a slow probe
never holds up the runner's loop; the runner writes what changed (`ProbeEvent`).

Handlers, as a kubelet's:

* exec: the command in the container's environment and mount namespace (its volumes, its private
  /tmp); exit code 0 passes. For images with `podNetwork` (hack/images.yaml) the probe's
  /etc/hosts maps `localhost` to the pod IP: those pods' servers listen on the pod IP, which is
  what their own loopback would reach in a pod's network namespace (KubeRay's injected probes
  `wget http://localhost:52365/...`). A literal 127.0.0.1 in a command is not rewritten;
* httpGet: GET scheme://host:port/path (host: the pod IP unless set; a named port is looked up in
  the container's ports; headers as given); a status in [200, 400) passes. HTTPS is not verified;
* tcpSocket: a TCP connection to host:port opens.

Not run: grpc probes (logged; counted as passing, as kwok would report the container). A container
the runner re-adopted after its own restart has no sandbox record: its exec probes get the probe's
/etc/hosts only.
"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import ssl
import subprocess
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from hack.bed.kubelet.sandbox import Mount, Sandbox

PERIOD_S, TIMEOUT_S, SUCCESS_THRESHOLD, FAILURE_THRESHOLD = 10, 1, 1, 3  # the API's defaults
WORKERS = 8  # probes in flight at once (one per probe at most)


KINDS = ("startup", "readiness", "liveness")  # container field: f"{kind}Probe"


@dataclass(frozen=True)
class ProbeSpec:
    """One probe of a container with the API's defaults filled in."""

    handler: str  # exec | httpGet | tcpSocket | grpc
    action: dict
    initial_delay_s: float
    period_s: float
    timeout_s: float
    success_threshold: int
    failure_threshold: int
    grace_s: float | None = None  # the probe's terminationGracePeriodSeconds (liveness, startup)

    @classmethod
    def of(cls, probe: dict) -> "ProbeSpec":
        handler = next((h for h in ("exec", "httpGet", "tcpSocket", "grpc") if h in probe), "none")
        return cls(
            handler=handler,
            action=probe.get(handler) or {},
            initial_delay_s=float(probe.get("initialDelaySeconds") or 0),
            period_s=float(probe.get("periodSeconds") or PERIOD_S),
            timeout_s=float(probe.get("timeoutSeconds") or TIMEOUT_S),
            success_threshold=int(probe.get("successThreshold") or SUCCESS_THRESHOLD),
            failure_threshold=int(probe.get("failureThreshold") or FAILURE_THRESHOLD),
            grace_s=probe.get("terminationGracePeriodSeconds"),
        )


@dataclass
class Target:
    """One probe of a running container: what to probe, how, and the run of results so far.
    `ready` is the probe's verdict: passing (readiness, startup) or alive (liveness)."""

    key: str  # "<pod uid>_<container>", the process table's key
    spec: ProbeSpec
    pod_ip: str
    ports: dict[str, int]  # the container's named ports
    started: float  # when the container's process started (epoch s)
    kind: str = "readiness"  # one of KINDS
    env: dict[str, str] = field(default_factory=dict)
    cwd: str = "/"
    sandbox: Sandbox = field(default_factory=Sandbox)
    ready: bool = False
    successes: int = 0
    failures: int = 0
    next_at: float = 0.0
    running: Future | None = None

    def __post_init__(self) -> None:
        self.next_at = self.started + self.spec.initial_delay_s

    @property
    def id(self) -> str:
        return f"{self.key}/{self.kind}"


@dataclass(frozen=True)
class ProbeEvent:
    """What a probe result changed: `ready`/`unready` (readiness), `started` (startup passed: the
    other probes run now), `kill` (liveness or startup failed failureThreshold times)."""

    target: Target
    what: str
    why: str = ""


def probe_sandbox(sb: Sandbox | None, hosts_file: Path | None) -> Sandbox:
    """The container's mounts with /etc/hosts swapped for the probe's own (localhost = pod IP)."""
    mounts = [m for m in (sb.mounts if sb else []) if not (hosts_file and m.target == "/etc/hosts")]
    if hosts_file is not None:
        mounts.append(Mount(hosts_file, "/etc/hosts", False))
    return Sandbox(mounts=mounts)  # the env is the Target's: the container's, sandbox env included


def write_probe_hosts(path: Path, pod_ip: str, pod_hosts: Path | None) -> Path:
    """An /etc/hosts whose `localhost` is the pod IP, the pod's other names kept."""
    lines = [f"{pod_ip}\tlocalhost"]
    if pod_hosts is not None and pod_hosts.exists():
        lines += [ln for ln in pod_hosts.read_text().splitlines() if "localhost" not in ln.split()]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def _port(value, ports: dict[str, int]) -> int:
    if isinstance(value, int) or str(value).isdigit():
        return int(value)
    if value not in ports:
        raise ValueError(f"port {value!r} is not a named port of the container")
    return ports[value]


def run_once(t: Target) -> tuple[bool, str]:
    """One try of the probe: (passed, why not)."""
    a, timeout = t.spec.action, t.spec.timeout_s
    if t.spec.handler == "exec":
        argv = list(a.get("command") or [])
        if not argv:
            return False, "exec probe without a command"
        try:
            proc = subprocess.Popen(
                t.sandbox.wrap(argv) if t.sandbox.mounts else argv,
                env=t.env or None,
                cwd=t.cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as e:
            return False, str(e)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            try:  # the whole probe: a shell's children (wget) too
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.communicate()
            return False, f"command timed out after {timeout:g}s"
        text = out.decode(errors="replace").strip()[-200:]
        return proc.returncode == 0, f"exit {proc.returncode}: {text}"
    host = a.get("host") or t.pod_ip
    try:
        port = _port(a.get("port"), t.ports)
    except ValueError as e:
        return False, str(e)
    if t.spec.handler == "httpGet":
        scheme = (a.get("scheme") or "HTTP").upper()
        conn_cls = http.client.HTTPSConnection if scheme == "HTTPS" else http.client.HTTPConnection
        kw = {"context": ssl._create_unverified_context()} if scheme == "HTTPS" else {}
        try:
            conn = conn_cls(host, port, timeout=timeout, **kw)
            headers = {h["name"]: h["value"] for h in a.get("httpHeaders") or []}
            conn.request("GET", a.get("path") or "/", headers={"User-Agent": "kube-probe/1.34", **headers})
            code = conn.getresponse().status
            conn.close()
        except (OSError, http.client.HTTPException) as e:
            return False, f"GET {host}:{port}{a.get('path') or '/'}: {e}"
        return 200 <= code < 400, f"HTTP {code}"
    if t.spec.handler == "tcpSocket":
        try:
            socket.create_connection((host, port), timeout=timeout).close()
        except OSError as e:
            return False, f"connect {host}:{port}: {e}"
        return True, ""
    return True, f"{t.spec.handler} probes are not run by the bed (counted as passing)"


class Prober:
    """Every probe of every running container; `tick` returns what their results changed."""

    def __init__(self, log: Callable[[str], None], run: Callable[[Target], tuple[bool, str]] = run_once):
        self.targets: dict[str, Target] = {}  # Target.id -> Target
        self.pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="probe")
        self.log = log
        self.run = run

    def add(self, t: Target) -> None:
        if t.spec.handler not in ("exec", "httpGet", "tcpSocket"):
            self.log(f"{t.key}: {t.spec.handler} {t.kind} probe not run by the bed: counted as passing")
        if t.kind == "liveness":
            t.ready = True  # alive until proven otherwise
        self.targets[t.id] = t

    def remove(self, key: str) -> None:
        """Forget every probe of container `key`."""
        for tid in [tid for tid, t in self.targets.items() if t.key == key]:
            del self.targets[tid]

    def __contains__(self, key: str) -> bool:
        return any(t.key == key for t in self.targets.values())

    def starting(self, key: str) -> bool:
        """Container `key` has a startup probe that has not passed yet (a kubelet's started: false)."""
        s = self.targets.get(f"{key}/startup")
        return s is not None and not s.ready

    def _gated(self, t: Target) -> bool:
        """A startup probe that has not passed holds the container's other probes."""
        return t.kind != "startup" and self.starting(t.key)

    def tick(self, now: float | None = None) -> list[ProbeEvent]:
        now = time.time() if now is None else now
        events = []
        for t in list(self.targets.values()):
            if t.running is not None and t.running.done():
                ok, why = t.running.result()
                t.running = None
                ev = self._record(t, ok, why)
                if ev is not None:
                    events.append(ev)
                    if ev.what == "started":  # the others start now, their initial delay counted from start
                        for o in self.targets.values():
                            if o.key == t.key and o is not t:
                                o.next_at = max(o.next_at, now)
            if t.id not in self.targets or self._gated(t) or (t.kind == "startup" and t.ready):
                continue
            if t.running is None and now >= t.next_at:
                t.next_at = now + t.spec.period_s
                t.running = self.pool.submit(self._safe_run, t)
        return events

    def _safe_run(self, t: Target) -> tuple[bool, str]:
        try:
            return self.run(t)
        except Exception as e:  # noqa: BLE001 - a probe that cannot run fails, as a kubelet counts it
            return False, f"probe error: {e}"

    def _record(self, t: Target, ok: bool, why: str) -> ProbeEvent | None:
        """Count one result; the event when it changes the container's readiness or life."""
        if ok:
            t.successes, t.failures = t.successes + 1, 0
            if not t.ready and t.successes >= t.spec.success_threshold:
                t.ready = True
                self.log(f"{t.key}: {t.kind} probe passed")
                return ProbeEvent(t, "started" if t.kind == "startup" else "ready")
            return None
        t.failures, t.successes = t.failures + 1, 0
        if t.failures < t.spec.failure_threshold:
            return None
        if t.kind == "readiness" and t.ready:
            t.ready = False
            self.log(f"{t.key}: readiness probe failed {t.failures}x ({why}): not ready")
            return ProbeEvent(t, "unready", why)
        if t.kind in ("liveness", "startup"):
            self.log(f"{t.key}: {t.kind} probe failed {t.failures}x ({why}): killing the container")
            self.remove(t.key)  # the container's probes end with it; its restart brings new ones
            return ProbeEvent(t, "kill", why)
        return None

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
