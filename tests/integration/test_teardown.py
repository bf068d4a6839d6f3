"""A trial's teardown (KubeCluster.delete_trial) on the bed's real API server deletes only what the
job owns. A job `web` shares its namespace with another workload whose Service, pod and
NetworkPolicy are named exactly as `web`'s baseline trial objects would be (`web-baseline`,
`web-baseline-0`) and even carry the trial's labels: tearing down `web`'s baseline leaves them, while
the objects the job does own (an ownerReference with its UID) go. Also for RayJobs where the bed
serves ray.io (KubeRay on): a suspended RayJob `web-baseline` of someone else survives.

No operator runs here: the test creates the job and the objects itself and calls delete_trial the
way the reconciler and the deletion handler do.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

import bed as bedlib
from hack.demo import wait_crd_established
from rltune.api.crdgen import GROUP, PLURAL, VERSION
from rltune.controller import rayjob as trial_rayjobs
from rltune.controller.kube import KubeCluster

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "twin-demo.yaml"
CRD = ROOT / "crds" / "rltuningjobs.yaml"

pytestmark = pytest.mark.bed


@pytest.fixture(scope="module")
def crd(bed):
    import subprocess

    r = subprocess.run(
        [str(bed.bin_dir / "kubectl"), "apply", "--server-side", "--force-conflicts", "-f", str(CRD)],
        env=bed.env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    wait_crd_established(bed.env(), f"{PLURAL}.{GROUP}", kubectl_bin=str(bed.bin_dir / "kubectl"))
    return bed


def labels(trial: str) -> dict:
    return {"rltune.io/job": "web", "rltune.io/trial": trial}


def meta(name: str, trial: str, owner: dict | None) -> dict:
    md = {"name": name, "labels": labels(trial)}
    if owner:
        md["ownerReferences"] = [owner]
    return md


def service(name: str, trial: str, owner: dict | None) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta(name, trial, owner),
        "spec": {"clusterIP": "None", "selector": {"app": name}, "ports": [{"port": 80}]},
    }


def pod(name: str, trial: str, owner: dict | None) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta(name, trial, owner),
        "spec": {
            "containers": [{"name": "main", "image": bedlib.PAUSE_IMAGE}],
            "nodeSelector": {"rltune.io/pool": "system"},
            "terminationGracePeriodSeconds": 1,
        },
    }


def policy(name: str, trial: str, owner: dict | None) -> dict:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta(name, trial, owner),
        "spec": {"podSelector": {"matchLabels": {"app": name}}, "policyTypes": ["Ingress"]},
    }


def rayjob(name: str, trial: str, owner: dict | None) -> dict:
    head = {"spec": {"containers": [{"name": "ray-head", "image": "rayproject/ray:2.55.0"}]}}
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": meta(name, trial, owner),
        "spec": {
            "entrypoint": "true",
            "suspend": True,  # KubeRay makes no RayCluster for it
            "shutdownAfterJobFinishes": True,
            "rayClusterSpec": {"headGroupSpec": {"rayStartParams": {}, "template": head}},
        },
    }


def alive(read) -> bool:
    """The object exists and is not being deleted."""
    try:
        obj = read()
    except ApiException as e:
        if e.status == 404:
            return False
        raise
    md = obj["metadata"] if isinstance(obj, dict) else obj.metadata
    return (md.get("deletionTimestamp") if isinstance(md, dict) else md.deletion_timestamp) is None


def test_teardown_deletes_only_what_the_job_owns(crd, namespace, core):
    api = crd.api_client()
    custom, net = client.CustomObjectsApi(api), client.NetworkingV1Api(api)
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"] = {"name": "web", "namespace": namespace}
    job = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, doc)
    uid = job["metadata"]["uid"]
    mine = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "RLTuningJob", "name": "web", "uid": uid, "controller": True}
    # another workload's: a ConfigMap owns them (so the garbage collector leaves them be)
    other_cm = core.create_namespaced_config_map(namespace, {"metadata": {"name": "web-site"}})
    theirs = {"apiVersion": "v1", "kind": "ConfigMap", "name": "web-site", "uid": other_cm.metadata.uid}
    # the name rltune would give web's baseline objects, with the trial's labels, owned by the other
    # workload or by nobody; and what the job owns (the same labels, other names)
    core.create_namespaced_service(namespace, service("web-baseline", "baseline", theirs))
    core.create_namespaced_pod(namespace, pod("web-baseline-0", "baseline", None))
    net.create_namespaced_network_policy(namespace, policy("web-baseline", "baseline", theirs))
    core.create_namespaced_service(namespace, service("web-baseline-mine", "baseline", mine))
    core.create_namespaced_pod(namespace, pod("web-baseline-1", "baseline", mine))
    net.create_namespaced_network_policy(namespace, policy("web-baseline-mine", "baseline", mine))

    cluster = KubeCluster(api)
    ray = cluster.serves(trial_rayjobs.KIND)
    if ray:
        for name, owner in (("web-baseline", theirs), ("web-baseline-mine", mine)):
            custom.create_namespaced_custom_object(
                trial_rayjobs.GROUP,
                trial_rayjobs.VERSION,
                namespace,
                trial_rayjobs.PLURAL,
                rayjob(name, "baseline", owner),
            )

    cluster.delete_trial(namespace, "web", "baseline", uid)

    assert alive(lambda: core.read_namespaced_service("web-baseline", namespace))
    assert alive(lambda: core.read_namespaced_pod("web-baseline-0", namespace))
    assert alive(lambda: net.read_namespaced_network_policy("web-baseline", namespace))
    assert not alive(lambda: core.read_namespaced_service("web-baseline-mine", namespace))
    assert not alive(lambda: core.read_namespaced_pod("web-baseline-1", namespace))
    assert not alive(lambda: net.read_namespaced_network_policy("web-baseline-mine", namespace))
    if ray:

        def get(name):
            return lambda: custom.get_namespaced_custom_object(
                trial_rayjobs.GROUP, trial_rayjobs.VERSION, namespace, trial_rayjobs.PLURAL, name
            )

        assert alive(get("web-baseline"))
        assert not alive(get("web-baseline-mine"))
    # a missing UID, or another job's of the same name (deleted and made anew), deletes nothing
    core.create_namespaced_service(namespace, service("web-t1", "t1", mine))
    for wrong in ("", "00000000-0000-0000-0000-000000000000"):
        cluster.delete_trial(namespace, "web", "t1", wrong)
        assert alive(lambda: core.read_namespaced_service("web-t1", namespace))
    cluster.delete_trial(namespace, "web", "t1", uid)
    assert not alive(lambda: core.read_namespaced_service("web-t1", namespace))
    # leave no RayJob behind for the namespace's deletion (KubeRay's finalizer needs its operator)
    if ray:
        custom.delete_namespaced_custom_object(
            trial_rayjobs.GROUP, trial_rayjobs.VERSION, namespace, trial_rayjobs.PLURAL, "web-baseline"
        )
    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "web")


def test_the_old_teardown_would_have_deleted_the_foreign_service():
    """What this guards against, without a cluster: the names rltune gives a trial's objects are the
    names another workload may already use."""
    from rltune.controller import netpol, pods, podspec

    assert pods.service_name("web", "baseline") == "web-baseline" == trial_rayjobs.rayjob_name("web", "baseline")
    assert netpol.policy_name("web", "baseline") == "web-baseline"
    assert copy.deepcopy(labels("baseline")) == podspec.trial_selector("web", "baseline")
