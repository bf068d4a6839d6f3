"""The trial's metrics exporter: rltune's metric contract (rltune.api.metrics, docs/metrics.md).

Every series carries the labels namespace, rltune_job, trial; per-step gauges add `step` (and
`phase` for rltune_step_phase_seconds). The registry is served over HTTP when a metrics port is
set (scrape mode) and pushed to the Pushgateway under the grouping key
{job="rltune-trial", namespace, rltune_job, trial} when a Pushgateway URL is set (push mode).
With a signing key (env RLTUNE_METRICS_KEY, given to the trial's pods only) each step's samples
and the failure reason are signed (api/metrics.py 'Signed'): the operator scores nothing else.
"""

from __future__ import annotations

import sys
import time
from typing import Optional

from prometheus_client import CollectorRegistry, Counter, Gauge, push_to_gateway, start_http_server

from rltune.api import metrics
from rltune.api.metrics import StepRecord

BASE_LABELS = ("namespace", "rltune_job", "trial")


class TrialExporter:
    def __init__(
        self,
        namespace: str,
        job: str,
        trial: str,
        mode: str = "twin",
        pushgateway_url: Optional[str] = None,
        metrics_port: Optional[int] = None,
        push_interval: float = 0.2,
        names: Optional[dict] = None,
        bind: str = "0.0.0.0",
        signing_key: Optional[str] = None,
    ):
        self.labels = {"namespace": namespace, "rltune_job": job, "trial": trial}
        self.signing_key = signing_key or ""
        self.mode = mode
        self.pushgateway_url = pushgateway_url
        self.metrics_port = metrics_port
        self.push_interval = push_interval
        self.bind = bind
        self.registry = CollectorRegistry()
        self._last_push = 0.0
        self._dirty = False
        self.push_errors = 0
        reg = self.registry
        self.step_gauges: dict[str, Gauge] = {}
        for contract, help_text in metrics.STEP_METRICS.items():
            extra = ("step", "phase") if contract == "step_phase_seconds" else ("step",)
            self.step_gauges[contract] = Gauge(
                metrics.name(contract, names), help_text, BASE_LABELS + extra, registry=reg
            )
        steps_name = metrics.name("trial_steps_total", names)
        self.steps = Counter(
            steps_name[:-6] if steps_name.endswith("_total") else steps_name,
            metrics.TRIAL_METRICS["trial_steps_total"],
            BASE_LABELS,
            registry=reg,
        )
        self.gpus = Gauge(
            metrics.name("trial_gpus", names), metrics.TRIAL_METRICS["trial_gpus"], BASE_LABELS, registry=reg
        )
        self.state = Gauge(
            metrics.name("trial_state", names), metrics.TRIAL_METRICS["trial_state"], BASE_LABELS, registry=reg
        )
        self.info = Gauge(
            metrics.name("trial_info", names),
            metrics.TRIAL_METRICS["trial_info"],
            BASE_LABELS + ("mode", "reason", "signature"),
            registry=reg,
        )
        self.signature = Gauge(
            metrics.SIGNATURE, metrics.SIGNATURE_HELP, BASE_LABELS + ("step", "signature"), registry=reg
        )
        self.steps.labels(**self.labels)  # export 0 before the first step
        self.state.labels(**self.labels).set(metrics.TRIAL_RUNNING)
        self.info.labels(**self.labels, mode=mode, reason="", signature="").set(1)

    # ------------------------------------------------------------------ serving
    def serve(self) -> None:
        if self.metrics_port:
            start_http_server(int(self.metrics_port), addr=self.bind, registry=self.registry)

    def grouping_key(self) -> dict:
        return dict(self.labels)

    def push(self, force: bool = False) -> None:
        if not self.pushgateway_url:
            return
        now = time.monotonic()
        if not force and now - self._last_push < self.push_interval:
            self._dirty = True
            return
        try:
            push_to_gateway(
                self.pushgateway_url,
                job=metrics.PUSH_JOB,
                registry=self.registry,
                grouping_key=self.grouping_key(),
                timeout=10,
            )
            self._dirty = False
        except Exception as e:  # keep training; report on stdout (stderr is reserved for the failure line)
            self.push_errors += 1
            if self.push_errors <= 3:
                print(f"rltune-trial: warning: push to {self.pushgateway_url} failed: {e}", file=sys.stdout, flush=True)
        self._last_push = time.monotonic()

    # ------------------------------------------------------------------ recording
    def set_gpus(self, gpus: float) -> None:
        self.gpus.labels(**self.labels).set(gpus)

    def record(self, rec: StepRecord) -> None:
        lab = dict(self.labels, step=str(rec.step))
        values = step_values(rec)
        for contract, phase, value in values:
            gauge = self.step_gauges[contract]
            (gauge.labels(**lab, phase=phase) if phase else gauge.labels(**lab)).set(value)
        if self.signing_key:
            sig = metrics.step_signature(self.signing_key, self.labels, rec.step, values)
            self.signature.labels(**lab, signature=sig).set(1)
        self.steps.labels(**self.labels).inc()
        self.push()

    def finish(self, ok: bool, reason: str = "") -> None:
        self.state.labels(**self.labels).set(metrics.TRIAL_SUCCEEDED if ok else metrics.TRIAL_FAILED)
        if reason:
            self.info.remove(
                self.labels["namespace"], self.labels["rltune_job"], self.labels["trial"], self.mode, "", ""
            )
            why = _label(reason)
            sig = metrics.reason_signature(self.signing_key, self.labels, why) if self.signing_key else ""
            self.info.labels(**self.labels, mode=self.mode, reason=why, signature=sig).set(1)
        self.push(force=True)


def step_values(rec: StepRecord) -> list[tuple[str, str, float]]:
    """(contract, phase or "", value) of every per-step sample the exporter sets for `rec`."""
    out = [("step_duration_seconds", "", float(rec.duration))]
    out += [("step_phase_seconds", ph, float(rec.phases.get(ph, 0.0))) for ph in metrics.PHASES]
    out += [(c, "", float(getattr(rec, attr))) for c, attr in metrics.STEP_FIELDS.items()]
    out.append(("step_warmup", "", 1.0 if rec.warmup else 0.0))
    return out


def _label(reason: str) -> str:
    one = " ".join(reason.split())
    return one[:240]
