"""The Helm chart `helm/rltune`, checked with the real helm binary (the bed's binary cache).

Static checks: lint, what `helm template` renders for the defaults, for watched namespaces and for
every value set, that wrong values are refused by values.schema.json naming the value, that the RBAC
never reaches Secrets or wildcards, and that the rendered operator settings file is what the
operator's own settings model accepts. Installing the chart on the bed is tested with the bed.
"""

from __future__ import annotations

import base64
import os
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from rltune.settings import OperatorSettings

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "rltune"
NS = "rltune-system"
RELEASE = "rl"
FULLNAME = "rl-rltune"
CONFIG = "/etc/rltune/config.yaml"

# The rules the operator gets on RLTuningJobs and their pods, services and events (docs/install.md).
JOB_RULES = [
    (["rltune.io"], ["rltuningjobs"], ["get", "list", "watch", "patch", "update"]),
    (["rltune.io"], ["rltuningjobs/status"], ["get", "patch", "update"]),
    (["rltune.io"], ["rltuningjobs/finalizers"], ["update"]),
    ([""], ["pods"], ["get", "list", "watch", "create", "delete"]),
    ([""], ["services"], ["get", "list", "watch", "create", "delete"]),
    ([""], ["events"], ["create", "patch"]),
    (["events.k8s.io"], ["events"], ["create", "patch"]),
    (["networking.k8s.io"], ["networkpolicies"], ["list", "create", "delete"]),
    (["ray.io"], ["rayjobs"], ["get", "list", "watch", "create", "delete"]),
]
CLUSTER_READ_RULES = [
    ([""], ["nodes"], ["get", "list", "watch"]),
    ([""], ["namespaces"], ["get", "list", "watch"]),
    (["apiextensions.k8s.io"], ["customresourcedefinitions"], ["get", "list", "watch"]),
]

# Every value set (not the defaults): the rendered config must still be a valid OperatorSettings.
ALL_VALUES: dict[str, Any] = {
    "image": {"repository": "registry.example.com/rltune/operator", "tag": "0.1.0-rc1", "pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "regcred"}],
    "resources": {"requests": {"cpu": "200m", "memory": "512Mi"}, "limits": {"cpu": 2, "memory": "2Gi"}},
    "nodeSelector": {"node-role.example.com/system": "true"},
    "tolerations": [{"key": "system", "operator": "Equal", "value": "yes", "effect": "NoSchedule"}],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}
                ]
            }
        }
    },
    "priorityClassName": "system-cluster-critical",
    "podAnnotations": {"example.com/team": "ml-infra"},
    "podLabels": {"team": "ml-infra"},
    "serviceAccount": {"create": True, "name": "rltune-operator", "annotations": {"example.com/role": "rltune"}},
    "watchNamespaces": ["team-a", "team-b"],
    "prometheus": {
        "url": "https://prometheus.example.com/api/prom",
        "bearerTokenSecret": {"name": "prom-token", "key": "token"},
        "caConfigMap": {"name": "prom-ca", "key": "ca.pem"},
    },
    "pushgateway": {"url": "http://pushgateway.monitoring.svc:9091"},
    "gpuPool": {
        "nodeSelector": {"cloud.google.com/gke-nodepool": "b300-pool"},
        "tolerations": [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            {"key": "dedicated", "operator": "Equal", "value": "rl", "effect": "NoExecute", "tolerationSeconds": 300},
        ],
    },
    "trialDefaults": {"cpu": 16, "memory": "200Gi", "guaranteed": True},
    "networkPolicy": {
        "enabled": False,
        "kuberay": {
            "namespaceSelector": {"kubernetes.io/metadata.name": "ray-system"},
            "podSelector": {"app": "kr", "app.kubernetes.io/name": None},
        },
        "prometheus": {"namespaceSelector": {"team": "obs"}, "podSelector": {"app.kubernetes.io/name": None}},
    },
    "podSecurity": {
        "allowPrivileged": False,
        "allowPrivilegeEscalation": False,
        "allowHostNamespaces": True,
        "allowHostPath": True,
        "allowRunAsRoot": False,
        "allowedCapabilities": ["IPC_LOCK"],
        "allowSecrets": True,
        "allowServiceAccount": False,
        "allowCsiVolumes": True,
        "allowedPriorityClasses": ["rl-low"],
        "allowedRuntimeClasses": ["nvidia"],
        "allowedSchedulers": ["volcano"],
        "allowedTolerationKeys": ["nvidia.com/gpu", "dedicated"],
        "allowAnyToleration": False,
    },
    "admissionPolicy": {"enabled": True},
    "reconcileInterval": 5,
    "workers": 4,
    "tickBudgetSeconds": 3,
    "verbose": True,
    "metrics": {
        "serviceMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "kps"}},
        "podMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "kps"}},
    },
    "pushgatewayMonitor": {
        "enabled": True,
        "interval": "10s",
        "labels": {"release": "kps"},
        "namespace": "obs",
        "selector": {"app": "pushgateway"},
        "port": "web",
    },
}


