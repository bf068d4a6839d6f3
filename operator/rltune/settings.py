"""The operator's settings: one typed object, built once at start-up.

A cluster admin sets them through the Helm chart's values (rendered into a ConfigMap that the
operator reads with `--config`, see docs/install.md); a few environment variables override single
fields, so the test bed and a developer's shell can point the operator at their own Prometheus.
Jobs cannot change these: they are the admin's decisions (the GPU pool, and above all what a job's
`podTemplate` may relax of the restricted pod security profile).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


def _url(v: Optional[str], field: str) -> Optional[str]:
    if v is None or v == "":
        return None
    if not v.startswith(("http://", "https://")):
        raise ValueError(f"{field} must start with http:// or https:// (got {v!r})")
    return v.rstrip("/")


def _allow_list(urls: list[str], field: str) -> list[str]:
    """An admin's list of endpoints jobs may name: each in the shape a job must use (no path)."""
    from .api.models import url_problem

    for i, u in enumerate(urls):
        why = url_problem(u)
        if why:
            raise ValueError(f"{field}[{i}]: {why}")
    return [u.rstrip("/") for u in urls]


class PrometheusSettings(_Model):
    """Where trials are scored. Managed Prometheus services want a bearer token and their own CA."""

    url: Optional[str] = Field(None, description="PromQL HTTP API base URL (no default: a cluster's own).")
    bearer_token_file: Optional[str] = Field(None, description="File holding a bearer token for Prometheus.")
    ca_file: Optional[str] = Field(None, description="CA bundle that signed Prometheus' TLS certificate.")
    allowed_job_urls: list[str] = Field(
        default_factory=list,
        description="Prometheus endpoints a job may name in spec.metrics.prometheusUrl, besides url (scheme, "
        "host and port, matched exactly; empty: jobs use url only). Never sent the bearer token.",
    )

    @field_validator("url")
    @classmethod
    def _check_url(cls, v: Optional[str]) -> Optional[str]:
        return _url(v, "prometheus.url")

    @field_validator("allowed_job_urls")
    @classmethod
    def _check_allowed(cls, v: list[str]) -> list[str]:
        return _allow_list(v, "prometheus.allowedJobUrls")


class GpuPoolSettings(_Model):
    """How trial pods find the GPU nodes. Empty selector: the GPU type's GFD product labels decide."""

    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Labels every GPU node of the pool carries (e.g. a cloud's node-pool label)."
    )
    tolerations: list[dict[str, Any]] = Field(
        default_factory=lambda: [dict(GPU_TOLERATION)], description="Tolerations of every trial pod."
    )


class TrialDefaults(_Model):
    """CPU and memory of trial pods (GPUs come from the configuration being tried)."""

    cpu: str = Field("2", description="CPU request per trial pod.")
    memory: str = Field("8Gi", description="Memory request per trial pod.")
    guaranteed: bool = Field(False, description="Limits equal to requests (Guaranteed QoS).")


class KueueSettings(_Model):
    """Admission through Kueue (https://kueue.sigs.k8s.io): the LocalQueue of jobs that name none."""

    default_queue: Optional[str] = Field(
        None,
        max_length=63,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description="LocalQueue (in each job's namespace) for jobs without resources.queueName; empty: none "
        "(trial pods go straight to the scheduler).",
    )

    @field_validator("default_queue", mode="before")
    @classmethod
    def _empty_is_none(cls, v: Any) -> Any:
        return v or None


