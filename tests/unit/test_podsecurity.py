"""controller/podsecurity.py: a job's podTemplate may relax the restricted profile only as far as the
cluster admin's podSecurity settings allow; each refusal names the field and the chart value. The
check covers the pods as they are created (the template merged into the operator's trial pod, Ray
head and worker pods), the job's own tolerations and priority class, and the operator's preflight
refuses what it finds before any pod exists."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from rltune.adapters import registry
from rltune.api.models import RLTuningJobSpec
from rltune.controller import pods as PODS
from rltune.controller import podspec, rayjob
from rltune.controller.podsecurity import (
    Violation,
    check_job,
    check_pod_spec,
    check_pod_template,
    trial_pod_specs,
)
from rltune.controller.reconcile import InvalidSpec, preflight
from rltune.settings import GPU_TOLERATION, OperatorSettings, PodSecurityBounds

P = "spec.resources.podTemplate"
C = f"{P}.containers[0]"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def ctr(**security) -> dict:
    return {"containers": [{"name": "trial", "securityContext": security}]}


# (template, field of the one violation, chart value the message names, bounds that allow it)
CASES = [
    # beyond the Pod Security Standards: Secrets and ServiceAccounts the job author may not have
    (
        {"volumes": [{"name": "s", "secret": {"secretName": "db"}}]},
        f"{P}.volumes[0].secret",
        "podSecurity.allowSecrets",
        {"allow_secrets": True},
    ),
    (
        {"volumes": [{"name": "p", "projected": {"sources": [{"secret": {"name": "db"}}]}}]},
        f"{P}.volumes[0].projected.sources[0].secret",
        "podSecurity.allowSecrets",
        {"allow_secrets": True},
    ),
    (
        {
            "containers": [
                {"name": "trial", "env": [{"name": "K", "valueFrom": {"secretKeyRef": {"name": "db", "key": "k"}}}]}
            ]
        },
        f"{C}.env[0].valueFrom.secretKeyRef",
        "podSecurity.allowSecrets",
        {"allow_secrets": True},
    ),
    (
        {"containers": [{"name": "trial", "envFrom": [{"secretRef": {"name": "db"}}]}]},
        f"{C}.envFrom[0].secretRef",
        "podSecurity.allowSecrets",
        {"allow_secrets": True},
    ),
    (
        {"serviceAccountName": "admin"},
        f"{P}.serviceAccountName",
        "podSecurity.allowServiceAccount",
        {"allow_service_account": True},
    ),
    (
        {"automountServiceAccountToken": True},
        f"{P}.automountServiceAccountToken",
        "podSecurity.allowServiceAccount",
        {"allow_service_account": True},
    ),
    (
        ctr(privileged=True),
        f"{C}.securityContext.privileged",
        "podSecurity.allowPrivileged",
        {"allow_privileged": True},
    ),
    (
        ctr(allowPrivilegeEscalation=True),
        f"{C}.securityContext.allowPrivilegeEscalation",
        "podSecurity.allowPrivilegeEscalation",
        {"allow_privilege_escalation": True},
    ),
    ({"hostNetwork": True}, f"{P}.hostNetwork", "podSecurity.allowHostNamespaces", {"allow_host_namespaces": True}),
    ({"hostPID": True}, f"{P}.hostPID", "podSecurity.allowHostNamespaces", {"allow_host_namespaces": True}),
    ({"hostIPC": True}, f"{P}.hostIPC", "podSecurity.allowHostNamespaces", {"allow_host_namespaces": True}),
    (
        {"volumes": [{"name": "ok", "emptyDir": {}}, {"name": "host", "hostPath": {"path": "/"}}]},
        f"{P}.volumes[1].hostPath",
        "podSecurity.allowHostPath",
        {"allow_host_path": True},
    ),
    (
        {"containers": [{"name": "trial", "ports": [{"containerPort": 80, "hostPort": 80}]}]},
        f"{C}.ports[0].hostPort",
        "podSecurity.allowHostNamespaces",
        {"allow_host_namespaces": True},
    ),
    (ctr(runAsUser=0), f"{C}.securityContext.runAsUser", "podSecurity.allowRunAsRoot", {"allow_run_as_root": True}),
    (
        {"securityContext": {"runAsNonRoot": False}},
        f"{P}.securityContext.runAsNonRoot",
        "podSecurity.allowRunAsRoot",
        {"allow_run_as_root": True},
    ),
    (
        ctr(capabilities={"add": ["SYS_ADMIN"], "drop": ["ALL"]}),
        f"{C}.securityContext.capabilities.add[0]",
        "podSecurity.allowedCapabilities",
        {"allowed_capabilities": ["SYS_ADMIN"]},
    ),
    (
        ctr(seccompProfile={"type": "Unconfined"}),
        f"{C}.securityContext.seccompProfile.type",
        "podSecurity.allowPrivileged",
        {"allow_privileged": True},
    ),
    (
        {"securityContext": {"seccompProfile": {"type": "Unconfined"}}},
        f"{P}.securityContext.seccompProfile.type",
        "podSecurity.allowPrivileged",
        {"allow_privileged": True},
    ),
    (
        ctr(procMount="Unmasked"),
        f"{C}.securityContext.procMount",
        "podSecurity.allowPrivileged",
        {"allow_privileged": True},
    ),
    (
        ctr(appArmorProfile={"type": "Unconfined"}),
        f"{C}.securityContext.appArmorProfile.type",
        "podSecurity.allowPrivileged",
        {"allow_privileged": True},
    ),
    (
        {
            "securityContext": {
                "sysctls": [
                    {"name": "net.ipv4.tcp_syncookies", "value": "1"},
                    {"name": "kernel.msgmax", "value": "65536"},
                ]
            }
        },
        f"{P}.securityContext.sysctls[1]",
        "podSecurity.allowPrivileged",
        {"allow_privileged": True},
    ),
    (
        ctr(seLinuxOptions={"type": "spc_t"}),
        f"{C}.securityContext.seLinuxOptions.type",
        "podSecurity.allowPrivileged",
        {"allow_privileged": True},
    ),
    (
        {"initContainers": [{"name": "init", "securityContext": {"privileged": True}}]},
        f"{P}.initContainers[0].securityContext.privileged",
        "podSecurity.allowPrivileged",
        {"allow_privileged": True},
    ),
    # volumes: the restricted profile's types; csi, secret and hostPath by their values
    (
        {"volumes": [{"name": "c", "csi": {"driver": "secrets-store.csi.k8s.io", "readOnly": True}}]},
        f"{P}.volumes[0].csi",
        "podSecurity.allowCsiVolumes",
        {"allow_csi_volumes": True},
    ),
    (
        {"volumes": [{"name": "t", "projected": {"sources": [{"serviceAccountToken": {"audience": "vault"}}]}}]},
        f"{P}.volumes[0].projected.sources[0].serviceAccountToken",
        "podSecurity.allowServiceAccount",
        {"allow_service_account": True},
    ),
    (
        {
            "volumes": [
                {
                    "name": "t",
                    "projected": {"sources": [{"configMap": {"name": "x"}}, {"clusterTrustBundle": {"name": "ca"}}]},
                }
            ]
        },
        f"{P}.volumes[0].projected.sources[1].clusterTrustBundle",
        "podSecurity.allowServiceAccount",
        {"allow_service_account": True},
    ),
    (
        {"automountServiceAccountToken": None},
        f"{P}.automountServiceAccountToken",
        "podSecurity.allowServiceAccount",
        {"allow_service_account": True},
    ),
    # the scheduler's trust: priority, runtime, scheduler, tolerations
    (
        {"priorityClassName": "system-cluster-critical"},
        f"{P}.priorityClassName",
        "podSecurity.allowedPriorityClasses",
        {"allowed_priority_classes": ["system-cluster-critical"]},
    ),
    (
        {"runtimeClassName": "runc-unsandboxed"},
        f"{P}.runtimeClassName",
        "podSecurity.allowedRuntimeClasses",
        {"allowed_runtime_classes": ["runc-unsandboxed"]},
    ),
    (
        {"schedulerName": "my-scheduler"},
        f"{P}.schedulerName",
        "podSecurity.allowedSchedulers",
        {"allowed_schedulers": ["my-scheduler"]},
    ),
    (
        {"tolerations": [dict(GPU_TOLERATION), {"operator": "Exists"}]},
        f"{P}.tolerations[1]",
        "podSecurity.allowAnyToleration",
        {"allow_any_toleration": True},
    ),
    (
        {"tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]},
        f"{P}.tolerations[0].key",
        "podSecurity.allowedTolerationKeys",
        {"allowed_toleration_keys": ["node-role.kubernetes.io/control-plane"]},
    ),
    (
        {"containers": [{"name": "trial", "livenessProbe": {"httpGet": {"host": "169.254.169.254", "port": 80}}}]},
        f"{C}.livenessProbe.httpGet.host",
        "podSecurity.allowHostNamespaces",
        {"allow_host_namespaces": True},
    ),
    (
        {"containers": [{"name": "trial", "lifecycle": {"preStop": {"tcpSocket": {"host": "10.0.0.1", "port": 22}}}}]},
        f"{C}.lifecycle.preStop.tcpSocket.host",
        "podSecurity.allowHostNamespaces",
        {"allow_host_namespaces": True},
    ),
]


@pytest.mark.parametrize("template,field,value,allow", CASES, ids=[c[1].removeprefix(P + ".") for c in CASES])
def test_each_relaxation_is_refused_by_field_unless_the_admin_allows_it(template, field, value, allow):
    (v,) = check_pod_template(template, PodSecurityBounds())
    assert isinstance(v, Violation) and v.field == field
    assert value in v.message and "chart" in v.message
    assert check_pod_template(template, PodSecurityBounds(**allow)) == []


def test_restricted_template_is_fine():
    tmpl = {
        "securityContext": {
            "runAsUser": 1000,
            "sysctls": [{"name": "net.ipv4.ip_local_port_range", "value": "1024 65000"}],
        },
        "containers": [
            {
                "name": "trial",
                "ports": [{"containerPort": 9400}],
                "securityContext": {
                    "capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]},
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
            }
        ],
        "volumes": [
            {"name": "data", "persistentVolumeClaim": {"claimName": "d"}},
            {"name": "cfg", "projected": {"sources": [{"configMap": {"name": "c"}}, {"downwardAPI": {"items": []}}]}},
            {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
        ],
        "schedulerName": "default-scheduler",
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }
    assert check_pod_template(tmpl, PodSecurityBounds()) == []


def test_dropping_fewer_than_all_capabilities_is_refused():
    (v,) = check_pod_template(ctr(capabilities={"drop": ["NET_RAW"]}), PodSecurityBounds(allow_privileged=True))
    assert v.field == f"{C}.securityContext.capabilities.drop" and "ALL" in v.message


def test_several_violations_are_all_reported():
    tmpl = {
        "hostNetwork": True,
        "volumes": [{"name": "h", "hostPath": {"path": "/var"}}],
        "containers": [{"name": "trial", "securityContext": {"privileged": True, "runAsUser": 0}}],
    }
    fields = {v.field for v in check_pod_template(tmpl, PodSecurityBounds())}
    assert fields == {
        f"{P}.hostNetwork",
        f"{P}.volumes[0].hostPath",
        f"{C}.securityContext.privileged",
        f"{C}.securityContext.runAsUser",
    }


def test_null_cannot_delete_the_restricted_defaults():
    """A strategic-merge null deletes a key: it must not strip the restricted settings podspec.py sets."""
    tmpl = {
        "securityContext": None,
        "containers": [
            {"name": "trial", "securityContext": {"seccompProfile": None, "capabilities": {"drop": None}}},
            {"name": "side", "securityContext": None},
        ],
    }
    fields = {v.field for v in check_pod_template(tmpl, PodSecurityBounds(allow_privileged=True))}
    assert fields == {
        f"{P}.securityContext",
        f"{C}.securityContext.seccompProfile",
        f"{C}.securityContext.capabilities.drop",
        f"{P}.containers[1].securityContext",
    }


def test_node_name_is_always_refused():
    (v,) = check_pod_template(
        {"nodeName": "b300-0"}, PodSecurityBounds(allow_privileged=True, allow_secrets=True, allow_service_account=True)
    )
    assert v.field == f"{P}.nodeName" and "nodeSelector" in v.message


# --------------------------------------------------------------------------- beyond every chart value

EVERYTHING = PodSecurityBounds(
    allow_privileged=True,
    allow_privilege_escalation=True,
    allow_host_namespaces=True,
    allow_host_path=True,
    allow_run_as_root=True,
    allow_secrets=True,
    allow_service_account=True,
    allow_csi_volumes=True,
    allow_any_toleration=True,
)


@pytest.mark.parametrize("kind", ["nfs", "iscsi", "rbd", "flexVolume", "cephfs", "gitRepo", "awsElasticBlockStore"])
def test_volume_types_beyond_the_restricted_profile_are_refused_whatever_the_chart_allows(kind):
    tmpl = {"volumes": [{"name": "v", kind: {"server": "nfs.example.com", "path": "/"}}]}
    (v,) = check_pod_template(tmpl, EVERYTHING)
    assert v.field == f"{P}.volumes[0].{kind}"
    assert "restricted" in v.message and "persistentVolumeClaim" in v.message and "remove it" in v.message


def test_projected_sources_beyond_the_known_ones_are_refused():
    tmpl = {"volumes": [{"name": "p", "projected": {"sources": [{"podCertificate": {"signerName": "x/y"}}]}}]}
    (v,) = check_pod_template(tmpl, EVERYTHING)
    assert v.field == f"{P}.volumes[0].projected.sources[0].podCertificate" and "remove it" in v.message


@pytest.mark.parametrize(
    "tmpl,field",
    [
        ({"containers": [{"name": "trial", "$patch": "delete"}]}, f"{C}.$patch"),
        ({"securityContext": {"$patch": "replace", "runAsUser": 1000}}, f"{P}.securityContext.$patch"),
        ({"volumes": [{"name": "v", "emptyDir": {}, "$retainKeys": ["emptyDir"]}]}, f"{P}.volumes[0].$retainKeys"),
        ({"$setElementOrder/containers": [{"name": "trial"}]}, f"{P}.$setElementOrder/containers"),
        (
            {"containers": [{"name": "trial", "securityContext": {"capabilities": {"$patch": "replace"}}}]},
            f"{C}.securityContext.capabilities.$patch",
        ),
    ],
)
def test_strategic_merge_directives_are_refused_anywhere(tmpl, field):
    vs = check_pod_template(tmpl, EVERYTHING)
    assert [v.field for v in vs] == [field]
    assert "directive" in vs[0].message and "remove it" in vs[0].message
    # and the merge itself never honours one (it used to delete a container named in `$patch: delete`)
    with pytest.raises(podspec.PodTemplateError) as e:
        podspec.merge_pod_spec({"containers": [{"name": "trial", "image": "x"}]}, tmpl)
    assert str(e.value).startswith(field + ":")


# --------------------------------------------------------------------------- the job and its merged pods


# knobs pinned to the baseline (an empty list), so that the specs pass preflight's search-space checks
PINNED = ("trainer.ep", "trainer.tp", "rollout.tp", "rollout.gpuMemoryUtilization", "async.staleFraction")


def example_spec(name: str, resources: dict) -> dict:
    raw = yaml.safe_load((EXAMPLES / name).read_text())["spec"]
    raw["resources"].update(resources)
    raw.setdefault("searchSpace", {})["knobs"] = {k: [] for k in PINNED}
    return raw


def twin_spec(**resources) -> RLTuningJobSpec:
    return RLTuningJobSpec.model_validate(example_spec("twin-demo.yaml", resources))


def verl_spec(**resources) -> RLTuningJobSpec:
    return registry.resolve(RLTuningJobSpec.model_validate(example_spec("verl-dapo-b300.yaml", resources)))


def created_pod_specs(spec: RLTuningJobSpec, settings: OperatorSettings) -> list[dict]:
    """The PodSpecs the operator would create for the job's baseline (Ray: the RayJob's pod templates)."""
    if registry.adapter_for(spec.workload.framework):
        m = rayjob.rayjob_manifest("ns", "j", None, spec, "t1", spec.baseline, 3, "http://pgw:9091", settings)
        return [p["spec"] for p in rayjob.pods_of(m)]
    pods, _ = PODS.trial_manifests("ns", "j", None, spec, "t1", spec.baseline, 3, 1, "http://pgw", settings=settings)
    return [p["spec"] for p in pods]


def containers(pod_spec: dict) -> list[dict]:
    return [c for lst in ("initContainers", "containers", "ephemeralContainers") for c in pod_spec.get(lst) or []]


@pytest.mark.parametrize("make", [twin_spec, verl_spec], ids=["trial-pod", "ray-pods"])
def test_the_operators_own_pods_pass_the_merged_check(make):
    settings = OperatorSettings()
    specs = trial_pod_specs(make(), settings)
    assert specs
    for pod_spec in specs:
        assert check_pod_spec(pod_spec, {}, PodSecurityBounds(), settings.gpu_pool.tolerations) == []


@pytest.mark.parametrize("make", [twin_spec, verl_spec], ids=["trial-pod", "ray-pods"])
def test_containers_a_template_adds_start_from_the_restricted_context(make):
    tmpl = {
        "containers": [{"name": "sidecar", "image": "busybox"}],
        "initContainers": [{"name": "prep", "image": "busybox", "securityContext": {"runAsUser": 1000}}],
        "ephemeralContainers": [{"name": "debug", "image": "busybox", "securityContext": {"capabilities": {}}}],
    }
    spec, settings = make(podTemplate=tmpl), OperatorSettings()
    assert check_job(spec, settings) == []
    pod_specs = created_pod_specs(spec, settings)
    assert pod_specs
    for pod_spec in pod_specs:
        added = {c["name"]: c for c in containers(pod_spec)}
        assert {"sidecar", "prep", "debug", "trial"} <= set(added)
        for c in added.values():
            for k, v in podspec.RESTRICTED_CONTAINER_SECURITY.items():
                assert c["securityContext"][k] == v, (c["name"], k)
        assert added["prep"]["securityContext"]["runAsUser"] == 1000  # what the template sets stays
        assert check_pod_spec(pod_spec, tmpl, PodSecurityBounds(), settings.gpu_pool.tolerations) == []


def test_a_relaxation_the_admin_allows_still_applies_to_an_added_container():
    tmpl = {"containers": [{"name": "sidecar", "image": "b", "securityContext": {"allowPrivilegeEscalation": True}}]}
    settings = OperatorSettings(podSecurity=PodSecurityBounds(allow_privilege_escalation=True))
    spec = twin_spec(podTemplate=tmpl)
    assert check_job(spec, settings) == []
    (pod_spec,) = created_pod_specs(spec, settings)[:1]
    sc = next(c for c in pod_spec["containers"] if c["name"] == "sidecar")["securityContext"]
    assert sc["allowPrivilegeEscalation"] is True and sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["runAsNonRoot"] is True and sc["seccompProfile"] == {"type": "RuntimeDefault"}


def test_deleting_the_trial_container_is_refused_before_any_pod():
    spec = twin_spec(podTemplate={"containers": [{"name": "trial", "$patch": "delete"}]})
    with pytest.raises(InvalidSpec) as e:
        preflight(spec, OperatorSettings())
    assert e.value.reason == "PodSecurityViolation" and f"{C}.$patch" in str(e.value)
    with pytest.raises(podspec.PodTemplateError):  # no pod without its restricted trial container is ever built
        created_pod_specs(spec, OperatorSettings())


def test_the_merged_pod_is_checked_and_named_by_the_template_field():
    """Were a container of the template ever left unrestricted (a merge without podspec.apply_template),
    the merged-pod check still finds it; a field is the template's where the value came from (the
    sidecar is the template's containers[0], the pod's containers[1]), else spec.resources.podTemplate."""
    settings = OperatorSettings()
    (base,) = trial_pod_specs(twin_spec(), settings)
    tmpl = {"containers": [{"name": "side", "image": "b", "securityContext": {"privileged": True}}]}
    merged = podspec.merge_pod_spec(base, tmpl)
    assert [c["name"] for c in merged["containers"]] == ["trial", "side"]
    vs = check_pod_spec(merged, tmpl, PodSecurityBounds(), settings.gpu_pool.tolerations)
    assert f"{C}.securityContext.privileged" in {v.field for v in vs}
    untraced = [v for v in vs if v.field == P]
    assert {m.message.split(" (merged")[0] for m in untraced} == {
        "the trial pod's spec.containers[1].securityContext.allowPrivilegeEscalation",
        "the trial pod's spec.containers[1].securityContext.capabilities.drop",
    }
    # what podspec.py really builds neutralises all but what the template itself asks for
    fixed = podspec.apply_template(copy.deepcopy(base), tmpl)
    vs = check_pod_spec(fixed, tmpl, PodSecurityBounds(), settings.gpu_pool.tolerations)
    assert [v.field for v in vs] == [f"{C}.securityContext.privileged"]
    # a null that deletes the operator's automountServiceAccountToken: false is the template's field
    tmpl = {"automountServiceAccountToken": None}
    merged = podspec.apply_template(copy.deepcopy(base), tmpl)
    assert "automountServiceAccountToken" not in merged
    (v,) = check_pod_spec(merged, tmpl, PodSecurityBounds(), settings.gpu_pool.tolerations)
    assert v.field == f"{P}.automountServiceAccountToken" and "podSecurity.allowServiceAccount" in v.message


# each hole of the issue, refused by the operator's preflight, and allowed by its chart value
HOLES = [
    (
        {"podTemplate": {"containers": [{"name": "side", "image": "b", "securityContext": {"privileged": True}}]}},
        f"{C}.securityContext.privileged",
        {"allow_privileged": True},
    ),
    (
        {"podTemplate": {"volumes": [{"name": "n", "nfs": {"server": "10.0.0.2", "path": "/"}}]}},
        f"{P}.volumes[0].nfs",
        None,
    ),
    (
        {"podTemplate": {"volumes": [{"name": "c", "csi": {"driver": "ebs.csi.aws.com"}}]}},
        f"{P}.volumes[0].csi",
        {"allow_csi_volumes": True},
    ),
    (
        {"podTemplate": {"volumes": [{"name": "t", "projected": {"sources": [{"serviceAccountToken": {}}]}}]}},
        f"{P}.volumes[0].projected.sources[0].serviceAccountToken",
        {"allow_service_account": True},
    ),
    (
        {"podTemplate": {"priorityClassName": "system-cluster-critical"}},
        f"{P}.priorityClassName",
        {"allowed_priority_classes": ["system-cluster-critical"]},
    ),
    ({"podTemplate": {"runtimeClassName": "kata"}}, f"{P}.runtimeClassName", {"allowed_runtime_classes": ["kata"]}),
    ({"podTemplate": {"schedulerName": "yunikorn"}}, f"{P}.schedulerName", {"allowed_schedulers": ["yunikorn"]}),
    ({"podTemplate": {"tolerations": [{"operator": "Exists"}]}}, f"{P}.tolerations[0]", {"allow_any_toleration": True}),
    ({"tolerations": [{"operator": "Exists"}]}, "spec.resources.tolerations[0]", {"allow_any_toleration": True}),
    (
        {"tolerations": [{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}]},
        "spec.resources.tolerations[0].key",
        {"allowed_toleration_keys": ["nvidia.com/gpu", "spot"]},
    ),
    (
        {"queueName": "team-a", "priorityClassName": "urgent"},
        "spec.resources.priorityClassName",
        {"allowed_priority_classes": ["urgent"]},
    ),
]


@pytest.mark.parametrize("resources,field,allow", HOLES, ids=[h[1].removeprefix("spec.resources.") for h in HOLES])
def test_preflight_refuses_each_hole_naming_the_field_unless_the_admin_allows_it(resources, field, allow):
    for make in (twin_spec, verl_spec):
        spec = make(**copy.deepcopy(resources))
        with pytest.raises(InvalidSpec) as e:
            preflight(spec, OperatorSettings())
        assert e.value.reason == "PodSecurityViolation", e.value
        assert str(e.value).startswith(f"{field}: "), str(e.value)
        if allow is not None:
            preflight(spec, OperatorSettings(podSecurity=PodSecurityBounds(**allow)))


def test_the_gpu_pools_own_tolerations_are_always_allowed():
    dedicated = {"key": "dedicated", "operator": "Equal", "value": "rl", "effect": "NoSchedule"}
    settings = OperatorSettings(gpuPool={"tolerations": [GPU_TOLERATION, dedicated]})
    spec = twin_spec(tolerations=[dict(dedicated)], podTemplate={"tolerations": [dict(dedicated), GPU_TOLERATION]})
    assert check_job(spec, settings) == []
    # the same key with another value is not the pool's own
    other = dict(dedicated, value="other-team")
    (v,) = check_job(twin_spec(tolerations=[other]), settings)
    assert v.field == "spec.resources.tolerations[0].key" and "podSecurity.allowedTolerationKeys" in v.message
