"""The metrics bridge: run a framework's training command and export its console log as rltune metrics.

    python -m rltune.adapters.bridge --framework verl --pushgateway URL --namespace NS --job JOB \\
        --trial T [--warmup-steps N] [--gpus G] -- python3 -m verl.trainer.main_ppo ...

The bridge runs the command, copies its stdout and stderr to its own, byte for byte and without
delay (the user's log looks as before), parses the lines with rltune.adapters.logs and, after every
completed RL step, pushes the trial's metric contract (docs/metrics.md) to the Pushgateway under
the grouping key {job="rltune-trial", namespace, rltune_job, trial}, the same as the trial
exporter (rltune.trial.exporter):

- per-step gauges with the `step` label (0, 1, ... in the order the steps complete; the framework's
  own step number is not used, so a resumed run still starts at 0), `rltune_step_warmup` 1 for the
  first N steps, `rltune_step_phase_seconds{phase}` for the phases the framework reports;
- `rltune_trial_steps_total`, `rltune_trial_state` (0 running, 1 succeeded, 2 failed),
  `rltune_trial_gpus` (with --gpus) and `rltune_trial_info{mode="real", reason, missing}`, where
  `missing` lists (comma-separated) the contract series the framework does not print: the bridge
  exports nothing for them rather than a made-up 0.

It forwards SIGTERM and SIGINT to the command (its own process group), and exits with the command's
exit code (128+N when a signal N ended it). A command that fails, or that exits 0 without printing
a single step, leaves `rltune_trial_state 2` and a one-line reason.

Shipping into a framework image. The bridge and the modules it imports (rltune.adapters.logs,
rltune.api.metrics) are stdlib-only, Python >= 3.8, so they run in the user's own verl / OpenRLHF
image, which lacks rltune. The operator adds an init container running the rltune image:

    python -m rltune.adapters.bridge --install /opt/rltune-bridge

which copies exactly those files (with the package __init__ files on their import path) into an
emptyDir volume also mounted in the Ray head container, whose entrypoint becomes

    PYTHONPATH=/opt/rltune-bridge python3 -m rltune.adapters.bridge --framework verl ... -- <the user's command>

The install directory is removed from the command's PYTHONPATH again, so the framework never sees
the copied `rltune` package.
"""

from __future__ import annotations

import argparse
import base64
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Optional
from urllib.parse import quote

from rltune.adapters.logs import FIELDS, FRAMEWORKS, LogParser, parser_for, phase_key
from rltune.api import metrics as metrics_contract
from rltune.api.metrics import StepRecord

INSTALL_MARKER = ".rltune-bridge"
# the files --install copies, relative to the directory holding the `rltune` package
INSTALL_FILES = (
    "rltune/__init__.py",
    "rltune/api/__init__.py",
    "rltune/api/metrics.py",
    "rltune/adapters/__init__.py",
    "rltune/adapters/logs.py",
    "rltune/adapters/bridge.py",
)
PUSH_TIMEOUT = 10.0


def _warn(msg: str) -> None:
    sys.stderr.write(f"rltune-bridge: {msg}\n")
    sys.stderr.flush()


# ---------------------------------------------------------------------------------------------- GPU memory
NVIDIA_SMI = ("nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits")


def parse_memory_total(text: str) -> Optional[float]:
    """GiB of the smallest GPU in `nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits`
    output (one MiB figure per GPU), or None when no line is a figure."""
    mib = []
    for line in text.splitlines():
        try:
            mib.append(float(line.strip()))
        except ValueError:
            continue
    mib = [m for m in mib if m > 0]
    return min(mib) / 1024.0 if mib else None


