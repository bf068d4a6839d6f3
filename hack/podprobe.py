"""Readiness probes of the containers the pod runner executes, run the way a kubelet runs them.

Without them a container is Ready the moment its process starts, before it listens: a Service
sends traffic to it, and an operator that waits for Ready (KubeRay submits a RayJob's driver once
the head pod is Ready) acts too early. A kubelet reports a container with a readinessProbe not
ready until the probe passed `successThreshold` times in a row (after `initialDelaySeconds`, every
`periodSeconds`, each try cut at `timeoutSeconds`), and not ready again after `failureThreshold`
failures in a row. This module keeps that state per container and runs the probes on a small
thread pool, so a slow probe never holds up the runner's loop; the runner writes the transitions.

Handlers, as a kubelet's:

* exec: the command in the container's environment and mount namespace (its volumes, its private
  /tmp); exit code 0 passes. For images with `podNetwork` (hack/images.yaml) the probe's
  /etc/hosts maps `localhost` to the pod IP: those pods' servers listen on the pod IP, which is
  what their own loopback would reach in a pod's network namespace (KubeRay's injected probes
  `wget http://localhost:52365/...`). A literal 127.0.0.1 in a command is not rewritten;
* httpGet: GET scheme://host:port/path (host: the pod IP unless set; a named port is looked up in
  the container's ports; headers as given); a status in [200, 400) passes. HTTPS is not verified;
* tcpSocket: a TCP connection to host:port opens.

Not run: grpc probes (logged; counted as passing, as kwok would report the container), liveness and
startup probes (a container is never restarted for failing one). A container the runner re-adopted
after its own restart has no sandbox record: its exec probe gets the probe's /etc/hosts only.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import subprocess
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from podsandbox import Mount, Sandbox

PERIOD_S, TIMEOUT_S, SUCCESS_THRESHOLD, FAILURE_THRESHOLD = 10, 1, 1, 3  # the API's defaults
WORKERS = 4


@dataclass(frozen=True)
class ProbeSpec:
    """A container's readinessProbe with the API's defaults filled in."""

    handler: str  # exec | httpGet | tcpSocket | grpc
    action: dict
    initial_delay_s: float
    period_s: float
    timeout_s: float
    success_threshold: int
    failure_threshold: int

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
        )


@dataclass
class Target:
    """One running container's readiness: what to probe, how, and the run of results so far."""

    key: str  # "<pod uid>_<container>", the process table's key
    spec: ProbeSpec
    pod_ip: str
    ports: dict[str, int]  # the container's named ports
    started: float  # when the container's process started (epoch s)
    env: dict[str, str] = field(default_factory=dict)
    cwd: str = "/"
    sandbox: Sandbox = field(default_factory=Sandbox)
    ready: bool = False
    successes: int = 0
    failures: int = 0
    next_at: float = 0.0
    running: Future | None = None
    last_error: str = ""

    def __post_init__(self) -> None:
        self.next_at = self.started + self.spec.initial_delay_s


def probe_sandbox(sb: Sandbox | None, hosts_file: Path | None) -> Sandbox:
    """The container's mounts with /etc/hosts swapped for the probe's own (localhost = pod IP)."""
    mounts = [m for m in (sb.mounts if sb else []) if not (hosts_file and m.target == "/etc/hosts")]
    if hosts_file is not None:
        mounts.append(Mount(hosts_file, "/etc/hosts", False))
    return Sandbox(mounts=mounts, env=dict(sb.env) if sb else {})


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
            r = subprocess.run(
                t.sandbox.wrap(argv) if t.sandbox.mounts else argv,
                env=t.env or None,
                cwd=t.cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                start_new_session=True,
            )
        except subprocess.TimeoutExpired:
            return False, f"command timed out after {timeout:g}s"
        except OSError as e:
            return False, str(e)
        out = r.stdout.decode(errors="replace").strip()[-200:]
        return r.returncode == 0, f"exit {r.returncode}: {out}"
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
    """The readiness of every probed container; `tick` returns the containers whose readiness changed."""

    def __init__(self, log: Callable[[str], None], run: Callable[[Target], tuple[bool, str]] = run_once):
        self.targets: dict[str, Target] = {}
        self.pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="probe")
        self.log = log
        self.run = run

    def add(self, t: Target) -> None:
        if t.spec.handler not in ("exec", "httpGet", "tcpSocket"):
            self.log(f"{t.key}: {t.spec.handler} readiness probe not run by the bed: counted as passing")
        self.targets[t.key] = t

    def remove(self, key: str) -> None:
        self.targets.pop(key, None)

    def __contains__(self, key: str) -> bool:
        return key in self.targets

    def tick(self, now: float | None = None) -> list[Target]:
        now = time.time() if now is None else now
        changed = []
        for t in list(self.targets.values()):
            if t.running is not None and t.running.done():
                ok, why = t.running.result()
                t.running = None
                if self._record(t, ok, why):
                    changed.append(t)
            if t.running is None and now >= t.next_at:
                t.next_at = now + t.spec.period_s
                t.running = self.pool.submit(self._safe_run, t)
        return changed

    def _safe_run(self, t: Target) -> tuple[bool, str]:
        try:
            return self.run(t)
        except Exception as e:  # noqa: BLE001 - a probe that cannot run fails, as a kubelet counts it
            return False, f"probe error: {e}"

    def _record(self, t: Target, ok: bool, why: str) -> bool:
        """Count one result; True when the container's readiness flips."""
        if ok:
            t.successes, t.failures = t.successes + 1, 0
            if not t.ready and t.successes >= t.spec.success_threshold:
                t.ready = True
                self.log(f"{t.key}: readiness probe passed: ready")
                return True
        else:
            t.failures, t.successes = t.failures + 1, 0
            t.last_error = why
            if t.ready and t.failures >= t.spec.failure_threshold:
                t.ready = False
                self.log(f"{t.key}: readiness probe failed {t.failures}x ({why}): not ready")
                return True
        return False

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
