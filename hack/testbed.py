#!/usr/bin/env python3
"""The test bed's command line: `python hack/testbed.py up|down|status|restart|kubeconfig|env|
kwok-config|kuberay on|off|kueue on|off` (hack.bed.cli lists them; docs/testbed.md).

The bed itself is the package hack.bed, one module a part. This file stays as the command's path
(Makefile, CI, docs) and for bench/paths.py's `hack_module("testbed")` (bench/api_rate.py,
bench/load.py), which reads the names below, as the bed's single module had them.
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # run as a file: its folder, hack/, is on sys.path; the folder that holds `hack` may not be
    _ROOT = str(Path(__file__).resolve().parents[1])
    if _ROOT not in sys.path:
        sys.path.insert(0, _ROOT)

from hack.bed import kueue, lifecycle, network, paths, pki, pools, processes  # noqa: E402
from hack.bed.cli import main  # noqa: E402

# the bed's names as bench/ reads them
AUDIT_LOG, KUBECONFIG = paths.AUDIT_LOG, paths.KUBECONFIG
PROMETHEUS_URL, PUSHGATEWAY_URL = network.PROMETHEUS_URL, network.PUSHGATEWAY_URL
OPERATOR_USER, operator_kubeconfig = pki.OPERATOR_USER, pki.operator_kubeconfig
is_up, up, running_pid = lifecycle.is_up, lifecycle.up, processes.running_pid
node_manifest, create_pool, delete_pool = pools.node_manifest, pools.create, pools.delete
KUEUE, kueue_enabled, queue_objects = kueue.NAME, kueue.enabled, kueue.queue_objects

if __name__ == "__main__":
    sys.exit(main())
