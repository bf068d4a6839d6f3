"""Trial pod manifests (controller/pods.py) with plain dicts: GPU-type selection over every known
GFD product string, pool selector and tolerations from the job and the operator settings, CPU and
memory requests (Guaranteed QoS when asked), the restricted security context, and a podTemplate
merged the way Kubernetes' strategic merge patch merges a PodSpec.

That such pods really schedule onto nodes carrying only the recorded GFD labels is checked on the
bed in tests/integration; test_placement.py checks it against the same node objects without one."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import rltune.settings as settings_mod
from rltune.api.hardware import CATALOG
from rltune.api.models import RLTuningJobSpec
from rltune.controller import pods as pod_manifests
from rltune.controller import podspec
from rltune.controller.podsecurity import check_pod_template
from rltune.settings import GpuPoolSettings, OperatorSettings, PodSecurityBounds, TrialDefaults

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "twin-demo.yaml"
AFFINITY_PATH = ("affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms")


def make_spec(**resources) -> RLTuningJobSpec:
    raw = yaml.safe_load(EXAMPLE.read_text())["spec"]
    raw["resources"].update(resources)
    return RLTuningJobSpec.model_validate(raw)


def build(spec: RLTuningJobSpec, settings: OperatorSettings | None = None, gpus: int = 8) -> list[dict]:
    cfg = spec.baseline.with_knobs({"gpus": gpus})
    pods, _ = pod_manifests.trial_manifests(
        "ns", "job", {"uid": "u"}, spec, "t1", cfg, 4, 1, "http://pgw", settings=settings or OperatorSettings()
    )
    return pods


def product_values(pod_spec: dict) -> list[str]:
    node = pod_spec
    for k in AFFINITY_PATH:
        node = node[k]
    (term,) = node
    (expr,) = term["matchExpressions"]
    assert expr["key"] == "nvidia.com/gpu.product" and expr["operator"] == "In"
    return expr["values"]


def trial_container(pod: dict) -> dict:
    (c,) = [c for c in pod["spec"]["containers"] if c["name"] == "trial"]
    return c


# --------------------------------------------------------------------------- GPU type selection


@pytest.mark.parametrize("gpu_type", ["B300", "H200", "H100", "B200", "H20", "GB200"])
def test_affinity_lists_every_known_product_string(gpu_type):
    (pod,) = build(make_spec(gpuType=gpu_type, gpusPerNode=4 if gpu_type == "GB200" else 8), gpus=4)
    assert product_values(pod["spec"]) == list(CATALOG[gpu_type].gfd_products)
    # never one guessed string through nodeSelector
    assert "nvidia.com/gpu.product" not in (pod["spec"].get("nodeSelector") or {})


def test_known_product_strings_are_the_recorded_ones():
    assert "NVIDIA-B300-SXM6-AC" in CATALOG["B300"].gfd_products
    assert "NVIDIA-B300" not in CATALOG["B300"].gfd_products  # rltune's old guess: no real node carries it
    assert {"NVIDIA-H200", "NVIDIA-H200-SXM5-141GB", "NVIDIA-H200-NVL"} <= set(CATALOG["H200"].gfd_products)
    assert CATALOG["H100"].gfd_product == "NVIDIA-H100-80GB-HBM3"


def test_pool_selector_from_job_else_settings_keeps_product_affinity():
    chart = OperatorSettings(gpu_pool=GpuPoolSettings(node_selector={"cloud.google.com/gke-nodepool": "chart-pool"}))
    (pod,) = build(make_spec(), chart)
    assert pod["spec"]["nodeSelector"] == {"cloud.google.com/gke-nodepool": "chart-pool"}
    assert product_values(pod["spec"]) == ["NVIDIA-B300-SXM6-AC"]
    (pod,) = build(make_spec(nodeSelector={"cloud.google.com/gke-nodepool": "job-pool"}), chart)
    assert pod["spec"]["nodeSelector"] == {"cloud.google.com/gke-nodepool": "job-pool"}  # the job's wins
    (pod,) = build(make_spec(nodeSelector={"pool": "gpu"}, gpuProductAffinity=False), chart)
    assert pod["spec"]["nodeSelector"] == {"pool": "gpu"} and "affinity" not in pod["spec"]


def test_tolerations_are_settings_plus_job_deduplicated():
    gpu = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    extra = {"key": "dedicated", "operator": "Equal", "value": "rl", "effect": "NoSchedule"}
    chart = OperatorSettings(gpu_pool=GpuPoolSettings(tolerations=[gpu, extra]))
    (pod,) = build(make_spec(tolerations=[dict(gpu), {"key": "team", "operator": "Exists"}]), chart)
    assert pod["spec"]["tolerations"] == [gpu, extra, {"key": "team", "operator": "Exists"}]


def test_reference_workload_requests_no_gpu_and_selects_no_gpu_type():
    spec = make_spec(gpuType="CPU")
    (pod,) = build(spec, gpus=1)
    res = trial_container(pod)["resources"]
    assert "nvidia.com/gpu" not in res["requests"] and "affinity" not in pod["spec"]


# --------------------------------------------------------------------------- resources


def test_guaranteed_qos_requests_equal_limits():
    s = OperatorSettings(trial_defaults=TrialDefaults(cpu="6", memory="48Gi", guaranteed=True))
    for pod in build(make_spec(), s, gpus=16):
        res = trial_container(pod)["resources"]
        assert res["requests"] == res["limits"] == {"cpu": "6", "memory": "48Gi", "nvidia.com/gpu": "8"}


def test_burstable_by_default_gpu_limits_still_equal_requests():
    (pod,) = build(make_spec(), OperatorSettings(), gpus=4)
    res = trial_container(pod)["resources"]
    assert res["requests"] == {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": "4"}
    assert res["limits"] == {"nvidia.com/gpu": "4"}


def test_default_settings_used_when_none_passed(monkeypatch):
    custom = OperatorSettings(
        trial_defaults=TrialDefaults(cpu="3", memory="5Gi"),
        gpu_pool=GpuPoolSettings(node_selector={"pool": "from-current"}),
    )
    monkeypatch.setattr(settings_mod, "_current", custom)
    spec = make_spec()
    pods, _ = pod_manifests.trial_manifests(
        "ns", "job", None, spec, "t1", spec.baseline.with_knobs({"gpus": 8}), 4, 1, None
    )
    assert trial_container(pods[0])["resources"]["requests"]["cpu"] == "3"
    assert pods[0]["spec"]["nodeSelector"] == {"pool": "from-current"}


# --------------------------------------------------------------------------- security context


def test_restricted_security_context_on_pod_and_container():
    for pod in build(make_spec(), gpus=16):
        psc = pod["spec"]["securityContext"]
        assert psc["runAsNonRoot"] is True and psc["runAsUser"] == 10001
        assert psc["seccompProfile"] == {"type": "RuntimeDefault"}
        for c in pod["spec"]["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
            assert sc["runAsNonRoot"] is True and sc["seccompProfile"] == {"type": "RuntimeDefault"}
        # the pod the operator builds passes its own restricted check with every relaxation off
        assert check_pod_template(pod["spec"], PodSecurityBounds(), prefix="spec") == []


def test_trial_uid_matches_the_trial_image():
    dockerfile = (Path(__file__).resolve().parents[2] / "images" / "trial" / "Dockerfile").read_text()
    assert f"USER {podspec.TRIAL_UID}" in dockerfile and f"--uid {podspec.TRIAL_UID}" in dockerfile


# --------------------------------------------------------------------------- podTemplate merge


def test_volume_mount_on_trial_merges_into_the_one_trial_container():
    tmpl = {
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "datasets"}}],
        "containers": [{"name": "trial", "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
    }
    (pod,) = build(make_spec(podTemplate=tmpl))
    assert [c["name"] for c in pod["spec"]["containers"]] == ["trial"]
    c = trial_container(pod)
    assert c["volumeMounts"] == [{"name": "data", "mountPath": "/data"}]
    env = {e["name"] for e in c["env"]}
    assert {"RLTUNE_TRIAL_SPEC", "RLTUNE_RANK", "MASTER_ADDR"} <= env  # default env kept
    assert c["image"] and c["command"] and c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["spec"]["volumes"] == tmpl["volumes"]


def test_env_merges_by_name_template_value_wins():
    tmpl = {
        "containers": [
            {
                "name": "trial",
                "env": [{"name": "MASTER_PORT", "value": "12345"}, {"name": "HF_HOME", "value": "/cache"}],
            }
        ]
    }
    (pod,) = build(make_spec(podTemplate=tmpl))
    env = trial_container(pod)["env"]
    assert [e["value"] for e in env if e["name"] == "MASTER_PORT"] == ["12345"]  # overridden, not duplicated
    assert env[-1] == {"name": "HF_HOME", "value": "/cache"}
    assert len(env) == len({e["name"] for e in env})


def test_sidecar_is_added_and_lists_without_merge_key_are_replaced():
    tmpl = {
        "containers": [
            {"name": "sidecar", "image": "busybox"},
            {"name": "trial", "args": ["--x"], "ports": [{"containerPort": 9400, "name": "metrics"}]},
        ],
        "tolerations": [{"operator": "Exists"}],
        "priorityClassName": "rl-low",
    }
    (pod,) = build(make_spec(podTemplate=tmpl))
    assert [c["name"] for c in pod["spec"]["containers"]] == ["trial", "sidecar"]
    c = trial_container(pod)
    assert c["args"] == ["--x"] and c["ports"] == [{"containerPort": 9400, "name": "metrics"}]
    assert pod["spec"]["tolerations"] == [{"operator": "Exists"}]  # no patchMergeKey in core/v1: replaced
    assert pod["spec"]["priorityClassName"] == "rl-low"


def test_merge_keys_retain_keys_and_null():
    base = {
        "containers": [
            {
                "name": "trial",
                "ports": [{"containerPort": 80, "protocol": "TCP"}],
                "volumeMounts": [{"name": "a", "mountPath": "/a", "readOnly": True}],
                "resources": {"requests": {"cpu": "2"}},
            }
        ],
        "volumes": [{"name": "a", "emptyDir": {}}, {"name": "gone", "emptyDir": {}}],
        "nodeSelector": {"x": "1", "y": "2"},
    }
    patch = {
        "containers": [
            {
                "name": "trial",
                "ports": [{"containerPort": 80, "name": "http"}],
                "volumeMounts": [{"mountPath": "/a", "name": "a", "readOnly": False}],
                "resources": {"requests": {"memory": "1Gi"}},
            }
        ],
        "volumes": [{"name": "a", "persistentVolumeClaim": {"claimName": "c"}}],
        "nodeSelector": {"y": None},
    }
    out = podspec.merge_pod_spec(base, patch)
    c = out["containers"][0]
    assert c["ports"] == [{"containerPort": 80, "protocol": "TCP", "name": "http"}]
    assert c["volumeMounts"] == [{"name": "a", "mountPath": "/a", "readOnly": False}]
    assert c["resources"] == {"requests": {"cpu": "2", "memory": "1Gi"}}
    # retainKeys: `a` keeps only what the patch gives it; `gone` is untouched
    assert out["volumes"] == [
        {"name": "a", "persistentVolumeClaim": {"claimName": "c"}},
        {"name": "gone", "emptyDir": {}},
    ]
    assert out["nodeSelector"] == {"x": "1"}
    assert base["volumes"][0] == {"name": "a", "emptyDir": {}}  # inputs untouched


def test_template_container_without_merge_key_names_the_field():
    with pytest.raises(
        podspec.PodTemplateError, match=r"spec\.resources\.podTemplate\.containers\[0\]\.name: required"
    ):
        build(make_spec(podTemplate={"containers": [{"image": "x"}]}))
    with pytest.raises(podspec.PodTemplateError, match=r"containers\[0\]\.volumeMounts\[0\]\.mountPath"):
        build(make_spec(podTemplate={"containers": [{"name": "trial", "volumeMounts": [{"name": "v"}]}]}))


def test_a_delete_directive_is_refused_not_honoured():
    """`{name: trial, $patch: delete}` used to remove the operator's restricted trial container."""
    with pytest.raises(podspec.PodTemplateError, match=r"spec\.resources\.podTemplate\.containers\[0\]\.\$patch: "):
        build(make_spec(podTemplate={"containers": [{"name": "trial", "$patch": "delete"}]}))
    with pytest.raises(podspec.PodTemplateError, match=r"podTemplate\.volumes\[0\]\.\$patch"):
        podspec.merge_pod_spec(
            {"volumes": [{"name": "v", "emptyDir": {}}]}, {"volumes": [{"name": "v", "$patch": "delete"}]}
        )


def test_every_container_of_the_merged_pod_is_restricted():
    tmpl = {
        "containers": [
            {"name": "sidecar", "image": "busybox"},
            {"name": "exporter", "image": "e", "securityContext": {"runAsUser": 2000, "capabilities": {"add": ["X"]}}},
        ],
        "initContainers": [{"name": "prep", "image": "busybox", "securityContext": None}],
    }
    (pod,) = build(make_spec(podTemplate=tmpl))
    by_name = {c["name"]: c for c in pod["spec"]["containers"] + pod["spec"]["initContainers"]}
    assert set(by_name) == {"trial", "sidecar", "exporter", "prep"}
    for c in by_name.values():
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["runAsNonRoot"] is True, c["name"]
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"} and "ALL" in sc["capabilities"]["drop"], c["name"]
    # what a container sets stays (podsecurity.py decides whether it may)
    assert by_name["exporter"]["securityContext"]["runAsUser"] == 2000
    assert by_name["exporter"]["securityContext"]["capabilities"] == {"add": ["X"], "drop": ["ALL"]}
