"""The metrics bridge (python -m rltune.adapters.bridge) against a real, standalone Pushgateway.

The bridge wraps a command that prints a recorded framework log (hack/replaylog.py over
tests/fixtures/logs/); the series read back from the Pushgateway's /metrics must be the parsed
records (rebuilt with the operator's own records_from_samples), the command's output must pass
through unchanged, its exit code must come back, and a failing command must leave
rltune_trial_state 2 with a reason. Needs /usr/bin/prometheus-pushgateway (apt package
prometheus-pushgateway); no test bed.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from rltune.adapters.logs import parse_log
from rltune.api.metrics import records_from_samples

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "logs"
REPLAY = ROOT / "hack" / "replaylog.py"
PGW_BIN = shutil.which("prometheus-pushgateway") or "/usr/bin/prometheus-pushgateway"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def pushgateway(tmp_path_factory):
    if not os.path.exists(PGW_BIN):
        pytest.skip("prometheus-pushgateway not installed (apt-get install prometheus-pushgateway)")
    port = _free_port()
    log = open(tmp_path_factory.mktemp("pgw") / "pushgateway.log", "w")
    proc = subprocess.Popen([PGW_BIN, f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 20
    while True:
        try:
            urllib.request.urlopen(url + "/-/ready", timeout=1).read()
            break
        except OSError:
            if time.time() > deadline or proc.poll() is not None:
                proc.kill()
                pytest.fail("the Pushgateway did not start")
            time.sleep(0.1)
    yield url
    proc.terminate()
    proc.wait(10)
    log.close()


def _samples(url: str, trial: str) -> list[tuple[str, dict, float]]:
    text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    out = []
    for line in text.splitlines():
        m = re.match(r"^(rltune_\w+)\{(.*)\} (\S+)$", line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2)))
        if labels.get("trial") == trial:
            out.append((m.group(1), labels, float(m.group(3))))
    return out


def _bridge(url: str, trial: str, command: list[str], *extra: str, env=None, **kw) -> subprocess.CompletedProcess:
    e = dict(os.environ if env is None else env)
    e["PYTHONPATH"] = str(ROOT / "operator")
    args = [sys.executable, "-m", "rltune.adapters.bridge", "--framework", extra[0] if extra else "verl"]
    args += ["--pushgateway", url, "--namespace", "ns-bridge", "--job", "job-a", "--trial", trial]
    args += list(extra[1:]) + ["--", *command]
    return subprocess.run(args, env=e, capture_output=True, timeout=120, **kw)


def _one(samples, metric: str) -> tuple[dict, float]:
    (hit,) = [(labels, v) for name, labels, v in samples if name == metric]
    return hit


@pytest.mark.parametrize("framework,fixture", [("verl", "verl-0.9.1.log"), ("openrlhf", "openrlhf-0.11.2.log")])
def test_pushed_series_equal_parsed_records(pushgateway, framework, fixture):
    trial = f"ok-{framework}"
    log = FIXTURES / fixture
    p = _bridge(pushgateway, trial, [sys.executable, str(REPLAY), str(log)], framework, "--warmup-steps", "2")
    assert p.returncode == 0, p.stderr.decode()
    # the output passes through byte for byte (the replayer drops only the fixture's "# " header)
    assert p.stdout == b"".join(ln for ln in log.read_bytes().splitlines(True) if not ln.startswith(b"# "))
    assert p.stderr == b""

    samples = _samples(pushgateway, trial)
    expected, parser = parse_log(framework, log.read_text())
    got = records_from_samples(samples)
    assert [r.step for r in got] == list(range(len(expected)))  # renumbered from 0
    for exp, rec in zip(expected, got):
        assert rec.duration == exp.duration
        assert rec.phases == exp.phases
        for attr in ("generated_tokens", "trained_tokens", "staleness", "reward", "logprob_mismatch", "preemptions"):
            assert getattr(rec, attr) == pytest.approx(getattr(exp, attr), rel=1e-12), attr
        assert rec.warmup == (rec.step < 2)
    names = {name for name, _, _ in samples}
    assert "rltune_step_kv_cache_usage_ratio" not in names  # not printed: not exported
    assert _one(samples, "rltune_trial_steps_total")[1] == len(expected)
    assert _one(samples, "rltune_trial_state")[1] == 1
    info, _ = _one(samples, "rltune_trial_info")
    assert info["reason"] == "" and info["mode"] == "real" and info["job"] == "rltune-trial"
    assert set(info["missing"].split(",")) == set(parser.missing)
    phases = {labels["phase"] for name, labels, _ in samples if name == "rltune_step_phase_seconds"}
    assert "generation_tail" not in phases


def test_exit_code_passes_through_and_failure_is_reported(pushgateway):
    trial = "fails"
    cmd = [
        "sh",
        "-c",
        f'"{sys.executable}" "{REPLAY}" "{FIXTURES / "verl-0.9.1.log"}"; '
        'echo "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB" >&2; exit 3',
    ]
    p = _bridge(pushgateway, trial, cmd)
    assert p.returncode == 3
    assert p.stderr.decode().endswith("CUDA out of memory. Tried to allocate 2.00 GiB\n")
    samples = _samples(pushgateway, trial)
    assert _one(samples, "rltune_trial_state")[1] == 2
    assert _one(samples, "rltune_trial_steps_total")[1] == 6  # the steps before the failure stay
    reason = _one(samples, "rltune_trial_info")[0]["reason"]
    assert "exited with code 3" in reason and "out of memory" in reason


def test_no_steps_is_a_failure_even_with_exit_0(pushgateway):
    p = _bridge(pushgateway, "silent", ["sh", "-c", "echo hello"])
    assert p.returncode == 0 and p.stdout == b"hello\n"
    samples = _samples(pushgateway, "silent")
    assert _one(samples, "rltune_trial_state")[1] == 2
    assert "no verl step metrics" in _one(samples, "rltune_trial_info")[0]["reason"]


def test_sigterm_is_forwarded(pushgateway, tmp_path):
    child = tmp_path / "child.py"
    child.write_text(
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: (print('child got SIGTERM', flush=True), sys.exit(7)))\n"
        "print('step:1 - timing_s/gen:1.0 - timing_s/step:2.0', flush=True)\n"
        "time.sleep(60)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT / "operator"))
    args = [sys.executable, "-m", "rltune.adapters.bridge", "--framework", "verl", "--pushgateway", pushgateway]
    args += ["--job", "job-a", "--namespace", "ns-bridge", "--trial", "term", "--", sys.executable, str(child)]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline().startswith(b"step:1")
    deadline = time.time() + 10
    while time.time() < deadline and not _samples(pushgateway, "term"):
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 7, err.decode()
    assert out == b"child got SIGTERM\n"
    samples = _samples(pushgateway, "term")
    assert _one(samples, "rltune_trial_state")[1] == 2
    assert _one(samples, "rltune_trial_steps_total")[1] == 1


def test_install_runs_without_rltune_or_site_packages(pushgateway, tmp_path):
    target = tmp_path / "bridge"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "operator"))
    subprocess.run([sys.executable, "-m", "rltune.adapters.bridge", "--install", str(target)], env=env, check=True)
    assert sorted(str(p.relative_to(target)) for p in target.rglob("*.py")) == [
        "rltune/__init__.py",
        "rltune/adapters/__init__.py",
        "rltune/adapters/bridge.py",
        "rltune/adapters/logs.py",
        "rltune/api/__init__.py",
        "rltune/api/metrics.py",
    ]
    # -S: no site-packages (no pydantic, prometheus_client, requests): only the installed copy
    probe = "import os; print(os.environ.get('PYTHONPATH', ''))"
    cmd = [sys.executable, "-S", "-m", "rltune.adapters.bridge", "--framework", "verl", "--pushgateway", pushgateway]
    cmd += ["--namespace", "ns-bridge", "--job", "job-a", "--trial", "installed", "--"]
    cmd += [sys.executable, "-c", f"{probe}; print(open({str(FIXTURES / 'verl-0.9.1.log')!r}).read(), end='')"]
    p = subprocess.run(cmd, env={"PATH": os.environ["PATH"], "PYTHONPATH": str(target)}, capture_output=True)
    assert p.returncode == 0, p.stderr.decode()
    assert p.stdout.split(b"\n", 1)[0] == b""  # the install dir is not on the command's PYTHONPATH
    samples = _samples(pushgateway, "installed")
    assert _one(samples, "rltune_trial_steps_total")[1] == 6