class PodSecurityBounds(_Model):
    """What a job's podTemplate may relax of the restricted profile. All off: trial pods are restricted."""

    allow_privileged: bool = False
    allow_privilege_escalation: bool = False
    allow_host_namespaces: bool = False
    allow_host_path: bool = False
    allow_run_as_root: bool = False
    allowed_capabilities: list[str] = Field(default_factory=list)
    allow_secrets: bool = Field(
        False,
        description="Secret volumes and env from Secrets (a job author who may "
        "not read a Secret could otherwise read it through a trial pod).",
    )
    allow_service_account: bool = Field(
        False,
        description="serviceAccountName / a mounted API token in trial pods (also projected serviceAccountToken "
        "and clusterTrustBundle sources).",
    )
    allow_csi_volumes: bool = Field(
        False, description="Inline CSI volumes (an inline CSI driver can mount cloud credentials or foreign storage)."
    )
    allowed_priority_classes: list[str] = Field(
        default_factory=list,
        description="PriorityClasses a podTemplate's priorityClassName, and Kueue WorkloadPriorityClasses "
        "spec.resources.priorityClassName, may name; empty: neither may be set (no preempting other tenants).",
    )
    allowed_runtime_classes: list[str] = Field(
        default_factory=list, description="RuntimeClasses a podTemplate's runtimeClassName may name; empty: none."
    )
    allowed_schedulers: list[str] = Field(
        default_factory=list,
        description="Schedulers a podTemplate's schedulerName may name besides default-scheduler; empty: none.",
    )
    allowed_toleration_keys: list[str] = Field(
        default_factory=lambda: ["nvidia.com/gpu"],
        description="Taint keys a podTemplate's or spec.resources.tolerations may tolerate beyond the gpuPool's own "
        "tolerations.",
    )
    allow_any_toleration: bool = Field(
        False,
        description="Tolerations of any key, and a toleration without a key (operator Exists: every taint, the "
        "control plane's and other tenants' dedicated nodes included).",
    )


class NetworkPeer(_Model):
    """Pods of other namespaces a trial's NetworkPolicy admits: matchLabels of the pods and of their namespaces."""

    namespace_selector: dict[str, str] = Field(
        default_factory=dict, description="Labels of the namespaces the pods run in; empty: every namespace."
    )
    pod_selector: dict[str, str] = Field(default_factory=dict, description="Labels of the pods; empty: all of them.")

    @model_validator(mode="after")
    def _not_everyone(self) -> "NetworkPeer":
        if not self.namespace_selector and not self.pod_selector:
            raise ValueError(
                "a NetworkPolicy peer needs a podSelector or a namespaceSelector (both empty admit every pod)"
            )
        return self


class NetworkPolicySettings(_Model):
    """One NetworkPolicy per trial (controller/netpol.py): its pods admit ingress only from the trial's own
    pods, the KubeRay operator and Prometheus. Off for clusters whose network plugin enforces none."""

    enabled: bool = Field(True, description="Create a NetworkPolicy with every trial.")
    kuberay: NetworkPeer = Field(
        default_factory=lambda: NetworkPeer(pod_selector={"app.kubernetes.io/name": "kuberay-operator"}),
        description="The KubeRay operator's pods (it polls a Ray trial's dashboard).",
    )
    prometheus: NetworkPeer = Field(
        default_factory=lambda: NetworkPeer(pod_selector={"app.kubernetes.io/name": "prometheus"}),
        description="Prometheus' pods (scrapes of a trial's metrics endpoints).",
    )


class OperatorSettings(_Model):
    prometheus: PrometheusSettings = Field(default_factory=PrometheusSettings)
    pushgateway_url: Optional[str] = Field(None, description="Where trials push their metrics (no default).")
    pushgateway_allowed_job_urls: list[str] = Field(
        default_factory=list,
        description="Pushgateways a job may name in spec.metrics.pushgatewayUrl, besides pushgatewayUrl "
        "(scheme, host and port, matched exactly; empty: jobs use pushgatewayUrl only).",
    )
    metrics_key_file: Optional[str] = Field(
        None,
        description="File holding the operator's secret key (the chart's Secret, mounted): each trial's metrics "
        "are signed with a key derived from it, so no other pod can score a trial. Unset: a key made at start-up "
        "(trials running across an operator restart then fail their metrics check).",
    )
    namespaces: list[str] = Field(default_factory=list, description="Watched namespaces; empty = all.")
    gpu_pool: GpuPoolSettings = Field(default_factory=GpuPoolSettings)
    trial_defaults: TrialDefaults = Field(default_factory=TrialDefaults)
    pod_security: PodSecurityBounds = Field(default_factory=PodSecurityBounds)
    kueue: KueueSettings = Field(default_factory=KueueSettings)
    network_policy: NetworkPolicySettings = Field(default_factory=NetworkPolicySettings)
    reconcile_interval: float = Field(2.0, gt=0)
    workers: int = Field(8, ge=1)
    tick_budget_seconds: float = Field(
        5.0,
        gt=0,
        description="Seconds one job's tick may spend weighing its search space before it proposes from what it "
        "weighed (condition SearchTruncated): no job holds a worker for long.",
    )
    bridge_image: str = Field(
        "ghcr.io/rltune/trial:0.1.0",
        min_length=1,
        description="Image whose rltune package the init container of a verl/OpenRLHF trial's Ray head copies "
        "the metrics bridge from (the user's image needs no rltune).",
    )

    @field_validator("pushgateway_url")
    @classmethod
    def _check_pgw(cls, v: Optional[str]) -> Optional[str]:
        return _url(v, "pushgatewayUrl")

    @field_validator("pushgateway_allowed_job_urls")
    @classmethod
    def _check_pgw_allowed(cls, v: list[str]) -> list[str]:
        return _allow_list(v, "pushgateway.allowedJobUrls")

    def missing(self) -> list[str]:
        """What an operator cannot run without (a job may still name its own URLs)."""
        return [
            f"{name} (chart value {value}, or env {env})"
            for name, ok, value, env in (
                ("the Prometheus URL", self.prometheus.url, "prometheus.url", "RLTUNE_PROMETHEUS_URL"),
                ("the Pushgateway URL", self.pushgateway_url, "pushgateway.url", "RLTUNE_PUSHGATEWAY_URL"),
            )
            if not ok
        ]


