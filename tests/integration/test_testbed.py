"""Acceptance tests of the local test bed (GitHub issue 2): real kube-apiserver, kube-scheduler,
kube-controller-manager, kwok nodes, the local pod runner, Prometheus and the Pushgateway."""

from __future__ import annotations

import json
import os
import time
import urllib.request
import uuid

import pytest
import yaml

import bed as bedlib
from hack.bed import binaries, components, images, kwok, paths, pools, processes


# ----------------------------------------------------------------------------- no bed needed
def test_image_mapping_regex_matches_globs():
    import re

    rx = re.compile(images.regex())
    for img in (
        "rltune/trial:dev",
        "ghcr.io/rltune/trial:0.1",
        "ghcr.io/rltune/operator:latest",
        "localhost:5000/rltune/trial:x",
    ):
        assert rx.match(img), img
    for img in ("registry.k8s.io/pause:3.10", "nginx", "rltune/other:1", "busybox"):
        assert not rx.match(img), img


def test_a_mount_that_would_hide_another_mounts_source_goes_last():
    """The chart's emptyDir at /tmp must not hide the service-account volume when the bed's state
    (where volumes are materialised) lives under /tmp, as in a CI clone."""
    from pathlib import Path

    from hack.bed.kubelet.sandbox import Mount, Sandbox

    state = Path("/tmp/clone/.state/bed/volumes/uid")
    sb = Sandbox(
        mounts=[
            Mount(state / "tmp", "/tmp", False),
            Mount(state / "kube-api-access", "/var/run/secrets/kubernetes.io/serviceaccount", True),
            Mount(state / "config", "/etc/rltune", True),
        ]
    )
    order = [m.target for m in sb.mount_order()]
    assert order[-1] == "/tmp" and set(order[:2]) == {"/etc/rltune", "/var/run/secrets/kubernetes.io/serviceaccount"}
    script = sb.wrap(["true"])[6]
    assert script.index("'/tmp'") > script.index("serviceaccount")


def test_a_volume_over_the_beds_own_files_is_not_mounted(tmp_path):
    """The container shares the host's filesystem here: an emptyDir at a parent of the checkout or
    of the bed's state would hide the python the pod runs with."""
    from hack.bed.kubelet.sandbox import PodSandboxes

    state = tmp_path / "clone" / ".state" / "bed"
    sbx = PodSandboxes(state, request=None, apiserver_host="127.0.0.1", apiserver_port=1, log=lambda m: None)
    assert sbx._hides_the_bed(str(tmp_path)) and sbx._hides_the_bed(str(state))
    assert sbx._hides_the_bed(str(paths.REPO.parent)) and sbx._hides_the_bed("/")
    assert not sbx._hides_the_bed("/etc/rltune") and not sbx._hides_the_bed(str(state / "volumes" / "x"))


def _step(pr, now: float) -> list[str]:
    """One tick of a Prober whose probes run at once: what changed, as ProbeEvent.what."""
    events = pr.tick(now)
    for t in pr.targets.values():
        if t.running is not None:
            t.running.result(timeout=5)  # the pool ran it; the next tick records it
    return [f"{e.target.kind}:{e.what}" for e in events]


def test_a_readiness_probe_flips_only_after_its_thresholds():
    """The probes' state machine, as a kubelet counts: not ready until successThreshold passes in a
    row (none before initialDelaySeconds), ready until failureThreshold failures in a row."""
    from hack.bed.kubelet.probes import Prober, ProbeSpec, Target

    results = iter([False, True, True, False, True, False, False])
    probe = {"exec": {"command": ["x"]}, "initialDelaySeconds": 5, "periodSeconds": 1}
    probe |= {"successThreshold": 2, "failureThreshold": 2}
    pr = Prober(log=lambda m: None, run=lambda t: (next(results), "scripted"))
    t = Target(key="uid_c", spec=ProbeSpec.of(probe), pod_ip="127.128.0.9", ports={}, started=100.0)
    pr.add(t)
    assert _step(pr, 104.0) == [] and t.running is None  # before initialDelaySeconds: no probe ran
    flips = [_step(pr, 105.0 + i) for i in range(8)]
    # results F T T F T F F: ready after the 2nd pass in a row, not ready after the 2nd failure in a row
    r, u = ["readiness:ready"], ["readiness:unready"]
    assert flips == [[], [], [], r, [], [], [], u]
    pr.shutdown()


