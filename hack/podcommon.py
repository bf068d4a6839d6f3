"""What every part of the pod runner shares: the repository's place, the API's clock, the log line."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HACK = REPO / "hack"


def now_iso() -> str:
    """A timestamp as the API server writes them (seconds, UTC)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def log(msg: str) -> None:
    """One line of the runner's log (.state/bed/logs/podrunner.log)."""
    print(f"[podrunner {time.strftime('%H:%M:%S')}] {msg}", flush=True)
