"""Where the bed's programs come from: the control plane, kwok, kubectl, helm, KubeRay and Kueue built
from Go modules by hack/binaries.sh (once per machine), Prometheus and the Pushgateway from apt."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from hack.bed import paths
from hack.bed.log import log


def bin_dir(build: bool = True) -> Path:
    script = paths.HACK / "binaries.sh"
    r = subprocess.run([str(script), "--check"], capture_output=True, text=True)
    if r.returncode == 0:
        return Path(r.stdout.strip())
    if not build:
        raise SystemExit(f"control-plane binaries missing: {r.stderr.strip()} (run hack/binaries.sh)")
    log("control-plane binaries missing; building them (once per machine, ~30+ min cold)")
    r = subprocess.run([str(script)], stdout=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise SystemExit("hack/binaries.sh failed")
    return Path(r.stdout.strip().splitlines()[-1])


def system_bin(name: str) -> str:
    p = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None)
    if not p:
        raise SystemExit(f"{name} not found: apt-get install prometheus prometheus-pushgateway")
    return p
