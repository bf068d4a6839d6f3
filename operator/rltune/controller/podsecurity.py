"""What a job's `resources.podTemplate` may ask of the pod security profile (pure; no API calls).

The operator creates trial pods with its own identity, so it must never be a way around a
namespace's pod security: whoever may create an RLTuningJob must not get pods they could not
create themselves. Trial pods start from the Pod Security Standards "restricted" settings
(podspec.py; every container the template adds too, `podspec.apply_template`); a template may relax them
only as far as the cluster admin allows in the chart's `podSecurity` values (operator settings).
Anything more is refused before any pod exists, with one Violation per offending field.

`check_job` is what the operator's preflight runs: the template itself (`check_pod_template`),
the job's own `spec.resources.tolerations` and `priorityClassName`, and then the pods as they would
be created, the template merged into a representative trial pod (or Ray head and worker pod) of
pods.py / rayjob.py (`check_pod_spec`): a violation of the merged pod is named by the template field
it came from, else `spec.resources.podTemplate`. Strategic-merge directives (`$patch`, ...) are
refused anywhere in a template: `{name: trial, $patch: delete}` would delete the restricted
container.

The checks follow the baseline and restricted controls of the Pod Security Standards,
https://kubernetes.io/docs/concepts/security/pod-security-standards/ :
host namespaces, privileged containers, capabilities, hostPath volumes, host ports, host probes and
lifecycle hooks, AppArmor, SELinux, /proc mount type, seccomp, sysctls, volume types, privilege
escalation, running as non-root / user 0 and Windows HostProcess. What the chart can relax, and
with which value:
  privileged, seccomp/AppArmor Unconfined, Unmasked /proc, custom SELinux
  types, unsafe sysctls, Windows HostProcess        podSecurity.allowPrivileged
  allowPrivilegeEscalation: true                    podSecurity.allowPrivilegeEscalation
  hostNetwork / hostPID / hostIPC, host ports,
  probe / lifecycle hook `host`                     podSecurity.allowHostNamespaces
  hostPath volumes                                  podSecurity.allowHostPath
  runAsUser 0, runAsNonRoot false                   podSecurity.allowRunAsRoot
  capabilities.add (beyond NET_BIND_SERVICE)        podSecurity.allowedCapabilities
  inline csi volumes                                podSecurity.allowCsiVolumes
Volumes are the restricted profile's types only (configMap, csi, downwardAPI, emptyDir, ephemeral,
persistentVolumeClaim, projected, secret; hostPath by its value): nfs, iscsi, rbd, flexVolume,
... are refused (a PersistentVolumeClaim reaches such storage through the admin's PersistentVolume).
Projected volumes take configMap and downwardAPI sources (secret, serviceAccountToken and
clusterTrustBundle by the values below).
Beyond the Pod Security Standards, what would give a job author access they may not have: reading
Secrets through a trial pod (secret volumes, projected secrets, secretKeyRef, envFrom secretRef:
podSecurity.allowSecrets), acting as a ServiceAccount (serviceAccountName,
automountServiceAccountToken, projected serviceAccountToken / clusterTrustBundle sources:
podSecurity.allowServiceAccount), and the scheduler's trust:
  priorityClassName (preempting other tenants' pods), and
  spec.resources.priorityClassName (Kueue's)        podSecurity.allowedPriorityClasses (empty: none)
  runtimeClassName                                  podSecurity.allowedRuntimeClasses (empty: none)
  schedulerName other than default-scheduler        podSecurity.allowedSchedulers (empty: none)
  tolerations beyond the gpuPool's own, in the
  template or spec.resources.tolerations            podSecurity.allowedTolerationKeys (nvidia.com/gpu)
  a toleration without a key (every taint), any key podSecurity.allowAnyToleration
`nodeName` is always refused: it bypasses the scheduler, the GPU pool's selector and quota
admission. Dropping fewer than ALL capabilities is never needed (added ones are applied after the
drop), so a template's `capabilities.drop` must keep ALL.

The chart's ValidatingAdmissionPolicy (helm/rltune/templates/admissionpolicy.yaml) enforces the
same profile and bounds, templated from the same values, on every pod and RayJob the operator's
ServiceAccount creates: the API server's backstop should this module ever let something through.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Iterable, Optional

from ..adapters.registry import adapter_for
from ..api.models import RLTuningJobSpec
from ..settings import OperatorSettings, PodSecurityBounds
from . import pods as pod_manifests
from . import podspec, rayjob

PREFIX = podspec.TEMPLATE_FIELD
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
CONTAINER_LISTS = podspec.CONTAINER_LISTS
# restricted "Volume Types": the only volume sources a restricted pod may use.
RESTRICTED_VOLUMES = frozenset(
    {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"}
)
# projected sources that hand the pod no credential
PLAIN_PROJECTIONS = frozenset({"configMap", "downwardAPI"})
DEFAULT_SCHEDULER = "default-scheduler"
PROBES = ("livenessProbe", "readinessProbe", "startupProbe")


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


def check_pod_template(
    template: Any, bounds: PodSecurityBounds, prefix: str = PREFIX, pool_tolerations: Iterable[dict] = ()
) -> list[Violation]:
    """Every field of the template that asks for more than `bounds` allow (empty: the template is fine).
    `pool_tolerations`: the chart's gpuPool.tolerations, which a template may repeat."""
    out: list[Violation] = []
    if not isinstance(template, dict):
        return out
    b = bounds
    out += [Violation(at, podspec.DIRECTIVE_REFUSED) for at in podspec.directive_paths(template, prefix)]
    for ns in ("hostNetwork", "hostPID", "hostIPC"):
        if template.get(ns) is True and not b.allow_host_namespaces:
            out.append(
                Violation(
                    f"{prefix}.{ns}",
                    f"{ns} (sharing the node's namespaces) is not allowed; "
                    + _fix("podSecurity.allowHostNamespaces=true"),
                )
            )
    _check_volumes(template, prefix, b, out)
    _check_identity(template, prefix, b, out)
    _check_scheduling(template, prefix, b, pool_tolerations, out)
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
            _check_probe_hosts(c, at, b, out)
    return out


