"""Where the test bed keeps its files: the checkout it runs from and its state directory.

RLTUNE_BED_STATE moves the state directory (default .state/bed), so a second bed can run beside
the default one (with its own RLTUNE_BED_PORT_OFFSET, hack.bed.network).
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HACK = REPO / "hack"
STATE = Path(os.environ.get("RLTUNE_BED_STATE", str(REPO / ".state" / "bed")))
PKI = STATE / "pki"
LOGS = STATE / "logs"
PIDS = STATE / "pids"
KUBECONFIG = STATE / "kubeconfig"
OPERATOR_KUBECONFIG = STATE / "operator.kubeconfig"
AUDIT_LOG = STATE / "audit.log"


def optional_on(name: str, env: str) -> bool:
    """Whether an optional component (KubeRay, Kueue) runs: `env` (0/false/no/off: without) when it
    is set, else the choice of the last `up` or switch, kept in STATE/<name>."""
    v = os.environ.get(env)
    if v is not None:
        return v.strip().lower() not in ("0", "false", "no", "off")
    f = STATE / name
    return not (f.exists() and f.read_text().strip() == "off")


def remember_choice(name: str, on: bool) -> None:
    """Keep an optional component's on/off for later `up`s (optional_on reads it)."""
    (STATE / name).write_text("on" if on else "off")
