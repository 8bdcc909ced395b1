"""What raylens' OTLP/HTTP exporter puts on the wire, and how it takes a failing collector.

``responses`` stands in for the collector: it answers every request the exporter sends
through ``requests``, so nothing leaves the process and no name is ever resolved.
"""

from __future__ import annotations

import gzip
import logging
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import requests
import responses
from opentelemetry.metrics import Observation
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from raylens.lens import (
    RecordedMetric,
    TelemetryConfig,
    init_telemetry,
    shutdown_telemetry,
)

BASE = "http://collector.test:4318"
METRICS_URL = BASE + "/v1/metrics"
GAUGE_NAME = "test.otlp.memory"
POINTS = {
    (("host.name", "h1"), ("ray.node.id", "aa")): 1.5e9,
    (("host.name", "h2"), ("ray.node.id", "bb")): 2e9,
}


@pytest.fixture
def collector(
    monkeypatch: pytest.MonkeyPatch, declare_gauge: Callable[..., RecordedMetric]
) -> Iterator[responses.RequestsMock]:
    """A mocked collector, a gauge with two points, and lens stopped while the mock is active.

    The exporter's own timeout is kept short so that a transient failure is not
    retried for the SDK's default ten seconds.
    """
    for variable in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.delenv("RAYLENS_EXPORTER", raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "0.5")
    declare_gauge(
        lambda options: [
            Observation(1.5e9, {"host.name": "h1", "ray.node.id": "aa"}),
            Observation(2e9, {"host.name": "h2", "ray.node.id": "bb"}),
        ],
        name=GAUGE_NAME,
        description="memory for OTLP wire tests",
    )
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        try:
            yield mock
        finally:
            # The final export on shutdown must also reach the mock, not the network.
            if not mock.registered():
                mock.add(responses.POST, METRICS_URL, status=200)
            shutdown_telemetry()


def _decoded(body: bytes | str | None) -> ExportMetricsServiceRequest:
    assert isinstance(body, bytes), f"expected a protobuf body, got {type(body).__name__}"
    request = ExportMetricsServiceRequest()
    request.ParseFromString(body)
    return request


def _gauge_points(request: ExportMetricsServiceRequest) -> dict[tuple[tuple[str, str], ...], float]:
    points = {}
    for resource_metrics in request.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                if metric.name != GAUGE_NAME:
                    continue
                assert metric.unit == "By"
                for point in metric.gauge.data_points:
                    key = tuple(sorted((kv.key, kv.value.string_value) for kv in point.attributes))
                    points[key] = point.as_double
    return points


@pytest.mark.parametrize("base", [BASE, BASE + "/"])
def test_base_endpoint_gets_one_protobuf_post_at_v1_metrics(
    collector: responses.RequestsMock, monkeypatch: pytest.MonkeyPatch, base: str
) -> None:
    collector.add(responses.POST, METRICS_URL, status=200)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", base)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "wire-test")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=ci")
    monkeypatch.setenv("RAYLENS_WORKER_GROUP", "policy")

    handle = init_telemetry()
    assert handle.config.exporter == "otlp"
    assert handle.force_flush()

    assert len(collector.calls) == 1
    sent = collector.calls[0].request
    assert sent.method == "POST"
    assert sent.url == METRICS_URL
    assert sent.headers["Content-Type"] == "application/x-protobuf"
    request = _decoded(sent.body)
    assert len(request.resource_metrics) == 1
    resource = {
        kv.key: kv.value.string_value for kv in request.resource_metrics[0].resource.attributes
    }
    assert resource["service.name"] == "wire-test"
    assert resource["deployment.environment"] == "ci"
    assert resource["rl.worker_group"] == "policy"
    assert _gauge_points(request) == POINTS


def test_metrics_endpoint_wins_over_the_base(
    collector: responses.RequestsMock, monkeypatch: pytest.MonkeyPatch
) -> None:
    full = "http://metrics.test:9000/custom/ingest"
    collector.add(responses.POST, full, status=200)
    collector.add(responses.POST, METRICS_URL, status=200)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", BASE)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", full)

    handle = init_telemetry()
    assert handle.config.otlp_endpoint == full
    handle.force_flush()

    assert [call.request.url for call in collector.calls] == [full]
    assert _gauge_points(_decoded(collector.calls[0].request.body)) == POINTS