SECRET_FIX = (
    "reading Secrets through trial pods is not allowed; remove it, or a cluster admin sets "
    "podSecurity.allowSecrets=true in " + CHART
)


def _check_volumes(template: dict, prefix: str, b: PodSecurityBounds, out: list[Violation]) -> None:
    """The restricted profile's volume types only (hostPath, secret and csi by the chart's values)."""
    for i, vol in enumerate(template.get("volumes") or []):
        if not isinstance(vol, dict):
            continue
        at = f"{prefix}.volumes[{i}]"
        for kind, src in vol.items():
            if kind == "name" or src is None or (isinstance(kind, str) and kind.startswith("$")):
                continue
            if kind == "hostPath":
                if not b.allow_host_path:
                    out.append(
                        Violation(
                            f"{at}.hostPath",
                            "hostPath volumes (files of the node) are not "
                            "allowed; use a persistentVolumeClaim, emptyDir or configMap, or a cluster admin "
                            "sets podSecurity.allowHostPath=true in " + CHART,
                        )
                    )
            elif kind == "secret":
                if not b.allow_secrets:
                    out.append(Violation(f"{at}.secret", SECRET_FIX))
            elif kind == "csi":
                if not b.allow_csi_volumes:
                    out.append(
                        Violation(
                            f"{at}.csi",
                            "inline CSI volumes are not allowed (a CSI driver can mount cloud credentials or "
                            "storage the job's author may not reach); use a persistentVolumeClaim, or a cluster "
                            "admin sets podSecurity.allowCsiVolumes=true in " + CHART,
                        )
                    )
            elif kind == "projected":
                _check_projected(src, at, b, out)
            elif kind not in RESTRICTED_VOLUMES:
                out.append(
                    Violation(
                        f"{at}.{kind}",
                        f"{kind} volumes are not allowed (the restricted Pod Security Standard's volume types "
                        f"only: {', '.join(sorted(RESTRICTED_VOLUMES))}); remove it: a persistentVolumeClaim "
                        "reaches such storage through a PersistentVolume a cluster admin made",
                    )
                )


