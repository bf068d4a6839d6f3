"""The pod runner's process table: the container processes it started, persisted so that a restarted
runner re-adopts them.

Each container runs as `sh -c '"$@"; echo $? > EXITFILE'` in its own session (process group), so
its exit code is recorded even while no runner waits for it. The record of a container
(.state/bed/runner/<pod uid>_<container>.json) holds pid + process start time (a reused pid is not
mistaken for it), the pod's identity, its log file and, once it ended, exit code and reason.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from hack.bed.kubelet.clock import now_iso
from hack.bed.kubelet.log import log


def proc_starttime(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):
        return None
    return fields[19]  # field 22 of stat: start time in clock ticks


def group_alive(pgid: int) -> bool:
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            fields = (p / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            return True
    return False


def alive(pid: int, starttime: str | None) -> bool:
    st = proc_starttime(pid)
    return st is not None and (starttime is None or st == starttime)


def exit_reason(code: int, lost: bool) -> str:
    """The container state reason a runtime reports for this end (137 = SIGKILL, as on OOM)."""
    if lost:
        return "ContainerStatusUnknown"
    return "Completed" if code == 0 else "OOMKilled" if code == 137 else "Error"


class Proc:
    """One running (or finished) container process."""

    def __init__(self, rec: dict, popen: subprocess.Popen | None = None, sandbox=None):
        self.rec = rec  # persisted: uid, ns, name, container, pid, starttime, exitfile, ...
        self.popen = popen
        self.sandbox = sandbox  # its sandbox.Sandbox (token refresh); None once re-adopted
        self.kill_at: float | None = None  # SIGKILL deadline once SIGTERM was sent

    @property
    def key(self) -> str:
        return f"{self.rec['uid']}_{self.rec['container']}"

    def is_alive(self) -> bool:
        if self.popen is not None:
            sh_alive = self.popen.poll() is None
        else:
            sh_alive = alive(self.rec["pid"], self.rec.get("starttime"))
        if sh_alive:
            return True
        # the sh wrapper dies on SIGTERM at once; while terminating, the container is alive as
        # long as anything of its process group is (e.g. a child that handles SIGTERM slowly)
        return self.kill_at is not None and group_alive(self.rec["pid"])

    def exit_code(self) -> int:
        ef = Path(self.rec["exitfile"])
        for _ in range(10):
            if ef.exists():
                txt = ef.read_text().strip()
                if txt:
                    return int(txt)
            time.sleep(0.02)
        if self.popen is not None and self.popen.returncode is not None:
            rc = self.popen.returncode
            return 128 - rc if rc < 0 else rc
        return -1  # unknown: lost while the runner was down

    def signal(self, sig: int) -> None:
        if self.rec["pid"] <= 0:
            return  # a container that never ran (ProcessTable.record_done); killpg(0) is our own group
        try:
            os.killpg(self.rec["pid"], sig)
        except (ProcessLookupError, PermissionError):
            pass


class ProcessTable(dict[str, Proc]):
    """ "<pod uid>_<container>" -> Proc, mirrored in record files under `recdir`."""

    def __init__(self, recdir: Path):
        super().__init__()
        self.recdir = recdir
        recdir.mkdir(parents=True, exist_ok=True)

    def of_pod(self, uid: str) -> list[tuple[str, Proc]]:
        return [(k, p) for k, p in self.items() if p.rec["uid"] == uid]

    def save(self, rec: dict) -> None:
        f = self.recdir / f"{rec['uid']}_{rec['container']}.json"
        tmp = f.with_suffix(".tmp")
        tmp.write_text(json.dumps(rec))
        tmp.replace(f)

    def forget(self, key: str) -> Proc | None:
        """Drop a container's record and exit file; returns its Proc if it was in the table."""
        for suffix in (".json", ".exit"):
            (self.recdir / f"{key}{suffix}").unlink(missing_ok=True)
        return self.pop(key, None)

    def start(
        self,
        pod: dict,
        container: str,
        restart_count: int,
        argv: list[str],
        env: dict[str, str],
        cwd: str,
        logfile: Path,
        sandbox,
    ) -> Proc:
        """Run argv in its own session (in the sandbox's mount namespace), output to logfile."""
        md = pod["metadata"]
        key = f"{md['uid']}_{container}"
        exitfile = self.recdir / f"{key}.exit"
        exitfile.unlink(missing_ok=True)
        env = {**env, "RLTUNE_EXIT_FILE": str(exitfile)}
        with open(logfile, "ab") as lf:
            lf.write(f"==== {now_iso()} container {container} start #{restart_count}: {json.dumps(argv)}\n".encode())
            lf.flush()
            if not argv:
                argv = ["/bin/sh", "-c", "echo 'no command for this image' >&2; exit 127"]
            # sh records the exit code even when the runner is not around to wait() for it
            p = subprocess.Popen(
                sandbox.wrap(["/bin/sh", "-c", '"$@"; echo $? > "$RLTUNE_EXIT_FILE"', "rltune-pod", *argv]),
                stdout=lf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=cwd,
                start_new_session=True,
                close_fds=True,
            )
        rec = {
            "uid": md["uid"],
            "namespace": md["namespace"],
            "name": md["name"],
            "container": container,
            "pid": p.pid,
            "starttime": proc_starttime(p.pid),
            "exitfile": str(exitfile),
            "log": str(logfile),
            "startedAt": now_iso(),
            "restartCount": restart_count,
            "argv": argv,
        }
        self.save(rec)
        self[key] = proc = Proc(rec, p, sandbox)
        log(f"started {md['namespace']}/{md['name']} [{container}] pid {p.pid}: {' '.join(argv)}")
        return proc

    def record_done(self, pod: dict, container: str, logfile: Path) -> Proc:
        """A container the bed does not run (an init container of an unmapped image) recorded as
        completed at once, the way kwok reports such containers."""
        md = pod["metadata"]
        t = now_iso()
        rec = {
            "uid": md["uid"],
            "namespace": md["namespace"],
            "name": md["name"],
            "container": container,
            "pid": 0,
            "starttime": None,
            "exitfile": str(self.recdir / f"{md['uid']}_{container}.exit"),
            "log": str(logfile),
            "startedAt": t,
            "restartCount": 0,
            "argv": [],
            "exitCode": 0,
            "finishedAt": t,
            "reason": "Completed",
            "done": True,
        }
        self.save(rec)
        self[f"{md['uid']}_{container}"] = proc = Proc(rec)
        with open(logfile, "ab") as lf:
            lf.write(f"==== {t} container {container}: image not run by the test bed, counted as completed\n".encode())
        return proc

    def finish(self, proc: Proc) -> bool:
        """Record the end of a process that is no longer alive; True when its exit code was lost."""
        rec = proc.rec
        code = proc.exit_code()
        lost = code < 0
        if lost:
            code = 255
        # killed for a failed liveness/startup probe: "Error" whatever the signal, as a runtime reports it
        reason = "Error" if rec.get("killedBy") and code != 0 and not lost else exit_reason(code, lost)
        proc.signal(signal.SIGKILL)  # like a container: nothing of it outlives its main process
        rec.update({"exitCode": code, "finishedAt": now_iso(), "reason": reason, "done": True})
        self.save(rec)
        proc.popen = None
        with open(rec["log"], "ab") as lf:
            lf.write(f"==== {now_iso()} container {rec['container']} exited {code} ({reason})\n".encode())
        log(f"{rec['namespace']}/{rec['name']} [{rec['container']}] exited {code} ({reason})")
        return lost

    @staticmethod
    def terminate(p: Proc, grace: float) -> None:
        """SIGTERM the process group; `kill_escalate` sends SIGKILL once `grace` has passed."""
        log(
            f"terminating {p.rec['namespace']}/{p.rec['name']} [{p.rec['container']}] "
            f"pid {p.rec['pid']} (grace {grace:g}s)"
        )
        p.signal(signal.SIGTERM)
        p.kill_at = time.time() + grace

    @staticmethod
    def kill_escalate(p: Proc, t: float) -> None:
        """SIGKILL a group past its grace period (again every 5 s while anything of it lives)."""
        if p.kill_at is not None and t >= p.kill_at:
            log(f"SIGKILL {p.rec['namespace']}/{p.rec['name']} pid {p.rec['pid']}")
            p.signal(signal.SIGKILL)
            p.kill_at = t + 5

    @staticmethod
    def sweep(p: Proc) -> None:
        """After a terminated container's main process ended: kill what is left of its group."""
        p.signal(signal.SIGKILL)
        if p.popen is not None:
            p.popen.poll()

    def adopt(self, live_uids: set[str]) -> list[Proc]:
        """Load the records a previous runner left: processes of pods that are gone are killed and
        forgotten, the others join the table (a finished one is reported by the next tick)."""
        adopted = []
        for f in sorted(self.recdir.glob("*.json")):
            try:
                rec = json.loads(f.read_text())
            except ValueError:
                f.unlink()
                continue
            p = Proc(rec)
            if rec["uid"] not in live_uids:
                if p.is_alive() and not rec.get("done"):
                    log(f"pod of pid {rec['pid']} is gone: killing it")
                    p.signal(signal.SIGTERM)
                    time.sleep(0.5)
                    p.signal(signal.SIGKILL)
                self.forget(p.key)
                continue
            self[p.key] = p
            adopted.append(p)
            if not rec.get("done") and p.is_alive():
                log(f"re-adopted {rec['namespace']}/{rec['name']} [{rec['container']}] pid {rec['pid']}")
        return adopted
