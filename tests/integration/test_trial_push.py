"""A twin trial pushes to the bed's real Pushgateway; the series come back through PromQL on Prometheus."""

import json
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.bed


def _query(prom: str, q: str) -> list:
    url = prom.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": q})
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]["result"]


def test_twin_trial_push_and_promql(request):
    try:
        bed = request.getfixturevalue("bed")
    except pytest.FixtureLookupError:
        pytest.skip("no `bed` fixture (tests/conftest.py) available")
    trial = "push-" + uuid.uuid4().hex[:8]
    spec = {
        "mode": "twin",
        "namespace": "itest",
        "job": "pushjob",
        "trial": trial,
        "model": {"preset": "qwen2.5-7b"},
        "task": {"promptsPerStep": 64, "samplesPerPrompt": 8, "maxResponseTokens": 8192},
        "config": {"gpus": 16, "rollout": {"tp": 1, "gpuMemoryUtilization": 0.6}, "trainer": {"tp": 2}},
        "steps": 4,
        "warmupSteps": 1,
        "seed": 1,
        "pushgatewayUrl": bed.pushgateway_url,
    }
    env = dict(os.environ, RLTUNE_TRIAL_SPEC=json.dumps(spec))
    env["PYTHONPATH"] = str(ROOT / "operator") + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("RLTUNE_PUSHGATEWAY_URL", None)
    r = subprocess.run(
        [sys.executable, "-m", "rltune.trial"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert "failed" not in r.stdout, r.stdout

    sel = f'namespace="itest",rltune_job="pushjob",trial="{trial}"'
    deadline = time.time() + 90
    steps = []
    while time.time() < deadline:
        steps = _query(bed.prometheus_url, f"rltune_step_duration_seconds{{{sel}}}")
        state = _query(bed.prometheus_url, f"rltune_trial_state{{{sel}}}")
        if len(steps) == 4 and state and float(state[0]["value"][1]) == 1:
            break
        time.sleep(1)
    assert sorted(int(s["metric"]["step"]) for s in steps) == [0, 1, 2, 3]
    for s in steps:
        assert s["metric"]["job"] == "rltune-trial"
        assert float(s["value"][1]) > 1.0
    scored = _query(
        bed.prometheus_url, f"rltune_step_duration_seconds{{{sel}}} unless on(step) (rltune_step_warmup{{{sel}}} == 1)"
    )
    assert sorted(int(s["metric"]["step"]) for s in scored) == [1, 2, 3]
    gen = _query(bed.prometheus_url, f'rltune_step_phase_seconds{{{sel},phase="generation"}}')
    assert len(gen) == 4
