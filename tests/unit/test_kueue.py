"""Admission through Kueue (controller/kueue.py) with plain dicts: a trial's pods as one Kueue pod
group, a RayJob trial in the queue, and how the operator reads gated and evicted trials. On the
bed with Kueue itself: tests/e2e/test_kueue.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from rltune.api.models import RLTuningJobSpec
from rltune.controller import kueue, rayjob
from rltune.controller import pods as pod_manifests
from rltune.settings import KueueSettings, OperatorSettings, load

ROOT = Path(__file__).resolve().parents[2]


def twin(**resources) -> RLTuningJobSpec:
    raw = yaml.safe_load((ROOT / "examples" / "twin-demo.yaml").read_text())["spec"]
    raw["resources"].update(resources)
    return RLTuningJobSpec.model_validate(raw)


def pods_of(spec: RLTuningJobSpec, settings: OperatorSettings, gpus: int = 16) -> list[dict]:
    cfg = spec.baseline.with_knobs({"gpus": gpus})
    pods, _ = pod_manifests.trial_manifests("ns", "job", None, spec, "t1", cfg, 4, 1, "http://pgw", settings=settings)
    return pods


def test_without_a_queue_pods_are_unchanged():
    pods = pods_of(twin(), OperatorSettings())
    assert all(not any(k.startswith("kueue.x-k8s.io/") for k in p["metadata"]["labels"]) for p in pods)
    assert all(kueue.POD_GROUP_TOTAL not in p["metadata"]["annotations"] for p in pods)


def test_a_trial_is_one_pod_group_in_the_jobs_queue():
    spec = twin(queueName="gpu-queue", priorityClassName="tuning")
    pods = pods_of(spec, OperatorSettings(), gpus=16)
    assert len(pods) == 2
    for p in pods:
        labels, notes = p["metadata"]["labels"], p["metadata"]["annotations"]
        assert labels[kueue.QUEUE_LABEL] == "gpu-queue" and labels[kueue.PRIORITY_LABEL] == "tuning"
        assert labels[kueue.POD_GROUP_LABEL] == pod_manifests.service_name("job", "t1") == "job-t1"
        assert notes[kueue.POD_GROUP_TOTAL] == "2" and notes[kueue.RETRIABLE_IN_GROUP] == "false"
        assert "schedulingGates" not in p["spec"]  # Kueue's webhook adds its gate


def test_the_charts_default_queue_applies_to_jobs_without_one():
    settings = OperatorSettings(kueue=KueueSettings(defaultQueue="team-a"))
    (pod,) = pods_of(twin(), settings, gpus=8)
    assert pod["metadata"]["labels"][kueue.QUEUE_LABEL] == "team-a"
    assert pod["metadata"]["annotations"][kueue.POD_GROUP_TOTAL] == "1"
    (pod,) = pods_of(twin(queueName="mine"), settings, gpus=8)
    assert pod["metadata"]["labels"][kueue.QUEUE_LABEL] == "mine"
    assert OperatorSettings.model_validate({"kueue": {"defaultQueue": ""}}).kueue.default_queue is None


def test_settings_env_override(tmp_path):
    f = tmp_path / "config.yaml"
    f.write_text("kueue: {defaultQueue: from-file}\n")
    assert load(str(f), {}).kueue.default_queue == "from-file"
    assert load(str(f), {"RLTUNE_KUEUE_DEFAULT_QUEUE": "from-env"}).kueue.default_queue == "from-env"


@pytest.mark.parametrize("name", ["Upper", "-dash", "a" * 64, "under_score"])
def test_queue_names_are_checked(name):
    with pytest.raises(ValidationError):
        twin(queueName=name)


def test_a_rayjob_trial_is_queued_as_a_whole():
    raw = yaml.safe_load((ROOT / "examples" / "verl-dapo-b300.yaml").read_text())["spec"]
    raw["resources"]["queueName"] = "gpu-queue"
    from rltune.adapters.registry import resolve

    spec = resolve(RLTuningJobSpec.model_validate(raw))
    m = rayjob.rayjob_manifest("ns", "j", None, spec, "t3", spec.baseline, 5, "http://pgw:9091", OperatorSettings())
    assert m["metadata"]["labels"][kueue.QUEUE_LABEL] == "gpu-queue"
    assert kueue.PRIORITY_LABEL not in m["metadata"]["labels"]
    # Kueue admits the RayJob; the Ray pods KubeRay creates carry no queue label of their own
    for p in rayjob.pods_of(m):
        assert kueue.QUEUE_LABEL not in p["metadata"]["labels"]


def pod(name: str, gated: bool = False, condition: dict | None = None) -> dict:
    p = {"metadata": {"name": name, "labels": {kueue.QUEUE_LABEL: "q"}}, "spec": {}, "status": {}}
    if gated:
        p["spec"]["schedulingGates"] = [{"name": kueue.ADMISSION_GATE}]
    if condition:
        p["status"]["conditions"] = [condition]
    return p


def test_gated_and_evicted_pods():
    assert kueue.gated([pod("a"), pod("b", gated=True)]) == "q"
    assert kueue.gated([pod("a")]) == ""
    stop = {
        "type": "TerminationTarget",
        "status": "True",
        "reason": "WorkloadEvicted",
        "message": "Preempted to accommodate a workload (UID: 1) due to prioritization in the ClusterQueue",
    }
    why = kueue.evicted([pod("a"), pod("b", condition=stop)])
    assert why.startswith("Kueue stopped pod b: WorkloadEvicted: Preempted to accommodate")
    assert kueue.evicted([pod("a")]) == ""
    rj = {"metadata": {"name": "j-t1", "labels": {kueue.QUEUE_LABEL: "q"}}, "spec": {"suspend": True}}
    assert kueue.gated([], rj) == "q"
    assert kueue.evicted([], rj, running=False) == ""  # not admitted yet: waiting, not evicted
    assert "suspended RayJob j-t1" in kueue.evicted([], rj, running=True)


class NoKueueCluster:
    """Just enough cluster for one reconcile of a job that names a queue where Kueue is missing."""

    def __init__(self, body: dict):
        self.body, self.written, self.created = body, [], []

    def get_job(self, namespace, name):
        return self.body

    def write_status(self, job, status):
        self.written.append(status)
        self.body = dict(self.body, status=status)
        return self.body

    def serves(self, kind):
        return False

    def create(self, manifest):
        self.created.append(manifest)
        return True

    def list_trial_pods(self, namespace, job):
        return []

    def refusal(self, manifest):
        return None

    def list_nodes(self):
        from rltune.api.hardware import gpu

        labels = {"nvidia.com/gpu.product": gpu("B300").gfd_products[0]}
        alloc = {"nvidia.com/gpu": "8", "cpu": "224", "memory": "4Ti"}
        taints = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
        return [
            {
                "metadata": {"name": f"n{i}", "labels": labels},
                "spec": {"taints": taints},
                "status": {"allocatable": alloc},
            }
            for i in range(2)
        ]


def test_a_queue_without_kueue_waits_with_a_condition():
    from rltune.controller.reconcile import Reconciler

    doc = yaml.safe_load((ROOT / "examples" / "twin-demo.yaml").read_text())
    doc["spec"]["resources"]["queueName"] = "gpu-queue"
    doc["metadata"].update({"namespace": "ns", "uid": "u", "generation": 1})
    cluster = NoKueueCluster(doc)
    r = Reconciler(cluster, settings=OperatorSettings())
    assert r.reconcile("ns", "twin-demo") == "Pending"
    st = cluster.written[-1]
    cond = next(c for c in st["conditions"] if c["type"] == "QueueAvailable")
    assert cond["status"] == "False" and cond["reason"] == "KueueMissing" and "'gpu-queue'" in cond["message"]
    assert not st.get("trials") and not cluster.created  # nothing runs around the queue
    # the same job without a queue runs as before (no Kueue needed)
    del doc["spec"]["resources"]["queueName"]
    doc.pop("status", None)
    cluster = NoKueueCluster(doc)
    Reconciler(cluster, settings=OperatorSettings(), metrics=None).reconcile("ns", "twin-demo")
    st = cluster.written[-1]
    assert not any(c["type"] == "QueueAvailable" for c in st["conditions"])
    assert [t["id"] for t in st["trials"]] == ["baseline"]
