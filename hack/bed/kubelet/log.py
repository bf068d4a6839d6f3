"""The pod runner's log line (.state/bed/logs/podrunner.log: its stdout)."""

from __future__ import annotations

import time


def log(msg: str) -> None:
    """One line of the runner's log."""
    print(f"[podrunner {time.strftime('%H:%M:%S')}] {msg}", flush=True)