def gpu_memory_gib(nominal: float, query: tuple = NVIDIA_SMI) -> tuple[float, str]:
    """The GPU memory a framework's peak is a share of, and where it came from: what the driver
    reports for this pod's GPUs (nvidia-smi, which the NVIDIA container toolkit mounts into GPU
    containers) when it answers, else `nominal` (the operator's catalog figure; 0 = unknown)."""
    try:
        out = subprocess.run(list(query), capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        out = None
    got = parse_memory_total(out.stdout) if out is not None and out.returncode == 0 else None
    if got:
        return got, "nvidia-smi"
    return nominal, "nominal" if nominal > 0 else "unknown"


# ---------------------------------------------------------------------------------------------- exposition
def _esc(v: str) -> str:
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(v: float) -> str:
    v = float(v)
    if v != v:
        return "NaN"
    if v in (float("inf"), float("-inf")):
        return "+Inf" if v > 0 else "-Inf"
    return repr(v)


def _one_line(reason: str) -> str:
    return " ".join(reason.split())[:240]


class TrialMetrics:
    """The trial's whole metric state, rendered as one text exposition (pushed with PUT)."""

    def __init__(
        self,
        namespace: str,
        job: str,
        trial: str,
        warmup_steps: int = 0,
        mode: str = "real",
        gpus: Optional[float] = None,
        names: Optional[dict[str, str]] = None,
        signing_key: Optional[str] = None,
    ):
        self.labels = {"namespace": namespace, "rltune_job": job, "trial": trial}
        self.signing_key = signing_key or ""  # env RLTUNE_METRICS_KEY: api/metrics.py 'Signed'

        self.warmup_steps = max(0, int(warmup_steps))
        self.mode = mode
        self.gpus = gpus
        self.names = names
        self.steps: list[tuple[StepRecord, frozenset[str]]] = []
        self.state = metrics_contract.TRIAL_RUNNING
        self.reason = ""
        self.lock = threading.Lock()

    def add(self, rec: StepRecord, missing: frozenset[str]) -> StepRecord:
        """Record one completed step (renumbered 0, 1, ...; warm-up flagged); return what is exported."""
        with self.lock:
            idx = len(self.steps)
            out = StepRecord(
                step=idx,
                duration=rec.duration,
                phases=dict(rec.phases),
                generated_tokens=rec.generated_tokens,
                trained_tokens=rec.trained_tokens,
                staleness=rec.staleness,
                reward=rec.reward,
                logprob_mismatch=rec.logprob_mismatch,
                kv_usage=rec.kv_usage,
                preemptions=rec.preemptions,
                trainer_memory=rec.trainer_memory,
                longest_sequence=rec.longest_sequence,
                warmup=idx < self.warmup_steps,
            )
            self.steps.append((out, frozenset(missing)))
            return out

    def finish(self, ok: bool, reason: str = "") -> None:
        with self.lock:
            self.state = metrics_contract.TRIAL_SUCCEEDED if ok else metrics_contract.TRIAL_FAILED
            self.reason = _one_line(reason)

    def missing(self) -> list[str]:
        out: set[str] = set()
        for _, miss in self.steps:
            out |= miss
        return sorted(out)

    def _lab(self, **extra: str) -> str:
        items = dict(self.labels, **extra)
        return "{" + ",".join(f'{k}="{_esc(v)}"' for k, v in items.items()) + "}"

    def render(self) -> str:
        with self.lock:
            lines: list[str] = []

            def family(contract: str, kind: str, help_text: str, samples: list[tuple[dict, float]]) -> None:
                if not samples:
                    return
                n = metrics_contract.name(contract, self.names)
                lines.append(f"# HELP {n} {help_text}")
                lines.append(f"# TYPE {n} {kind}")
                for extra, value in samples:
                    lines.append(f"{n}{self._lab(**extra)} {_num(value)}")

            per: dict[str, list[tuple[dict, float]]] = {c: [] for c in metrics_contract.STEP_METRICS}
            signatures: list[tuple[dict, float]] = []
            for rec, miss in self.steps:
                s = str(rec.step)
                values = [("step_duration_seconds", "", float(rec.duration))]
                for phase in metrics_contract.PHASES:
                    if phase in rec.phases and phase_key(phase) not in miss:
                        values.append(("step_phase_seconds", phase, float(rec.phases[phase])))
                for contract, attr in FIELDS.items():
                    if contract not in miss:
                        values.append((contract, "", float(getattr(rec, attr))))
                values.append(("step_warmup", "", 1.0 if rec.warmup else 0.0))
                for contract, phase, value in values:
                    per[contract].append(({"step": s, "phase": phase} if phase else {"step": s}, value))
                if self.signing_key:
                    sig = metrics_contract.step_signature(self.signing_key, self.labels, rec.step, values)
                    signatures.append(({"step": s, "signature": sig}, 1.0))
            for contract, help_text in metrics_contract.STEP_METRICS.items():
                family(contract, "gauge", help_text, per[contract])
            if signatures:
                lines.append(f"# HELP {metrics_contract.SIGNATURE} {metrics_contract.SIGNATURE_HELP}")
                lines.append(f"# TYPE {metrics_contract.SIGNATURE} gauge")
                lines.extend(f"{metrics_contract.SIGNATURE}{self._lab(**extra)} {_num(v)}" for extra, v in signatures)
            T = metrics_contract.TRIAL_METRICS
            family("trial_steps_total", "counter", T["trial_steps_total"], [({}, float(len(self.steps)))])
            if self.gpus is not None:
                family("trial_gpus", "gauge", T["trial_gpus"], [({}, float(self.gpus))])
            family("trial_state", "gauge", T["trial_state"], [({}, float(self.state))])
            info = {"mode": self.mode, "reason": self.reason, "missing": ",".join(self.missing())}
            if self.signing_key and self.reason:
                info["signature"] = metrics_contract.reason_signature(self.signing_key, self.labels, self.reason)
            family("trial_info", "gauge", T["trial_info"], [(info, 1.0)])
            return "\n".join(lines) + "\n"


def group_path(namespace: str, job: str, trial: str) -> str:
    """The Pushgateway path of the trial's group (values with '/' or empty: base64, as the API asks)."""
    parts = []
    for k, v in (("job", metrics_contract.PUSH_JOB), ("namespace", namespace), ("rltune_job", job), ("trial", trial)):
        if not v or "/" in v:
            parts.append(f"{k}@base64/{base64.urlsafe_b64encode(v.encode()).decode() or '='}")
        else:
            parts.append(f"{k}/{quote(v, safe='')}")
    return "/metrics/" + "/".join(parts)


def push(url: str, path: str, body: str, timeout: float = PUSH_TIMEOUT) -> None:
    req = urllib.request.Request(
        url.rstrip("/") + path,
        data=body.encode(),
        method="PUT",
        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        r.read()


class Pusher(threading.Thread):
    """Pushes the latest state in the background (the log copy never waits on the network)."""

    def __init__(self, metrics: TrialMetrics, url: Optional[str], interval: float = 0.2):
        super().__init__(name="rltune-bridge-push", daemon=True)
        self.metrics = metrics
        self.url = url
        lab = metrics.labels
        self.path = group_path(lab["namespace"], lab["rltune_job"], lab["trial"])
        self.interval = interval
        self.wake = threading.Event()
        self.stopping = False
        self.errors = 0

    def push_now(self, retries: int = 0) -> bool:
        if not self.url:
            return True
        for attempt in range(retries + 1):
            try:
                push(self.url, self.path, self.metrics.render())
                return True
            except (urllib.error.URLError, OSError, ValueError) as e:
                self.errors += 1
                if self.errors <= 3:
                    _warn(f"push to {self.url} failed: {e}")
                if attempt < retries:
                    time.sleep(min(2.0, 0.5 * (attempt + 1)))
        return False

    def run(self) -> None:
        while not self.stopping:
            self.wake.wait()
            self.wake.clear()
            if self.stopping:
                return
            self.push_now()
            time.sleep(self.interval)

    def stop(self) -> None:
        self.stopping = True
        self.wake.set()


# ---------------------------------------------------------------------------------------------- the command
_ERROR_LINE = re.compile(r"(?:Error|Exception|Killed|OOM)\b|out of memory", re.IGNORECASE)


class Tee(threading.Thread):
    """Copies one of the command's streams to ours, unchanged, and feeds complete lines to `on_line`."""

    def __init__(self, src, dst_fd: int, on_line):
        super().__init__(daemon=True)
        self.src = src
        self.dst_fd = dst_fd
        self.on_line = on_line
        self.last_lines: list[str] = []

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                n = os.write(self.dst_fd, view)
            except InterruptedError:
                continue
            except OSError:  # our own stream is gone: keep draining the child
                return
            view = view[n:]

    def _line(self, raw: bytes) -> None:
        text = raw.decode("utf-8", errors="replace")
        if text.strip():
            self.last_lines = (self.last_lines + [text.strip()])[-20:]
        self.on_line(text)

    def run(self) -> None:
        fd = self.src.fileno()
        pending = b""
        while True:
            try:
                chunk = os.read(fd, 65536)
            except InterruptedError:
                continue
            except OSError:
                break
            if not chunk:
                break
            self._write(chunk)
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                self._line(raw)
        if pending:
            self._line(pending)


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")  # lines reach the bridge when printed, not when a buffer fills
    root = Path(__file__).resolve().parents[2]
    if (root / INSTALL_MARKER).exists() and env.get("PYTHONPATH"):
        keep = [p for p in env["PYTHONPATH"].split(os.pathsep) if p and Path(p).resolve() != root]
        if keep:
            env["PYTHONPATH"] = os.pathsep.join(keep)
        else:
            del env["PYTHONPATH"]
    return env


def failure_reason(rc: int, tees: list[Tee], framework: str, steps: int) -> str:
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        head = f"the command was killed by {name}"
    else:
        head = f"the command exited with code {rc}"
    lines = [line for t in tees for line in t.last_lines]
    if any("out of memory" in line.lower() for line in lines):
        return f"{head}: CUDA out of memory"
    hits = [line for line in lines if _ERROR_LINE.search(line)]
    tail = hits[-1] if hits else (tees[-1].last_lines[-1] if tees and tees[-1].last_lines else "")
    return f"{head} after {steps} {framework} steps" + (f": {tail}" if tail else "")


def run(args: argparse.Namespace, command: list[str]) -> int:
    names = None
    if args.names:
        import json

        names = json.loads(args.names)
    metrics = TrialMetrics(
        args.namespace,
        args.job,
        args.trial,
        args.warmup_steps,
        mode=args.mode,
        gpus=args.gpus,
        names=names,
        signing_key=os.environ.get(metrics_contract.KEY_ENV),
    )
    # nothing is written to the user's stderr about it: the log passes through byte for byte
    mem, _ = gpu_memory_gib(args.gpu_memory_gib)
    parser: LogParser = parser_for(args.framework, mem)
    pusher = Pusher(metrics, args.pushgateway, interval=args.push_interval)
    lock = threading.Lock()

    def on_line(text: str) -> None:
        with lock:
            try:
                done = parser.feed(text)
            except Exception as e:  # a line the parser chokes on must never stop the training
                _warn(f"could not parse a line: {e}")
                return
            for rec in done:
                metrics.add(rec, parser.missing_by_step.get(rec.step, parser.missing))
        if done:
            pusher.wake.set()

    try:
        child = subprocess.Popen(
            command,
            stdin=None,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=_child_env(),
            preexec_fn=os.setpgrp,  # its own process group: a terminal's Ctrl-C reaches it only through us
        )
    except OSError as e:
        _warn(f"cannot run {command[0]}: {e}")
        metrics.finish(False, f"cannot run {command[0]}: {e}")
        pusher.push_now(retries=2)
        return 127

    def forward(signum, _frame):
        try:
            os.killpg(child.pid, signum)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)

    pusher.start()
    pusher.wake.set()  # state running, 0 steps, before the first step
    tees = [Tee(child.stdout, 1, on_line), Tee(child.stderr, 2, on_line)]
    for t in tees:
        t.start()
    rc = child.wait()
    for t in tees:
        t.join()
    pusher.stop()
    pusher.join(timeout=PUSH_TIMEOUT + 1)

    steps = len(metrics.steps)
    if rc == 0 and steps:
        metrics.finish(True)
    elif rc == 0:
        hint = " (verl: is 'console' in trainer.logger?)" if args.framework == "verl" else ""
        metrics.finish(False, f"the command exited 0 but printed no {args.framework} step metrics{hint}")
    else:
        metrics.finish(False, failure_reason(rc, tees, args.framework, steps))
    pusher.push_now(retries=3)
    return rc if rc >= 0 else 128 - rc


# ---------------------------------------------------------------------------------------------- install
def install(target: str) -> int:
    """Copy the bridge's files into `target` so `PYTHONPATH=target python3 -m rltune.adapters.bridge` works."""
    src_root = Path(__file__).resolve().parents[2]
    dst_root = Path(target)
    for rel in INSTALL_FILES:
        dst = dst_root / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src_root / rel, dst)
    (dst_root / INSTALL_MARKER).write_text("rltune metrics bridge (python -m rltune.adapters.bridge)\n")
    # prove the copy needs nothing but the standard library: no site-packages, only `target`
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(dst_root)}
    probe = subprocess.run(
        [sys.executable, "-S", "-c", "import rltune.adapters.bridge"],
        env=env,
        cwd=str(dst_root),
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        _warn(f"the installed bridge does not import with the standard library alone:\n{probe.stderr}")
        return 1
    print(f"rltune-bridge: installed into {dst_root}: PYTHONPATH={dst_root} python3 -m rltune.adapters.bridge ...")
    return 0


# ---------------------------------------------------------------------------------------------- cli
def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, command = argv[:i], argv[i + 1 :]
    ap = argparse.ArgumentParser(
        prog="python -m rltune.adapters.bridge",
        description="Run a framework's training command; push its console metrics as rltune's contract.",
    )
    ap.add_argument("--install", metavar="DIR", help="copy the bridge into DIR (for PYTHONPATH=DIR) and exit")
    ap.add_argument("--framework", choices=FRAMEWORKS)
    ap.add_argument("--pushgateway", default=os.environ.get("RLTUNE_PUSHGATEWAY_URL"), help="Pushgateway URL")
    ap.add_argument("--namespace", default="default")
    ap.add_argument("--job", help="the RLTuningJob's name (label rltune_job)")
    ap.add_argument("--trial", help="the trial id (label trial)")
    ap.add_argument("--warmup-steps", type=int, default=0, help="flag the first N steps as warm-up")
    ap.add_argument("--gpus", type=float, default=None, help="export rltune_trial_gpus")
    ap.add_argument(
        "--gpu-memory-gib",
        type=float,
        default=0.0,
        help="the trial GPU's memory when nvidia-smi does not answer (the driver's figure wins): turns the "
        "framework's peak trainer memory (GiB) into the contract's share",
    )
    ap.add_argument("--mode", default="real", help="rltune_trial_info's mode label")
    ap.add_argument("--names", default=None, help="JSON: spec.metrics.names overrides of the contract names")
    ap.add_argument("--push-interval", type=float, default=0.2, help="at most one push per this many seconds")
    args = ap.parse_args(argv)
    if args.install:
        return install(args.install)
    if not args.framework or not args.job or not args.trial or not command:
        ap.error("--framework, --job, --trial and `-- <command ...>` are required (or --install DIR)")
    if not args.pushgateway:
        _warn("no --pushgateway (or RLTUNE_PUSHGATEWAY_URL): the metrics are parsed but not exported")
    return run(args, command)


if __name__ == "__main__":
    sys.exit(main())
