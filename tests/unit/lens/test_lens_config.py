from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import pytest
from opentelemetry.metrics import Observation

from raylens.lens import (
    RecordedMetric,
    TelemetryConfig,
    get_telemetry_handle,
    init_telemetry,
    shutdown_telemetry,
)
from raylens_fakes import MetricsProbe


def test_defaults_from_empty_environment() -> None:
    config = TelemetryConfig.from_env({})
    assert config.enabled is True
    assert config.exporter == "none"
    assert config.prometheus_addr == "127.0.0.1:9464"
    assert config.prometheus_host_port == ("127.0.0.1", 9464)
    assert config.service_name == "raylens"
    assert config.export_interval_ms == 60_000
    assert config.otlp_endpoint == "http://localhost:4318/v1/metrics"


# A value for every variable TelemetryConfig reads.
_EVERY_VARIABLE = {
    "RAYLENS_TELEMETRY": "off",
    "RAYLENS_EXPORTER": "Prometheus",
    "RAYLENS_PROMETHEUS_ADDR": "0.0.0.0:9100",
    "OTEL_SERVICE_NAME": "trainer",
    "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod, team=rl%20infra",
    "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/",
    "OTEL_METRIC_EXPORT_INTERVAL": "5000",
}


def test_reads_every_variable() -> None:
    config = TelemetryConfig.from_env(_EVERY_VARIABLE)
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


def test_an_empty_variable_counts_as_unset() -> None:
    # OpenTelemetry's configuration rules: an empty value is the same as no value.
    empty = {**dict.fromkeys(_EVERY_VARIABLE, ""), "RAYLENS_PROMETHEUS_ADDR": " "}
    config = TelemetryConfig.from_env(empty)

    assert config == TelemetryConfig.from_env({})


def test_service_name_from_resource_attributes_unless_otel_service_name_is_set() -> None:
    attributes = "service.name=from-attributes,team=rl"

    named = TelemetryConfig.from_env({"OTEL_RESOURCE_ATTRIBUTES": attributes})
    assert named.service_name == "from-attributes"
    overridden = TelemetryConfig.from_env(
        {"OTEL_RESOURCE_ATTRIBUTES": attributes, "OTEL_SERVICE_NAME": "trainer"}
    )
    assert overridden.service_name == "trainer"


@pytest.mark.parametrize("value", ["host:\u00b2", "host:\u0669"])
def test_a_port_of_non_ascii_digits_is_refused_naming_the_variable(value: str) -> None:
    with pytest.raises(ValueError) as error:
        TelemetryConfig.from_env({"RAYLENS_PROMETHEUS_ADDR": value})

    message = str(error.value)
    assert "RAYLENS_PROMETHEUS_ADDR" in message
    assert repr(value) in message
    assert "host:port" in message


# Exporters ------------------------------------------------------------------------------

_GAUGE_NAME = "test.console.awkward"


@pytest.fixture
def awkward_gauge(declare_gauge: Callable[..., RecordedMetric]) -> RecordedMetric:
    """A gauge whose attribute values hold a newline, quotes, a backslash and braces."""
    return declare_gauge(
        lambda options: [
            Observation(1.0, {"rl.worker_groups": 'policy\nrollout "b"'}),
            Observation(2.0, {"rl.worker_groups": "C:\\tmp}{,x"}),
        ],
        name=_GAUGE_NAME,
        description="gauge with awkward attribute values",
    )


def test_console_writes_one_line_per_point_whatever_the_attribute_values(
    awkward_gauge: RecordedMetric, capsys: pytest.CaptureFixture[str]
) -> None:
    init_telemetry(TelemetryConfig(exporter="console")).force_flush()

    lines = [line for line in capsys.readouterr().out.splitlines() if _GAUGE_NAME in line]
    assert sorted(lines) == [
        'test.console.awkward{rl.worker_groups="C:\\\\tmp}{,x"} 2.0 By',
        'test.console.awkward{rl.worker_groups="policy\\nrollout \\"b\\""} 1.0 By',
    ]


@pytest.mark.parametrize(
    "config",
    [TelemetryConfig(exporter="none"), TelemetryConfig(enabled=False, exporter="console")],
    ids=["none", "off"],
)
def test_none_and_off_export_nothing(
    config: TelemetryConfig, awkward_gauge: RecordedMetric, capsys: pytest.CaptureFixture[str]
) -> None:
    handle = init_telemetry(config)

    assert handle.is_exporting is False
    assert handle.force_flush() is True
    shutdown_telemetry()
    assert capsys.readouterr().out == ""
    assert not [t for t in threading.enumerate() if "Export" in t.name]


@pytest.mark.slow
def test_prometheus_endpoint_thread_is_a_named_daemon_that_stops() -> None:
    def servers() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == "raylens-prometheus-exporter"]

    init_telemetry(TelemetryConfig(exporter="prometheus", prometheus_addr="127.0.0.1:0"))
    assert [t.daemon for t in servers()] == [True]

    shutdown_telemetry()
    assert servers() == []


# The pipeline's lifetime and the probe ----------------------------------------------------


def test_shutdown_never_raises_when_every_part_fails(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from raylens.lens import add_shutdown_hook

    def fail(*args: object, **kwargs: object) -> None:
        raise RuntimeError("part failed")

    handle = init_telemetry(TelemetryConfig(), metric_reader=MetricsProbe().reader)
    add_shutdown_hook(fail)
    monkeypatch.setattr(handle.meter_provider, "shutdown", fail)
    handle._closers.append(fail)

    with caplog.at_level(logging.WARNING, logger="raylens"):
        shutdown_telemetry()

    assert get_telemetry_handle() is None
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 3


def test_every_probe_read_is_a_fresh_collection(
    metrics_probe: MetricsProbe, declare_gauge: Callable[..., RecordedMetric]
) -> None:
    current = [Observation(1, {"k": "a"})]
    gauge = declare_gauge(lambda options: current, unit="1")
    assert metrics_probe.points(gauge.name) == {frozenset({("k", "a")}): 1}
    current[:] = [Observation(2, {"k": "b"})]
    assert metrics_probe.points(gauge.name) == {frozenset({("k", "b")}): 2}
    snapshot = metrics_probe.snapshot()
    current[:] = []
    assert snapshot.points(gauge.name) == {frozenset({("k", "b")}): 2}  # held still
    assert metrics_probe.points(gauge.name) == {}
    assert gauge.name not in metrics_probe.names()
    assert metrics_probe.points("test.probe.never.declared") == {}


def test_a_probe_refuses_to_install_over_a_running_pipeline() -> None:
    running = init_telemetry(TelemetryConfig())
    probe = MetricsProbe()

    # Installed silently, it would read nothing and every "no point" assertion would pass.
    with pytest.raises(RuntimeError, match=r"already running.*shutdown_telemetry"):
        probe.install()
    assert get_telemetry_handle() is running
