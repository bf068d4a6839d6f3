"""The test bed's addresses: every component on 127.0.0.1, its ports, URLs and the pod IP range.

RLTUNE_BED_PORT_OFFSET shifts every port (and the pod IP range) so a second bed, with its own
RLTUNE_BED_STATE, can run beside the default one (e.g. CI while a developer's bed is up).
"""

from __future__ import annotations

import os

PORT_OFFSET = int(os.environ.get("RLTUNE_BED_PORT_OFFSET", "0"))
PORTS = {
    "etcd": 12379,
    "etcd-peer": 12380,
    "kube-apiserver": 16443,
    "kube-controller-manager": 20257,
    "kube-scheduler": 20259,
    "kwok": 20247,
    "prometheus": 19090,
    "pushgateway": 19091,
    "operator-metrics": 18080,  # scraped by Prometheus when an operator runs locally
    "kuberay-metrics": 20280,
    "kuberay-health": 20281,
    "kueue-webhook": 20290,
    "kueue-health": 20291,
}
PORTS = {k: v + PORT_OFFSET for k, v in PORTS.items()}
HOST = "127.0.0.1"
APISERVER_URL = f"https://{HOST}:{PORTS['kube-apiserver']}"
PROMETHEUS_URL = f"http://{HOST}:{PORTS['prometheus']}"
PUSHGATEWAY_URL = f"http://{HOST}:{PORTS['pushgateway']}"
# kwok hands out pod IPs from a loopback range: each "pod" process can bind its own 127.x address
# (Linux routes all of 127/8 to lo), so many trials can use the same port, and Prometheus can
# scrape <podIP>:<port> exactly like on a real cluster.
POD_CIDR = f"127.{128 + (PORT_OFFSET // 1000) % 120}.0.0/16"
SERVICE_CIDR = "10.96.0.0/16"