def test_a_startup_probe_holds_liveness_and_a_failing_liveness_probe_kills():
    """Until the startup probe passed, the liveness probe does not run (a kubelet's rule, so a slow
    starter is not killed); then failureThreshold liveness failures in a row mean `kill`, once."""
    from hack.bed.kubelet.probes import Prober, ProbeSpec, Target

    flag = {"up": False}
    runs = []

    def run(t):
        runs.append(t.kind)
        return (flag["up"], "starting") if t.kind == "startup" else (False, "hung")

    pr = Prober(log=lambda m: None, run=run)
    liveness = {"exec": {"command": ["x"]}, "periodSeconds": 1, "failureThreshold": 2}
    startup = liveness | {"failureThreshold": 30}
    for kind, probe in (("startup", startup), ("liveness", liveness)):
        pr.add(Target(key="uid_c", spec=ProbeSpec.of(probe), pod_ip="127.128.0.9", ports={}, started=0.0, kind=kind))
    seen = [_step(pr, float(i)) for i in range(5)]
    assert "liveness" not in runs and not any(seen)  # held while the startup probe fails
    flag["up"] = True
    seen = [_step(pr, 5.0 + i) for i in range(6)]
    assert ["startup:started"] in seen and ["liveness:kill"] in seen
    assert seen.index(["liveness:kill"]) > seen.index(["startup:started"])
    assert "uid_c" not in pr  # the killed container's probes ended with it
    pr.shutdown()


