"""`rltune operator`: run the kopf operator in this process.

One active replica: the Helm chart runs one pod with `strategy: Recreate`. Restart safety comes
from the design, not from standbys: every decision is recorded in the job's status before a pod is
created, and pod names are deterministic, so a replacement pod continues where the last one
stopped. kopf's peering is not used (a standby operator that sees a higher-priority peer pauses;
two replicas without peering would both act).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Optional


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        default=os.environ.get("RLTUNE_CONFIG"),
        help="operator settings file (YAML; the Helm chart's ConfigMap); env RLTUNE_CONFIG",
    )
    p.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=[],
        help="namespace to watch (repeatable); default: the settings' namespaces, else all",
    )
    p.add_argument(
        "--bind-address",
        default=os.environ.get("RLTUNE_BIND_ADDRESS", "0.0.0.0"),
        help="address of the metrics and health endpoints (the chart passes the pod IP)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=int(os.environ.get("RLTUNE_METRICS_PORT", "18080")),
        help="port of the operator's own Prometheus metrics (0 = off)",
    )
    p.add_argument(
        "--liveness-port",
        type=int,
        default=int(os.environ.get("RLTUNE_LIVENESS_PORT", "18081")),
        help="port of kopf's /healthz liveness endpoint (0 = off)",
    )
    p.add_argument("--verbose", "-v", action="store_true")


def run(args: Optional[argparse.Namespace] = None) -> int:
    if args is None:
        p = argparse.ArgumentParser(prog="rltune operator")
        add_arguments(p)
        args = p.parse_args()
    from .. import settings as settings_mod

    try:
        settings = settings_mod.load(args.config)
    except settings_mod.SettingsError as e:
        print(f"rltune operator: {e}", file=sys.stderr)
        return 2
    if args.namespace:
        settings.namespaces = list(args.namespace)
    if settings.missing():
        print("rltune operator: not configured: " + "; ".join(settings.missing()), file=sys.stderr)
        return 2
    settings_mod.install(settings)
    from .trialkeys import MetricsKeyError, operator_key

    try:
        operator_key(settings)  # a missing or short key file stops the start, not the first trial
    except MetricsKeyError as e:
        print(f"rltune operator: {e}", file=sys.stderr)
        return 2

    import kopf

    from . import (
        handlers,  # noqa: F401 - registers the handlers
        selfmetrics,
    )

    kopf.configure(verbose=args.verbose)
    for noisy in ("kubernetes", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if not args.verbose:
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    logging.getLogger("rltune.controller").info(
        "rltune operator: watching %s; Prometheus %s; Pushgateway %s",
        ", ".join(settings.namespaces) or "all namespaces",
        settings.prometheus.url,
        settings.pushgateway_url,
    )
    selfmetrics.serve(args.metrics_port, args.bind_address)
    kopf.run(
        standalone=True,
        clusterwide=not settings.namespaces,
        namespaces=settings.namespaces,
        liveness_endpoint=(f"http://{args.bind_address}:{args.liveness_port}/healthz" if args.liveness_port else None),
    )
    return 0


def main() -> None:
    raise SystemExit(run())


if __name__ == "__main__":
    main()
