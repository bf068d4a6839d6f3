"""KubeRay on the test bed, for real: the bed's KubeRay operator (ray-operator v1.5.0, hack/binaries.sh)
reconciles a RayJob into a RayCluster whose head and worker pods the pod runner runs as real Ray
nodes (`ray start --head ... --block`, the worker after KubeRay's `wait-gcs-ready` init container),
and a submitter Job whose pod runs `ray job submit` against the head's dashboard. The job's driver
connects with ray.init() and sees both nodes; with shutdownAfterJobFinishes the cluster goes away.

Also the kubelet behaviour this needs from the pod runner: init containers in order before the
main containers (and a failing one failing the pod), and /etc/hosts that learns a Service whose pod
became Running after the container started.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest
import yaml

import bed as bedlib
from hack.bed import kuberay
from rltune.controller.rayjob import SUBMITTER_RETRIES

pytestmark = [pytest.mark.bed, pytest.mark.slow]

RAY_IMAGE = "rayproject/ray:2.55.0"  # mapped: a "Ray image" (hack/images.yaml)
MARK = "RLTUNE-RAYJOB-OK"


@pytest.fixture(autouse=True)
def _kuberay_on(bed):
    if not kuberay.enabled():
        pytest.skip("the bed runs without KubeRay (RLTUNE_BED_KUBERAY=0 / testbed.py kuberay off)")


def kubectl(bed, *args, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(["kubectl", *args], env=bed.env(), input=stdin, capture_output=True, text=True, timeout=120)
    if check:
        assert r.returncode == 0, f"kubectl {' '.join(args)}:\n{r.stdout}\n{r.stderr}"
    return r


def get(bed, ns: str, kind: str, name: str) -> dict | None:
    r = kubectl(bed, "-n", ns, "get", kind, name, "-o", "json", check=False)
    return json.loads(r.stdout) if r.returncode == 0 else None


def items(bed, ns: str, kind: str, selector: str | None = None) -> list[dict]:
    args = ["-n", ns, "get", kind, "-o", "json"] + (["-l", selector] if selector else [])
    return json.loads(kubectl(bed, *args).stdout)["items"]


def entrypoint(nodes: int, gpus: int) -> str:
    # one line: KubeRay pastes it into the submitter's bash command line, Ray runs it with a shell.
    # It waits (up to 5 min, for a loaded CI machine) for the worker to join: KubeRay submits once
    # the head is Ready (its probes pass), which may be before the worker's raylet registered.
    return (
        'python -c "import ray, time; ray.init(); '
        "n_alive = lambda: len([n for n in ray.nodes() if n['Alive']]); "
        f"next((i for i in range(300) if n_alive() >= {nodes} or time.sleep(1)), None); "
        "alive = [n for n in ray.nodes() if n['Alive']]; "
        f"assert len(alive) == {nodes}, alive; "
        "ips = sorted(n['NodeManagerAddress'] for n in alive); "
        f"assert len(set(ips)) == {nodes}, ips; "
        "gpus = ray.cluster_resources().get('GPU', 0); "
        f"assert gpus == {gpus}, ray.cluster_resources(); "
        "where = ray.get([ray.remote(lambda: ray.util.get_node_ip_address()).options("
        "scheduling_strategy=ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy("
        "n['NodeID'], soft=False)).remote() for n in alive]); "
        f"print('{MARK}', len(alive), 'nodes', ips, 'tasks ran on', sorted(where), 'GPUs', gpus)\""
    )


def ray_container(name: str, cpu: str = "1", memory: str = "2Gi", gpus: int = 0) -> dict:
    limits = {"cpu": cpu, "memory": memory}
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    return {
        "name": name,
        "image": RAY_IMAGE,
        "resources": {"requests": dict(limits), "limits": dict(limits)},
    }


def rayjob(name: str, gpu_worker: bool) -> dict:
    worker_spec: dict = {"containers": [ray_container("ray-worker", gpus=1 if gpu_worker else 0)]}
    if gpu_worker:
        product = bedlib.GPU_TYPES["B300"]["labels"]["nvidia.com/gpu.product"]
        worker_spec.update(nodeSelector={"nvidia.com/gpu.product": product}, tolerations=[dict(bedlib.GPU_TOLERATION)])
    else:
        worker_spec["nodeSelector"] = {"rltune.io/pool": "system"}
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": name},
        "spec": {
            "entrypoint": entrypoint(2, 1 if gpu_worker else 0),
            "submissionMode": "K8sJobMode",
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": 0,
            "activeDeadlineSeconds": 600,
            # a submitter pod that cannot connect is retried (the operator's reason: clusters without probes)
            "submitterConfig": {"backoffLimit": SUBMITTER_RETRIES},
            "rayClusterSpec": {
                "rayVersion": "2.55.0",
                "headGroupSpec": {
                    "rayStartParams": {},
                    "template": {
                        "spec": {
                            "nodeSelector": {"rltune.io/pool": "system"},
                            "containers": [ray_container("ray-head")],
                        }
                    },
                },
                "workerGroupSpecs": [
                    {
                        "groupName": "gpu" if gpu_worker else "cpu",
                        "replicas": 1,
                        "minReplicas": 1,
                        "maxReplicas": 1,
                        "rayStartParams": {},
                        "template": {"spec": worker_spec},
                    }
                ],
            },
        },
    }


def run_rayjob(bed, ns: str, name: str, gpu_worker: bool, queue: str | None = None) -> dict:
    """Run a RayJob to Complete and check what ran; with `queue`, it names that Kueue LocalQueue and
    must be created suspended (Kueue's webhook holds it until admission). Returns its last status."""
    t0 = time.time()
    rj = rayjob(name, gpu_worker)
    if queue:
        rj["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": queue}
    created = json.loads(kubectl(bed, "-n", ns, "create", "-o", "json", "-f", "-", stdin=yaml.safe_dump(rj)).stdout)
    if queue:
        assert created["spec"]["suspend"] is True, created["spec"]  # suspended until Kueue admits it
    seen_pods: dict[str, dict] = {}  # name -> last seen pod (they are gone at the end)
    cluster = None

    def finished() -> bool:
        nonlocal cluster
        for p in items(bed, ns, "pods"):
            seen_pods[p["metadata"]["name"]] = p
        rj = get(bed, ns, "rayjob", name) or {}
        st = rj.get("status") or {}
        cluster = st.get("rayClusterName") or cluster
        if st.get("jobDeploymentStatus") in ("Failed", "ValidationFailed"):
            pytest.fail(f"RayJob failed: {json.dumps(st)}\n{diagnose(bed, ns, seen_pods)}")
        return st.get("jobDeploymentStatus") == "Complete"

    try:
        bedlib.wait_for(finished, 600, interval=2.0, what=f"RayJob {ns}/{name} Complete")
    except Exception:
        pytest.fail(f"RayJob {name} did not complete:\n{diagnose(bed, ns, seen_pods)}")
    st = get(bed, ns, "rayjob", name)["status"]
    t_done = time.time() - t0
    assert st["jobStatus"] == "SUCCEEDED", st
    assert st["jobDeploymentStatus"] == "Complete", st

    # the pods that ran: a head, a worker (after its wait-gcs-ready init container), the submitter
    kinds = {(p["metadata"].get("labels") or {}).get("ray.io/node-type"): p for p in seen_pods.values()}
    assert "head" in kinds and "worker" in kinds, sorted(seen_pods)
    worker = kinds["worker"]
    assert [c["name"] for c in worker["spec"].get("initContainers", [])] == ["wait-gcs-ready"]
    # KubeRay's own readiness probe on the head (GCS and raylet health through the dashboard), which
    # the bed runs (hack/podprobe.py): the head was Ready, and the driver submitted, once it passed
    probe = " ".join(kinds["head"]["spec"]["containers"][0]["readinessProbe"]["exec"]["command"])
    assert "localhost:8265/api/gcs_healthz" in probe, probe
    wlog = bed.pod_log(ns, worker["metadata"]["name"])
    assert "GCS is ready." in wlog, wlog[-3000:]
    assert wlog.index("container wait-gcs-ready start") < wlog.index("container ray-worker start"), wlog[-3000:]
    if gpu_worker:
        assert worker["spec"]["nodeName"].startswith("b300-"), worker["spec"]["nodeName"]
        assert "--num-gpus=1" in " ".join(worker["spec"]["containers"][0].get("args") or []), worker["spec"]

    # the driver's output, through the submitter pod's log (`ray job logs --follow`); a submitter
    # pod that failed to connect would have been retried (the Job's backoffLimit), as KubeRay intends
    submitters = [p for p in seen_pods.values() if (p["metadata"].get("labels") or {}).get("job-name") == name]
    assert submitters, sorted(seen_pods)
    said = f"{MARK} 2 nodes"  # what the driver prints (the command line, also logged, has no such text)
    logs = {}
    for p in submitters:
        sub = p["metadata"]["name"]
        r = kubectl(bed, "-n", ns, "logs", sub, check=False)
        logs[sub] = r.stdout if r.returncode == 0 and said in r.stdout else bed.pod_log(ns, sub)
    slog = next((text for text in logs.values() if said in text), "")
    assert said in slog, logs
    print(f"\nsubmitter pods: {len(submitters)}; driver said: {next(ln for ln in slog.splitlines() if said in ln)}")

    # shutdownAfterJobFinishes: the RayCluster and its pods are deleted
    assert cluster, st

    def cluster_gone() -> bool:
        return get(bed, ns, "raycluster", cluster) is None and not items(bed, ns, "pods", f"ray.io/cluster={cluster}")

    bedlib.wait_for(cluster_gone, 120, interval=1.0, what=f"RayCluster {cluster} and its pods deleted")
    print(
        f"\nRayJob {name} ({'GPU' if gpu_worker else 'CPU'} worker): Complete/SUCCEEDED in {t_done:.1f}s, "
        f"cluster gone after {time.time() - t0:.1f}s"
    )
    return st


def diagnose(bed, ns: str, pods: dict[str, dict]) -> str:
    out = [kubectl(bed, "-n", ns, "get", "rayjob,raycluster,job,pods,svc", "-o", "wide", check=False).stdout]
    for name in pods:
        out.append(f"---- log of {name}:\n" + bed.pod_log(ns, name)[-2500:])
    return "\n".join(out)


def test_rayjob_with_cpu_worker_runs_for_real(bed, namespace):
    run_rayjob(bed, namespace, "rj-cpu", gpu_worker=False)


def test_rayjob_with_gpu_worker_on_the_gpu_pool(bed, namespace):
    run_rayjob(bed, namespace, "rj-gpu", gpu_worker=True)


# ----------------------------------------------------------------------------- the runner's kubelet parts
def _py(name: str, code: str) -> dict:
    return {"name": name, "image": bedlib.TRIAL_IMAGE, "command": ["python", "-c", code]}


def test_init_containers_run_in_order_before_the_main_container(bed, core, namespace):
    flag = f"/tmp/rltune-init-{bedlib.unique('x')}"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "inits"},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": {"rltune.io/pool": "system"},
            "initContainers": [
                _py("first", f"import time; print('first ran'); open({flag!r}, 'w').write('1'); time.sleep(2)"),
                {"name": "unmapped", "image": bedlib.PAUSE_IMAGE},
                _py("second", f"print('second saw', open({flag!r}).read())"),
            ],
            "containers": [_py("main", f"import os; print('main ran'); os.remove({flag!r})")],
        },
    }
    core.create_namespaced_pod(namespace, pod)
    # while the first init container runs, the pod is Pending and not Initialized, as from a kubelet
    seen = {}

    def initializing():
        p = core.read_namespaced_pod("inits", namespace)
        conds = {c.type: c.status for c in p.status.conditions or []}
        inits = {s.name: s.state for s in p.status.init_container_statuses or []}
        if p.status.phase == "Pending" and conds.get("Initialized") == "False" and inits.get("first").running:
            seen["main"] = p.status.container_statuses[0].state.waiting.reason
            return True
        return False

    bedlib.wait_for(initializing, 30, what="pod initializing")
    assert seen["main"] == "PodInitializing"
    p = bedlib.wait_pod(core, namespace, "inits", timeout=60)
    assert p.status.phase == "Succeeded", p.status
    inits = {s.name: s.state.terminated for s in p.status.init_container_statuses}
    assert all(t is not None and t.exit_code == 0 for t in inits.values()), inits
    assert bedlib.pod_condition(p, "Initialized").status == "True"
    log = bed.pod_log(namespace, "inits")
    order = [log.index(s) for s in ("first ran", "second saw 1", "main ran")]
    assert order == sorted(order), log