# environment variable -> (path of the field, parser)
ENV_OVERRIDES: dict[str, tuple[tuple[str, ...], Any]] = {
    "RLTUNE_PROMETHEUS_URL": (("prometheus", "url"), str),
    "RLTUNE_PROMETHEUS_BEARER_TOKEN_FILE": (("prometheus", "bearerTokenFile"), str),
    "RLTUNE_PROMETHEUS_CA_FILE": (("prometheus", "caFile"), str),
    "RLTUNE_PUSHGATEWAY_URL": (("pushgatewayUrl",), str),
    "RLTUNE_PROMETHEUS_ALLOWED_JOB_URLS": (("prometheus", "allowedJobUrls"), json.loads),
    "RLTUNE_PUSHGATEWAY_ALLOWED_JOB_URLS": (("pushgatewayAllowedJobUrls",), json.loads),
    "RLTUNE_METRICS_KEY_FILE": (("metricsKeyFile",), str),
    "RLTUNE_RECONCILE_INTERVAL": (("reconcileInterval",), float),
    "RLTUNE_WORKERS": (("workers",), int),
    "RLTUNE_TICK_BUDGET_SECONDS": (("tickBudgetSeconds",), float),
    "RLTUNE_BRIDGE_IMAGE": (("bridgeImage",), str),
    "RLTUNE_GPU_POOL_SELECTOR": (("gpuPool", "nodeSelector"), json.loads),
    "RLTUNE_POD_SECURITY": (("podSecurity",), json.loads),
    "RLTUNE_KUEUE_DEFAULT_QUEUE": (("kueue", "defaultQueue"), str),
}


class SettingsError(ValueError):
    pass


def load(path: Optional[str] = None, environ: Optional[dict[str, str]] = None) -> OperatorSettings:
    """Settings from a YAML file (the chart's ConfigMap) and then the environment overrides."""
    import yaml

    env = os.environ if environ is None else environ
    path = path or env.get("RLTUNE_CONFIG")
    raw: dict[str, Any] = {}
    if path:
        try:
            raw = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise SettingsError(f"operator config {path}: {e}") from None
        if not isinstance(raw, dict):
            raise SettingsError(f"operator config {path}: not a YAML mapping")
    for var, (keys, parse) in ENV_OVERRIDES.items():
        if env.get(var):
            try:
                value = parse(env[var])
            except ValueError as e:
                raise SettingsError(f"{var}: {e}") from None
            node = raw
            for k in keys[:-1]:
                node = node.setdefault(k, {})
            node[keys[-1]] = value
    try:
        return OperatorSettings.model_validate(raw)
    except ValueError as e:
        raise SettingsError(f"operator settings: {e}") from None


_current: Optional[OperatorSettings] = None


def current() -> OperatorSettings:
    """The settings of this process (loaded from the environment on first use)."""
    global _current
    if _current is None:
        _current = load()
    return _current


def install(s: OperatorSettings) -> None:
    """Make `s` the settings of this process (the operator's start-up does this once)."""
    global _current
    _current = s
