"""The test bed's log line (stderr: its stdout is what `hack/testbed.py` prints as its answer)."""

from __future__ import annotations

import sys
import time


def log(msg: str) -> None:
    print(f"[bed {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)
