"""KubeRay (ray-operator, built by hack/binaries.sh) on the bed: its CRDs, RBAC and ServiceAccount, and
its operator as a bed process.

It runs by default; RLTUNE_BED_KUBERAY=0 at `up` starts the bed without it (no operator, no ray.io
CRDs), to try what rltune does where KubeRay is missing. The choice is kept in .state/bed/kuberay
so a later plain `up` (the tests' fixture) keeps it; `testbed.py kuberay on|off` changes it on a
running bed (`switch`).
"""

from __future__ import annotations

from pathlib import Path

from hack.bed import binaries, clients, network, paths, processes, serviceaccounts

NAME = "kuberay-operator"  # its bed process, its ServiceAccount and its ClusterRole
NAMESPACE = "kuberay-system"
CRDS = ("rayclusters.ray.io", "rayjobs.ray.io", "rayservices.ray.io")


def enabled() -> bool:
    """RLTUNE_BED_KUBERAY (0/false/no/off: without) when set, else the choice of the last `up`."""
    return paths.optional_on("kuberay", "RLTUNE_BED_KUBERAY")


def command(bins: Path) -> list[str]:
    """Like a pod of the operator: its own ServiceAccount (kubeconfig with its token), and the
    bed-wide hosts file (Service names the pod runner keeps current) as /etc/hosts, so it reaches a
    RayCluster's dashboard at <head-svc>.<ns>.svc.cluster.local:8265."""
    host, ports = network.HOST, network.PORTS
    return processes.in_private_mounts(
        'mount --bind "$0" /etc/hosts && exec "$@"',
        f"{paths.STATE}/hosts",
        str(bins / NAME),
        f"--metrics-addr={host}:{ports['kuberay-metrics']}",
        f"--health-probe-bind-address={host}:{ports['kuberay-health']}",
        "--enable-leader-election=false",
        "--log-stdout-encoder=console",
        "--reconcile-concurrency=4",
    )


def rbac() -> str:
    """Namespace, ServiceAccount, a non-expiring token Secret and the binding of KubeRay's own
    ClusterRole (config/rbac/role.yaml of the module, copied by hack/binaries.sh)."""
    return serviceaccounts.rbac(NAMESPACE, NAME, "kuberay-operator")


def ensure(bins: Path) -> None:
    """KubeRay's CRDs (server-side apply: they are too big for the last-applied annotation), its
    RBAC, and a kubeconfig with its ServiceAccount's token (.state/bed/kuberay-operator.kubeconfig)."""
    kubectl = clients.kubectl
    kubectl(bins, "apply", "--server-side", "--force-conflicts", "-f", str(bins / "kuberay" / "crd"))
    kubectl(bins, "apply", "--server-side", "--force-conflicts", "-f", str(bins / "kuberay" / "rbac"))
    kubectl(bins, "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=rbac())
    kubectl(bins, "wait", "--for=condition=Established", "--timeout=60s", *[f"crd/{c}" for c in CRDS])
    serviceaccounts.kubeconfig(bins, NAMESPACE, NAME, paths.STATE / f"{NAME}.kubeconfig")
    hosts = paths.STATE / "hosts"  # the pod runner keeps it current; it must exist to be mounted
    if not hosts.exists():
        hosts.write_text("127.0.0.1\tlocalhost\n")


def start(bins: Path, argv: list[str], wait: bool = True) -> None:
    ensure(bins)
    processes.start(NAME, argv, env={"KUBECONFIG": str(paths.STATE / f"{NAME}.kubeconfig")}, exe=str(bins / NAME))
    if wait:
        url = f"http://{network.HOST}:{network.PORTS['kuberay-health']}/readyz"
        processes.wait_for(NAME, lambda: clients.http_ok(url), 60, NAME)


def switch(on: bool) -> None:
    """Install (operator + CRDs) or remove KubeRay on a running bed; remembered for later `up`s."""
    bins = binaries.bin_dir(build=on)
    paths.remember_choice("kuberay", on)
    if on:
        start(bins, command(bins))
        print("KubeRay is on")
        return
    processes.stop(NAME)
    clients.kubectl(bins, "delete", "--ignore-not-found", "--wait=true", "--timeout=120s", *[f"crd/{c}" for c in CRDS])
    print("KubeRay is off")
