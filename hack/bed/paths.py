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
