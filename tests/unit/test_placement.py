"""controller/placement.py against node objects built from the recorded GPU Feature Discovery labels
(hack/gfd/labels.yaml through hack/testbed.py:node_manifest, the same objects the bed creates):
a trial pod for a GPU type fits a node carrying only the real labels of that type and no other
type's node; an unmatched selector gives a message naming the selector and what the nodes carry.
Also the framework check (no silent simulation)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bed import testbed
from rltune.api.hardware import CATALOG
from rltune.api.models import RLTuningJobSpec
from rltune.controller import pods as P
from rltune.controller.placement import check_pool, pod_requests, quantity, why_not
from rltune.settings import GpuPoolSettings, OperatorSettings

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "twin-demo.yaml"
FIXTURE = Path(testbed.GFD_FIXTURE)


def make_spec(**resources) -> RLTuningJobSpec:
    raw = yaml.safe_load(EXAMPLE.read_text())["spec"]
    raw["resources"].update(resources)
    return RLTuningJobSpec.model_validate(raw)


def trial_pod_spec(spec: RLTuningJobSpec, settings: OperatorSettings | None = None, gpus: int = 8) -> dict:
    pods, _ = P.trial_manifests(
        "ns",
        "job",
        None,
        spec,
        "t1",
        spec.baseline.with_knobs({"gpus": gpus}),
        4,
        1,
        None,
        settings=settings or OperatorSettings(),
    )
    return pods[0]["spec"]


def node(gpu_type: str | None, pool: str = "gpu", index: int = 0, gpus: int = 8) -> dict:
    return testbed.node_manifest(pool, index, gpu_type, gpus, "224", "4Ti")


def test_fixture_records_a_source_for_every_type_and_value():
    doc = yaml.safe_load(FIXTURE.read_text())
    assert {"B300", "B200", "H200", "H100", "H20"} <= set(doc["types"])
    for name, entry in doc["types"].items():
        assert entry["source"].startswith("https://"), name
        labels = set(entry["labels"])
        assert labels == {
            "nvidia.com/gpu.product",
            "nvidia.com/gpu.memory",
            "nvidia.com/gpu.family",
            "nvidia.com/gpu.compute.major",
            "nvidia.com/gpu.compute.minor",
            "nvidia.com/gpu.machine",
            "nvidia.com/gpu.present",
        }, name
        # every label is either recorded in the source or has a stated derivation
        assert labels <= set(entry.get("recorded") or []) | set(entry.get("derived") or {}), name
        # the product the bed's nodes carry is one rltune selects on
        assert entry["labels"]["nvidia.com/gpu.product"] in CATALOG[name].gfd_products


def test_bed_nodes_carry_exactly_the_recorded_labels():
    doc = yaml.safe_load(FIXTURE.read_text())
    n = node("B300", gpus=8)
    gpu_labels = {k: v for k, v in n["metadata"]["labels"].items() if k.startswith("nvidia.com/")}
    assert gpu_labels == doc["types"]["B300"]["labels"] | {"nvidia.com/gpu.count": "8"}
    assert gpu_labels["nvidia.com/gpu.product"] == "NVIDIA-B300-SXM6-AC"
    assert n["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert n["spec"]["taints"] == [doc["taint"]]
    assert not node(None, pool="system")["spec"]["taints"]


@pytest.mark.parametrize("gpu_type", ["B300", "B200", "H200", "H100", "H20"])
def test_pod_for_a_type_fits_only_nodes_of_that_type(gpu_type):
    spec = trial_pod_spec(make_spec(gpuType=gpu_type))
    assert check_pool([node(gpu_type)], spec) is None
    others = [node(t, pool=t.lower()) for t in ("B300", "B200", "H200", "H100", "H20") if t != gpu_type]
    assert check_pool(others + [node(None, pool="system")], spec) is not None
    assert check_pool(others + [node(gpu_type, pool="mine")], spec) is None


def test_b300_pod_on_h200_cluster_message_names_selector_and_labels_present():
    spec = trial_pod_spec(make_spec(gpuType="B300"))
    msg = check_pool([node("H200", index=i) for i in range(3)] + [node(None, pool="system")], spec)
    assert "nvidia.com/gpu.product in [NVIDIA-B300-SXM6-AC]" in msg
    assert "nvidia.com/gpu.product=NVIDIA-H200 (3 nodes)" in msg
    assert "spec.resources.nodeSelector" in msg and "gpuPool.nodeSelector" in msg


def test_unmatched_pool_selector_message_names_it_and_what_nodes_carry():
    s = OperatorSettings(gpu_pool=GpuPoolSettings(node_selector={"cloud.google.com/gke-nodepool": "b300-pool"}))
    spec = trial_pod_spec(make_spec(), s)
    nodes = [node("B300", index=i) for i in range(2)]
    for n in nodes:
        n["metadata"]["labels"]["cloud.google.com/gke-nodepool"] = "gpu-pool"
    msg = check_pool(nodes, spec)
    assert "nodeSelector {cloud.google.com/gke-nodepool: b300-pool}" in msg
    assert "cloud.google.com/gke-nodepool=gpu-pool (2 nodes)" in msg
    nodes[1]["metadata"]["labels"]["cloud.google.com/gke-nodepool"] = "b300-pool"
    assert check_pool(nodes, spec) is None


def test_pool_label_without_gfd_labels_needs_the_opt_out():
    bare = node(None, pool="gke")
    bare["status"]["allocatable"]["nvidia.com/gpu"] = "8"
    bare["metadata"]["labels"]["cloud.google.com/gke-accelerator"] = "nvidia-b300"
    sel = {"cloud.google.com/gke-accelerator": "nvidia-b300"}
    with_affinity = trial_pod_spec(make_spec(nodeSelector=sel))
    assert "gpuProductAffinity: false" in check_pool([bare], with_affinity)
    assert check_pool([bare], trial_pod_spec(make_spec(nodeSelector=sel, gpuProductAffinity=False))) is None


def test_untolerated_taint_and_too_few_gpus_are_explained():
    spec = trial_pod_spec(make_spec(), OperatorSettings(gpu_pool=GpuPoolSettings(tolerations=[])))
    msg = check_pool([node("B300")], spec)
    assert "taints the pod does not tolerate: nvidia.com/gpu=present:NoSchedule" in msg
    spec = trial_pod_spec(make_spec(gpusPerNode=8), gpus=8)
    msg = check_pool([node("B300", gpus=4)], spec)
    assert "too little allocatable nvidia.com/gpu (most: 4, the pod requests 8)" in msg


def test_transient_node_state_does_not_make_a_pool_wrong():
    n = node("B300")
    n["spec"]["taints"].append({"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"})
    n["spec"]["unschedulable"] = True
    assert check_pool([n], trial_pod_spec(make_spec())) is None


def test_affinity_operators_and_requests():
    n = node("H100")

    def fits(*exprs):
        return (
            why_not(
                n,
                {
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [{"matchExpressions": list(exprs)}]
                            }
                        }
                    },
                    "tolerations": [{"operator": "Exists"}],
                },
            )
            is None
        )

    assert fits({"key": "nvidia.com/gpu.compute.major", "operator": "Gt", "values": ["8"]})
    assert not fits({"key": "nvidia.com/gpu.compute.major", "operator": "Lt", "values": ["9"]})
    assert fits({"key": "nvidia.com/gpu.family", "operator": "NotIn", "values": ["blackwell"]})
    assert fits({"key": "nvidia.com/gpu.present", "operator": "Exists"})
    assert not fits({"key": "nvidia.com/mig.capable", "operator": "Exists"})
    assert pod_requests(
        {
            "containers": [
                {"resources": {"limits": {"nvidia.com/gpu": "2"}, "requests": {"cpu": "500m"}}},
                {"resources": {"requests": {"cpu": "1"}}},
            ],
            "initContainers": [{"resources": {"requests": {"cpu": "4"}}}],
        }
    ) == {"nvidia.com/gpu": 2.0, "cpu": 4.0}
    assert quantity("8Gi") == 8 * 2**30 and quantity("250m") == 0.25 and quantity("1e3") == 1000


def test_empty_cluster():
    assert "no nodes" in check_pool([], trial_pod_spec(make_spec()))


def test_gpus_per_node_must_be_a_node_size_the_pool_has():
    from rltune.controller.placement import check_gpus_per_node

    nodes = [node("B300", index=i, gpus=8) for i in range(2)] + [node("H200", pool="h", gpus=4)]
    spec = make_spec(gpusPerNode=4)
    pod = trial_pod_spec(spec, gpus=4)
    msg = check_gpus_per_node(nodes, pod, 4)
    # the 4-GPU H200 node does not count: B300 pods cannot land there
    assert msg and "spec.resources.gpusPerNode" in msg and "2 node(s) with 8" in msg and "gpusPerNode: 8" in msg
    assert check_gpus_per_node(nodes, trial_pod_spec(make_spec(), gpus=8), 8) is None
    # a pod without GPUs (the reference workload on CPUs) is not held to a node size
    assert check_gpus_per_node(nodes, {"containers": [{"name": "trial"}]}, 4) is None
