"""Read a trial's per-step metrics from Prometheus (HTTP API, PromQL) and delete Pushgateway groups.

A trial is judged only on what it exported and signed: the operator rebuilds the StepRecords with
the metrics contract's records_from_samples from one instant query per trial, over the steps whose
signature verifies with the trial's key (api/metrics.py 'Signed'). Every call is bounded
(bounded_http: a total deadline, a size cap, no redirects) and fails with rltune's own words; a
query names metrics only by `__name__` with escaped values, so nothing a job writes shapes it.
"""

from __future__ import annotations

import hmac
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional
from urllib.parse import quote

from ..api.metrics import PUSH_JOB, SIGNATURE, STEP_METRICS, StepRecord, name, reason_signature, records_from_samples
from ..api.metrics import verified as verified_samples
from ..settings import current as settings
from .bounded_http import HttpError, meaning, request

REASON_MAX = 240  # characters of a trial's exported failure reason kept


def prometheus_url(spec_url: Optional[str]) -> str:
    url = spec_url or settings().prometheus.url
    if not url:
        raise MetricsError(
            "no Prometheus URL: set the chart value prometheus.url (env RLTUNE_PROMETHEUS_URL) "
            "or the job's spec.metrics.prometheusUrl"
        )
    return url.rstrip("/")


def pushgateway_url(spec_url: Optional[str]) -> Optional[str]:
    url = spec_url or settings().pushgateway_url
    return url.rstrip("/") if url else None


def _own(prom: str) -> bool:
    s = settings().prometheus
    return bool(s.url) and prom.rstrip("/") == s.url.rstrip("/")


def _auth(prom: str) -> dict[str, Any]:
    """Request options for the operator's own Prometheus: its bearer token and CA (managed
    Prometheus services). Never for a URL a job named itself: a job must not be able to make the
    operator send its token to a server of the job author's choosing."""
    s = settings().prometheus
    if not _own(prom):
        return {}
    opts: dict[str, Any] = {}
    if s.bearer_token_file:
        try:  # re-read on every call: mounted tokens rotate
            opts["headers"] = {"Authorization": "Bearer " + Path(s.bearer_token_file).read_text().strip()}
        except OSError as e:
            raise MetricsError(f"prometheus.bearerTokenFile {s.bearer_token_file}: {e.strerror}") from None
    if s.ca_file:
        opts["ca_file"] = s.ca_file
    return opts


def _q(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _selector(names: list[str], namespace: str, job: str, trial: str, extra: str = "") -> str:
    regex = "|".join(re.escape(n) for n in sorted(set(names)))
    return (
        f'{{__name__=~"{_q(regex)}", namespace="{_q(namespace)}", rltune_job="{_q(job)}", trial="{_q(trial)}"{extra}}}'
    )


def trial_query(namespace: str, job: str, trial: str, overrides: Optional[dict[str, str]] = None) -> str:
    return _selector([name(c, overrides) for c in STEP_METRICS] + [SIGNATURE], namespace, job, trial)


class MetricsError(RuntimeError):
    pass


@dataclass(frozen=True)
class TrialSteps:
    steps: list[StepRecord]  # the steps whose signature verified
    forged: int  # steps seen with no valid signature (ignored)


def _where(prom: str) -> str:
    return "the operator's Prometheus" if _own(prom) else "the job's Prometheus (spec.metrics.prometheusUrl)"


def _query(prom: str, query: str, timeout: float) -> list[dict]:
    """The result vector of an instant query, or MetricsError in rltune's words."""
    where = _where(prom)
    try:
        r = request("GET", f"{prom}/api/v1/query", params={"query": query}, deadline=timeout, what=where, **_auth(prom))
    except HttpError as e:
        raise MetricsError(str(e)) from None
    try:
        body = json.loads(r.body)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise MetricsError(f"{where} answered HTTP {r.status} without a Prometheus API answer ({meaning(r.status)})")
    if r.status != 200 or body.get("status") != "success":
        kind = body.get("errorType")
        kind = kind if kind in ("bad_data", "timeout", "canceled", "execution", "internal", "unavailable") else None
        raise MetricsError(
            f"{where} refused the query: HTTP {r.status} ({meaning(r.status)})"
            + (f", error type {kind}" if kind else "")
        )
    data = body.get("data")
    result = data.get("result") if isinstance(data, dict) else None
    if not isinstance(result, list):
        raise MetricsError(f"{where} answered a query without a result vector")
    return result


def _samples(result: list[dict]) -> list[tuple[str, dict, float]]:
    out = []
    for series in result:
        try:
            labels = {str(k): str(v) for k, v in dict(series["metric"]).items()}
            value = float(series["value"][1])
        except (KeyError, TypeError, ValueError, IndexError):
            continue
        out.append((labels.pop("__name__", ""), labels, value))
    return out


def query_trial(
    prom: str,
    namespace: str,
    job: str,
    trial: str,
    key: str,
    overrides: Optional[dict[str, str]] = None,
    timeout: float = 10.0,
) -> TrialSteps:
    """Every signed step the trial has reported so far (warm-up steps included, flagged)."""
    result = _query(prom, trial_query(namespace, job, trial, overrides), timeout)
    v = verified_samples(_samples(result), key, overrides)
    return TrialSteps(records_from_samples(v.samples, overrides), v.forged)


def delete_group(pgw: str, namespace: str, job: str, trial: str, timeout: float = 5.0) -> bool:
    path = "/".join(
        f"{k}/{quote(v, safe='')}"
        for k, v in (("job", PUSH_JOB), ("namespace", namespace), ("rltune_job", job), ("trial", trial))
    )
    try:
        r = request("DELETE", f"{pgw}/metrics/{path}", deadline=timeout, max_bytes=1 << 16, what="the Pushgateway")
        return r.status in (200, 202, 404)
    except HttpError:
        return False


def trial_reason(
    prom: str,
    namespace: str,
    job: str,
    trial: str,
    key: str,
    overrides: Optional[dict[str, str]] = None,
    timeout: float = 5.0,
) -> Optional[str]:
    """The failure reason the trial exported and signed (rltune_trial_info's `reason` label), if any."""
    q = _selector([name("trial_info", overrides)], namespace, job, trial, ', reason!=""')
    try:
        result = _query(prom, q, timeout)
    except MetricsError:
        return None
    labels = {"namespace": namespace, "rltune_job": job, "trial": trial}
    for _, lab, _ in _samples(result):
        reason = lab.get("reason", "")[:REASON_MAX]
        want = reason_signature(key, labels, lab.get("reason", ""))
        if reason and hmac.compare_digest(lab.get("signature", ""), want):
            return "".join(ch if ch.isprintable() else " " for ch in reason)
    return None
