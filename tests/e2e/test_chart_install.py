"""The path a user takes on a real cluster, on the test bed: `helm install` of helm/rltune, the
operator running from the chart as a pod under its own ServiceAccount (in-cluster config, a
TokenRequest token; the API server enforces the chart's RBAC for real), a twin job to Succeeded on
nodes that carry only the recorded real GFD labels, `helm test`, and the RBAC boundaries
(`kubectl auth can-i`): no Secrets, no pods outside the watched namespaces. Both namespaces
enforce the restricted Pod Security Standard, so every pod the chart and the operator make passes
the API server's PodSecurity admission."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
import yaml

import bed as bedlib
from hack import demo

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "twin-demo.yaml"
GFD = ROOT / "hack" / "gfd" / "labels.yaml"

pytestmark = [pytest.mark.bed, pytest.mark.slow]


def run(env, *args, check=True, timeout=240):
    r = subprocess.run(list(args), env=env, capture_output=True, text=True, timeout=timeout)
    if check:
        assert r.returncode == 0, f"{' '.join(args)}:\n{r.stdout}\n{r.stderr}"
    return r


def wait(cond, timeout, what):
    return bedlib.wait_for(cond, timeout, what=what, interval=1.0)


def get_job(env, ns, name):
    r = run(env, "kubectl", "get", "rltuningjob", name, "-n", ns, "-o", "json", check=False)
    return json.loads(r.stdout) if r.returncode == 0 else None


def small_job(name: str, **resources) -> dict:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"] = {"name": name}
    doc["spec"]["budget"].update(maxTrials=2, parallelTrials=2, confirmSteps=0, stepsPerTrial=3)
    doc["spec"]["resources"].update(resources)
    return doc


def apply(env, ns, doc):
    r = subprocess.run(
        ["kubectl", "apply", "-n", ns, "-f", "-"],
        env=env,
        input=yaml.safe_dump(doc),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr


def condition(job: dict, type_: str) -> dict:
    return next((c for c in (job.get("status") or {}).get("conditions") or [] if c["type"] == type_), {})


@pytest.fixture
def release(bed, core, namespace):
    """The chart installed into its own namespace, watching only `namespace`."""
    env = bedlib.chart_env(bed)
    sys_ns = bedlib.unique("rltune-sys")
    name = "rl" + sys_ns[-6:]
    # both namespaces enforce the Pod Security Standards' restricted profile (the API server's
    # PodSecurity admission): the operator pod, the helm test pod and every trial pod must pass it
    restricted = {"pod-security.kubernetes.io/enforce": "restricted"}
    core.create_namespace({"metadata": {"name": sys_ns, "labels": restricted}})
    core.patch_namespace(namespace, {"metadata": {"labels": restricted}})
    demo.helm_install(env, name, sys_ns, watch=(namespace,))
    yield env, name, sys_ns
    subprocess.run(
        ["kubectl", "delete", "rltuningjobs", "--all", "-n", namespace, "--wait=true", "--timeout=60s"],
        env=env,
        capture_output=True,
        timeout=90,
    )
    subprocess.run(["helm", "uninstall", name, "-n", sys_ns, "--wait"], env=env, capture_output=True, timeout=120)
    subprocess.run(["kubectl", "delete", "namespace", sys_ns, "--wait=false"], env=env, capture_output=True)


def test_chart_operator_tunes_a_job_as_its_service_account(bed, core, namespace, release):
    env, name, sys_ns = release
    pod = wait(lambda: demo.operator_pod(env, name, sys_ns), 60, "the operator pod")
    sa = pod["spec"]["serviceAccountName"]
    assert sa and sa != "default"
    user = f"system:serviceaccount:{sys_ns}:{sa}"

    # helm test: a hook pod GETs the operator's /healthz through its Service name
    r = run(env, "helm", "test", name, "-n", sys_ns, "--timeout", "120s", check=False)
    assert r.returncode == 0 and "Succeeded" in r.stdout, r.stdout + r.stderr

    # a job whose podTemplate adds a volume and a mount to container `trial` (strategic merge)
    doc = small_job("chart-twin")
    doc["spec"]["resources"]["podTemplate"] = {
        "volumes": [{"name": "scratch", "emptyDir": {}}],
        "containers": [{"name": "trial", "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}],
    }
    apply(env, namespace, doc)
    job = wait(
        lambda: (
            (j := get_job(env, namespace, "chart-twin"))
            and (j.get("status") or {}).get("phase") in ("Succeeded", "Failed")
            and j
        ),
        300,
        "the job to finish",
    )
    st = job["status"]
    assert st["phase"] == "Succeeded", st.get("message")
    assert condition(job, "Ready").get("status") == "True"
    assert condition(job, "Reconciling").get("status") == "False"
    assert condition(job, "Stalled").get("status") == "False"
    run(env, "kubectl", "wait", "--for=condition=Ready", "rltuningjob/chart-twin", "-n", namespace, "--timeout=10s")

    # the job's status was written by the chart's ServiceAccount, and its pods created by it
    writers = {
        ev["user"]["username"]
        for ev, ref in bedlib.audit_events(bed, namespace)
        if ref.get("resource") in ("rltuningjobs", "pods")
        and ev.get("verb") in ("create", "update", "patch")
        and (ev.get("responseStatus") or {}).get("code", 0) < 300
        and ref.get("subresource") in ("status", None)
        and not (ref.get("resource") == "rltuningjobs" and ev.get("verb") == "create")
    }
    assert user in writers, writers
    pod_creators = {
        ev["user"]["username"]
        for ev, ref in bedlib.audit_events(bed, namespace)
        if ref.get("resource") == "pods" and ev.get("verb") == "create" and not ref.get("subresource")
    }
    assert pod_creators == {user}, pod_creators

    # the trials ran (with the template's mount merged into container trial, the API server accepted
    # the pods: a second container named trial would be refused) on GPU nodes that carry the
    # recorded real GFD product labels
    recorded = {e["labels"]["nvidia.com/gpu.product"] for e in yaml.safe_load(GFD.read_text())["types"].values()}
    log = bed.pod_log(namespace, "chart-twin-baseline-0")
    assert log, "no log of the baseline pod"
    events = run(env, "kubectl", "get", "events", "-n", namespace, "-o", "json").stdout
    scheduled = [e for e in json.loads(events)["items"] if e.get("reason") == "Scheduled"]
    assert scheduled
    for e in scheduled:
        node = e["message"].rsplit(" to ", 1)[-1].strip()
        labels = core.read_node(node).metadata.labels
        assert labels["nvidia.com/gpu.product"] in recorded
    # events are reported by component rltune
    sources = {
        (e.get("reportingComponent") or (e.get("source") or {}).get("component"))
        for e in json.loads(events)["items"]
        if e["involvedObject"].get("kind") == "RLTuningJob"
    }
    assert sources == {"rltune"}, sources

    # RBAC as the API server enforces it
    def can_i(*args):
        return run(env, "kubectl", "auth", "can-i", *args, f"--as={user}", check=False).stdout.strip()

    assert can_i("get", "secrets", "-n", namespace) == "no"
    assert can_i("list", "secrets", "-n", sys_ns) == "no"
    assert can_i("create", "pods", "-n", namespace) == "yes"
    assert can_i("create", "pods", "-n", "default") == "no"
    assert can_i("delete", "pods", "-n", "kube-system") == "no"
    assert can_i("patch", "rltuningjobs.rltune.io/status", "-n", namespace) == "yes"
    assert can_i("*", "*") == "no"
    # trials' NetworkPolicies: created with each trial (a refused dry run would have failed the job)
    # and deleted at its teardown, under the chart's rule (list, create, delete; nothing else)
    policies = "networkpolicies.networking.k8s.io"
    assert can_i("create", policies, "-n", namespace) == can_i("delete", policies, "-n", namespace) == "yes"
    assert can_i("create", policies, "-n", "default") == "no" and can_i("patch", policies, "-n", namespace) == "no"
    from kubernetes import client

    net = client.NetworkingV1Api(bed.api_client())
    wait(lambda: not net.list_namespaced_network_policy(namespace).items, 30, "the trials' NetworkPolicies to go")

    # rltune report --job draws the report from the status
    out = Path(bed.state_dir).parent / "e2e" / f"report-{namespace}.html"
    run(env, str(ROOT / ".venv" / "bin" / "rltune"), "report", "--job", f"{namespace}/chart-twin", "-o", str(out))
    html = out.read_text()
    assert "rltune tuning report" in html and "baseline" in html and ".png" in html


def test_unmatched_selector_is_a_condition_not_a_timeout(bed, core, namespace, release):
    env, name, sys_ns = release
    doc = small_job("nowhere", nodeSelector={"cloud.google.com/gke-nodepool": "b300-pool"})
    t0 = time.time()
    apply(env, namespace, doc)
    job = wait(
        lambda: (j := get_job(env, namespace, "nowhere")) and (j.get("status") or {}).get("phase") == "Failed" and j,
        60,
        "the job to fail",
    )
    took = time.time() - t0
    assert took < doc["spec"]["budget"]["scheduleTimeoutSeconds"]
    c = condition(job, "PodsSchedulable")
    assert c.get("status") == "False" and c.get("reason") == "NoMatchingNodes"
    assert "cloud.google.com/gke-nodepool" in c["message"] and "nvidia.com/gpu.product" in c["message"]
    assert condition(job, "Stalled").get("status") == "True"
    assert not bedlib.pod_creations(bed, namespace), "a pod was created for an unplaceable job"


def test_a_verl_job_without_verl_command_and_host_path_are_refused(bed, core, namespace, release):
    env, name, sys_ns = release
    verl = small_job("verl-job")
    verl["spec"]["workload"]["framework"] = "verl"
    host = small_job("hostpath-job")
    host["spec"]["resources"]["podTemplate"] = {"volumes": [{"name": "h", "hostPath": {"path": "/etc"}}]}
    apply(env, namespace, verl)
    apply(env, namespace, host)
    for jname, reason, field in (
        ("verl-job", "InvalidCommand", "spec.workload.command"),
        ("hostpath-job", "PodSecurityViolation", "hostPath"),
    ):
        job = wait(
            lambda jname=jname: (
                (j := get_job(env, namespace, jname)) and condition(j, "SpecValid").get("status") == "False" and j
            ),
            60,
            f"{jname} refused",
        )
        c = condition(job, "SpecValid")
        assert c["reason"] == reason and field in c["message"], c
        assert job["status"]["phase"] == "Failed"
    assert not bedlib.pod_creations(bed, namespace)


@pytest.mark.parametrize(
    "values",
    [
        [],
        [
            "--set",
            "watchNamespaces={team-a,team-b}",
            "--set",
            "prometheus.bearerTokenSecret.name=prom-token",
            "--set",
            "prometheus.caConfigMap.name=prom-ca",
        ],
    ],
)
def test_rendered_chart_passes_a_server_side_dry_run(bed, values):
    """Every object `helm template` renders is accepted by the API server (schema, RBAC objects,
    the Deployment's security context) in a server-side dry run."""
    env = demo.bed_env()
    env.update(bed.env())
    demo.apply_crd(env)
    out = run(
        env, "helm", "template", "rltune", str(ROOT / "helm" / "rltune"), "-n", "default", "--include-crds", *values
    ).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "ServiceAccount", "ConfigMap", "Service", "CustomResourceDefinition"} <= kinds
    assert ("Role" in kinds) == bool(values) and ("ClusterRole" in kinds)
    for ns in ["team-a", "team-b"] if values else []:
        run(env, "kubectl", "create", "namespace", ns, check=False)
    try:
        r = subprocess.run(
            ["kubectl", "apply", "--dry-run=server", "--server-side", "--force-conflicts", "-f", "-"],
            env=env,
            input=out,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        for ns in ["team-a", "team-b"] if values else []:
            run(env, "kubectl", "delete", "namespace", ns, "--wait=false", check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("(server dry run)") == len(docs), r.stdout