def _check_projected(src: Any, at: str, b: PodSecurityBounds, out: list[Violation]) -> None:
    sources = src.get("sources") if isinstance(src, dict) else None
    for j, item in enumerate(sources if isinstance(sources, list) else []):
        if not isinstance(item, dict):
            continue
        for kind, v in item.items():
            if v is None or kind in PLAIN_PROJECTIONS:
                continue
            field = f"{at}.projected.sources[{j}].{kind}"
            if kind == "secret":
                if not b.allow_secrets:
                    out.append(Violation(field, SECRET_FIX))
            elif kind in ("serviceAccountToken", "clusterTrustBundle"):
                if not b.allow_service_account:
                    what = (
                        "a projected serviceAccountToken is an API token of the pod's ServiceAccount (for any audience)"
                        if kind == "serviceAccountToken"
                        else "a projected clusterTrustBundle has the kubelet read cluster-scoped "
                        "ClusterTrustBundles for the pod"
                    )
                    out.append(
                        Violation(
                            field,
                            f"{what}; trial pods act as no ServiceAccount: remove it, or a cluster admin sets "
                            "podSecurity.allowServiceAccount=true in " + CHART,
                        )
                    )
            else:
                out.append(
                    Violation(
                        field,
                        f"projected {kind} sources are not allowed (configMap and downwardAPI; secret, "
                        "serviceAccountToken and clusterTrustBundle by the chart's podSecurity values); remove it",
                    )
                )


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
        elif "automountServiceAccountToken" in template and template["automountServiceAccountToken"] is None:
            out.append(
                Violation(
                    f"{prefix}.automountServiceAccountToken",
                    "null would remove the trial pods' automountServiceAccountToken: false (the API server "
                    "would then mount a token); " + _fix("podSecurity.allowServiceAccount=true"),
                )
            )
    if b.allow_secrets:
        return
    for lst in CONTAINER_LISTS:
        for i, c in enumerate(template.get(lst) or []):
            if not isinstance(c, dict):
                continue
            for j, e in enumerate(c.get("env") or []):
                if isinstance(e, dict) and isinstance(e.get("valueFrom"), dict) and e["valueFrom"].get("secretKeyRef"):
                    out.append(Violation(f"{prefix}.{lst}[{i}].env[{j}].valueFrom.secretKeyRef", SECRET_FIX))
            for j, e in enumerate(c.get("envFrom") or []):
                if isinstance(e, dict) and e.get("secretRef"):
                    out.append(Violation(f"{prefix}.{lst}[{i}].envFrom[{j}].secretRef", SECRET_FIX))


def _not_listed(what: str, why: str, value: str, allowed: Iterable[str]) -> str:
    return (
        f"{what} is not allowed ({why}; allowed: {', '.join(allowed) or 'none'}); remove it, or a cluster admin "
        f"adds it to {value} in {CHART}"
    )


def _check_scheduling(
    template: dict, prefix: str, b: PodSecurityBounds, pool: Iterable[dict], out: list[Violation]
) -> None:
    """What the scheduler and the node trust a pod with: its priority, runtime, scheduler and tolerations."""
    pc = template.get("priorityClassName")
    if pc and pc not in b.allowed_priority_classes:
        out.append(
            Violation(
                f"{prefix}.priorityClassName",
                _not_listed(
                    f"priority class {pc}",
                    "a priority lets trial pods preempt other tenants' pods",
                    "podSecurity.allowedPriorityClasses",
                    b.allowed_priority_classes,
                ),
            )
        )
    rc = template.get("runtimeClassName")
    if rc and rc not in b.allowed_runtime_classes:
        out.append(
            Violation(
                f"{prefix}.runtimeClassName",
                _not_listed(
                    f"runtime class {rc}",
                    "a runtime class picks the node's container runtime handler",
                    "podSecurity.allowedRuntimeClasses",
                    b.allowed_runtime_classes,
                ),
            )
        )
    sn = template.get("schedulerName")
    if sn and sn != DEFAULT_SCHEDULER and sn not in b.allowed_schedulers:
        out.append(
            Violation(
                f"{prefix}.schedulerName",
                _not_listed(
                    f"scheduler {sn}",
                    "another scheduler need not honour the GPU pool, quotas or taints",
                    "podSecurity.allowedSchedulers",
                    [DEFAULT_SCHEDULER, *b.allowed_schedulers],
                ),
            )
        )
    if isinstance(template.get("tolerations"), list):
        check_tolerations(template["tolerations"], f"{prefix}.tolerations", b, pool, out)


def _toleration(t: dict) -> dict:
    """A toleration as the API server defaults it (operator Equal; empty values dropped), for comparing."""
    return {k: v for k, v in {"operator": "Equal", **t}.items() if v not in (None, "")}


