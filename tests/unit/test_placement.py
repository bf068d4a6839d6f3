"""controller/placement.py against node objects built from the recorded GPU Feature Discovery labels
(hack/gfd/labels.yaml through hack/bed/pools.py:node_manifest, the same objects the bed creates):
a trial pod for a GPU type fits a node carrying only the real labels of that type and no other
type's node; an unmatched selector gives a message naming what the job asked for and how many nodes
pass each check, never a label value, taint or size of a node (the job's condition is read by tenants,
the cluster's layout is not theirs). Also the framework check (no silent simulation)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hack.bed import pools
from rltune.api.hardware import CATALOG
from rltune.api.models import RLTuningJobSpec
from rltune.controller import pods as pod_manifests
from rltune.controller.placement import check_pool, pod_requests, quantity, why_not
from rltune.settings import GpuPoolSettings, OperatorSettings

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "twin-demo.yaml"
FIXTURE = Path(pools.GFD_FIXTURE)


def make_spec(**resources) -> RLTuningJobSpec:
    raw = yaml.safe_load(EXAMPLE.read_text())["spec"]
    raw["resources"].update(resources)
    return RLTuningJobSpec.model_validate(raw)


def trial_pod_spec(spec: RLTuningJobSpec, settings: OperatorSettings | None = None, gpus: int = 8) -> dict:
    pods, _ = pod_manifests.trial_manifests(
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
    return pools.node_manifest(pool, index, gpu_type, gpus, "224", "4Ti")


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


def test_b300_pod_on_h200_cluster_message_names_what_the_job_asked_and_counts():
    spec = trial_pod_spec(make_spec(gpuType="B300"))
    msg = check_pool([node("H200", index=i) for i in range(3)] + [node(None, pool="system")], spec)
    assert "nvidia.com/gpu.product in [NVIDIA-B300-SXM6-AC]" in msg  # the job's GPU type
    assert "of the cluster's 4 nodes, 3 have allocatable nvidia.com/gpu; 0 match the required node affinity" in msg
    assert "H200" not in msg  # what the nodes are is not the job's to read
    assert "spec.resources.nodeSelector" in msg and "gpuPool.nodeSelector" in msg


def test_unmatched_pool_selector_message_names_it_and_counts():
    s = OperatorSettings(gpu_pool=GpuPoolSettings(node_selector={"cloud.google.com/gke-nodepool": "b300-pool"}))
    spec = trial_pod_spec(make_spec(), s)
    nodes = [node("B300", index=i) for i in range(2)]
    for n in nodes:
        n["metadata"]["labels"]["cloud.google.com/gke-nodepool"] = "gpu-pool"
    msg = check_pool(nodes, spec)
    assert "nodeSelector {cloud.google.com/gke-nodepool: b300-pool}" in msg
    assert "of the cluster's 2 nodes, 2 have allocatable nvidia.com/gpu; 0 match nodeSelector {" in msg
    assert "gpu-pool" not in msg
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
    assert "0 of those carry no NoSchedule/NoExecute taint the pod does not tolerate (its tolerations: none)" in msg
    assert "present" not in msg  # the node's taint
    tolerating = OperatorSettings(gpu_pool=GpuPoolSettings(tolerations=[{"key": "x", "operator": "Exists"}]))
    msg = check_pool([node("B300")], trial_pod_spec(make_spec(), tolerating))
    assert "(its tolerations: x)" in msg
    spec = trial_pod_spec(make_spec(gpusPerNode=8), gpus=8)
    msg = check_pool([node("B300", gpus=5), node("B300", index=1, gpus=7)], spec)
    assert "2 of those have less allocatable nvidia.com/gpu than the pod requests (8)" in msg
    assert "most" not in msg and "5" not in msg and "7" not in msg  # no node's size


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
    assert msg and "spec.resources.gpusPerNode: 4 GPUs per node" in msg
    assert "none of the 2 nodes trial pods can use has 4 allocatable nvidia.com/gpu (2 with more, 0 with fewer)" in msg
    assert "8" not in msg  # the nodes' size is not the job's to read
    assert check_gpus_per_node(nodes, trial_pod_spec(make_spec(), gpus=8), 8) is None
    # a pod without GPUs (the reference workload on CPUs) is not held to a node size
    assert check_gpus_per_node(nodes, {"containers": [{"name": "trial"}]}, 4) is None


def _layout_strings(nodes: list[dict]) -> set[str]:
    """What a cluster's layout is made of: node names, label keys=values and values, taints."""
    out: set[str] = set()
    for n in nodes:
        md = n["metadata"]
        out.add(md["name"])
        for k, v in (md.get("labels") or {}).items():
            out |= {f"{k}={v}", f"{k}: {v}", str(v)}
        for t in (n.get("spec") or {}).get("taints") or []:
            out |= {t["key"], f"{t['key']}={t.get('value', '')}", str(t.get("value") or "")}
        out |= {f"{k}: {v}" for k, v in (n["status"].get("allocatable") or {}).items()}
    return {x for x in out if len(x) >= 3 and not x.isdigit()}


def test_node_label_values_the_job_did_not_ask_for_never_appear():
    """Nodes with labels and taints of their own (another team's pool, a dedicated taint): whatever the
    job got wrong, its messages name only what it asked for, and counts."""
    nodes = [node("H200", pool="team-secret", index=i, gpus=4) for i in range(3)] + [node(None, pool="system")]
    for i, n in enumerate(nodes):
        n["metadata"]["labels"] |= {"example.com/owner": f"team-owl-{i}", "topology.kubernetes.io/zone": "zone-yak"}
        n["spec"].setdefault("taints", []).append(
            {"key": "example.com/dedicated", "value": "lynx", "effect": "NoSchedule"}
        )
    hidden = _layout_strings(nodes)
    assert {"team-owl-0", "zone-yak", "lynx", "example.com/dedicated", "NVIDIA-H200"} <= hidden
    jobs = {
        "gpu type": make_spec(gpuType="B300"),
        "selector": make_spec(gpuType="H200", nodeSelector={"example.com/owner": "team-mine"}),
        "taint": make_spec(gpuType="H200"),
        "size": make_spec(gpuType="H200", gpusPerNode=8),
        "no affinity": make_spec(gpuType="H200", gpuProductAffinity=False, nodeSelector={"example.com/pool": "x"}),
    }
    from rltune.controller.placement import check_gpus_per_node

    for what, spec in jobs.items():
        pod = trial_pod_spec(spec, gpus=8)
        asked = repr(pod)  # the job's own nodeSelector, affinity and tolerations may be named
        msgs = [check_pool(nodes, pod), check_gpus_per_node(nodes, pod, spec.resources.gpus_per_node)]
        assert msgs[0], what
        for msg in filter(None, msgs):
            leaked = sorted(x for x in hidden if x in msg and x not in asked)
            assert not leaked, (what, leaked, msg)
    # a job that tolerates the taint but asks for 8 GPUs a node on the 4-GPU pool: counts only
    tol = [{"key": "example.com/dedicated", "operator": "Exists"}, {"key": "nvidia.com/gpu", "operator": "Exists"}]
    pod = trial_pod_spec(make_spec(gpuType="H200", gpusPerNode=4, tolerations=tol), gpus=4)
    msg = check_gpus_per_node(nodes, pod, 8)
    assert (
        msg
        and "none of the 3 nodes trial pods can use has 8 allocatable nvidia.com/gpu (0 with more, 3 with fewer)" in msg
    )
    assert not [x for x in hidden if x in msg and x not in repr(pod)], msg