def test_a_failing_init_container_fails_the_pod(bed, core, namespace):
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "badinit"},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": {"rltune.io/pool": "system"},
            "initContainers": [_py("boom", "import sys; sys.exit(3)")],
            "containers": [_py("main", "print('must not run')")],
        },
    }
    core.create_namespaced_pod(namespace, pod)
    p = bedlib.wait_pod(core, namespace, "badinit", timeout=60)
    assert p.status.phase == "Failed", p.status
    t = p.status.init_container_statuses[0].state.terminated
    assert t.exit_code == 3 and t.reason == "Error", t
    assert p.status.container_statuses[0].state.waiting.reason == "PodInitializing"
    assert "must not run" not in bed.pod_log(namespace, "badinit")


def test_etc_hosts_learns_a_service_whose_pod_came_up_later(bed, core, namespace):
    core.create_namespaced_service(
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "later"},
            "spec": {"selector": {"app": "later"}, "ports": [{"port": 80}]},
        },
    )
    name = f"later.{namespace}.svc.cluster.local"
    looker = _py(
        "look",
        "import socket, time\n"
        "for _ in range(300):\n"
        f"    try: print('resolved', socket.gethostbyname({name!r}), flush=True); break\n"
        "    except OSError: time.sleep(0.2)\n"
        "else: raise SystemExit('never resolved')",
    )
    core.create_namespaced_pod(
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "looker"},
            "spec": {"restartPolicy": "Never", "containers": [looker]},
        },
    )
    bedlib.wait_for(lambda: "container look start" in bed.pod_log(namespace, "looker"), 30, what="looker started")
    time.sleep(3)  # the looker's /etc/hosts was written without the Service
    core.create_namespaced_pod(
        namespace, bedlib.python_pod("backend", "import time; time.sleep(120)", labels={"app": "later"})
    )
    p = bedlib.wait_pod(core, namespace, "looker", timeout=60)
    assert p.status.phase == "Succeeded", bed.pod_log(namespace, "looker")
    ip = core.read_namespaced_pod("backend", namespace).status.pod_ip
    assert f"resolved {ip}" in bed.pod_log(namespace, "looker")