def test_probe_handlers_reach_the_pod_ip_and_named_ports(tmp_path):
    """httpGet goes to the pod IP and a named port; 2xx/3xx pass, others fail; tcpSocket connects;
    exec passes on exit 0, and its /etc/hosts maps localhost to the pod IP."""
    import http.server
    import threading

    from hack.bed.kubelet.probes import ProbeSpec, Target, probe_sandbox, run_once, write_probe_hosts

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200 if self.path == "/ok" else 503)
            self.end_headers()

        def log_message(self, *a):
            pass

    ip = "127.128.250.7"
    srv = http.server.HTTPServer((ip, 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    port = srv.server_address[1]

    def target(probe: dict) -> Target:
        return Target(key="k", spec=ProbeSpec.of(probe), pod_ip=ip, ports={"http": port}, started=0.0)

    assert run_once(target({"httpGet": {"path": "/ok", "port": "http"}}))[0]
    assert not run_once(target({"httpGet": {"path": "/bad", "port": port}}))[0]
    assert "not a named port" in run_once(target({"httpGet": {"path": "/ok", "port": "nope"}}))[1]
    assert run_once(target({"tcpSocket": {"port": port}}))[0]
    srv.shutdown()
    srv.server_close()
    assert not run_once(target({"tcpSocket": {"port": port}}))[0]
    hosts = write_probe_hosts(tmp_path / "probe-hosts", ip, None)
    t = target({"exec": {"command": ["sh", "-c", "getent hosts localhost"]}})
    t.sandbox = probe_sandbox(None, hosts)
    ok, out = run_once(t)
    assert ok and ip in out, out
    assert not run_once(target({"exec": {"command": ["false"]}}))[0]
    slow = target({"exec": {"command": ["sh", "-c", "sleep 30 & wait"]}, "timeoutSeconds": 1})
    t0 = time.time()
    ok, why = run_once(slow)
    assert not ok and "timed out" in why and time.time() - t0 < 5  # the shell's child was killed too


def test_kwok_stages_are_data_with_the_runner_images_filled_in():
    """hack/kwok/*.yaml are the Stages; the pods the runner executes are excluded from kwok's own
    completion and deletion by the image selector filled in for @MAPPED_IMAGES@."""
    import re

    docs = {d["metadata"]["name"]: d for d in yaml.safe_load_all(kwok.config())}
    assert len(docs) == len(list(kwok.STAGES.glob("*.yaml")))
    assert kwok.MAPPED_IMAGES not in kwok.config()
    for stage in ("rltune-pod-complete", "rltune-pod-delete"):
        keys = [e["key"] for e in docs[stage]["spec"]["selector"]["matchExpressions"]]
        sel = next(k for k in keys if "image" in k)
        rx = re.search(r'test\("(.*)"\)', sel).group(1).replace("\\\\", "\\")
        assert re.match(rx, "ghcr.io/rltune/trial:0.1.0") and not re.match(rx, "nginx")


def test_kwok_config_is_valid_yaml_with_stages():
    docs = list(yaml.safe_load_all(kwok.config()))
    names = {d["metadata"]["name"] for d in docs}
    assert {"rltune-node-initialize", "rltune-pod-ready", "rltune-pod-running-unready", "rltune-pod-complete"} <= names
    assert "rltune-pod-delete" in names
    for d in docs:
        assert d["kind"] == "Stage"


def test_node_manifest_gfd_labels_and_taint():
    n = pools.node_manifest("h200", 3, "H200", 8, "192", "2Ti")
    lab = n["metadata"]["labels"]
    recorded = pools.gpu_types()["H200"]["labels"]
    assert {k: lab[k] for k in recorded} == recorded  # exactly the recorded GFD labels
    assert lab["nvidia.com/gpu.count"] == "8"
    assert lab["nvidia.com/gpu.family"] == "hopper"
    assert n["status"]["capacity"]["nvidia.com/gpu"] == "8"
    assert n["spec"]["taints"] == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    cpu = pools.node_manifest("system", 0, None, 0, "32", "128Gi")
    assert "nvidia.com/gpu" not in cpu["status"]["capacity"] and not cpu["spec"]["taints"]


def test_env_expansion():
    from hack.bed.kubelet.invoke import expand

    assert expand("--x=$(A) $$(A) $(B)", {"A": "1"}) == "--x=1 $(A) $(B)"


# ----------------------------------------------------------------------------- scheduling
def _gpu_pool(core, pool="b300"):
    nodes = core.list_node(label_selector=f"rltune.io/pool={pool}").items
    if not nodes:
        pytest.skip(f"bed has no '{pool}' pool (started with another shape?)")
    return nodes


def test_gpu_pod_scheduled_on_b300_node(bed, core, namespace):
    _gpu_pool(core)
    core.create_namespaced_pod(namespace, bedlib.gpu_pod("gpu8", 8))
    pod = bedlib.wait_pod(core, namespace, "gpu8", phases=("Running",), timeout=30)
    node = core.read_node(pod.spec.node_name)
    assert node.metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-B300-SXM6-AC"
    assert node.status.allocatable["nvidia.com/gpu"] == "8"
    assert bedlib.pod_condition(pod, "PodScheduled").status == "True"

    # the apiserver's audit log records the pod creation (Metadata level)
    def audited():
        for line in bed.audit_log.read_text().splitlines():
            ev = json.loads(line)
            ref = ev.get("objectRef", {})
            if (
                ev["verb"] == "create"
                and ref.get("resource") == "pods"
                and ref.get("namespace") == namespace
                and ev["stage"] == "ResponseComplete"
            ):
                return ev

    ev = bedlib.wait_for(audited, 10, what="audit event")
    assert ev["level"] == "Metadata" and ev["responseStatus"]["code"] == 201


def test_pod_asking_9_gpus_stays_pending(bed, core, namespace):
    _gpu_pool(core)
    core.create_namespaced_pod(namespace, bedlib.gpu_pod("gpu9", 9))

    def unschedulable():
        p = core.read_namespaced_pod("gpu9", namespace)
        c = bedlib.pod_condition(p, "PodScheduled")
        return c if c is not None and c.status == "False" else None

    cond = bedlib.wait_for(unschedulable, 30, what="PodScheduled=False")
    assert cond.reason == "Unschedulable"
    assert "Insufficient nvidia.com/gpu" in cond.message
    assert core.read_namespaced_pod("gpu9", namespace).status.phase == "Pending"


def _busy_gpu_nodes(core, pool: str) -> dict[str, str]:
    """node -> 'ns/pod' for live pods that hold GPUs on the pool's nodes."""
    nodes = {n.metadata.name for n in core.list_node(label_selector=f"rltune.io/pool={pool}").items}
    busy = {}
    for p in core.list_pod_for_all_namespaces().items:
        if p.spec.node_name in nodes and p.status.phase not in ("Succeeded", "Failed"):
            if any((c.resources and c.resources.limits or {}).get("nvidia.com/gpu") for c in p.spec.containers):
                busy[p.spec.node_name] = f"{p.metadata.namespace}/{p.metadata.name}"
    return busy


def test_eight_pods_fill_the_pool_and_ninth_pends(bed, core, namespace):
    nodes = _gpu_pool(core)
    assert len(nodes) == 8
    pool = "b300"
    try:  # the default pool, once other tests' / demos' GPU pods have left it
        bedlib.wait_for(lambda: not _busy_gpu_nodes(core, pool), 20, what="b300 pool free")
    except TimeoutError:
        # someone (a demo, another test) holds GPUs there: use a fresh pool of the same shape
        pool = bedlib.unique("fill")
        bedlib.create_pool(core, pool, "B300", nodes=8, gpus_per_node=8)
    sel = {"rltune.io/pool": pool}
    try:
        for i in range(9):
            core.create_namespaced_pod(namespace, bedlib.gpu_pod(f"fill-{i}", 8, node_selector=sel))

        def settled():
            pods = core.list_namespaced_pod(namespace).items
            bound = [p for p in pods if p.spec.node_name]
            pending = [
                p
                for p in pods
                if not p.spec.node_name and getattr(bedlib.pod_condition(p, "PodScheduled"), "status", None) == "False"
            ]
            return (bound, pending) if len(bound) == 8 and len(pending) == 1 else None

        bound, pending = bedlib.wait_for(settled, 60, what="8 bound + 1 unschedulable")
        assert len({p.spec.node_name for p in bound}) == 8  # one per node: 8 GPUs each
        assert "Insufficient nvidia.com/gpu" in bedlib.pod_condition(pending[0], "PodScheduled").message
    finally:
        if pool != "b300":
            core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
            bedlib.delete_pool(core, pool)


def test_h200_pool_of_16_nodes_can_be_created(bed, core, namespace):
    pool = bedlib.unique("h200")
    names = bedlib.create_pool(core, pool, "H200", nodes=16, gpus_per_node=8, cpu="192", memory="2Ti")
    try:
        assert len(names) == 16
        nodes = core.list_node(label_selector=f"rltune.io/pool={pool}").items
        assert len(nodes) == 16
        h200 = pools.gpu_types()["H200"]["labels"]
        assert {n.metadata.labels["nvidia.com/gpu.product"] for n in nodes} == {h200["nvidia.com/gpu.product"]}
        assert {n.metadata.labels["nvidia.com/gpu.memory"] for n in nodes} == {h200["nvidia.com/gpu.memory"]}
        core.create_namespaced_pod(
            namespace,
            bedlib.gpu_pod(
                "h200pod", 8, product=h200["nvidia.com/gpu.product"], node_selector={"rltune.io/pool": pool}
            ),
        )
        pod = bedlib.wait_pod(core, namespace, "h200pod", phases=("Running",), timeout=30)
        assert pod.spec.node_name.startswith(pool)
    finally:
        core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        bedlib.delete_pool(core, pool)


# ----------------------------------------------------------------------------- pod runner
def test_mapped_pod_runs_locally_and_succeeds(bed, core, namespace):
    code = (
        "import os, sys; print('hello from', os.environ['POD_NAME'], os.environ['POD_NAMESPACE'],"
        " os.environ['POD_IP'], os.environ['NODE_NAME'], os.environ['GREETING'], sys.executable);"
        " print('pushgateway', os.environ['RLTUNE_PUSHGATEWAY_URL'])"
    )
    core.create_namespaced_pod(
        namespace, bedlib.python_pod("ok", code, env=[{"name": "GREETING", "value": "hi-$(POD_NAME)"}])
    )
    pod = bedlib.wait_pod(core, namespace, "ok", timeout=60)
    assert pod.status.phase == "Succeeded", pod.status
    cs = pod.status.container_statuses[0]
    assert cs.state.terminated.exit_code == 0 and cs.state.terminated.reason == "Completed"
    out = bed.pod_log(namespace, "ok")
    assert f"hello from ok {namespace} {pod.status.pod_ip} {pod.spec.node_name} hi-ok" in out
    assert str(bed.repo / ".venv") in out or "python" in out
    assert pod.status.pod_ip.startswith("127.")
    # kubectl logs: apiserver -> kwok's kubelet endpoint -> the CRI copy of the pod's output
    logs = bedlib.wait_for(
        lambda: core.read_namespaced_pod_log("ok", namespace, container="trial"), 10, what="pod logs via the API"
    )
    assert logs.splitlines()[0].startswith(f"hello from ok {namespace}")


@pytest.mark.parametrize("exit_code,reason", [(3, "Error"), (137, "OOMKilled")])
def test_mapped_pod_failure_reports_exit_code(bed, core, namespace, exit_code, reason):
    core.create_namespaced_pod(namespace, bedlib.python_pod("fail", f"import sys; sys.exit({exit_code})"))
    pod = bedlib.wait_pod(core, namespace, "fail", timeout=60)
    assert pod.status.phase == "Failed"
    term = pod.status.container_statuses[0].state.terminated
    assert term.exit_code == exit_code and term.reason == reason


def test_deleting_a_running_pod_kills_its_process(bed, core, namespace):
    marker = f"rltune-sleep-{uuid.uuid4().hex[:8]}"
    core.create_namespaced_pod(
        namespace, bedlib.python_pod("sleeper", f"import time  # {marker}\ntime.sleep(600)", grace=10)
    )
    pod = bedlib.wait_pod(core, namespace, "sleeper", phases=("Running",), timeout=30)
    pids = bedlib.wait_for(lambda: bedlib.pids_with_cmdline(marker), 30, what="process started")
    assert bedlib.pod_pids(pod.metadata.uid)
    core.delete_namespaced_pod("sleeper", namespace)  # graceful (10 s); SIGTERM ends python
    bedlib.wait_pod_gone(core, namespace, "sleeper", timeout=20)
    bedlib.wait_for(lambda: not bedlib.pids_with_cmdline(marker), 10, what="process gone")
    assert not bedlib.pod_pids(pod.metadata.uid)
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or "Z" in open(f"/proc/{pid}/stat").read().split()[2]


def test_sigterm_ignoring_process_is_killed_after_grace(bed, core, namespace):
    marker = f"rltune-stubborn-{uuid.uuid4().hex[:8]}"
    code = (
        f"import signal, time  # {marker}\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ready', flush=True)\ntime.sleep(600)"
    )
    core.create_namespaced_pod(namespace, bedlib.python_pod("stubborn", code, grace=2))
    bedlib.wait_pod(core, namespace, "stubborn", phases=("Running",), timeout=30)
    bedlib.wait_for(
        lambda: "\nready\n" in bed.pod_log(namespace, "stubborn"), 30, what="process ready (SIGTERM ignored)"
    )
    t0 = time.time()
    core.delete_namespaced_pod("stubborn", namespace)
    bedlib.wait_pod_gone(core, namespace, "stubborn", timeout=20)
    assert time.time() - t0 >= 1.5  # it waited for the grace period before SIGKILL
    bedlib.wait_for(lambda: not bedlib.pids_with_cmdline(marker), 10, what="process gone")


def test_runner_restart_readopts_without_duplicates(bed, core, namespace):
    marker = f"rltune-readopt-{uuid.uuid4().hex[:8]}"
    flag = bed.state_dir / f"{marker}.go"
    code = f"import os, time  # {marker}\nwhile not os.path.exists({str(flag)!r}): time.sleep(0.1)\nprint('released')"
    core.create_namespaced_pod(namespace, bedlib.python_pod("readopt", code))
    bedlib.wait_pod(core, namespace, "readopt", phases=("Running",), timeout=30)
    bedlib.wait_for(lambda: bedlib.pids_with_cmdline(marker), 30, what="process started")
    processes.stop("podrunner")
    argv = components.commands(binaries.bin_dir(build=False))["podrunner"]
    processes.start("podrunner", argv)
    time.sleep(2)  # the new runner lists pods and re-adopts
    assert (
        len([p for p in bedlib.pids_with_cmdline(marker) if "rltune-pod" not in open(f"/proc/{p}/cmdline").read()]) == 1
    )
    flag.write_text("go")
    try:
        pod = bedlib.wait_pod(core, namespace, "readopt", timeout=30)
        assert pod.status.phase == "Succeeded"
        assert "released" in bed.pod_log(namespace, "readopt")
    finally:
        flag.unlink(missing_ok=True)


def test_owner_deletion_garbage_collects_pods(bed, core, namespace):
    owner = core.create_namespaced_config_map(namespace, {"metadata": {"name": "owner"}, "data": {"k": "v"}})
    ref = bedlib.owner_ref(owner, "ConfigMap")
    marker = f"rltune-gc-{uuid.uuid4().hex[:8]}"
    core.create_namespaced_pod(
        namespace, bedlib.python_pod("child-mapped", f"import time  # {marker}\ntime.sleep(600)", owner=ref)
    )
    plain = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "child-plain", "ownerReferences": [dict(ref, controller=False)]},
        "spec": {"containers": [{"name": "c", "image": bedlib.PAUSE_IMAGE}], "terminationGracePeriodSeconds": 1},
    }
    core.create_namespaced_pod(namespace, plain)
    bedlib.wait_pod(core, namespace, "child-mapped", phases=("Running",), timeout=30)
    bedlib.wait_pod(core, namespace, "child-plain", phases=("Running",), timeout=30)
    bedlib.wait_for(lambda: bedlib.pids_with_cmdline(marker), 30, what="process started")
    core.delete_namespaced_config_map("owner", namespace)  # background propagation
    bedlib.wait_pod_gone(core, namespace, "child-plain", timeout=30)
    bedlib.wait_pod_gone(core, namespace, "child-mapped", timeout=30)
    bedlib.wait_for(lambda: not bedlib.pids_with_cmdline(marker), 10, what="process gone")


