"""Which HTTP endpoints a job may make the operator talk to: a cluster admin's decision.

A URL in a job's spec (`spec.metrics.prometheusUrl`, `pushgatewayUrl`) is written by a tenant who
may be hostile. The operator would GET it with its own network position (the node's metadata
service, another team's Ray head, any in-cluster JSON API) and DELETE on it at teardown. So a
job-named URL is accepted only when it names exactly, on scheme, host and port, an endpoint the
admin listed in the chart (`prometheus.allowedJobUrls`, `pushgateway.allowedJobUrls`) or the
chart's own. The CRD already refuses user info, paths, queries and fragments (api.models.URL_PATTERN),
so an allowed URL is one of a handful of strings an admin wrote. Loopback, link-local and metadata
addresses get a message of their own, and pass only when listed.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Optional
from urllib.parse import urlsplit

from ..settings import OperatorSettings

# cloud metadata services reached by name (their addresses are link-local and caught as such)
METADATA_HOSTS = frozenset({"metadata", "metadata.google.internal", "metadata.azure.com", "instance-data"})


@dataclass(frozen=True)
class Endpoint:
    """The parts of a URL that decide where a request goes."""

    scheme: str
    host: str
    port: int

    @classmethod
    def of(cls, url: str) -> Optional["Endpoint"]:
        try:
            u = urlsplit(url.strip())
            port = u.port or (443 if u.scheme == "https" else 80)
        except ValueError:
            return None
        if u.scheme not in ("http", "https") or not u.hostname:
            return None
        return cls(u.scheme, u.hostname.lower().rstrip("."), port)

    def special(self) -> str:
        """'' for an ordinary host, else what makes it special (loopback, link-local, metadata)."""
        if self.host in METADATA_HOSTS or self.host == "localhost" or self.host.endswith(".localhost"):
            return "a loopback or cloud metadata address"
        try:
            ip = ipaddress.ip_address(self.host)
        except ValueError:
            return ""
        if ip.is_loopback or ip.is_unspecified:
            return "a loopback address"
        if ip.is_link_local:
            return "a link-local address (where cloud metadata services answer)"
        return ""


@dataclass(frozen=True)
class EndpointKind:
    field: str  # the job's field
    chart_value: str  # the chart value listing what jobs may name
    what: str


PROMETHEUS = EndpointKind("spec.metrics.prometheusUrl", "prometheus.allowedJobUrls", "Prometheus")
PUSHGATEWAY = EndpointKind("spec.metrics.pushgatewayUrl", "pushgateway.allowedJobUrls", "Pushgateway")


def allowed(kind: EndpointKind, settings: OperatorSettings) -> list[str]:
    """The operator's own endpoint of this kind first, then the ones jobs may name."""
    if kind is PROMETHEUS:
        own, listed = settings.prometheus.url, settings.prometheus.allowed_job_urls
    else:
        own, listed = settings.pushgateway_url, settings.pushgateway_allowed_job_urls
    return [u for u in [own, *listed] if u]


def problem(kind: EndpointKind, url: Optional[str], settings: OperatorSettings) -> Optional[str]:
    """Why a job may not name `url` for `kind` (None: it may, or it names none)."""
    if not url:
        return None
    ep = Endpoint.of(url)
    if ep is not None and any(Endpoint.of(a) == ep for a in allowed(kind, settings)):
        return None
    special = ep.special() if ep else ""
    shown = url[:80]
    return (
        f"{kind.field}: {shown!r} is "
        + (f"{special}, and it is " if special else "")
        + f"not a {kind.what} endpoint a cluster admin allows jobs to name; remove it to use the operator's own, "
        f"or a cluster admin adds it to the chart value {kind.chart_value}"
    )


def problems(prometheus_url: Optional[str], pushgateway_url: Optional[str], settings: OperatorSettings) -> list[str]:
    return [
        p for p in (problem(PROMETHEUS, prometheus_url, settings), problem(PUSHGATEWAY, pushgateway_url, settings)) if p
    ]
