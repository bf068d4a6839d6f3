"""What a hostile tenant can make the operator do over HTTP, and what it can make it say.

Real sockets on the loopback (servers made here that drip, flood, redirect or answer secrets),
the operator's own functions: the allow-list of job-named endpoints, the bounded HTTP call, the
Prometheus reads and their error messages, metric names as names, and the signed metric contract.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest

from loopback import Loopback, Quiet
from rltune.api import metrics as metrics_contract
from rltune.api.models import RLTuningJobSpec, url_problem
from rltune.controller import bounded_http, endpoints, prom
from rltune.controller.reconcile import InvalidSpec, preflight, validate_spec
from rltune.settings import OperatorSettings

MARKER = "AKIAMARKER-SECRET-7f3a"  # what a fake metadata server answers: must never reach a message


class Server(Loopback):
    """A loopback HTTP server whose handler is `handle(request_handler)`; counts requests."""

    def __init__(self, handle):
        self.requests = 0
        self.sent = 0
        self.closed_early = threading.Event()
        outer = self

        class H(Quiet):
            def do_GET(self):  # noqa: N802
                outer.requests += 1
                handle(self, outer)

            do_DELETE = do_GET  # noqa: N815

        super().__init__(H)


@pytest.fixture
def serve():
    made = []

    def make(handle):
        s = Server(handle)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def _answer(h, status: int, body: bytes, headers: dict | None = None):
    h.send_response(status)
    for k, v in (headers or {}).items():
        h.send_header(k, v)
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


# ------------------------------------------------------------------ bounded calls


def test_a_dripping_server_is_cut_at_the_deadline(serve):
    """A byte every 0.2 s for 10 s: the call fails at its 1 s deadline and closes the connection, so
    the server sees the close long before it has sent its 50 bytes (a per-read timeout never would)."""

    def drip(h, srv):
        h.send_response(200)
        h.send_header("Content-Length", "50")
        h.end_headers()
        h.wfile.flush()
        try:
            for _ in range(50):
                time.sleep(0.2)
                h.wfile.write(b"x")
                h.wfile.flush()
                srv.sent += 1
        except OSError:
            srv.closed_early.set()

    srv = serve(drip)
    with pytest.raises(bounded_http.HttpError) as e:
        bounded_http.request("GET", srv.url + "/api/v1/query", deadline=1.0, what="the operator's Prometheus")
    assert "did not answer within 1 s" in str(e.value)
    assert srv.closed_early.wait(5), f"the server sent {srv.sent} bytes and never saw the connection close"
    assert srv.sent < 25


def test_a_huge_answer_is_dropped_at_the_cap(serve):
    def flood(h, srv):
        h.send_response(200)
        h.end_headers()
        try:
            for _ in range(64):
                h.wfile.write(b"{" * (1 << 20))
                srv.sent += 1
        except OSError:
            srv.closed_early.set()

    srv = serve(flood)
    with pytest.raises(bounded_http.HttpError) as e:
        bounded_http.request("GET", srv.url, max_bytes=4 * bounded_http.MiB, what="the Pushgateway")
    assert "more than 4 MiB" in str(e.value)
    assert srv.closed_early.wait(5) and srv.sent < 64


def test_redirects_are_not_followed(serve):
    target = serve(lambda h, srv: _answer(h, 200, b"{}"))
    hop = serve(lambda h, srv: _answer(h, 302, b"", {"Location": target.url + "/latest/meta-data/"}))
    r = bounded_http.request("GET", hop.url)
    assert r.status == 302 and target.requests == 0


def test_a_server_error_body_never_reaches_the_message(serve, monkeypatch):
    srv = serve(lambda h, srv: _answer(h, 500, f'{{"status":"error","error":"{MARKER}"}}'.encode()))
    monkeypatch.setattr(prom, "settings", lambda: OperatorSettings(prometheus={"url": srv.url}))
    with pytest.raises(prom.MetricsError) as e:
        prom.query_trial(srv.url, "ns", "job", "t1", key="k")
    assert MARKER not in str(e.value) and "HTTP 500" in str(e.value) and "the operator's Prometheus" in str(e.value)
    # a 200 that is not Prometheus (a metadata service's JSON): still no body in the message
    srv2 = serve(lambda h, srv: _answer(h, 200, f'{{"AccessKeyId":"{MARKER}"}}'.encode()))
    with pytest.raises(prom.MetricsError) as e:
        prom.query_trial(srv2.url, "ns", "job", "t1", key="k")
    assert MARKER not in str(e.value)
    assert prom.trial_reason(srv2.url, "ns", "job", "t1", key="k") is None


def test_connection_errors_are_rltunes_words():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    with pytest.raises(bounded_http.HttpError) as e:
        bounded_http.request("GET", f"http://127.0.0.1:{port}/x", deadline=2, what="the Pushgateway")
    assert str(e.value) == "the Pushgateway refused the connection"


# ------------------------------------------------------------------ job-named endpoints


def _job(**metrics) -> dict:
    from test_validation import demo  # the demo job as a dict

    raw = demo()
    raw["metrics"] = metrics
    return raw


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/iam/security-credentials/node-role#",
        "http://user:pw@prometheus.monitoring:9090",
        "http://prometheus.monitoring:9090/api/v1/query?query=up",
        "http://prometheus.monitoring:9090#",
    ],
)
def test_urls_with_more_than_a_host_are_refused_by_the_model(url):
    assert url_problem(url)
    with pytest.raises(InvalidSpec) as e:
        validate_spec(_job(prometheusUrl=url))
    assert "spec.metrics.prometheusUrl" in str(e.value)


@pytest.mark.parametrize(
    "url, special",
    [
        ("http://169.254.169.254", "link-local"),
        ("http://127.0.0.1:9090", "loopback"),
        ("http://metadata.google.internal", "metadata"),
        ("http://ray-head.team-b.svc:8265", ""),
        ("http://prometheus-pushgateway.monitoring:9091", ""),
    ],
)
def test_a_job_may_name_only_what_the_admin_listed(url, special):
    s = OperatorSettings(prometheus={"url": "http://prometheus-operated.monitoring.svc:9090"})
    spec = RLTuningJobSpec.model_validate(_job(prometheusUrl=url, pushgatewayUrl=url))
    with pytest.raises(InvalidSpec) as e:
        preflight(spec, s)
    msg = str(e.value)
    assert e.value.reason == "EndpointNotAllowed"
    assert "spec.metrics.prometheusUrl" in msg and "prometheus.allowedJobUrls" in msg
    assert "spec.metrics.pushgatewayUrl" in msg and "pushgateway.allowedJobUrls" in msg
    assert special in msg
    # listed by the admin (scheme, host and port exactly): allowed; another port is not
    ok = OperatorSettings(prometheus={"allowedJobUrls": [url]}, pushgatewayAllowedJobUrls=[url + "/"])
    assert endpoints.problems(url, url, ok) == []


def test_the_operators_own_endpoints_may_be_named():
    s = OperatorSettings(prometheus={"url": "http://Prom.Monitoring:80/"}, pushgatewayUrl="http://pgw:9091")
    assert endpoints.problems("http://prom.monitoring", "http://pgw:9091", s) == []
    assert endpoints.problems("https://prom.monitoring", None, s)  # another scheme is another endpoint
    assert endpoints.problems("http://prom.monitoring:8080", None, s)  # and another port


def test_settings_refuse_an_allow_list_entry_with_a_path():
    with pytest.raises(ValueError, match=r"prometheus.allowedJobUrls\[0\]"):
        OperatorSettings(prometheus={"allowedJobUrls": ["http://p:9090/api/v1"]})


# ------------------------------------------------------------------ metric names are names


@pytest.mark.parametrize(
    "bad",
    [
        'label_replace(kube_secret_info{namespace="team-b"},"reason","$1","secret","(.+)") or rltune_trial_info',
        "up or vector(1)",
        'x{a="b"}',
        "0starts_with_digit",
    ],
)
def test_metric_names_must_be_prometheus_names(bad):
    with pytest.raises(InvalidSpec) as e:
        validate_spec(_job(names={"trial_info": bad}))
    assert "spec.metrics.names" in str(e.value) and "not a Prometheus metric name" in str(e.value)


def test_queries_select_by_name_with_escaped_values():
    q = prom.trial_query('ns"x', "job\\", "t1", {"step_duration_seconds": "my:step_seconds"})
    assert q.startswith('{__name__=~"') and 'namespace="ns\\"x"' in q and 'rltune_job="job\\\\"' in q
    assert "my:step_seconds" in q and metrics_contract.SIGNATURE in q


# ------------------------------------------------------------------ signed metrics


def _step_samples(labels: dict, step: int, duration: float, key: str | None) -> list:
    lab = dict(labels, step=str(step))
    values = [("step_duration_seconds", "", duration), ("step_phase_seconds", "generation", duration / 2)]
    out = [(metrics_contract.name(c), dict(lab, phase=ph) if ph else dict(lab), v) for c, ph, v in values]
    if key is not None:
        out.append(
            (
                metrics_contract.SIGNATURE,
                dict(lab, signature=metrics_contract.step_signature(key, labels, step, values)),
                1.0,
            )
        )
    return out


def test_only_steps_signed_with_the_trials_key_are_scored():
    labels = {"namespace": "team-b", "rltune_job": "tune", "trial": "t1", "job": "rltune-trial"}
    key = metrics_contract.trial_key(b"operator secret", "team-b", "uid-b", "t1")
    real = _step_samples(labels, 0, 300.0, key) + _step_samples(labels, 1, 290.0, key)
    # team A's pod pushes an absurdly fast step under B's labels, in its own group and unsigned
    spoof = _step_samples(dict(labels, instance="a"), 2, 1.0, None)
    # ... or signed with a key it made up, or B's valid signature on a changed value
    forged = _step_samples(dict(labels, instance="b"), 3, 1.0, "guessed")
    tampered = [(n, dict(lab, instance="c"), v) for n, lab, v in _step_samples(labels, 1, 290.0, key)]
    tampered[0] = (tampered[0][0], tampered[0][1], 1.0)  # B's signature, a faster duration
    v = metrics_contract.verified(real + spoof + forged + tampered, key)
    recs = metrics_contract.records_from_samples(v.samples)
    assert [(r.step, r.duration) for r in recs] == [(0, 300.0), (1, 290.0)]
    assert v.forged == 3
    # another trial's key (or another job of the same name: another UID) verifies nothing
    assert (
        metrics_contract.verified(
            real, metrics_contract.trial_key(b"operator secret", "team-b", "uid-b2", "t1")
        ).samples
        == []
    )


def test_the_exporters_signature_survives_the_text_format():
    """The trial's exporter signs what it exports: its samples, read back as text and parsed as the
    operator's query would see them, verify."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from rltune.trial.exporter import TrialExporter

    key = metrics_contract.trial_key(b"s" * 32, "ns", "uid", "t1")
    ex = TrialExporter("ns", "job", "t1", signing_key=key)
    ex.record(
        metrics_contract.StepRecord(step=0, duration=0.1 + 0.2, phases={"generation": 1 / 3}, reward=0.1, warmup=True)
    )
    ex.finish(ok=False, reason="CUDA out of memory")
    samples = [
        (s.name, dict(s.labels), s.value)
        for fam in text_string_to_metric_families(generate_latest(ex.registry).decode())
        for s in fam.samples
    ]
    recs = metrics_contract.records_from_samples(metrics_contract.verified(samples, key).samples)
    assert len(recs) == 1 and recs[0].duration == 0.1 + 0.2 and recs[0].warmup
    info = next(lab for n, lab, _ in samples if n == "rltune_trial_info" and lab["reason"])
    assert info["signature"] == metrics_contract.reason_signature(
        key, {"namespace": "ns", "rltune_job": "job", "trial": "t1"}, info["reason"]
    )


def test_the_bridges_signature_verifies():
    from prometheus_client.parser import text_string_to_metric_families

    from rltune.adapters.bridge import TrialMetrics

    key = metrics_contract.trial_key(b"s" * 32, "ns", "uid", "t1")
    tm = TrialMetrics("ns", "job", "t1", warmup_steps=1, signing_key=key)
    tm.add(
        metrics_contract.StepRecord(step=7, duration=12.25, phases={"generation": 9.5}),
        frozenset({"step_kv_cache_usage_ratio"}),
    )
    tm.add(metrics_contract.StepRecord(step=8, duration=11.0, phases={"generation": 8.0}), frozenset())
    samples = [
        (s.name, dict(s.labels), s.value) for fam in text_string_to_metric_families(tm.render()) for s in fam.samples
    ]
    v = metrics_contract.verified(samples, key)
    assert [r.duration for r in metrics_contract.records_from_samples(v.samples)] == [12.25, 11.0] and v.forged == 0
    assert metrics_contract.verified(samples, "another").forged == 2