# ----------------------------------------------------------------------------- prometheus
def test_pushed_value_is_queryable_in_prometheus(bed):
    job = bedlib.unique("testbed-probe")
    value = 1234.5 + (uuid.uuid4().int % 1000)
    bedlib.push_metric(
        bed.pushgateway_url,
        job,
        f'# TYPE rltune_testbed_probe gauge\nrltune_testbed_probe{{trial="t1"}} {value}\n',
        instance="x",
    )
    res = bedlib.wait_for(
        lambda: bedlib.prom_query(bed.prometheus_url, f'rltune_testbed_probe{{job="{job}"}}'),
        30,
        interval=0.5,
        what="metric in Prometheus",
    )
    assert float(res[0]["value"][1]) == value
    assert res[0]["metric"]["trial"] == "t1"  # honor_labels keeps the pushed labels
    req = urllib.request.Request(f"{bed.pushgateway_url}/metrics/job/{job}/instance/x", method="DELETE")
    urllib.request.urlopen(req, timeout=5).close()


def test_pod_metrics_scraped_via_file_sd(bed, core, namespace):
    code = (
        "import http.server, os\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        body = b'rltune_testbed_pod_up 1\\n'\n"
        "        self.send_response(200); self.send_header('Content-Type','text/plain')\n"
        "        self.end_headers(); self.wfile.write(body)\n"
        "    def log_message(self, *a): pass\n"
        "http.server.HTTPServer((os.environ['POD_IP'], 9400), H).serve_forever()\n"
    )
    core.create_namespaced_pod(
        namespace,
        bedlib.python_pod(
            "exporter",
            code,
            labels={"rltune.io/trial": "t7"},
            annotations={"prometheus.io/scrape": "true", "prometheus.io/port": "9400"},
        ),
    )
    bedlib.wait_pod(core, namespace, "exporter", phases=("Running",), timeout=30)
    res = bedlib.wait_for(
        lambda: bedlib.prom_query(
            bed.prometheus_url, f'rltune_testbed_pod_up{{namespace="{namespace}",pod="exporter"}}'
        ),
        30,
        interval=0.5,
        what="pod metric scraped",
    )
    assert res[0]["metric"]["pod_label_rltune_io_trial"] == "t7"


