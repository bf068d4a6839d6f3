"""Local trial backend: one `python -m rltune.trial --spec FILE` process per trial.

Each trial serves rltune's metrics on a free local port; the backend scrapes that endpoint
(prometheus_client's text parser -> api.metrics.records_from_samples) while the trial runs and
once more when its `rltune_trial_state` turns final. Trials are started with
RLTUNE_LINGER_SECONDS so they keep serving after their last step until the backend has read
them; the backend then terminates them. A trial that dies before it could be scraped is judged
from its exit code (137 = out of memory) and the one-line reason it printed on stderr.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from prometheus_client.parser import text_string_to_metric_families

from ..api import metrics
from ..api.models import TrialSpec
from ..tuner.backend import TrialObservation

PKG_ROOT = str(Path(__file__).resolve().parents[2])  # the directory holding the rltune package


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(url: str, timeout: float = 3.0) -> list[tuple[str, dict, float]]:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        text = r.read().decode()
    out = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.append((s.name, dict(s.labels), float(s.value)))
    return out


@dataclass
class _Trial:
    proc: subprocess.Popen
    port: int
    dir: Path
    steps: list = field(default_factory=list)
    final: Optional[TrialObservation] = None
    started: float = 0.0


class LocalBackend:
    """TrialBackend running trials as local processes (twin mode by default)."""

    def __init__(
        self,
        mode: Optional[str] = None,
        workdir: Optional[str] = None,
        linger_s: float = 600.0,
        extra_env: Optional[dict] = None,
        names: Optional[dict] = None,
    ):
        self.mode = mode  # None: as the TrialSpec says; "twin" or "real" overrides
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="rltune-trials-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.linger_s = linger_s
        self.extra_env = dict(extra_env or {})
        self.names = names
        self.trials: dict[str, _Trial] = {}

    # ------------------------------------------------------------------ protocol
    def launch(self, trial_id: str, spec: TrialSpec) -> None:
        port = free_port()
        upd = {"metrics_port": port}
        if self.mode:
            upd["mode"] = self.mode
        spec = spec.model_copy(update=upd)
        d = self.workdir / trial_id
        d.mkdir(parents=True, exist_ok=True)
        f = d / "spec.json"
        f.write_text(json.dumps(spec.model_dump(by_alias=True, mode="json", exclude_none=True), indent=1))
        env = dict(os.environ)
        env["PYTHONPATH"] = PKG_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["RLTUNE_LINGER_SECONDS"] = str(self.linger_s)
        env["RLTUNE_METRICS_BIND"] = "127.0.0.1"
        env.pop("RLTUNE_TRIAL_SPEC", None)
        env.update(self.extra_env)
        proc = subprocess.Popen(
            [sys.executable, "-m", "rltune.trial", "--spec", str(f)],
            stdout=open(d / "stdout.log", "wb"),
            stderr=open(d / "stderr.log", "wb"),
            env=env,
            start_new_session=True,
        )
        self.trials[trial_id] = _Trial(proc, port, d, started=time.monotonic())

    def poll(self, trial_id: str) -> TrialObservation:
        t = self.trials[trial_id]
        if t.final is not None:
            return t.final
        samples = None
        try:
            samples = scrape(f"http://127.0.0.1:{t.port}/metrics")
        except Exception:  # noqa: BLE001 - not up yet, or already gone
            pass
        if samples is not None:
            t.steps = metrics.records_from_samples(samples, self.names)
            state, reason = self._state(samples)
            if state in (metrics.TRIAL_SUCCEEDED, metrics.TRIAL_FAILED):
                ok = state == metrics.TRIAL_SUCCEEDED
                self._stop(t)
                t.final = TrialObservation(
                    "succeeded" if ok else "failed",
                    t.steps,
                    "" if ok else (reason or self._stderr_reason(t)),
                    t.proc.returncode,
                )
                return t.final
        rc = t.proc.poll()
        if rc is not None:
            if rc == 0 and samples is None and t.steps:
                t.final = TrialObservation("succeeded", t.steps, "", rc)
            else:
                reason = self._stderr_reason(t) or f"trial exited with code {rc}"
                if rc == 137 and "memory" not in reason.lower():
                    reason = f"out of memory (exit 137): {reason}"
                t.final = TrialObservation("failed" if rc != 0 or not t.steps else "succeeded", t.steps, reason, rc)
            return t.final
        return TrialObservation("running", t.steps)

    def cancel(self, trial_id: str) -> None:
        t = self.trials.get(trial_id)
        if t is None:
            return
        self._stop(t)
        if t.final is None:
            t.final = TrialObservation("failed", t.steps, "cancelled", t.proc.returncode)

    def close(self) -> None:
        for t in self.trials.values():
            self._stop(t)

    # ------------------------------------------------------------------ helpers
    def _state(self, samples) -> tuple[Optional[int], str]:
        state, reason = None, ""
        sname, iname = metrics.name("trial_state", self.names), metrics.name("trial_info", self.names)
        for n, labels, v in samples:
            if n == sname:
                state = int(v)
            elif n == iname and labels.get("reason"):
                reason = labels["reason"]
        return state, reason

    @staticmethod
    def _stderr_reason(t: _Trial) -> str:
        try:
            lines = (t.dir / "stderr.log").read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        for line in reversed(lines):
            if line.startswith("rltune-trial:"):
                return line[len("rltune-trial:") :].strip()
        return lines[-1].strip() if lines else ""

    @staticmethod
    def _stop(t: _Trial) -> None:
        if t.proc.poll() is None:
            try:
                os.killpg(t.proc.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                t.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(t.proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                t.proc.wait()
