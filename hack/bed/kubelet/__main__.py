"""`python -m hack.bed.kubelet --kubeconfig=... --state=...`: run the pod runner until SIGTERM/SIGINT
(the bed process `podrunner`, hack.bed.components)."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from hack.bed import kubelet
from hack.bed.kubelet.log import log
from hack.bed.kubelet.runner import Runner


def main() -> int:
    ap = argparse.ArgumentParser(
        prog="python -m hack.bed.kubelet",
        description=kubelet.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--state", required=True)
    a = ap.parse_args()
    r = Runner(a.kubeconfig, Path(a.state))

    def _stop(*_):
        r.stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    r.run()
    log("stopped (pod processes keep running; they are re-adopted on the next start)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