# ----------------------------------------------------------------------------- what a kubelet gives a pod
def test_pod_gets_its_service_account_volumes_and_names(bed, core, namespace):
    """A pod reaches the API server as its own ServiceAccount (a TokenRequest token bound to the pod,
    mounted where in-cluster clients look), never with the bed's admin credentials; its configMap
    volume and /etc/hosts (Service names -> ready endpoints) are there like on a kubelet."""
    from kubernetes import client

    rbac = client.RbacAuthorizationV1Api(bed.api_client())
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "reader"}})
    rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": "cm-reader"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}],
        },
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "cm-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
        },
    )
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "settings"}, "data": {"a.yaml": "x: 1\n"}})
    # a Service with a ready endpoint whose name the pod must resolve
    core.create_namespaced_pod(
        namespace, bedlib.python_pod("server", "import time; time.sleep(120)", labels={"app": "server"})
    )
    server = bedlib.wait_pod(core, namespace, "server", phases=("Running",), timeout=30)
    core.create_namespaced_service(
        namespace, {"metadata": {"name": "web"}, "spec": {"selector": {"app": "server"}, "ports": [{"port": 8080}]}}
    )
    code = (
        "import os, socket, json\n"
        "from kubernetes import client, config\n"
        "assert 'KUBECONFIG' not in os.environ, 'admin kubeconfig leaked into the pod'\n"
        "config.load_incluster_config()\n"
        "api = client.CoreV1Api()\n"
        "ns = os.environ['POD_NAMESPACE']\n"
        "print('configmaps', [c.metadata.name for c in api.list_namespaced_config_map(ns).items])\n"
        "try:\n"
        "    api.list_namespaced_secret(os.environ['POD_NAMESPACE'])\n"
        "    print('secrets: allowed')\n"
        "except client.ApiException as e:\n"
        "    print('secrets:', e.status)\n"
        "review = {'apiVersion': 'authentication.k8s.io/v1', 'kind': 'SelfSubjectReview'}\n"
        "who = client.AuthenticationV1Api().create_self_subject_review(review)\n"
        "print('user', who.status.user_info.username)\n"
        "print('file', open('/etc/settings/a.yaml').read().strip())\n"
        "print('web', socket.gethostbyname('web.' + os.environ['POD_NAMESPACE'] + '.svc'))\n"
    )
    pod = bedlib.python_pod("client", code)
    pod["spec"]["serviceAccountName"] = "reader"
    pod["spec"]["volumes"] = [{"name": "settings", "configMap": {"name": "settings"}}]
    pod["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "settings", "mountPath": "/etc/settings", "readOnly": True}
    ]
    core.create_namespaced_pod(namespace, pod)
    done = bedlib.wait_pod(core, namespace, "client", timeout=60)
    out = bed.pod_log(namespace, "client")
    assert done.status.phase == "Succeeded", out
    assert "configmaps" in out and "'settings'" in out
    assert "secrets: 403" in out
    assert f"user system:serviceaccount:{namespace}:reader" in out
    assert "file x: 1" in out
    assert f"web {server.status.pod_ip}" in out
    # the token was requested for this pod (TokenRequest bound to it), not taken from a Secret
    assert any(
        ref.get("subresource") == "token" and ref.get("name") == "reader"
        for _, ref in bedlib.audit_events(bed, namespace)
    )