def check_tolerations(
    tolerations: Iterable[Any], at: str, b: PodSecurityBounds, pool: Iterable[dict], out: list[Violation]
) -> None:
    """Tolerations beyond the GPU pool's own (`pool`: the chart's gpuPool.tolerations) are bounded by
    podSecurity.allowedTolerationKeys; one without a key tolerates every taint (podSecurity.allowAnyToleration)."""
    if b.allow_any_toleration:
        return
    own = [_toleration(t) for t in pool if isinstance(t, dict)]
    for i, t in enumerate(tolerations):
        if not isinstance(t, dict) or _toleration(t) in own:
            continue
        key = t.get("key") or ""
        if not key:
            out.append(
                Violation(
                    f"{at}[{i}]",
                    f"the toleration {json.dumps(t, separators=(',', ':'))} has no key: it tolerates every taint "
                    "(the control plane's, NoExecute evictions, other tenants' dedicated nodes); name the taint's "
                    "key, or a cluster admin sets podSecurity.allowAnyToleration=true in " + CHART,
                )
            )
        elif key not in b.allowed_toleration_keys:
            out.append(
                Violation(
                    f"{at}[{i}].key",
                    _not_listed(
                        f"tolerating the taint {key}",
                        "a taint keeps pods off nodes that are not theirs; the gpuPool's own tolerations are "
                        "always allowed",
                        "podSecurity.allowedTolerationKeys",
                        b.allowed_toleration_keys,
                    ),
                )
            )


def _check_probe_hosts(c: dict, at: str, b: PodSecurityBounds, out: list[Violation]) -> None:
    """baseline "Host Probes / Lifecycle Hooks": a `host` makes the kubelet connect anywhere from the node."""
    if b.allow_host_namespaces:
        return
    lifecycle = c.get("lifecycle") if isinstance(c.get("lifecycle"), dict) else {}
    handlers = [(p, c.get(p)) for p in PROBES]
    handlers += [(f"lifecycle.{h}", lifecycle.get(h)) for h in ("postStart", "preStop")]
    for name, h in handlers:
        if not isinstance(h, dict):
            continue
        for kind in ("httpGet", "tcpSocket"):
            if isinstance(h.get(kind), dict) and h[kind].get("host"):
                out.append(
                    Violation(
                        f"{at}.{name}.{kind}.host",
                        "a probe or lifecycle hook host makes the kubelet connect to that address from the node; "
                        "remove host (the pod's own IP is the default), or a cluster admin sets "
                        "podSecurity.allowHostNamespaces=true in " + CHART,
                    )
                )


# --------------------------------------------------------------------------- the merged pod

MERGED = "<merged pod>"  # prefix of the merged pod's own paths, before they are traced to the template
_SEG = re.compile(r"\.([^.\[\]]+)|\[(\d+)\]")


def _check_restricted(pod: dict, b: PodSecurityBounds, out: list[Violation]) -> None:
    """What every trial pod must have (not only: must not ask for): the restricted settings on every
    container, and no API token."""
    psc = pod.get("securityContext") if isinstance(pod.get("securityContext"), dict) else {}
    pod_seccomp = psc.get("seccompProfile") if isinstance(psc.get("seccompProfile"), dict) else {}
    if not b.allow_service_account and pod.get("automountServiceAccountToken") is not False:
        out.append(
            Violation(
                f"{MERGED}.automountServiceAccountToken",
                "must be false (trial pods run without an API token); " + _fix("podSecurity.allowServiceAccount=true"),
            )
        )
    for lst in CONTAINER_LISTS:
        for i, c in enumerate(pod.get(lst) or []):
            if not isinstance(c, dict):
                continue
            at = f"{MERGED}.{lst}[{i}].securityContext"
            sc = c.get("securityContext") if isinstance(c.get("securityContext"), dict) else {}
            if sc.get("allowPrivilegeEscalation") is not False and not (
                b.allow_privilege_escalation or b.allow_privileged
            ):
                out.append(
                    Violation(
                        f"{at}.allowPrivilegeEscalation",
                        "must be false in every container of a trial pod; "
                        + _fix("podSecurity.allowPrivilegeEscalation=true"),
                    )
                )
            caps = sc.get("capabilities") if isinstance(sc.get("capabilities"), dict) else {}
            if "ALL" not in [str(d).upper() for d in caps.get("drop") or []]:
                out.append(Violation(f"{at}.capabilities.drop", "must keep ALL (trial pods drop every capability)"))
            nonroot = sc["runAsNonRoot"] if sc.get("runAsNonRoot") is not None else psc.get("runAsNonRoot")
            if nonroot is not True and not b.allow_run_as_root:
                out.append(
                    Violation(
                        f"{at}.runAsNonRoot",
                        "must be true in every container (or the pod); " + _fix("podSecurity.allowRunAsRoot=true"),
                    )
                )
            seccomp = sc.get("seccompProfile") if isinstance(sc.get("seccompProfile"), dict) else pod_seccomp
            if seccomp.get("type") not in ("RuntimeDefault", "Localhost") and not b.allow_privileged:
                out.append(
                    Violation(
                        f"{at}.seccompProfile.type",
                        "must be RuntimeDefault or Localhost in every container (or the pod); "
                        + _fix("podSecurity.allowPrivileged=true"),
                    )
                )