def test_an_endpoint_given_in_code_is_where_the_request_goes(
    collector: responses.RequestsMock,
) -> None:
    url = "http://other.test:4318/v1/metrics"
    collector.add(responses.POST, url, status=200)

    init_telemetry(TelemetryConfig(exporter="otlp", otlp_endpoint=url)).force_flush()

    assert [call.request.url for call in collector.calls] == [url]


@pytest.mark.parametrize(
    ("failure", "attempts"),
    [
        pytest.param({"status": 500}, 1, id="500-not-retried"),
        pytest.param({"status": 503}, 1, id="503-retry-would-outlast-timeout"),
        pytest.param({"status": 503, "headers": {"Retry-After": "3600"}}, 1, id="503-retry-after"),
        pytest.param(
            {"body": requests.ConnectionError("connection refused")},
            2,
            id="connection-error-retried-once-at-once",
        ),
    ],
)
def test_a_failing_collector_costs_one_export_and_is_logged(
    collector: responses.RequestsMock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    failure: dict,
    attempts: int,
) -> None:
    for _ in range(attempts):
        collector.add(responses.POST, METRICS_URL, **failure)
    collector.add(responses.POST, METRICS_URL, status=200)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", BASE)
    handle = init_telemetry()

    with caplog.at_level(logging.WARNING):
        handle.force_flush()  # must not raise
    assert len(collector.calls) == attempts
    failed = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert failed, "a failed export left no log record"
    assert all(r.name.startswith("opentelemetry") for r in failed), [r.name for r in failed]

    # The collector is back: the next export carries the points again.
    assert handle.force_flush()
    assert len(collector.calls) == attempts + 1
    last = collector.calls[-1]
    assert last.response is not None and last.response.status_code == 200
    assert _gauge_points(_decoded(last.request.body)) == POINTS


def test_compression_and_headers_from_the_environment_reach_the_request(
    collector: responses.RequestsMock, monkeypatch: pytest.MonkeyPatch
) -> None:
    collector.add(responses.POST, METRICS_URL, status=200)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", BASE)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=team%20a")

    init_telemetry().force_flush()

    sent = collector.calls[0].request
    assert sent.headers["Content-Encoding"] == "gzip"
    assert sent.headers["x-tenant"] == "team a"
    assert isinstance(sent.body, bytes)
    assert _gauge_points(_decoded(gzip.decompress(sent.body))) == POINTS


@pytest.mark.parametrize(
    "setting",
    [{"RAYLENS_TELEMETRY": "off"}, {"RAYLENS_EXPORTER": "none"}, {"RAYLENS_EXPORTER": "console"}],
)
def test_no_request_when_otlp_is_not_the_chosen_exporter(
    collector: responses.RequestsMock,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    setting: dict[str, str],
) -> None:
    collector.add(responses.POST, METRICS_URL, status=200)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", BASE)
    for variable, value in setting.items():
        monkeypatch.setenv(variable, value)

    init_telemetry().force_flush()
    shutdown_telemetry()

    assert len(collector.calls) == 0  # the endpoint alone does not override the choice
    capsys.readouterr()


def test_shutdown_against_a_collector_that_keeps_failing_returns_within_its_timeout(
    collector: responses.RequestsMock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The exporter would retry a 503 for its own ten seconds; shutdown cuts that short.

    A driver stops lens at exit, so an unreachable collector must not hold the exit up.
    """
    collector.add(responses.POST, METRICS_URL, status=503)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", BASE)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "10")
    init_telemetry()

    started = time.monotonic()
    shutdown_telemetry(timeout_ms=200)
    took = time.monotonic() - started

    # The export thread notices the shutdown before it would retry; wait for it to end
    # while the collector is still mocked.
    for thread in threading.enumerate():
        if thread.name == "OtelPeriodicExportingMetricReader":
            thread.join(10)
            assert not thread.is_alive()
    assert len(collector.calls) >= 1
    # Retrying with backoff 1 s, 2 s, 4 s (each +-20 %) would take at least 5.6 s.
    assert took < 3, f"shutdown_telemetry(timeout_ms=200) took {took:.2f} s"