def _probe_server(port: int, flag: str) -> str:
    """Python for a pod: listen on 0.0.0.0:port after 3 s; /healthz answers 'success' (200) unless
    `flag` exists (503)."""
    return (
        "import http.server, os, time\n"
        "time.sleep(3)\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        f"        bad = os.path.exists({flag!r})\n"
        "        self.send_response(503 if bad else 200); self.end_headers(); self.wfile.write(b'success')\n"
        "    def log_message(self, *a): pass\n"
        "print('listening', flush=True)\n"
        f"http.server.HTTPServer(('0.0.0.0', {port}), H).serve_forever()\n"
    )


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_probed_pod_is_ready_only_once_its_readiness_probe_passes(bed, core, namespace):
    """As on a kubelet: a container with a readinessProbe is Running but not Ready until the probe
    passes, not Ready again after failureThreshold failures, and a Service resolves to it only while
    it is Ready (KubeRay waits for a Ready head before it submits a job)."""
    port, flag = _free_port(), str(bed.state_dir / f"probe-{uuid.uuid4().hex[:8]}.bad")
    pod = bedlib.python_pod("probed", _probe_server(port, flag), labels={"app": "probed"})
    c = pod["spec"]["containers"][0]
    c["ports"] = [{"name": "health", "containerPort": port}]
    c["readinessProbe"] = {"httpGet": {"path": "/healthz", "port": "health"}, "periodSeconds": 1, "failureThreshold": 2}
    core.create_namespaced_service(
        namespace, {"metadata": {"name": "probed"}, "spec": {"selector": {"app": "probed"}, "ports": [{"port": port}]}}
    )
    core.create_namespaced_pod(namespace, pod)
    running = bedlib.wait_pod(core, namespace, "probed", phases=("Running",), timeout=30)
    assert bedlib.pod_condition(running, "Ready").status == "False", running.status
    assert bedlib.pod_condition(running, "Initialized").status == "True"
    assert running.status.container_statuses[0].ready is False
    name = f"probed.{namespace}.svc"
    assert name not in (bed.state_dir / "hosts").read_text()  # no ready endpoint yet

    def ready() -> bool:
        p = core.read_namespaced_pod("probed", namespace)
        return bedlib.pod_condition(p, "Ready").status == "True" and p.status.container_statuses[0].ready

    bedlib.wait_for(ready, 30, what="Ready after the probe passed")
    assert "listening" in bed.pod_log(namespace, "probed")  # not before its server listened
    bedlib.wait_for(lambda: name in (bed.state_dir / "hosts").read_text(), 10, what="Service resolves once Ready")
    open(flag, "w").close()  # the server now answers 503
    bedlib.wait_for(lambda: not ready(), 20, what="not Ready after failureThreshold failures")
    p = core.read_namespaced_pod("probed", namespace)
    assert p.status.phase == "Running" and p.status.container_statuses[0].state.running is not None
    bedlib.wait_for(lambda: name not in (bed.state_dir / "hosts").read_text(), 10, what="Service drops the endpoint")
    os.unlink(flag)
    bedlib.wait_for(ready, 20, what="Ready again")