def _helm_path() -> Path:
    out = subprocess.run([str(ROOT / "hack" / "binaries.sh"), "--print"], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip()) / "helm"


@pytest.fixture(scope="module")
def helm() -> Path:
    path = _helm_path()
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.skip(f"helm binary not found at {path}: build it with `make binaries`")
    return path


def run_helm(helm: Path, *args: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "HELM_CACHE_HOME": "/tmp/rltune-helm/cache",
        "HELM_CONFIG_HOME": "/tmp/rltune-helm/config",
        "HELM_DATA_HOME": "/tmp/rltune-helm/data",
        "KUBECONFIG": "/dev/null",
    }
    return subprocess.run([str(helm), *args], capture_output=True, text=True, env=env, timeout=120)


def render(helm: Path, *args: str) -> list[dict]:
    """`helm template` of the chart (test hooks included) as a list of objects."""
    p = run_helm(helm, "template", RELEASE, str(CHART), "--namespace", NS, *args)
    assert p.returncode == 0, p.stderr
    return [d for d in yaml.safe_load_all(p.stdout) if d]


def render_values(helm: Path, tmp_path: Path, values: dict, *args: str) -> list[dict]:
    f = tmp_path / "values.yaml"
    f.write_text(yaml.safe_dump(values))
    return render(helm, "-f", str(f), *args)


def of_kind(objs: list[dict], kind: str) -> list[dict]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: list[dict], kind: str, name: str | None = None) -> dict:
    found = [o for o in of_kind(objs, kind) if name is None or o["metadata"]["name"] == name]
    assert len(found) == 1, f"want one {kind} {name or ''}, got {[o['metadata']['name'] for o in found]}"
    return found[0]


def operator_pod(objs: list[dict]) -> dict:
    return one(objs, "Deployment")["spec"]["template"]["spec"]


def operator_container(objs: list[dict]) -> dict:
    (c,) = operator_pod(objs)["containers"]
    return c


def settings_of(objs: list[dict]) -> tuple[dict, OperatorSettings]:
    raw = yaml.safe_load(one(objs, "ConfigMap")["data"]["config.yaml"])
    return raw, OperatorSettings.model_validate(raw)


def rules_of(role: dict) -> list[tuple[list[str], list[str], list[str]]]:
    return [(r.get("apiGroups", []), r.get("resources", []), r["verbs"]) for r in role["rules"]]


# ----------------------------------------------------------------------------- without helm


def test_app_version_is_the_project_version():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert chart["apiVersion"] == "v2" and chart["name"] == "rltune"
    assert chart["appVersion"] == project["version"], (
        f"helm/rltune/Chart.yaml appVersion {chart['appVersion']!r} != pyproject.toml version "
        f"{project['version']!r}: set appVersion to the project's version"
    )


def test_chart_crd_is_the_generated_crd():
    chart_crd = CHART / "crds" / "rltuningjobs.yaml"
    assert chart_crd.read_bytes() == (ROOT / "crds" / "rltuningjobs.yaml").read_bytes(), (
        "helm/rltune/crds/rltuningjobs.yaml drifted from crds/rltuningjobs.yaml: run `make crd`"
    )


# ----------------------------------------------------------------------------- helm lint


@pytest.mark.parametrize("args", [[], ["--set", "watchNamespaces={team-a,team-b}"]], ids=["defaults", "namespaced"])
def test_helm_lint_is_clean(helm, args):
    p = run_helm(helm, "lint", str(CHART), "--namespace", NS, *args)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "[WARNING]" not in out and "[ERROR]" not in out, out
    assert "1 chart(s) linted, 0 chart(s) failed" in out, out


# ----------------------------------------------------------------------------- defaults


