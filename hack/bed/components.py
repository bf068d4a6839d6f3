"""The bed's components: which processes it runs, in which order, with which command lines."""

from __future__ import annotations

import sys
from pathlib import Path

from hack.bed import binaries, kuberay, kueue, kwok, network, paths

ORDER = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
    "pushgateway",
    "prometheus",
    "podrunner",
    kuberay.NAME,
    kueue.NAME,
]


def enabled() -> list[str]:
    """The components this bed runs: all of ORDER but KubeRay and Kueue where they are off."""
    return [n for n in ORDER if (n != kuberay.NAME or kuberay.enabled()) and (n != kueue.NAME or kueue.enabled())]


def commands(bins: Path) -> dict[str, list[str]]:
    """Each component's argv (`bins`: hack/binaries.sh's bin dir)."""
    s = str(paths.STATE)
    kc = str(paths.KUBECONFIG)
    host, ports = network.HOST, network.PORTS
    return {
        "etcd": [
            str(bins / "etcd"),
            "--name=bed",
            f"--data-dir={s}/etcd",
            f"--listen-client-urls=http://{host}:{ports['etcd']}",
            f"--advertise-client-urls=http://{host}:{ports['etcd']}",
            f"--listen-peer-urls=http://{host}:{ports['etcd-peer']}",
            f"--initial-advertise-peer-urls=http://{host}:{ports['etcd-peer']}",
            f"--initial-cluster=bed=http://{host}:{ports['etcd-peer']}",
            "--listen-metrics-urls=",
            "--unsafe-no-fsync=true",
            "--quota-backend-bytes=4294967296",
            "--log-level=warn",
        ],
        "kube-apiserver": [
            str(bins / "kube-apiserver"),
            f"--etcd-servers=http://{host}:{ports['etcd']}",
            f"--bind-address={host}",
            f"--advertise-address={host}",
            f"--secure-port={ports['kube-apiserver']}",
            f"--tls-cert-file={s}/pki/apiserver.crt",
            f"--tls-private-key-file={s}/pki/apiserver.key",
            f"--client-ca-file={s}/pki/ca.crt",
            f"--service-account-key-file={s}/pki/sa.pub",
            f"--service-account-signing-key-file={s}/pki/sa.key",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-cluster-ip-range={network.SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC",
            "--allow-privileged=true",
            "--enable-admission-plugins=NamespaceLifecycle,ServiceAccount,DefaultTolerationSeconds,"
            "ResourceQuota,LimitRanger,Priority,DefaultStorageClass,"
            "MutatingAdmissionWebhook,ValidatingAdmissionWebhook,ValidatingAdmissionPolicy",
            f"--audit-policy-file={s}/audit-policy.yaml",
            f"--audit-log-path={paths.AUDIT_LOG}",
            "--audit-log-format=json",
            "--audit-log-maxsize=200",
            "--audit-log-maxbackup=2",
            "--audit-log-mode=blocking",
            f"--kubelet-client-certificate={s}/pki/apiserver.crt",
            f"--kubelet-client-key={s}/pki/apiserver.key",
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            "--endpoint-reconciler-type=none",
            # front-proxy / requestheader auth (aggregated APIs; keeps components' logs quiet)
            f"--requestheader-client-ca-file={s}/pki/ca.crt",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={s}/pki/apiserver.crt",
            f"--proxy-client-key-file={s}/pki/apiserver.key",
            "--profiling=false",
            "--v=1",
        ],
        "kube-controller-manager": [
            str(bins / "kube-controller-manager"),
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            f"--bind-address={host}",
            f"--secure-port={ports['kube-controller-manager']}",
            "--leader-elect=false",
            "--controllers=*",
            f"--root-ca-file={s}/pki/ca.crt",
            f"--service-account-private-key-file={s}/pki/sa.key",
            "--use-service-account-credentials=false",
            f"--service-cluster-ip-range={network.SERVICE_CIDR}",
            "--node-monitor-grace-period=3m",
            "--node-monitor-period=10s",
            "--concurrent-gc-syncs=20",
            "--kube-api-qps=500",
            "--kube-api-burst=1000",
            "--profiling=false",
            "--v=1",
        ],
        "kube-scheduler": [
            str(bins / "kube-scheduler"),
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            f"--bind-address={host}",
            f"--secure-port={ports['kube-scheduler']}",
            "--leader-elect=false",
            "--kube-api-qps=500",
            "--kube-api-burst=1000",
            "--profiling=false",
            "--v=1",
        ],
        "kwok": [
            str(bins / "kwok"),
            f"--kubeconfig={kc}",
            f"--config={s}/kwok.yaml",
            f"--manage-nodes-with-annotation-selector={kwok.NODE_ANNOTATION}=fake",
            f"--cidr={network.POD_CIDR}",
            f"--node-ip={host}",
            f"--node-port={ports['kwok']}",
            f"--server-address={host}:{ports['kwok']}",
            f"--tls-cert-file={s}/pki/apiserver.crt",
            f"--tls-private-key-file={s}/pki/apiserver.key",
            "--node-lease-duration-seconds=40",
            "--enable-crds=Logs",
            "--v=WARN",
        ],
        "pushgateway": [
            binaries.system_bin("prometheus-pushgateway"),
            f"--web.listen-address={host}:{ports['pushgateway']}",
            f"--persistence.file={s}/pushgateway.db",
            "--persistence.interval=5s",
            "--web.enable-admin-api",
            "--log.level=warn",
        ],
        "prometheus": [
            binaries.system_bin("prometheus"),
            f"--config.file={s}/prometheus/prometheus.yml",
            f"--storage.tsdb.path={s}/prometheus/data",
            f"--web.listen-address={host}:{ports['prometheus']}",
            "--web.enable-lifecycle",
            "--web.enable-admin-api",
            "--storage.tsdb.retention.time=7d",
            "--log.level=warn",
        ],
        # the fake kubelet, run from the checkout (processes.start's cwd): hack/bed/kubelet
        "podrunner": [
            sys.executable,
            "-m",
            "hack.bed.kubelet",
            f"--kubeconfig={kc}",
            f"--state={s}",
        ],
        kueue.NAME: kueue.command(bins),
        kuberay.NAME: kuberay.command(bins),
    }