def test_an_exec_probe_sees_the_pods_own_localhost(bed, core, namespace):
    """KubeRay injects exec probes that `wget http://localhost:<port>/...`: for a Ray image (its
    servers bind the pod IP, hack/bed/kubelet/podnet) the probe's localhost is the pod IP, as in a pod."""
    port = _free_port()
    pod = bedlib.python_pod("rayish", _probe_server(port, "/nonexistent"))
    c = pod["spec"]["containers"][0]
    c["image"] = "rayproject/ray:2.55.0"
    cmd = f"wget --tries 1 -T 2 -q -O- http://localhost:{port}/healthz | grep success"
    c["readinessProbe"] = {"exec": {"command": ["bash", "-c", cmd]}, "periodSeconds": 1}
    core.create_namespaced_pod(namespace, pod)
    running = bedlib.wait_pod(core, namespace, "rayish", phases=("Running",), timeout=30)
    assert bedlib.pod_condition(running, "Ready").status == "False"
    bedlib.wait_for(
        lambda: bedlib.pod_condition(core.read_namespaced_pod("rayish", namespace), "Ready").status == "True",
        30,
        what="Ready through the exec probe",
    )
    # the server listens on the pod IP only: the host's 127.0.0.1 has nothing on that port
    import socket

    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_a_failing_liveness_probe_restarts_the_container(bed, core, namespace):
    """failureThreshold liveness failures in a row: the container is killed (events Unhealthy and
    Killing, lastState terminated with reason Error) and restarts as restartPolicy Always says."""
    port, flag = _free_port(), str(bed.state_dir / f"live-{uuid.uuid4().hex[:8]}.bad")
    pod = bedlib.python_pod("live", _probe_server(port, flag), restart_policy="Always", grace=2)
    pod["spec"]["containers"][0]["livenessProbe"] = {
        "httpGet": {"path": "/healthz", "port": port},
        "initialDelaySeconds": 5,
        "periodSeconds": 1,
        "failureThreshold": 2,
    }
    core.create_namespaced_pod(namespace, pod)
    bedlib.wait_pod(core, namespace, "live", phases=("Running",), timeout=30)
    bedlib.wait_for(lambda: "listening" in bed.pod_log(namespace, "live"), 30, what="server listening")
    time.sleep(4)  # alive and answering: the probe passes, nothing restarts
    assert core.read_namespaced_pod("live", namespace).status.container_statuses[0].restart_count == 0
    open(flag, "w").close()  # /healthz now answers 503

    def restarted():
        cs = core.read_namespaced_pod("live", namespace).status.container_statuses[0]
        return cs if cs.restart_count >= 1 else None

    cs = bedlib.wait_for(restarted, 30, what="restarted after its liveness probe failed")
    os.unlink(flag)
    term = cs.last_state.terminated
    assert term is not None and term.reason == "Error" and term.exit_code != 0, cs
    reasons = {e.reason for e in core.list_namespaced_event(namespace, field_selector="involvedObject.name=live").items}
    assert {"Unhealthy", "Killing"} <= reasons, reasons
    assert "failed its liveness probe: killed" in bed.pod_log(namespace, "live")
    bedlib.wait_for(
        lambda: core.read_namespaced_pod("live", namespace).status.container_statuses[0].state.running is not None,
        60,
        what="running again",
    )


