"""controller/podsecurity.py: a job's podTemplate may relax the restricted profile only as far as the
cluster admin's podSecurity settings allow; each refusal names the field and the chart value."""

from __future__ import annotations

import pytest

from rltune.controller.podsecurity import Violation, check_pod_template
from rltune.settings import PodSecurityBounds

P = "spec.resources.podTemplate"
C = f"{P}.containers[0]"


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
]


@pytest.mark.parametrize("template,field,value,allow", CASES, ids=[c[1].removeprefix(P + ".") for c in CASES])
def test_each_relaxation_is_refused_by_field_unless_the_admin_allows_it(template, field, value, allow):
    (v,) = check_pod_template(template, PodSecurityBounds())
    assert isinstance(v, Violation) and v.field == field
    assert value in v.message and "chart" in v.message
    assert check_pod_template(template, PodSecurityBounds(**allow)) == []


def test_restricted_template_is_fine():
    tmpl = {
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "d"}}],
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
        "priorityClassName": "low",
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
    """A strategic-merge null deletes a key: it must not strip the restricted settings pods.py sets."""
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
