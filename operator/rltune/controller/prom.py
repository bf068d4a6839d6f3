"""Read a trial's per-step metrics from Prometheus (HTTP API, PromQL) and delete Pushgateway groups.

A trial is judged only on what it exported: the operator rebuilds the StepRecords with the metrics
contract's records_from_samples from one instant query per trial.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Optional
from urllib.parse import quote

import requests

from ..api.metrics import PUSH_JOB, STEP_METRICS, StepRecord, name, records_from_samples
from ..settings import current as settings


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


def _auth(prom: str) -> dict[str, Any]:
    """requests options for the operator's own Prometheus: its bearer token and CA (managed
    Prometheus services). Never for a URL a job named itself: a job must not be able to make the
    operator send its token to a server of the job author's choosing."""
    s = settings().prometheus
    if not s.url or prom.rstrip("/") != s.url.rstrip("/"):
        return {}
    opts: dict[str, Any] = {}
    if s.bearer_token_file:
        try:  # re-read on every call: mounted tokens rotate
            opts["headers"] = {"Authorization": "Bearer " + Path(s.bearer_token_file).read_text().strip()}
        except OSError as e:
            raise MetricsError(f"prometheus.bearerTokenFile {s.bearer_token_file}: {e}") from None
    if s.ca_file:
        opts["verify"] = s.ca_file
    return opts


def _q(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"')


def trial_query(namespace: str, job: str, trial: str, overrides: Optional[dict[str, str]] = None) -> str:
    names = sorted({name(c, overrides) for c in STEP_METRICS})
    regex = "|".join(re.escape(n) for n in names)
    return f'{{__name__=~"{_q(regex)}", namespace="{_q(namespace)}", rltune_job="{_q(job)}", trial="{_q(trial)}"}}'


class MetricsError(RuntimeError):
    pass


def query_trial(
    prom: str, namespace: str, job: str, trial: str, overrides: Optional[dict[str, str]] = None, timeout: float = 10.0
) -> list[StepRecord]:
    """Every step the trial has reported so far (warm-up steps included, flagged)."""
    try:
        r = requests.get(
            f"{prom}/api/v1/query",
            params={"query": trial_query(namespace, job, trial, overrides)},
            timeout=timeout,
            **_auth(prom),
        )
        r.raise_for_status()
        body = r.json()
    except (requests.RequestException, ValueError) as e:
        raise MetricsError(f"Prometheus at {prom} unreachable: {e}") from e
    if body.get("status") != "success":
        raise MetricsError(f"Prometheus query failed: {body.get('error', body)}")
    samples = []
    for series in body["data"]["result"]:
        labels = dict(series["metric"])
        metric = labels.pop("__name__", "")
        samples.append((metric, labels, float(series["value"][1])))
    return records_from_samples(samples, overrides)


def delete_group(pgw: str, namespace: str, job: str, trial: str, timeout: float = 5.0) -> bool:
    path = "/".join(
        f"{k}/{quote(v, safe='')}"
        for k, v in (("job", PUSH_JOB), ("namespace", namespace), ("rltune_job", job), ("trial", trial))
    )
    try:
        r = requests.delete(f"{pgw}/metrics/{path}", timeout=timeout)
        return r.status_code in (200, 202, 404)
    except requests.RequestException:
        return False


def trial_reason(
    prom: str, namespace: str, job: str, trial: str, overrides: Optional[dict[str, str]] = None, timeout: float = 5.0
) -> Optional[str]:
    """The failure reason a trial exported (rltune_trial_info's `reason` label), if any."""
    q = (
        f'{name("trial_info", overrides)}{{namespace="{_q(namespace)}", rltune_job="{_q(job)}", '
        f'trial="{_q(trial)}", reason!=""}}'
    )
    try:
        r = requests.get(f"{prom}/api/v1/query", params={"query": q}, timeout=timeout, **_auth(prom))
        r.raise_for_status()
        res = r.json()["data"]["result"]
    except (requests.RequestException, ValueError, KeyError, MetricsError):
        return None
    return res[0]["metric"].get("reason") if res else None
