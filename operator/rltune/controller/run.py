"""`rltune operator`: run the kopf operator in this process."""

from __future__ import annotations

import argparse
import logging
import os
from typing import Optional


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--namespace", "-n", action="append", default=[],
                   help="namespace to watch (repeatable); default: all namespaces")
    p.add_argument("--metrics-port", type=int, default=int(os.environ.get("RLTUNE_METRICS_PORT", "18080")),
                   help="port of the operator's own Prometheus metrics (0 = off)")
    p.add_argument("--liveness-port", type=int, default=int(os.environ.get("RLTUNE_LIVENESS_PORT", "18081")),
                   help="port of kopf's /healthz liveness endpoint (0 = off)")
    p.add_argument("--peering", default=os.environ.get("RLTUNE_PEERING"),
                   help="kopf peering name for one-active/standby replicas; default: standalone")
    p.add_argument("--verbose", "-v", action="store_true")


def run(args: Optional[argparse.Namespace] = None) -> int:
    if args is None:
        p = argparse.ArgumentParser(prog="rltune operator")
        add_arguments(p)
        args = p.parse_args()
    import kopf

    from . import handlers  # noqa: F401 - registers the handlers
    from . import selfmetrics

    kopf.configure(verbose=args.verbose)
    for noisy in ("kubernetes", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if not args.verbose:
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    selfmetrics.serve(args.metrics_port)
    kopf.run(
        standalone=args.peering is None,
        peering_name=args.peering,
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        liveness_endpoint=f"http://0.0.0.0:{args.liveness_port}/healthz" if args.liveness_port else None,
    )
    return 0


def main() -> None:
    raise SystemExit(run())


if __name__ == "__main__":
    main()
