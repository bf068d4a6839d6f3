"""rltune local test bed: a real Kubernetes control plane with kwok-simulated GPU nodes.

    python hack/testbed.py up [--no-wait]   start everything (no-op when it is up)
    python hack/testbed.py down             stop everything it started, wipe cluster data
    python hack/testbed.py status           which processes are alive
    python hack/testbed.py kubeconfig       print the admin kubeconfig path
    python hack/testbed.py env              print KUBECONFIG=..., PROMETHEUS_URL=... lines
    python hack/testbed.py kuberay on|off   install / remove KubeRay (operator + CRDs) on a running bed
    python hack/testbed.py kueue on|off     install / remove Kueue (manager, CRDs, webhooks) on a running bed

Processes (all on 127.0.0.1, pid files + logs under .state/bed/):
    etcd :12379, kube-apiserver :16443, kube-controller-manager :20257, kube-scheduler :20259,
    kwok :20247, prometheus :19090, pushgateway :19091, the pod runner (hack/bed/kubelet),
    the KubeRay operator (metrics :20280, health :20281; RLTUNE_BED_KUBERAY=0 at `up`: without it),
    Kueue (webhooks :20290, health :20291; RLTUNE_BED_KUEUE=0 at `up`: without it).
See docs/testbed.md. Binaries come from hack/binaries.sh (built once per machine).
"""

from __future__ import annotations

import argparse

from hack.bed import components, configs, kuberay, kueue, kwok, lifecycle, paths


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("up")
    u.add_argument("--no-wait", action="store_true")
    d = sub.add_parser("down")
    d.add_argument("--keep-data", action="store_true", help="keep etcd/prometheus data")
    sub.add_parser("status")
    r = sub.add_parser("restart", help="restart processes of a running bed (keeps data)")
    r.add_argument("names", nargs="+", choices=components.ORDER)
    sub.add_parser("kubeconfig")
    sub.add_parser("env")
    sub.add_parser("kwok-config")
    k = sub.add_parser("kuberay", help="install / remove KubeRay (operator + CRDs) on a running bed")
    k.add_argument("state", choices=["on", "off"])
    q = sub.add_parser("kueue", help="install / remove Kueue (manager, CRDs, webhooks) on a running bed")
    q.add_argument("state", choices=["on", "off"])
    a = ap.parse_args(argv)
    if a.cmd == "up":
        lifecycle.up(wait=not a.no_wait)
    elif a.cmd == "down":
        lifecycle.down(keep_data=a.keep_data)
    elif a.cmd == "restart":
        lifecycle.restart(a.names)
    elif a.cmd == "status":
        return lifecycle.status()
    elif a.cmd == "kubeconfig":
        print(paths.KUBECONFIG)
    elif a.cmd == "env":
        print(configs.env_text())
    elif a.cmd == "kwok-config":
        print(kwok.config())
    elif a.cmd == "kuberay":
        kuberay.switch(a.state == "on")
    elif a.cmd == "kueue":
        kueue.switch(a.state == "on")
    return 0
