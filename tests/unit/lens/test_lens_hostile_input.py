"""Odd values from outside raylens never cost other points, and bad settings are refused clearly."""

from __future__ import annotations

import io
import threading
from collections.abc import Callable
from typing import Any

import pytest
import requests
from opentelemetry.metrics import Observation
from opentelemetry.sdk.metrics.export import MetricsData, ResourceMetrics, ScopeMetrics
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.test.metrictestutil import _generate_gauge

from raylens.lens import (
    RecordedMetric,
    TelemetryConfig,
    init_telemetry,
    register_observable_gauge,
)
from raylens.lens.exporters import ConsoleLineExporter
from raylens_fakes import MetricsProbe

_LONE = "\ud800"


@pytest.fixture
def surrogate_gauge(declare_gauge: Callable[..., RecordedMetric]) -> RecordedMetric:
    return declare_gauge(
        lambda options: [
            Observation(1.0, {"host.name": "good", "rl.worker_groups": "policy"}),
            Observation(2.0, {"host.name": f"bad{_LONE}", "rl.worker_groups": f"g{_LONE}"}),
        ],
        name="test.hostile.memory",  # served to Prometheus as test_hostile_memory
        description="hostile label values",
    )


def test_lone_surrogates_are_replaced_before_the_sdk_sees_them(
    surrogate_gauge: RecordedMetric, metrics_probe: MetricsProbe
) -> None:
    points = metrics_probe.points(surrogate_gauge.name)
    assert points == {
        frozenset({("host.name", "good"), ("rl.worker_groups", "policy")}): 1.0,
        frozenset({("host.name", "bad\ufffd"), ("rl.worker_groups", "g\ufffd")}): 2.0,
    }


def test_a_gauge_declared_encodable_is_not_checked_again_and_redeclaring_restores_the_check(
    metrics_probe: MetricsProbe, declare_gauge: Callable[..., RecordedMetric]
) -> None:
    points = [Observation(1.0, {"host.name": f"bad{_LONE}"})]
    gauge = declare_gauge(lambda options: points, attributes_encodable=True)
    # The callback vouched for its text: lens hands it to the SDK as it came.
    assert metrics_probe.points(gauge.name) == {frozenset({("host.name", f"bad{_LONE}")}): 1.0}

    register_observable_gauge(gauge, lambda options: points)

    assert metrics_probe.points(gauge.name) == {frozenset({("host.name", "bad\ufffd")}): 1.0}


@pytest.mark.slow
def test_prometheus_serves_every_series_despite_a_lone_surrogate(
    surrogate_gauge: RecordedMetric,
) -> None:
    handle = init_telemetry(TelemetryConfig(exporter="prometheus", prometheus_addr="127.0.0.1:0"))
    response = requests.get(f"http://127.0.0.1:{handle.prometheus.port}/metrics", timeout=5)
    assert response.status_code == 200
    samples = [line for line in response.text.splitlines() if line.startswith("test_hostile")]
    assert any('host_name="good"' in s for s in samples)
    assert any('host_name="bad\ufffd"' in s for s in samples)


def _data(*points: tuple[dict[str, object], float]) -> MetricsData:
    """One gauge point per metric, built with opentelemetry-test-utils' generator."""
    metrics = [
        _generate_gauge("m", value, attributes=attributes, unit="By")
        for attributes, value in points
    ]
    scope = ScopeMetrics(InstrumentationScope("t"), metrics, schema_url="")
    return MetricsData([ResourceMetrics(Resource.create({}), [scope], schema_url="")])


class _Utf8Only(io.StringIO):
    """A stream that, like a UTF-8 terminal or pipe, refuses text that does not encode."""

    def write(self, text: str) -> int:
        text.encode("utf-8")
        return super().write(text)


def test_console_writes_every_other_point_when_one_cannot_be_encoded() -> None:
    stream = _Utf8Only()
    exporter = ConsoleLineExporter(stream)
    exporter.export(_data(({"h": "a"}, 1), ({"h": f"b{_LONE}"}, 2), ({}, 3)))
    lines = stream.getvalue().splitlines()
    assert lines[0] == 'm{h="a"} 1 By'
    assert lines[1] == 'm{h="b\ufffd"} 2 By'
    assert lines[2] == "m{} 3 By"


def test_console_skips_only_the_point_that_cannot_be_formatted() -> None:
    class Unprintable:
        def __str__(self) -> str:
            raise RuntimeError("no text")

    stream = io.StringIO()
    ConsoleLineExporter(stream).export(
        _data(({"h": "a"}, 1), ({"h": Unprintable()}, 2), ({"h": "c"}, 3))
    )
    assert stream.getvalue().splitlines() == ['m{h="a"} 1 By', 'm{h="c"} 3 By']


