"""Bringing the bed up and down: `up` (no-op when it is up), `down` (stop everything, wipe the
cluster's data), `restart` (some components, keeping data), `status`, `is_up`."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import time
from pathlib import Path

from hack.bed import (
    binaries,
    clients,
    components,
    configs,
    kuberay,
    kueue,
    kwok,
    network,
    paths,
    pki,
    pools,
    processes,
)
from hack.bed.log import log


def is_up() -> bool:
    if not all(processes.running_pid(n) for n in components.enabled()):
        return False
    try:
        code, _ = clients.api_get("/readyz", timeout=2)
        return code == 200
    except Exception:  # noqa: BLE001
        return False


def up(wait: bool = True) -> None:
    t0 = time.time()
    if is_up():
        print(f"test bed is up (kubeconfig {paths.KUBECONFIG})")
        return
    bins = binaries.bin_dir(build=True)
    paths.STATE.mkdir(parents=True, exist_ok=True)
    for d in (
        paths.LOGS,
        paths.PIDS,
        paths.STATE / "prometheus" / "targets",
        paths.STATE / "pods",
        paths.STATE / "runner",
    ):
        d.mkdir(parents=True, exist_ok=True)
    pki.ensure()
    pki.write_kubeconfig()
    (paths.STATE / "audit-policy.yaml").write_text(configs.audit_policy())
    (paths.STATE / "kwok.yaml").write_text(kwok.config())
    (paths.STATE / "prometheus" / "prometheus.yml").write_text(configs.prometheus_config())
    argv = components.commands(bins)
    fresh = not (paths.STATE / "etcd").exists()

    processes.start("etcd", argv["etcd"])
    processes.wait_for(
        "etcd", lambda: clients.http_ok(f"http://{network.HOST}:{network.PORTS['etcd']}/health"), 60, "etcd"
    )
    processes.start("kube-apiserver", argv["kube-apiserver"])
    processes.wait_for("kube-apiserver", lambda: clients.api_get("/readyz", 2)[0] == 200, 120, "kube-apiserver")
    kwok.ensure_logs_crd()
    for name in ("kube-controller-manager", "kube-scheduler", "kwok", "pushgateway", "prometheus"):
        processes.start(name, argv[name])
    processes.wait_for("pushgateway", lambda: clients.http_ok(f"{network.PUSHGATEWAY_URL}/-/ready"), 30, "pushgateway")
    processes.wait_for("prometheus", lambda: clients.http_ok(f"{network.PROMETHEUS_URL}/-/ready"), 60, "prometheus")

    api = clients.core_api()
    existing = {n.metadata.labels.get("rltune.io/pool") for n in api.list_node().items}
    for p in pools.load():
        if p["name"] in existing:
            continue
        names = pools.create(
            api,
            p["name"],
            p.get("gpuType"),
            int(p.get("nodes", 1)),
            int(p.get("gpusPerNode", 8)),
            str(p.get("cpu", "32")),
            str(p.get("memory", "128Gi")),
            wait_ready=wait,
        )
        log(f"pool {p['name']}: {len(names)} nodes ({p.get('gpuType') or 'cpu'})")
    configs.write_env_file()
    processes.start("podrunner", argv["podrunner"])
    if kuberay.enabled():
        kuberay.start(bins, argv[kuberay.NAME], wait=wait)
    (paths.STATE / "kuberay").write_text("on" if kuberay.enabled() else "off")
    if kueue.enabled():
        kueue.start(bins, argv[kueue.NAME], wait=wait)
    (paths.STATE / "kueue").write_text("on" if kueue.enabled() else "off")
    if wait:

        def default_sa() -> bool:
            return any(sa.metadata.name == "default" for sa in api.list_namespaced_service_account("default").items)

        processes.wait_for("ServiceAccount default/default", default_sa, 60, "kube-controller-manager")
        processes.wait_for(
            "kube-scheduler",
            lambda: (
                clients.api_get("/api/v1/namespaces/default")[0] == 200
                and clients.healthz(network.PORTS["kube-scheduler"])
            ),
            60,
            "kube-scheduler",
        )
    how = "fresh" if fresh else "existing data"
    log(f"test bed up in {time.time() - t0:.1f}s ({how}); KUBECONFIG={paths.KUBECONFIG}")
    print(f"test bed is up (kubeconfig {paths.KUBECONFIG})")


def down(keep_data: bool = False) -> None:
    for name in reversed(components.ORDER):
        processes.stop(name)
    # the runner kills its pods' process groups on SIGTERM; sweep leftovers (marked by env)
    for pid in processes.pod_process_pids():
        for kill in (lambda p=pid: os.killpg(p, signal.SIGKILL), lambda p=pid: os.kill(p, signal.SIGKILL)):
            try:
                kill()
            except (ProcessLookupError, PermissionError):
                pass
    if not keep_data:
        for d in ("etcd", "prometheus/data", "runner", "pods"):
            shutil.rmtree(paths.STATE / d, ignore_errors=True)
        (paths.STATE / "pushgateway.db").unlink(missing_ok=True)
        for f in (paths.STATE / "prometheus" / "targets").glob("*.json"):
            f.unlink()
        # memory-backed emptyDirs of its pods (hack/bed/kubelet/sandbox.py: PodSandboxes.shm_root)
        shm = "rltune-bed-" + hashlib.sha1(str(paths.STATE.resolve()).encode()).hexdigest()[:8]
        shutil.rmtree(Path("/dev/shm") / shm, ignore_errors=True)
    print("test bed is down")


def restart(names: list[str]) -> None:
    """Restart some processes of a running bed with the current code and flags (keeps data)."""
    argv = components.commands(binaries.bin_dir(build=False))
    (paths.STATE / "audit-policy.yaml").write_text(configs.audit_policy())
    (paths.STATE / "kwok.yaml").write_text(kwok.config())
    (paths.STATE / "prometheus" / "prometheus.yml").write_text(configs.prometheus_config())
    for name in names:
        if name not in argv:
            raise SystemExit(f"unknown process {name}; one of {components.ORDER}")
        processes.stop(name)
        if name == "kwok":
            kwok.ensure_logs_crd()
        if name == kuberay.NAME:
            kuberay.start(binaries.bin_dir(build=False), argv[name])
            continue
        if name == kueue.NAME:
            kueue.start(binaries.bin_dir(build=False), argv[name])
            continue
        processes.start(name, argv[name])
        if name == "kube-apiserver":
            processes.wait_for("kube-apiserver", lambda: clients.api_get("/readyz", 2)[0] == 200, 120, name)
            kwok.ensure_logs_crd()


def status() -> int:
    rc = 0
    for name in components.ORDER:
        pid = processes.running_pid(name)
        if not pid and name not in components.enabled():
            which = "KUEUE=0 / testbed.py kueue" if name == kueue.NAME else "KUBERAY=0 / testbed.py kuberay"
            print(f"{name:26s} off (RLTUNE_BED_{which} off)")
            continue
        print(f"{name:26s} {'up   pid ' + str(pid) if pid else 'down'}")
        rc |= 0 if pid else 1
    return rc
