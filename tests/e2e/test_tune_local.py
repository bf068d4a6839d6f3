"""`rltune tune examples/<twin job>.yaml --local` finds a >= 1.3x faster configuration within 8 trials.

Runs the CLI as a subprocess: trials are real `python -m rltune.trial` processes (twin mode) whose
metrics the local backend scrapes over HTTP. No timing asserts.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_tune_local_finds_a_faster_configuration(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "operator") + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    report = tmp_path / "out" / "real" / "report.md"  # a folder that does not exist yet: tune creates it
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "rltune.cli",
            "tune",
            str(ROOT / "examples" / "bench-seed-35b-a3b-math.yaml"),
            "--local",
            "--max-trials",
            "8",
            "--report",
            str(report),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=900,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    out = p.stdout
    assert "baseline Succeeded" in out
    m = re.search(r"winner: (\S+) — .* ([0-9.]+)x the baseline", out)
    assert m, out[-3000:]
    assert float(m.group(2)) >= 1.3, out[-3000:]
    res = json.loads(report.with_suffix(".json").read_text())
    search = [t for t in res["trials"] if t["id"].startswith("t")]
    assert len(search) <= 8
    # the same lifecycle as the operator's: the winner was re-run as a confirmation trial
    assert [t["id"] for t in res["trials"] if t["id"].startswith("c")], res["trials"]
    assert res["best"] == m.group(1)
    # the line prints the status's winner (the confirmation's measurement), as `rltune report` does
    assert res["winner"]["trial"] == m.group(1) and res["winner"]["confirmed"], res["winner"]
    assert float(m.group(2)) == pytest.approx(res["winner"]["speedup"], abs=0.005)
    best = next(t for t in res["trials"] if t["id"] == res["best"])
    assert best["state"] == "Succeeded" and all(g["passed"] for g in best["gates"].values())
    assert report.exists() and "rltune tuning report" in report.read_text()
    # rewardGate nonInferiority (the default): the baseline was profiled as long as the confirmation, and
    # the condition states the confirmation's power, in the results and the report
    assert res["baseline"]["summary"]["totalSteps"] == 12, res["baseline"]["summary"]
    reason = res["rewardGate"]["reason"]
    assert reason in ("Resolved", "Underpowered") and f"Reward gate ({reason})" in report.read_text()