def test_a_startup_probe_holds_readiness_and_liveness_until_it_passes(bed, core, namespace):
    """A slow starter with a startupProbe is not ready, and not killed by a liveness probe that
    would fail at once, until its startup probe passes; then it is started, and Ready once its
    readiness probe passes too."""
    flag = str(bed.state_dir / f"started-{uuid.uuid4().hex[:8]}")
    ready_flag = flag + ".ready"
    pod = bedlib.python_pod("slowstart", "import time; time.sleep(300)")
    check = {"exec": {"command": ["test", "-f", flag]}, "periodSeconds": 1}
    pod["spec"]["containers"][0]["startupProbe"] = check | {"failureThreshold": 60}
    pod["spec"]["containers"][0]["livenessProbe"] = check | {"failureThreshold": 1}
    pod["spec"]["containers"][0]["readinessProbe"] = {
        "exec": {"command": ["test", "-f", ready_flag]},
        "periodSeconds": 1,
    }
    core.create_namespaced_pod(namespace, pod)
    bedlib.wait_pod(core, namespace, "slowstart", phases=("Running",), timeout=30)
    time.sleep(4)  # the liveness probe would have killed it by now if it ran
    p = core.read_namespaced_pod("slowstart", namespace)
    cs = p.status.container_statuses[0]
    assert cs.restart_count == 0 and cs.ready is False and bedlib.pod_condition(p, "Ready").status == "False", p.status
    assert cs.started is False  # as a kubelet reports it until the startup probe passed
    open(flag, "w").close()
    cs = bedlib.wait_for(
        lambda: (s := core.read_namespaced_pod("slowstart", namespace).status.container_statuses[0]).started and s,
        20,
        what="started once the startup probe passed",
    )
    assert cs.ready is False  # its readiness probe has not passed yet
    open(ready_flag, "w").close()
    bedlib.wait_for(
        lambda: bedlib.pod_condition(core.read_namespaced_pod("slowstart", namespace), "Ready").status == "True",
        20,
        what="Ready once the readiness probe passed too",
    )
    cs = core.read_namespaced_pod("slowstart", namespace).status.container_statuses[0]
    assert cs.restart_count == 0 and cs.started is True, cs
    os.unlink(flag)
    os.unlink(ready_flag)
