"""The operator's settings: the chart's settings file, env overrides, and errors that name the value."""

from __future__ import annotations

import pytest

from rltune import settings
from rltune.controller import prom


def test_defaults_without_a_file():
    s = settings.load(None, environ={})
    # no default endpoints (the test bed's ports are no production default): the operator says so
    assert s.prometheus.url is None and s.pushgateway_url is None
    assert [m.split(" (")[0] for m in s.missing()] == ["the Prometheus URL", "the Pushgateway URL"]
    assert s.namespaces == [] and s.pod_security.allow_host_path is False
    assert s.gpu_pool.tolerations == [settings.GPU_TOLERATION]


def test_file_then_env_overrides(tmp_path):
    f = tmp_path / "config.yaml"
    f.write_text(
        "prometheus:\n  url: https://prom.example:9090/\n  caFile: /etc/ca.crt\n"
        "namespaces: [team-a, team-b]\ngpuPool:\n  nodeSelector: {pool: b300}\n"
        "podSecurity: {allowHostPath: true}\n"
    )
    s = settings.load(str(f), environ={})
    assert s.prometheus.url == "https://prom.example:9090" and s.prometheus.ca_file == "/etc/ca.crt"
    assert s.namespaces == ["team-a", "team-b"] and s.gpu_pool.node_selector == {"pool": "b300"}
    assert s.pod_security.allow_host_path is True
    s = settings.load(str(f), environ={"RLTUNE_PROMETHEUS_URL": "http://other:9090"})
    assert s.prometheus.url == "http://other:9090" and s.prometheus.ca_file == "/etc/ca.crt"


@pytest.mark.parametrize(
    "text,names",
    [
        ("prometheus: {url: prom:9090}\n", "prometheus.url"),
        ("pushgatewayUrl: pgw:9091\n", "pushgatewayUrl"),
        ("podSecurity: {allowHostpath: true}\n", "allowHostpath"),
        ("workers: 0\n", "workers"),
        ("tickBudgetSeconds: 0\n", "tickBudgetSeconds"),
        ("- a\n- b\n", "not a YAML mapping"),
    ],
)
def test_bad_settings_name_the_value(tmp_path, text, names):
    f = tmp_path / "config.yaml"
    f.write_text(text)
    with pytest.raises(settings.SettingsError, match=names.replace(".", r"\.")):
        settings.load(str(f), environ={})


def test_the_tick_budget_is_a_setting_with_an_env_override():
    assert settings.load(None, environ={}).tick_budget_seconds == 5.0
    assert settings.load(None, environ={"RLTUNE_TICK_BUDGET_SECONDS": "2.5"}).tick_budget_seconds == 2.5


def test_bad_env_override_names_the_variable():
    with pytest.raises(settings.SettingsError, match="RLTUNE_POD_SECURITY"):
        settings.load(None, environ={"RLTUNE_POD_SECURITY": "{not json"})


def test_prometheus_token_goes_only_to_the_operators_own_prometheus(tmp_path):
    tok = tmp_path / "token"
    tok.write_text("s3cret\n")
    old = settings._current
    try:
        settings.install(
            settings.OperatorSettings.model_validate(
                {"prometheus": {"url": "https://prom.example:9090", "bearerTokenFile": str(tok), "caFile": "/ca.crt"}}
            )
        )
        opts = prom._auth("https://prom.example:9090")
        assert opts["headers"]["Authorization"] == "Bearer s3cret" and opts["ca_file"] == "/ca.crt"
        # a job that names its own Prometheus never receives the operator's token
        assert prom._auth("https://attacker.example:9090") == {}
        tok.unlink()
        with pytest.raises(prom.MetricsError, match="bearerTokenFile"):
            prom._auth("https://prom.example:9090")
    finally:
        settings._current = old


def test_operator_refuses_to_start_unconfigured(monkeypatch, capsys):
    from rltune.controller import run

    for var in ("RLTUNE_PROMETHEUS_URL", "RLTUNE_PUSHGATEWAY_URL", "RLTUNE_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    p = run.argparse.ArgumentParser()
    run.add_arguments(p)
    assert run.run(p.parse_args([])) == 2
    err = capsys.readouterr().err
    assert "prometheus.url" in err and "RLTUNE_PUSHGATEWAY_URL" in err
