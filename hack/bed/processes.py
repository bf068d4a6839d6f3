"""The bed's processes: each started in its own session, its pid file under .state/bed/pids/ and its
log under .state/bed/logs/, found again by a later `hack/testbed.py` (a marker in its cmdline)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from hack.bed import paths
from hack.bed.log import log


def in_private_mounts(script: str, *args: str) -> list[str]:
    """argv that runs the shell `script` (its $0, $1, ... are `args`) in a private mount namespace,
    so the bind mounts it makes for a process (a hosts file, a certificate directory, a sandbox's
    volumes) are that process's alone."""
    return ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", script, *args]


def _pid_file(name: str) -> Path:
    return paths.PIDS / f"{name}.pid"


def _proc_cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


_POPENS: dict[str, subprocess.Popen] = {}  # processes this python process started


def _alive(name: str) -> bool:
    """Liveness for waiting right after a start: our own child's poll() is exact, whereas
    /proc/<pid>/cmdline can still show the pre-exec image for a moment after Popen returns."""
    p = _POPENS.get(name)
    if p is not None:
        return p.poll() is None
    return running_pid(name) is not None


def running_pid(name: str) -> int | None:
    """pid of the bed's process `name` if alive (and really ours: marker in its cmdline)."""
    f = _pid_file(name)
    if not f.exists():
        return None
    try:
        data = json.loads(f.read_text())
    except ValueError:
        return None
    pid = int(data["pid"])
    cmd = _proc_cmdline(pid)
    if not cmd or _proc_state(pid) in ("Z", "X", ""):
        return None
    if cmd[0] == "":
        return pid  # between fork and exec: the cmdline is empty for a moment
    if data.get("exe") and Path(cmd[0]).name != Path(data["exe"]).name and data["exe"] not in cmd:
        return None
    return pid


def start(name: str, argv: list[str], env: dict | None = None, exe: str | None = None) -> int:
    """Start `argv` as bed process `name` (own session, log under LOGS); `exe` is the program it
    ends up running when argv[0] is a wrapper that execs it (liveness checks look for it)."""
    pid = running_pid(name)
    if pid:
        return pid
    paths.LOGS.mkdir(parents=True, exist_ok=True)
    paths.PIDS.mkdir(parents=True, exist_ok=True)
    logf = open(paths.LOGS / f"{name}.log", "ab")
    logf.write(f"\n==== {time.strftime('%Y-%m-%dT%H:%M:%S')} start: {' '.join(argv)}\n".encode())
    logf.flush()
    full_env = dict(os.environ)
    full_env.update(env or {})
    p = subprocess.Popen(
        argv,
        stdout=logf,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=full_env,
        cwd=str(paths.REPO),
        start_new_session=True,
        close_fds=True,
    )
    logf.close()
    _POPENS[name] = p
    _pid_file(name).write_text(json.dumps({"pid": p.pid, "exe": exe or argv[0], "argv": argv}))
    log(f"started {name} (pid {p.pid}), log {paths.LOGS / (name + '.log')}")
    return p.pid


def stop(name: str, timeout: float | None = None) -> None:
    if timeout is None:  # an apiserver with open watches takes its time; etcd must flush
        timeout = {"etcd": 15.0, "podrunner": 10.0}.get(name, 5.0)
    pid = running_pid(name)
    if pid:
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.time() + timeout
        while time.time() < deadline and _proc_state(pid) not in ("", "Z", "X"):
            time.sleep(0.1)
        if _proc_state(pid) not in ("", "Z", "X"):
            log(f"{name} did not stop in {timeout}s: SIGKILL")
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            time.sleep(0.2)
        log(f"stopped {name} (pid {pid})")
    _pid_file(name).unlink(missing_ok=True)


def wait_for(what: str, check, timeout: float = 120.0, name: str | None = None) -> None:
    t0 = time.time()
    last = None
    while time.time() - t0 < timeout:
        try:
            if check():
                log(f"{what} ready in {time.time() - t0:.1f}s")
                return
        except Exception as e:  # noqa: BLE001 - keep polling
            last = e
        if name and not _alive(name):
            tail = ""
            lf = paths.LOGS / f"{name}.log"
            if lf.exists():
                tail = "\n".join(lf.read_text(errors="replace").splitlines()[-25:])
            raise SystemExit(f"{name} exited while waiting for {what}:\n{tail}")
        time.sleep(0.25)
    raise SystemExit(f"timed out after {timeout}s waiting for {what}: {last}")


def pod_process_pids() -> list[int]:
    """pids of pod processes started by the runner for this state dir (marked in environ)."""
    marker = f"RLTUNE_BED_STATE={paths.STATE}".encode()
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            env = (p / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker in env and any(e.startswith(b"RLTUNE_POD_UID=") for e in env):
            out.append(int(p.name))
    return out
