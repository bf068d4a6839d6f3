"""What a job's `resources.podTemplate` may ask of the pod security profile (pure; no API calls).

The operator creates trial pods with its own identity, so it must never be a way around a
namespace's pod security: whoever may create an RLTuningJob must not get pods they could not
create themselves. Trial pods start from the Pod Security Standards "restricted" settings
(pods.py); a template may relax them only as far as the cluster admin allows in the chart's
`podSecurity` values (operator settings). Anything more is refused before any pod exists, with one
Violation per offending field.

The checks follow the baseline and restricted controls of the Pod Security Standards,
https://kubernetes.io/docs/concepts/security/pod-security-standards/ :
host namespaces, privileged containers, capabilities, hostPath volumes, host ports, AppArmor,
SELinux, /proc mount type, seccomp, sysctls, privilege escalation, running as non-root / user 0
and Windows HostProcess. What the chart can relax, and with which value:
  privileged, seccomp/AppArmor Unconfined, Unmasked /proc, custom SELinux
  types, unsafe sysctls, Windows HostProcess        podSecurity.allowPrivileged
  allowPrivilegeEscalation: true                    podSecurity.allowPrivilegeEscalation
  hostNetwork / hostPID / hostIPC, host ports       podSecurity.allowHostNamespaces
  hostPath volumes                                  podSecurity.allowHostPath
  runAsUser 0, runAsNonRoot false                   podSecurity.allowRunAsRoot
  capabilities.add (beyond NET_BIND_SERVICE)        podSecurity.allowedCapabilities
Beyond the Pod Security Standards, what would give a job author access they may not have: reading
Secrets through a trial pod (secret volumes, projected secrets, secretKeyRef, envFrom secretRef:
podSecurity.allowSecrets) and acting as a ServiceAccount (serviceAccountName,
automountServiceAccountToken: podSecurity.allowServiceAccount). `nodeName` is always refused: it
bypasses the scheduler, the GPU pool's selector and quota admission.
Dropping fewer than ALL capabilities is never needed (added ones are applied after the drop), so
a template's `capabilities.drop` must keep ALL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..settings import PodSecurityBounds

PREFIX = "spec.resources.podTemplate"
CHART = "the rltune chart's values"

# Pod Security Standards, baseline "Sysctls": the safe set.
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
        "net.ipv4.tcp_rmem",
        "net.ipv4.tcp_wmem",
    }
)
# restricted "Capabilities": the only one a restricted pod may add.
ALWAYS_ALLOWED_CAPS = frozenset({"NET_BIND_SERVICE"})
# baseline "SELinux": the types a pod may set.
SAFE_SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})
CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")


@dataclass(frozen=True)
class Violation:
    field: str  # e.g. spec.resources.podTemplate.volumes[0].hostPath
    message: str  # what is not allowed and how to fix it

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


def _fix(value: str) -> str:
    return f"remove it, or a cluster admin sets {value} in {CHART}"


# restricted settings of trial pods that a template's null (a strategic-merge delete) would remove
_KEEP = ("runAsNonRoot", "seccompProfile", "allowPrivilegeEscalation", "capabilities")


def _check_security_context(sc: Any, at: str, b: PodSecurityBounds, out: list[Violation]) -> None:
    if not isinstance(sc, dict):
        return
    for k in _KEEP:
        if k in sc and sc[k] is None:
            out.append(
                Violation(
                    f"{at}.{k}",
                    "null would remove a restricted setting of trial pods; set a value "
                    "instead (the restricted one is the default)",
                )
            )
    if isinstance(sc.get("capabilities"), dict) and "drop" in sc["capabilities"] and sc["capabilities"]["drop"] is None:
        out.append(Violation(f"{at}.capabilities.drop", "must keep ALL (trial pods drop every capability)"))
    if sc.get("privileged") is True and not b.allow_privileged:
        out.append(
            Violation(
                f"{at}.privileged", "privileged containers are not allowed; " + _fix("podSecurity.allowPrivileged=true")
            )
        )
    if sc.get("allowPrivilegeEscalation") is True and not (b.allow_privilege_escalation or b.allow_privileged):
        out.append(
            Violation(
                f"{at}.allowPrivilegeEscalation",
                "privilege escalation is not allowed; set it "
                "to false, or a cluster admin sets podSecurity.allowPrivilegeEscalation=true in " + CHART,
            )
        )
    if sc.get("runAsUser") == 0 and not b.allow_run_as_root:
        out.append(
            Violation(
                f"{at}.runAsUser",
                "running as root (user 0) is not allowed; use a non-zero user "
                "(trial images run as 10001), or a cluster admin sets podSecurity.allowRunAsRoot=true "
                "in " + CHART,
            )
        )
    if sc.get("runAsNonRoot") is False and not b.allow_run_as_root:
        out.append(
            Violation(
                f"{at}.runAsNonRoot", "runAsNonRoot: false is not allowed; " + _fix("podSecurity.allowRunAsRoot=true")
            )
        )
    caps = sc.get("capabilities")
    if isinstance(caps, dict):
        allowed = ALWAYS_ALLOWED_CAPS | {c.upper() for c in b.allowed_capabilities}
        for i, cap in enumerate(caps.get("add") or []):
            if str(cap).upper().removeprefix("CAP_") not in allowed and not b.allow_privileged:
                out.append(
                    Violation(
                        f"{at}.capabilities.add[{i}]",
                        f"adding capability {cap} is not allowed "
                        f"(allowed: {', '.join(sorted(allowed))}); remove it, or a cluster admin adds "
                        f"it to podSecurity.allowedCapabilities in {CHART}",
                    )
                )
        drop = caps.get("drop")
        if drop is not None and "ALL" not in [str(d).upper() for d in drop]:
            out.append(
                Violation(
                    f"{at}.capabilities.drop",
                    "must keep ALL (trial pods drop every capability; "
                    "list the ones you need under capabilities.add instead)",
                )
            )
    seccomp = (sc.get("seccompProfile") or {}).get("type") if isinstance(sc.get("seccompProfile"), dict) else None
    if seccomp == "Unconfined" and not b.allow_privileged:
        out.append(
            Violation(
                f"{at}.seccompProfile.type",
                "seccomp profile Unconfined is not allowed; use "
                "RuntimeDefault or Localhost, or a cluster admin sets podSecurity.allowPrivileged=true "
                "in " + CHART,
            )
        )
    apparmor = sc.get("appArmorProfile")
    if isinstance(apparmor, dict) and apparmor.get("type") == "Unconfined" and not b.allow_privileged:
        out.append(
            Violation(
                f"{at}.appArmorProfile.type",
                "AppArmor profile Unconfined is not allowed; use "
                "RuntimeDefault or Localhost, or a cluster admin sets podSecurity.allowPrivileged=true "
                "in " + CHART,
            )
        )
    if sc.get("procMount") not in (None, "Default") and not b.allow_privileged:
        out.append(
            Violation(
                f"{at}.procMount",
                f"procMount {sc.get('procMount')} is not allowed (only Default); "
                + _fix("podSecurity.allowPrivileged=true"),
            )
        )
    se = sc.get("seLinuxOptions")
    if isinstance(se, dict) and not b.allow_privileged:
        if str(se.get("type") or "") not in SAFE_SELINUX_TYPES:
            out.append(
                Violation(
                    f"{at}.seLinuxOptions.type",
                    f"SELinux type {se.get('type')} is not allowed "
                    f"(allowed: {', '.join(sorted(t for t in SAFE_SELINUX_TYPES if t))}); "
                    + _fix("podSecurity.allowPrivileged=true"),
                )
            )
        for k in ("user", "role"):
            if se.get(k):
                out.append(
                    Violation(
                        f"{at}.seLinuxOptions.{k}",
                        f"setting the SELinux {k} is not allowed; " + _fix("podSecurity.allowPrivileged=true"),
                    )
                )
    win = sc.get("windowsOptions")
    if isinstance(win, dict) and win.get("hostProcess") is True and not b.allow_privileged:
        out.append(
            Violation(
                f"{at}.windowsOptions.hostProcess",
                "Windows HostProcess pods are not allowed; " + _fix("podSecurity.allowPrivileged=true"),
            )
        )


def check_pod_template(template: Any, bounds: PodSecurityBounds, prefix: str = PREFIX) -> list[Violation]:
    """Every field of the template that asks for more than `bounds` allow (empty: the template is fine)."""
    out: list[Violation] = []
    if not isinstance(template, dict):
        return out
    b = bounds
    for ns in ("hostNetwork", "hostPID", "hostIPC"):
        if template.get(ns) is True and not b.allow_host_namespaces:
            out.append(
                Violation(
                    f"{prefix}.{ns}",
                    f"{ns} (sharing the node's namespaces) is not allowed; "
                    + _fix("podSecurity.allowHostNamespaces=true"),
                )
            )
    for i, vol in enumerate(template.get("volumes") or []):
        if isinstance(vol, dict) and vol.get("hostPath") is not None and not b.allow_host_path:
            out.append(
                Violation(
                    f"{prefix}.volumes[{i}].hostPath",
                    "hostPath volumes (files of the node) are not "
                    "allowed; use a persistentVolumeClaim, emptyDir or configMap, or a cluster admin "
                    "sets podSecurity.allowHostPath=true in " + CHART,
                )
            )
    _check_identity(template, prefix, b, out)
    psc = template.get("securityContext")
    if "securityContext" in template and psc is None:
        out.append(
            Violation(
                f"{prefix}.securityContext",
                "null would remove the restricted pod security context of trial pods; set single fields instead",
            )
        )
    _check_security_context(psc, f"{prefix}.securityContext", b, out)
    if isinstance(psc, dict):
        for i, sysctl in enumerate(psc.get("sysctls") or []):
            name = sysctl.get("name") if isinstance(sysctl, dict) else None
            if name not in SAFE_SYSCTLS and not b.allow_privileged:
                out.append(
                    Violation(
                        f"{prefix}.securityContext.sysctls[{i}]",
                        f"sysctl {name} is not in the "
                        "Pod Security Standards' safe set; " + _fix("podSecurity.allowPrivileged=true"),
                    )
                )
    for lst in CONTAINER_LISTS:
        for i, c in enumerate(template.get(lst) or []):
            if not isinstance(c, dict):
                continue
            at = f"{prefix}.{lst}[{i}]"
            if "securityContext" in c and c["securityContext"] is None:
                out.append(
                    Violation(
                        f"{at}.securityContext",
                        "null would remove the restricted security context "
                        "of trial containers; set single fields instead",
                    )
                )
            _check_security_context(c.get("securityContext"), f"{at}.securityContext", b, out)
            for j, port in enumerate(c.get("ports") or []):
                if isinstance(port, dict) and port.get("hostPort") and not b.allow_host_namespaces:
                    out.append(
                        Violation(
                            f"{at}.ports[{j}].hostPort",
                            "host ports are not allowed; remove "
                            "hostPort, or a cluster admin sets podSecurity.allowHostNamespaces=true "
                            "in " + CHART,
                        )
                    )
    return out


def _check_identity(template: dict, prefix: str, b: PodSecurityBounds, out: list[Violation]) -> None:
    """Secrets and ServiceAccounts: access the job author may not have themselves."""
    if template.get("nodeName"):
        out.append(
            Violation(
                f"{prefix}.nodeName",
                "nodeName bypasses the scheduler and the GPU pool; use spec.resources.nodeSelector instead",
            )
        )
    if not b.allow_service_account:
        for k in ("serviceAccountName", "serviceAccount"):
            if template.get(k):
                out.append(
                    Violation(
                        f"{prefix}.{k}",
                        "trial pods run without a ServiceAccount token; remove it, "
                        "or a cluster admin sets podSecurity.allowServiceAccount=true in " + CHART,
                    )
                )
        if template.get("automountServiceAccountToken") is True:
            out.append(
                Violation(
                    f"{prefix}.automountServiceAccountToken",
                    "trial pods run without an API token; " + _fix("podSecurity.allowServiceAccount=true"),
                )
            )
    if b.allow_secrets:
        return
    secret_fix = (
        "reading Secrets through trial pods is not allowed; remove it, or a cluster admin sets "
        "podSecurity.allowSecrets=true in " + CHART
    )
    for i, vol in enumerate(template.get("volumes") or []):
        if not isinstance(vol, dict):
            continue
        if vol.get("secret") is not None:
            out.append(Violation(f"{prefix}.volumes[{i}].secret", secret_fix))
        for j, src in enumerate(
            ((vol.get("projected") or {}).get("sources") or []) if isinstance(vol.get("projected"), dict) else []
        ):
            if isinstance(src, dict) and src.get("secret") is not None:
                out.append(Violation(f"{prefix}.volumes[{i}].projected.sources[{j}].secret", secret_fix))
    for lst in CONTAINER_LISTS:
        for i, c in enumerate(template.get(lst) or []):
            if not isinstance(c, dict):
                continue
            for j, e in enumerate(c.get("env") or []):
                if isinstance(e, dict) and isinstance(e.get("valueFrom"), dict) and e["valueFrom"].get("secretKeyRef"):
                    out.append(Violation(f"{prefix}.{lst}[{i}].env[{j}].valueFrom.secretKeyRef", secret_fix))
            for j, e in enumerate(c.get("envFrom") or []):
                if isinstance(e, dict) and e.get("secretRef"):
                    out.append(Violation(f"{prefix}.{lst}[{i}].envFrom[{j}].secretRef", secret_fix))
