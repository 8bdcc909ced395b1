from __future__ import annotations

import pytest

from raylens.lens import TelemetryConfig


def test_defaults_from_empty_environment() -> None:
    config = TelemetryConfig.from_env({})
    assert config.enabled is True
    assert config.exporter == "none"
    assert config.prometheus_addr == "127.0.0.1:9464"
    assert config.prometheus_host_port == ("127.0.0.1", 9464)
    assert config.service_name == "raylens"
    assert config.export_interval_ms == 60_000
    assert config.otlp_endpoint == "http://localhost:4318/v1/metrics"


def test_reads_every_variable() -> None:
    config = TelemetryConfig.from_env(
        {
            "RAYLENS_TELEMETRY": "off",
            "RAYLENS_EXPORTER": "Prometheus",
            "RAYLENS_PROMETHEUS_ADDR": "0.0.0.0:9100",
            "OTEL_SERVICE_NAME": "trainer",
            "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod, team=rl%20infra",
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/",
            "OTEL_METRIC_EXPORT_INTERVAL": "5000",
        }
    )
    assert config.enabled is False
    assert config.exporter == "prometheus"
    assert config.prometheus_host_port == ("0.0.0.0", 9100)
    assert config.service_name == "trainer"
    assert config.resource_attributes == {"deployment.environment": "prod", "team": "rl infra"}
    assert config.otlp_endpoint == "http://collector:4318/v1/metrics"
    assert config.export_interval_ms == 5000


def test_an_otlp_endpoint_makes_otlp_the_default_exporter() -> None:
    config = TelemetryConfig.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})
    assert config.exporter == "otlp"


def test_the_metrics_specific_endpoint_is_used_as_is() -> None:
    config = TelemetryConfig.from_env(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://base:4318",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://m:4318/custom",
        }
    )
    assert config.otlp_endpoint == "http://m:4318/custom"


def test_ipv6_prometheus_address() -> None:
    config = TelemetryConfig.from_env({"RAYLENS_PROMETHEUS_ADDR": "[::1]:9464"})
    assert config.prometheus_host_port == ("::1", 9464)


@pytest.mark.parametrize(
    ("variable", "value", "allowed"),
    [
        ("RAYLENS_EXPORTER", "jaeger", "console, otlp, prometheus, none"),
        ("RAYLENS_TELEMETRY", "maybe", "on, off"),
        ("RAYLENS_PROMETHEUS_ADDR", "localhost", "host:port"),
        ("RAYLENS_PROMETHEUS_ADDR", "localhost:99999", "0 to 65535"),
        ("OTEL_METRIC_EXPORT_INTERVAL", "soon", "positive whole number"),
        ("OTEL_METRIC_EXPORT_INTERVAL", "0", "positive whole number"),
        ("OTEL_RESOURCE_ATTRIBUTES", "novalue", "key=value"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318", "http"),
    ],
)
def test_bad_values_name_variable_value_and_what_is_allowed(
    variable: str, value: str, allowed: str
) -> None:
    with pytest.raises(ValueError) as error:
        TelemetryConfig.from_env({variable: value})
    message = str(error.value)
    assert variable in message
    assert repr(value) in message
    assert allowed in message


def test_constructor_rejects_unknown_exporter() -> None:
    with pytest.raises(ValueError, match=r"'stdout'.*allowed: console, otlp, prometheus, none"):
        TelemetryConfig(exporter="stdout")


def test_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAYLENS_EXPORTER", "console")
    assert TelemetryConfig.from_env().exporter == "console"
