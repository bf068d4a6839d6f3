"""`python -m rltune.trial` as a subprocess: twin mode, scrape over HTTP, OOM exit code."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]


def _env(**extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "operator") + os.pathsep + env.get("PYTHONPATH", "")
    for k in ("RLTUNE_PUSHGATEWAY_URL", "RLTUNE_METRICS_PORT", "RLTUNE_TRIAL_SPEC"):
        env.pop(k, None)
    env.update(extra)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spec(**over):
    d = {
        "mode": "twin",
        "namespace": "ns1",
        "job": "job1",
        "trial": "t3",
        "model": {"preset": "qwen2.5-7b"},
        "task": {"promptsPerStep": 64, "samplesPerPrompt": 8, "maxResponseTokens": 8192},
        "config": {"gpus": 16, "rollout": {"tp": 1, "gpuMemoryUtilization": 0.6}, "trainer": {"tp": 2}},
        "steps": 4,
        "warmupSteps": 1,
        "seed": 7,
    }
    d.update(over)
    return d


def _scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    samples = []
    for fam in text_string_to_metric_families(text):
        samples.extend(fam.samples)
    return samples


def test_twin_trial_serves_metrics_over_http():
    port = _free_port()
    env = _env(
        RLTUNE_TRIAL_SPEC=json.dumps(_spec()),
        RLTUNE_METRICS_PORT=str(port),
        RLTUNE_TWIN_SECONDS_PER_STEP="0.3",
        RLTUNE_LINGER_SECONDS="30",
        RLTUNE_METRICS_BIND="127.0.0.1",
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "rltune.trial"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 60
        samples = []
        saw_running = False
        while time.time() < deadline:
            try:
                samples = _scrape(port)
            except OSError:
                time.sleep(0.1)
                continue
            state = [s for s in samples if s.name == "rltune_trial_state"]
            if state and state[0].value == 0:
                saw_running = True
            if state and state[0].value == 1:
                break
            time.sleep(0.1)
        assert saw_running, "never observed the trial running"
        by = {}
        for s in samples:
            by.setdefault(s.name, []).append(s)
        durs = by["rltune_step_duration_seconds"]
        assert sorted(int(s.labels["step"]) for s in durs) == [0, 1, 2, 3]
        for s in durs:
            assert s.labels["namespace"] == "ns1" and s.labels["rltune_job"] == "job1" and s.labels["trial"] == "t3"
            assert s.value > 1.0  # simulated seconds, not wall time
        warm = {int(s.labels["step"]): s.value for s in by["rltune_step_warmup"]}
        assert warm == {0: 1.0, 1: 0.0, 2: 0.0, 3: 0.0}
        phases = {s.labels["phase"] for s in by["rltune_step_phase_seconds"]}
        assert {"generation", "generation_tail", "training", "weight_sync", "old_logprob"} <= phases
        gen = {
            int(s.labels["step"]): s.value for s in by["rltune_step_phase_seconds"] if s.labels["phase"] == "generation"
        }
        for s in durs:
            assert gen[int(s.labels["step"])] < s.value
        assert by["rltune_trial_steps_total"][0].value == 4
        assert by["rltune_trial_gpus"][0].value == 16
        info = by["rltune_trial_info"][0]
        assert info.labels["mode"] == "twin" and info.labels["reason"] == ""
    finally:
        proc.kill()
        proc.wait(10)


def test_oom_config_exits_137_with_one_line(tmp_path):
    spec = _spec(
        config={"gpus": 8, "rollout": {"tp": 1}, "trainer": {"tp": 1, "recompute": "none", "microBatchTokens": 262144}},
        gpuType="H100",
    )
    f = tmp_path / "spec.json"
    f.write_text(json.dumps(spec))
    r = subprocess.run(
        [sys.executable, "-m", "rltune.trial", "--spec", str(f)],
        env=_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 137
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("rltune-trial: ")
    assert "out of memory" in lines[0].lower()


def test_invalid_spec_exits_1(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "rltune.trial"],
        env=_env(RLTUNE_TRIAL_SPEC='{"mode": "twin"}'),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("rltune-trial: ")


def test_success_exit_0_and_pushgateway_failure_is_not_fatal(tmp_path):
    env = _env(RLTUNE_TRIAL_SPEC=json.dumps(_spec(steps=2)), RLTUNE_PUSHGATEWAY_URL="http://127.0.0.1:9")
    r = subprocess.run(
        [sys.executable, "-m", "rltune.trial"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    assert "push to http://127.0.0.1:9 failed" in r.stdout