# Settings the SDK or the exporter would choke on ----------------------------------------


def test_export_interval_above_what_a_thread_can_wait_is_refused() -> None:
    too_long = int(threading.TIMEOUT_MAX * 1000) + 1000
    with pytest.raises(ValueError) as error:
        TelemetryConfig.from_env({"OTEL_METRIC_EXPORT_INTERVAL": str(too_long)})
    message = str(error.value)
    assert "OTEL_METRIC_EXPORT_INTERVAL" in message
    assert repr(str(too_long)) in message
    assert "1 to " in message
    with pytest.raises(ValueError, match="export_interval_ms"):
        TelemetryConfig(export_interval_ms=too_long)


def test_the_largest_allowed_interval_is_accepted() -> None:
    from raylens.lens.config import MAX_EXPORT_INTERVAL_MS

    config = TelemetryConfig.from_env({"OTEL_METRIC_EXPORT_INTERVAL": str(MAX_EXPORT_INTERVAL_MS)})
    assert config.export_interval_ms == MAX_EXPORT_INTERVAL_MS
    assert MAX_EXPORT_INTERVAL_MS / 1000 <= threading.TIMEOUT_MAX


@pytest.mark.parametrize(
    "url",
    [
        "http://[::1",
        "http://[::1]:99999",
        "http://:4318",
        "http://host:port",
        "http://exa mple:4318",
        "http://coll\nector:4318",
        "ftp://collector:4318",
    ],
)
@pytest.mark.parametrize(
    "variable", ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"]
)
def test_a_malformed_otlp_endpoint_is_refused(variable: str, url: str) -> None:
    with pytest.raises(ValueError) as error:
        TelemetryConfig.from_env({variable: url})
    message = str(error.value)
    assert variable in message
    assert repr(url.strip()) in message or repr(url) in message


@pytest.mark.parametrize(
    "url",
    ["http://[::1]:4318", "https://collector.example:443/otlp", "http://10.0.0.1:4318/"],
)
def test_well_formed_otlp_endpoints_are_accepted(url: str) -> None:
    config = TelemetryConfig.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": url})
    assert config.otlp_endpoint == url.rstrip("/") + "/v1/metrics"


def test_an_endpoint_of_adversarial_length_is_checked_quickly() -> None:
    # urllib.parse scans linearly; this is a correctness check, not a timing one.
    url = "http://[" + ":" * 200_000
    with pytest.raises(ValueError, match="OTEL_EXPORTER_OTLP_ENDPOINT"):
        TelemetryConfig.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": url})


# The worker group as a resource attribute -----------------------------------------------


@pytest.mark.parametrize("variable", ["RAYLENS_WORKER_GROUP", "NRL_WORKER_GROUP"])
def test_the_worker_group_variable_becomes_a_resource_attribute(variable: str) -> None:
    config = TelemetryConfig.from_env({variable: "policy"})
    assert config.resource_attributes["rl.worker_group"] == "policy"


def test_raylens_worker_group_wins_over_nemo_rl_and_resource_attributes() -> None:
    config = TelemetryConfig.from_env(
        {
            "RAYLENS_WORKER_GROUP": "policy",
            "NRL_WORKER_GROUP": "other",
            "OTEL_RESOURCE_ATTRIBUTES": "rl.worker_group=env,team=rl",
        }
    )
    assert config.resource_attributes == {"rl.worker_group": "policy", "team": "rl"}


def test_no_worker_group_variable_adds_no_attribute() -> None:
    assert "rl.worker_group" not in TelemetryConfig.from_env({}).resource_attributes


def _exported_resource(
    config: TelemetryConfig, declare_gauge: Callable[..., RecordedMetric]
) -> Any:
    """The resource attributes of one collection of a one-point gauge under ``config``."""
    probe = MetricsProbe()
    probe.install(config)
    declare_gauge(lambda options: [Observation(1.0, {})])
    try:
        data = probe.collect()
        assert data is not None
        return data.resource_metrics[0].resource.attributes
    finally:
        probe.uninstall()


def test_the_worker_group_reaches_the_exported_resource(
    declare_gauge: Callable[..., RecordedMetric],
) -> None:
    config = TelemetryConfig.from_env({"RAYLENS_WORKER_GROUP": f"w{_LONE}"})
    attributes = _exported_resource(config, declare_gauge)
    assert attributes["rl.worker_group"] == "w\ufffd"


def test_a_resource_built_in_code_is_made_exportable(
    declare_gauge: Callable[..., RecordedMetric],
) -> None:
    config = TelemetryConfig(service_name=f"svc{_LONE}", resource_attributes={"team": f"t{_LONE}"})
    attributes = _exported_resource(config, declare_gauge)
    assert attributes["service.name"] == "svc\ufffd"
    assert attributes["team"] == "t\ufffd"
