"""The pure core stays pure: rltune.tuner never pulls in Kubernetes, kopf or the twin (the twin is
the benchmarks' ground truth; a tuner that read it would be grading its own exam)."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_tuner_imports_neither_kubernetes_nor_the_twin():
    code = (
        "import sys, rltune.tuner, rltune.tuner.loop, rltune.tuner.backend, rltune.backends.local\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('kubernetes', 'kopf')"
        " or m.startswith('rltune.twin')"
        " or m.startswith('rltune.controller'))\n"
        "print(','.join(bad))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO / "operator"), "PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "", f"rltune.tuner pulled in {r.stdout.strip()}"