def test_defaults_render_one_restart_safe_operator(helm):
    objs = render(helm)
    kinds = sorted(o["kind"] for o in objs)
    assert kinds == sorted(
        [
            "ServiceAccount",
            "ConfigMap",
            "ClusterRole",
            "ClusterRole",
            "ClusterRoleBinding",
            "ClusterRoleBinding",
            "Service",
            "Deployment",
            "Pod",
            "Secret",  # the metrics signing secret (templates/metrics-key-secret.yaml)
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
            "ValidatingAdmissionPolicyBinding",
        ]
    ), kinds
    dep = one(objs, "Deployment")
    assert dep["spec"]["replicas"] == 1
    assert dep["spec"]["strategy"] == {"type": "Recreate"}
    pod = operator_pod(objs)
    assert pod["serviceAccountName"] == FULLNAME == one(objs, "ServiceAccount")["metadata"]["name"]
    assert pod["automountServiceAccountToken"] is True
    c = operator_container(objs)
    assert c["args"] == [
        "--config",
        CONFIG,
        "--bind-address",
        "$(RLTUNE_POD_IP)",
        "--metrics-port",
        "18080",
        "--liveness-port",
        "18081",
    ]
    assert {"name": "RLTUNE_POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in c["env"]
    assert "command" not in c, "the image's entrypoint is `rltune operator`; the chart sets args only"
    assert {"name": "RLTUNE_POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}} in c["env"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"metrics": 18080, "health": 18081}
    for probe in ("livenessProbe", "readinessProbe"):
        get = c[probe]["httpGet"]
        assert get["path"] == "/healthz" and ports[get["port"]] == 18081, probe
    assert c["resources"]["requests"] and c["resources"]["limits"]
    # the settings file is mounted where --config points
    mount = next(m for m in c["volumeMounts"] if m["name"] == "config")
    assert f"{mount['mountPath']}/config.yaml" == CONFIG
    config_vol = next(v for v in pod["volumes"] if v["name"] == "config")
    assert config_vol["configMap"]["name"] == one(objs, "ConfigMap")["metadata"]["name"]
    assert "checksum/config" in dep["spec"]["template"]["metadata"]["annotations"]


def test_image_tag_defaults_to_app_version(helm):
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert operator_container(render(helm))["image"] == f"ghcr.io/rltune/operator:{app_version}"
    assert operator_container(render(helm, "--set", "image.tag=dev"))["image"] == "ghcr.io/rltune/operator:dev"


def test_restricted_security_context(helm):
    objs = render(helm)
    pod = operator_pod(objs)
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 10001,
        "runAsGroup": 10001,
        "fsGroup": 10001,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    sc = operator_container(objs)["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    # a read-only root still needs a writable /tmp
    tmp = next(m for m in operator_container(objs)["volumeMounts"] if m["mountPath"] == "/tmp")
    assert "emptyDir" in next(v for v in pod["volumes"] if v["name"] == tmp["name"])
    assert not any("hostPath" in v for v in pod["volumes"])


def test_health_test_hook(helm):
    objs = render(helm)
    pod = one(objs, "Pod")
    ann = pod["metadata"]["annotations"]
    assert ann["helm.sh/hook"] == "test"
    assert ann["helm.sh/hook-delete-policy"] == "before-hook-creation"
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never"
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (c,) = spec["containers"]
    assert c["image"] == operator_container(objs)["image"]
    assert c["command"][:2] == ["python", "-c"]
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    env = {e["name"]: e["value"] for e in c["env"]}
    svc = one(objs, "Service")
    health_port = next(p["port"] for p in svc["spec"]["ports"] if p["name"] == "health")
    assert env["HEALTH_URL"] == f"http://{svc['metadata']['name']}.{NS}.svc:{health_port}/healthz"
    compile(c["command"][2], "test-health", "exec")  # the probe script is valid Python


def test_service_exposes_metrics_and_health(helm):
    objs = render(helm)
    svc = one(objs, "Service")
    assert svc["spec"]["type"] == "ClusterIP"
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == {"metrics": 18080, "health": 18081}
    labels = one(objs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()


# ----------------------------------------------------------------------------- RBAC


def test_cluster_wide_rbac_is_the_documented_list(helm):
    objs = render(helm)
    assert not of_kind(objs, "Role") and not of_kind(objs, "RoleBinding")
    assert rules_of(one(objs, "ClusterRole", FULLNAME)) == JOB_RULES
    assert rules_of(one(objs, "ClusterRole", f"{FULLNAME}-cluster-read")) == CLUSTER_READ_RULES
    for b in of_kind(objs, "ClusterRoleBinding"):
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": FULLNAME, "namespace": NS}]
    assert {b["roleRef"]["name"] for b in of_kind(objs, "ClusterRoleBinding")} == {FULLNAME, f"{FULLNAME}-cluster-read"}


def test_watch_namespaces_gives_roles_and_namespace_args(helm):
    objs = render(helm, "--set", "watchNamespaces={team-a,team-b}")
    roles = of_kind(objs, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    for r in roles:
        assert rules_of(r) == JOB_RULES
    bindings = of_kind(objs, "RoleBinding")
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for b in bindings:
        assert b["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": FULLNAME}
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": FULLNAME, "namespace": NS}]
    # only the small read-only ClusterRole remains: nothing on pods, services or jobs cluster-wide
    (cr,) = of_kind(objs, "ClusterRole")
    assert rules_of(cr) == CLUSTER_READ_RULES
    assert all(set(verbs) <= {"get", "list", "watch"} for _, _, verbs in rules_of(cr))
    assert not any("pods" in res for _, res, _ in rules_of(cr))
    args = operator_container(objs)["args"]
    assert args[:2] == ["--config", CONFIG]
    assert [args[i + 1] for i, a in enumerate(args) if a == "--namespace"] == ["team-a", "team-b"]
    raw, s = settings_of(objs)
    assert s.namespaces == ["team-a", "team-b"]


@pytest.mark.parametrize("mode", ["defaults", "namespaced", "all-values"])
def test_no_rule_reaches_secrets_or_wildcards(helm, tmp_path, mode):
    args = {"defaults": [], "namespaced": ["--set", "watchNamespaces={team-a}"]}.get(mode)
    objs = render(helm, *args) if args is not None else render_values(helm, tmp_path, ALL_VALUES)
    roles = of_kind(objs, "ClusterRole") + of_kind(objs, "Role")
    assert roles
    for role in roles:
        for rule in role["rules"]:
            words = [
                *rule.get("apiGroups", []),
                *rule.get("resources", []),
                *rule["verbs"],
                *rule.get("resourceNames", []),
                *rule.get("nonResourceURLs", []),
            ]
            assert "*" not in words, (role["metadata"]["name"], rule)
            assert not any("secret" in w for w in words), (role["metadata"]["name"], rule)
    for b in of_kind(objs, "ClusterRoleBinding") + of_kind(objs, "RoleBinding"):
        assert b["roleRef"]["name"] != "cluster-admin"


# ----------------------------------------------------------------------------- monitors


def test_monitors_only_with_the_prometheus_operator_api(helm):
    monitors = lambda objs: sorted(
        (o["kind"], o["metadata"]["name"])
        for o in objs  # noqa: E731
        if o["apiVersion"] == "monitoring.coreos.com/v1"
    )
    enable = [
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        "metrics.podMonitor.enabled=true",
        "--set",
        "pushgatewayMonitor.enabled=true",
    ]
    assert monitors(render(helm)) == []
    assert monitors(render(helm, "--api-versions", "monitoring.coreos.com/v1")) == []  # API but not enabled
    assert monitors(render(helm, *enable)) == []  # enabled but no such API in the cluster
    objs = render(helm, "--api-versions", "monitoring.coreos.com/v1", *enable)
    assert monitors(objs) == [
        ("PodMonitor", FULLNAME),
        ("ServiceMonitor", FULLNAME),
        ("ServiceMonitor", f"{FULLNAME}-pushgateway"),
    ]
    sm = one(objs, "ServiceMonitor", FULLNAME)
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    assert sm["spec"]["selector"]["matchLabels"].items() <= one(objs, "Service")["metadata"]["labels"].items()
    pm = one(objs, "PodMonitor")
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    pgw = one(objs, "ServiceMonitor", f"{FULLNAME}-pushgateway")
    assert pgw["spec"]["endpoints"][0]["honorLabels"] is True
    assert pgw["spec"]["endpoints"][0]["port"] == "http"
    assert pgw["spec"]["namespaceSelector"] == {"matchNames": ["monitoring"]}
    assert pgw["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "prometheus-pushgateway"}


# ----------------------------------------------------------------------------- values.schema.json


BAD_VALUES = [
    (["--set", "watchNamespaces=foo"], "at '/watchNamespaces': got string, want array"),
    (["--set", "replicaCount=2"], "additional properties 'replicaCount' not allowed"),
    (["--set", "podSecurity.allowHostPath=yes"], "at '/podSecurity/allowHostPath': got string, want boolean"),
    (["--set", "prometheus.url=prometheus:9090"], "at '/prometheus/url'"),
    (["--set", "trialDefaults.memory=lots"], "at '/trialDefaults/memory'"),
    (["--set", "gpuPool.tolerations[0].operator=Maybe"], "at '/gpuPool/tolerations/0/operator'"),
    (["--set", "image.pullPolicy=Sometimes"], "at '/image/pullPolicy'"),
    (["--set", "reconcileInterval=0"], "at '/reconcileInterval'"),
    (["--set", "watchNamespaces={Team_A}"], "at '/watchNamespaces/0'"),
    (["--set", "metrics.serviceMonitor.enable=true"], "additional properties 'enable' not allowed"),
    (["--set", "networkPolicy.enabled=maybe"], "at '/networkPolicy/enabled': got string, want boolean"),
    (["--set", "networkPolicy.kuberay.podSelector=x"], "at '/networkPolicy/kuberay/podSelector'"),
]


@pytest.mark.parametrize("args, names", BAD_VALUES, ids=[a[1] for a, _ in BAD_VALUES])
def test_wrong_values_are_refused_naming_the_value(helm, args, names):
    p = run_helm(helm, "template", RELEASE, str(CHART), "--namespace", NS, *args)
    assert p.returncode != 0, f"{args} was accepted:\n{p.stdout[:500]}"
    assert "values don't meet the specifications of the schema" in p.stderr, p.stderr
    assert names in p.stderr, p.stderr


# ----------------------------------------------------------------------------- the settings file


def test_default_settings_file_is_valid(helm):
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    raw, s = settings_of(render(helm))
    assert s.prometheus.url == values["prometheus"]["url"]
    assert s.prometheus.bearer_token_file is None and s.prometheus.ca_file is None
    assert s.pushgateway_url == values["pushgateway"]["url"]
    assert s.namespaces == []
    assert s.gpu_pool.node_selector == {} and s.gpu_pool.tolerations == values["gpuPool"]["tolerations"]
    assert (s.trial_defaults.cpu, s.trial_defaults.memory, s.trial_defaults.guaranteed) == ("2", "8Gi", False)
    # every bound is off, and the chart's defaults are the operator's own
    assert raw["podSecurity"] == values["podSecurity"]
    # (only the GPU taint may be tolerated beyond gpuPool.tolerations)
    assert not any(v for k, v in s.pod_security.model_dump().items() if k != "allowed_toleration_keys")
    assert s.pod_security.allowed_toleration_keys == ["nvidia.com/gpu"]
    assert s.pod_security == type(s.pod_security)()
    assert s.reconcile_interval == values["reconcileInterval"]
    assert s.tick_budget_seconds == values["tickBudgetSeconds"] == type(s)().tick_budget_seconds
    # trials are fenced by default; the peers are the KubeRay operator's and kube-prometheus-stack's pods
    assert s.network_policy == type(s.network_policy)() and s.network_policy.enabled is True
    assert s.network_policy.kuberay.pod_selector == {"app.kubernetes.io/name": "kuberay-operator"}
    assert s.network_policy.prometheus.pod_selector == {"app.kubernetes.io/name": "prometheus"}


def test_every_value_set_renders_a_valid_operator(helm, tmp_path):
    objs = render_values(helm, tmp_path, ALL_VALUES)
    raw, s = settings_of(objs)
    pod = operator_pod(objs)
    c = operator_container(objs)
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in pod["volumes"]}
    # the token and CA files the settings name are where the kubelet mounts the Secret and ConfigMap
    assert s.prometheus.url == "https://prometheus.example.com/api/prom"
    assert s.prometheus.bearer_token_file == f"{mounts['prometheus-token']}/token"
    assert vols["prometheus-token"]["secret"]["secretName"] == "prom-token"
    assert vols["prometheus-token"]["secret"]["items"] == [{"key": "token", "path": "token"}]
    assert s.prometheus.ca_file == f"{mounts['prometheus-ca']}/ca.pem"
    assert vols["prometheus-ca"]["configMap"] == {
        "name": "prom-ca",
        "defaultMode": 0o444,
        "items": [{"key": "ca.pem", "path": "ca.pem"}],
    }
    assert s.pushgateway_url == "http://pushgateway.monitoring.svc:9091"
    assert s.namespaces == ["team-a", "team-b"]
    assert s.gpu_pool.node_selector == {"cloud.google.com/gke-nodepool": "b300-pool"}
    assert s.gpu_pool.tolerations == ALL_VALUES["gpuPool"]["tolerations"]
    assert (s.trial_defaults.cpu, s.trial_defaults.memory, s.trial_defaults.guaranteed) == ("16", "200Gi", True)
    assert s.pod_security.allow_host_path is True and s.pod_security.allowed_capabilities == ["IPC_LOCK"]
    assert s.pod_security.allow_secrets is True and s.pod_security.allow_service_account is False
    assert s.pod_security.allow_privileged is False
    assert s.pod_security.allow_csi_volumes is True and s.pod_security.allowed_priority_classes == ["rl-low"]
    assert (s.pod_security.allowed_runtime_classes, s.pod_security.allowed_schedulers) == (["nvidia"], ["volcano"])
    assert s.pod_security.allowed_toleration_keys == ["nvidia.com/gpu", "dedicated"]
    assert (s.reconcile_interval, s.workers, s.tick_budget_seconds) == (5, 4, 3)
    # a default selector label set to null is gone (Helm merges maps), not ANDed with the new one
    np = s.network_policy
    assert np.enabled is False
    assert (np.kuberay.namespace_selector, np.kuberay.pod_selector) == (
        {"kubernetes.io/metadata.name": "ray-system"},
        {"app": "kr"},
    )
    assert (np.prometheus.namespace_selector, np.prometheus.pod_selector) == ({"team": "obs"}, {})
    # the rest of the values land on the operator pod
    assert c["image"] == "registry.example.com/rltune/operator:0.1.0-rc1" and c["imagePullPolicy"] == "Always"
    assert c["args"][-1] == "--verbose"
    assert pod["serviceAccountName"] == "rltune-operator" == one(objs, "ServiceAccount")["metadata"]["name"]
    assert one(objs, "ServiceAccount")["metadata"]["annotations"] == {"example.com/role": "rltune"}
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["nodeSelector"] == ALL_VALUES["nodeSelector"]
    assert pod["tolerations"] == ALL_VALUES["tolerations"]
    assert pod["affinity"] == ALL_VALUES["affinity"]
    assert pod["priorityClassName"] == "system-cluster-critical"
    meta = one(objs, "Deployment")["spec"]["template"]["metadata"]
    assert meta["labels"]["team"] == "ml-infra" and meta["annotations"]["example.com/team"] == "ml-infra"
    assert c["resources"] == ALL_VALUES["resources"]
    # monitors are off here (no --api-versions), the RBAC is namespaced
    assert not [o for o in objs if o["apiVersion"] == "monitoring.coreos.com/v1"]
    assert sorted(r["metadata"]["namespace"] for r in of_kind(objs, "Role")) == ["team-a", "team-b"]


def test_a_changed_setting_rolls_the_operator_pod(helm):
    checksum = lambda objs: one(objs, "Deployment")["spec"]["template"]["metadata"]["annotations"][  # noqa: E731
        "checksum/config"
    ]
    assert checksum(render(helm)) == checksum(render(helm))
    assert checksum(render(helm)) != checksum(render(helm, "--set", "trialDefaults.memory=16Gi"))


def _setting_keys(model: type[BaseModel], prefix: str = "") -> set[str]:
    """Dotted camelCase paths of every leaf field of a settings model."""
    keys = set()
    for name, field in model.model_fields.items():
        key = prefix + (field.alias or name)
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys |= _setting_keys(ann, key + ".")
        else:
            keys.add(key)
    return keys


def _raw_keys(d: dict, prefix: str = "") -> set[str]:
    keys = set()
    for k, v in d.items():
        if isinstance(v, dict) and k not in ("nodeSelector", "namespaceSelector", "podSelector"):
            keys |= _raw_keys(v, f"{prefix}{k}.")
        else:
            keys.add(prefix + k)
    return keys


def test_chart_sets_every_operator_setting(helm, tmp_path):
    """A setting added to rltune.settings must get a chart value (and a schema entry) too."""
    raw, _ = settings_of(render_values(helm, tmp_path, ALL_VALUES))
    missing = _setting_keys(OperatorSettings) - _raw_keys(raw)
    assert not missing, (
        f"operator settings the chart cannot set: {sorted(missing)} (helm/rltune/values.yaml, "
        "values.schema.json, templates/configmap.yaml)"
    )


# ----------------------------------------------------------------------------- admission policy


def policies(objs: list[dict]) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in of_kind(objs, "ValidatingAdmissionPolicy")}


def policy_messages(objs: list[dict]) -> list[str]:
    return [v["message"] for p in policies(objs).values() for v in p["spec"]["validations"]]


def validation(policy: dict, needle: str) -> str:
    """The expression of the policy's one validation whose message holds `needle`."""
    (expr,) = [v["expression"] for v in policy["spec"]["validations"] if needle in v["message"]]
    return expr


def test_admission_policy_matches_what_the_operators_service_account_creates(helm):
    objs = render(helm)
    pods, rayjobs = f"{FULLNAME}-{NS}-pods", f"{FULLNAME}-{NS}-rayjobs"
    pols = policies(objs)
    assert sorted(pols) == [pods, rayjobs]
    user = f"system:serviceaccount:{NS}:{FULLNAME}"
    for p in pols.values():
        spec = p["spec"]
        assert spec["failurePolicy"] == "Fail"
        assert spec["matchConditions"] == [
            {"name": "created-by-the-rltune-operator", "expression": f"request.userInfo.username == '{user}'"}
        ]
        (rule,) = spec["matchConstraints"]["resourceRules"]
        assert rule["operations"] == ["CREATE"]
        for v in spec["validations"]:
            assert v["reason"] == "Forbidden" and v["message"].startswith("rltune admission policy: spec."), v
    rule = lambda name: pols[name]["spec"]["matchConstraints"]["resourceRules"][0]  # noqa: E731
    assert (rule(pods)["apiGroups"], rule(pods)["resources"]) == ([""], ["pods"])
    assert (rule(rayjobs)["apiGroups"], rule(rayjobs)["resources"]) == (["ray.io"], ["rayjobs"])
    # a RayJob's pods are made by KubeRay: its head, worker and submitter templates are checked
    (specs,) = pols[rayjobs]["spec"]["variables"]
    for where in ("headGroupSpec.template.spec", "workerGroupSpecs", "submitterPodTemplate.spec"):
        assert where in specs["expression"]
    assert pols[pods]["spec"]["variables"] == [{"name": "specs", "expression": "[object.spec]"}]
    bindings = of_kind(objs, "ValidatingAdmissionPolicyBinding")
    assert sorted(b["spec"]["policyName"] for b in bindings) == [pods, rayjobs]
    assert all(b["spec"]["validationActions"] == ["Deny"] for b in bindings)
    # the ServiceAccount the operator runs as is the one matched, whatever its name
    objs = render(helm, "--set", "serviceAccount.name=rltune-operator")
    for p in policies(objs).values():
        assert f"'system:serviceaccount:{NS}:rltune-operator'" in p["spec"]["matchConditions"][0]["expression"]
    assert operator_pod(objs)["serviceAccountName"] == "rltune-operator"
    assert not policies(render(helm, "--set", "admissionPolicy.enabled=false"))
    assert not of_kind(render(helm, "--set", "admissionPolicy.enabled=false"), "ValidatingAdmissionPolicyBinding")


RELAXED = [
    ("podSecurity.allowPrivileged=true", "privileged must not be true"),
    ("podSecurity.allowPrivileged=true", "seccompProfile.type"),
    ("podSecurity.allowPrivileged=true", "capabilities.add may add only"),
    ("podSecurity.allowPrivilegeEscalation=true", "allowPrivilegeEscalation must be false"),
    ("podSecurity.allowRunAsRoot=true", "runAsNonRoot"),
    ("podSecurity.allowRunAsRoot=true", "runAsUser must not be 0"),
    ("podSecurity.allowHostNamespaces=true", "hostNetwork"),
    ("podSecurity.allowHostNamespaces=true", "hostPort"),
    ("podSecurity.allowSecrets=true", "spec.volumes[*].secret"),
    ("podSecurity.allowCsiVolumes=true", "inline CSI"),
    ("podSecurity.allowServiceAccount=true", "automountServiceAccountToken must be false"),
]


@pytest.mark.parametrize("value,message", RELAXED, ids=[f"{v}:{m}" for v, m in RELAXED])
def test_each_podsecurity_value_relaxes_the_admission_policy_too(helm, value, message):
    assert sum(message in m for m in policy_messages(render(helm))) == 2  # pods and RayJobs
    assert not any(message in m for m in policy_messages(render(helm, "--set", value)))


def test_the_policys_lists_are_the_operators_own(helm, tmp_path):
    """The policy refuses nothing rltune's own check allows: its volume types, projected sources,
    sysctls, SELinux types and name lists are podsecurity.py's and the podSecurity values'."""
    import re

    from rltune.controller import podsecurity

    def has_list(expr: str, var: str) -> set[str]:
        return set(re.findall(rf"has\({var}\.(\w+)\)", expr))

    pol = policies(render(helm))[f"{FULLNAME}-{NS}-pods"]
    assert has_list(validation(pol, "volume types"), "v") == set(podsecurity.RESTRICTED_VOLUMES)
    assert has_list(validation(pol, "projected.sources may be only"), "p") == set(podsecurity.PLAIN_PROJECTIONS)
    for name in podsecurity.SAFE_SYSCTLS:
        assert f'"{name}"' in validation(pol, "sysctls")
    for t in podsecurity.SAFE_SELINUX_TYPES:
        assert f'"{t}"' in validation(pol, "seLinuxOptions")
    assert '["NET_BIND_SERVICE"]' in validation(pol, "capabilities.add may add only")
    assert "in []" in validation(pol, "priorityClassName") and "in []" in validation(pol, "runtimeClassName")
    assert '["","default-scheduler"]' in validation(pol, "schedulerName")
    values = {
        "podSecurity": {
            "allowHostPath": True,
            "allowSecrets": True,
            "allowServiceAccount": True,
            "allowedCapabilities": ["IPC_LOCK"],
            "allowedPriorityClasses": ["rl-low", "rl-high"],
            "allowedRuntimeClasses": ["nvidia"],
            "allowedSchedulers": ["volcano"],
        }
    }
    pol = policies(render_values(helm, tmp_path, values))[f"{FULLNAME}-{NS}-pods"]
    assert has_list(validation(pol, "volume types"), "v") == set(podsecurity.RESTRICTED_VOLUMES) | {"hostPath"}
    assert has_list(validation(pol, "projected.sources may be only"), "p") == {
        "configMap",
        "downwardAPI",
        "secret",
        "serviceAccountToken",
        "clusterTrustBundle",
    }
    assert '["NET_BIND_SERVICE","IPC_LOCK"]' in validation(pol, "capabilities.add may add only")
    prio = validation(pol, "priorityClassName")
    assert prio.count('in ["rl-low","rl-high"]') == 2  # the pod's class and Kueue's label
    assert 'in ["nvidia"]' in validation(pol, "runtimeClassName")
    assert '["","default-scheduler","volcano"]' in validation(pol, "schedulerName")


# ----------------------------------------------------------------------------- tenant safety


def test_job_named_endpoints_are_the_admins_lists(helm, tmp_path):
    objs = render_values(
        helm,
        tmp_path,
        {
            "prometheus": {"allowedJobUrls": ["http://thanos.monitoring:9090"]},
            "pushgateway": {"allowedJobUrls": ["http://pgw.team-a:9091"]},
        },
    )
    _, s = settings_of(objs)
    assert s.prometheus.allowed_job_urls == ["http://thanos.monitoring:9090"]
    assert s.pushgateway_allowed_job_urls == ["http://pgw.team-a:9091"]
    assert settings_of(render(helm))[1].prometheus.allowed_job_urls == []  # default: none


def test_an_allowed_url_with_a_path_fails_the_install(helm, tmp_path):
    vals = tmp_path / "v.yaml"
    vals.write_text(yaml.safe_dump({"prometheus": {"allowedJobUrls": ["http://169.254.169.254/latest/meta-data"]}}))
    r = run_helm(helm, "template", RELEASE, str(CHART), "--namespace", NS, "-f", str(vals))
    assert r.returncode != 0 and "allowedJobUrls" in r.stderr


def test_the_metrics_key_is_a_secret_mounted_into_the_operator_only(helm, tmp_path):
    objs = render(helm)
    secret = one(objs, "Secret")
    assert len(base64.b64decode(secret["data"]["key"])) == 64
    _, s = settings_of(objs)
    vol = next(v for v in operator_pod(objs)["volumes"] if v["name"] == "metrics-key")
    assert vol["secret"]["secretName"] == secret["metadata"]["name"]
    mount = next(m for m in operator_container(objs)["volumeMounts"] if m["name"] == "metrics-key")
    assert s.metrics_key_file == mount["mountPath"] + "/key" and mount["readOnly"] is True
    # an admin's own Secret: the chart makes none and mounts that one
    objs = render_values(helm, tmp_path, {"metricsKey": {"existingSecret": "my-key"}})
    assert not [o for o in objs if o["kind"] == "Secret"]
    vol = next(v for v in operator_pod(objs)["volumes"] if v["name"] == "metrics-key")
    assert vol["secret"]["secretName"] == "my-key"