def _trace(rel: str, merged: Any, template: Any) -> Optional[str]:
    """The template's path of the merged pod's field `rel` (e.g. `.containers[1].securityContext`):
    list items are matched by their merge key (podspec.py's strategic merge), replaced lists by index.
    None: the template does not set it (the value is the operator's own)."""
    m, t, lists = merged, template, podspec.POD_MERGE_KEYS
    key: Optional[str] = None
    sub: dict = {}
    out = ""
    for name, idx in _SEG.findall(rel):
        if name:
            if not (isinstance(m, dict) and isinstance(t, dict) and name in t):
                return None
            rule = lists.get(name) if isinstance(t[name], list) else None
            key, sub = (rule[0], rule[2] or {}) if rule else (None, {})
            m, t, lists = m.get(name), t[name], {}
            out += f".{name}"
        else:
            i = int(idx)
            if not (isinstance(m, list) and isinstance(t, list) and i < len(m)):
                return None
            if key is None:  # a list without a merge key: the template's replaced the operator's
                j: Optional[int] = i if i < len(t) else None
            else:
                want = m[i].get(key) if isinstance(m[i], dict) else None
                j = next((n for n, x in enumerate(t) if isinstance(x, dict) and x.get(key) == want), None)
            if j is None:
                return None
            m, t, lists, key = m[i], t[j], sub, None
            out += f"[{j}]"
    return out


def check_pod_spec(
    pod_spec: dict, template: Any, bounds: PodSecurityBounds, pool_tolerations: Iterable[dict] = ()
) -> list[Violation]:
    """The trial pod as it would be created (the template merged into the operator's PodSpec): every field
    beyond `bounds` and every restricted setting it lacks, named by the template field it came from
    (spec.resources.podTemplate... ), else spec.resources.podTemplate with the pod's own path."""
    raw = check_pod_template(pod_spec, bounds, MERGED, pool_tolerations)
    _check_restricted(pod_spec, bounds, raw)
    out: list[Violation] = []
    for v in raw:
        rel = v.field[len(MERGED) :]
        src = _trace(rel, pod_spec, template if isinstance(template, dict) else {})
        traced = (
            Violation(PREFIX + src, v.message)
            if src is not None
            else Violation(PREFIX, f"the trial pod's spec{rel} (merged from the template): {v.message}")
        )
        if traced not in out:
            out.append(traced)
    return out


def trial_pod_specs(spec: RLTuningJobSpec, settings: OperatorSettings) -> list[dict]:
    """The PodSpecs of the job's trial pods as pods.py / rayjob.py build them, the template merged: the
    baseline's first pod, or a verl/OpenRLHF trial's Ray head and worker pods. Raises
    podspec.PodTemplateError when the template cannot be merged."""
    if adapter_for(spec.workload.framework) is not None:
        gpus = spec.resources.gpus_per_node
        return [rayjob._pod_template(spec, settings, {}, gpus, {}, head=head)["spec"] for head in (True, False)]
    pods, _ = pod_manifests.trial_manifests(
        "preflight", "job", None, spec, "preflight", spec.baseline, 1, 0, None, settings
    )
    return [pods[0]["spec"]]


def check_job(spec: RLTuningJobSpec, settings: OperatorSettings) -> list[Violation]:
    """Everything the operator refuses of a job's pods before any exists: the podTemplate
    (`check_pod_template`), the job's own tolerations and Kueue priority class, and, when those are
    fine, the trial pods as they would be created (`check_pod_spec`). Raises podspec.PodTemplateError when
    the template cannot be merged."""
    b, r = settings.pod_security, spec.resources
    pool = settings.gpu_pool.tolerations
    out: list[Violation] = []
    if r.priority_class_name and r.priority_class_name not in b.allowed_priority_classes:
        out.append(
            Violation(
                "spec.resources.priorityClassName",
                _not_listed(
                    f"the priority class {r.priority_class_name}",
                    "a Kueue priority lets the job's trials preempt other tenants' workloads",
                    "podSecurity.allowedPriorityClasses",
                    b.allowed_priority_classes,
                ),
            )
        )
    check_tolerations(r.tolerations or [], "spec.resources.tolerations", b, pool, out)
    if r.pod_template:
        out += check_pod_template(r.pod_template, b, pool_tolerations=pool)
    if out or not r.pod_template:
        return out
    for pod_spec in trial_pod_specs(spec, settings):
        out += [v for v in check_pod_spec(pod_spec, r.pod_template, b, pool) if v not in out]
    return out
