"""Each exporter, for real: console lines, OTLP/HTTP into a receiver on 127.0.0.1, a Prometheus scrape."""

from __future__ import annotations

import gzip
import io
import threading
import zlib
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests
from opentelemetry.metrics import Observation

from raylens.lens import (
    RecordedMetric,
    TelemetryConfig,
    init_telemetry,
)
from raylens.lens.exporters import ConsoleLineExporter, format_point_line

_GAUGE_NAME = "test.export.memory"


@pytest.fixture
def exported_gauge(declare_gauge: Callable[..., RecordedMetric]) -> RecordedMetric:
    return declare_gauge(
        lambda options: [
            Observation(1.5e9, {"host.name": "h1", "ray.node.id": "aa"}),
            Observation(2e9, {"host.name": "h2", "ray.node.id": "bb"}),
        ],
        name=_GAUGE_NAME,
        description="memory for exporter tests",
    )


def test_format_point_line_sorts_attributes() -> None:
    line = format_point_line("m", "By", {"b": "2", "a": "1"}, 3)
    assert line == 'm{a="1",b="2"} 3 By'


def test_console_prints_one_line_per_point(
    exported_gauge: RecordedMetric, capsys: pytest.CaptureFixture[str]
) -> None:
    handle = init_telemetry(TelemetryConfig(exporter="console"))
    assert handle.is_exporting
    handle.force_flush()
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith(_GAUGE_NAME)]
    assert sorted(lines) == [
        'test.export.memory{host.name="h1",ray.node.id="aa"} 1500000000.0 By',
        'test.export.memory{host.name="h2",ray.node.id="bb"} 2000000000.0 By',
    ]


def test_console_exporter_writes_to_a_given_stream() -> None:
    stream = io.StringIO()
    exporter = ConsoleLineExporter(stream)
    from opentelemetry.sdk.metrics.export import MetricsData

    exporter.export(MetricsData(resource_metrics=[]))
    assert stream.getvalue() == ""


class _OtlpReceiver(BaseHTTPRequestHandler):
    received: list[tuple[str, bytes]]
    arrived: threading.Event

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        encoding = self.headers.get("Content-Encoding", "")
        if encoding == "gzip":
            body = gzip.decompress(body)
        elif encoding == "deflate":
            body = zlib.decompress(body)
        self.server.received.append((self.path, body))  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()
        self.server.arrived.set()  # type: ignore[attr-defined]

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def otlp_receiver() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _OtlpReceiver)
    server.received = []  # type: ignore[attr-defined]
    server.arrived = threading.Event()  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(5)


@pytest.mark.slow
def test_otlp_sends_names_units_and_attributes(
    exported_gauge: RecordedMetric, otlp_receiver: ThreadingHTTPServer
) -> None:
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceRequest,
    )

    port = otlp_receiver.server_address[1]
    config = TelemetryConfig.from_env(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
            "OTEL_SERVICE_NAME": "otlp-test",
        }
    )
    handle = init_telemetry(config)
    assert config.exporter == "otlp" and handle.is_exporting
    handle.force_flush()
    assert otlp_receiver.arrived.wait(10)
    path, body = otlp_receiver.received[0]
    assert path == "/v1/metrics"
    request = ExportMetricsServiceRequest()
    request.ParseFromString(body)
    resource = request.resource_metrics[0]
    resource_attrs = {kv.key: kv.value.string_value for kv in resource.resource.attributes}
    assert resource_attrs["service.name"] == "otlp-test"
    metrics = {m.name: m for sm in resource.scope_metrics for m in sm.metrics}
    gauge = metrics[_GAUGE_NAME]
    assert gauge.unit == "By"
    points = {
        tuple(sorted((kv.key, kv.value.string_value) for kv in p.attributes)): p.as_double
        for p in gauge.gauge.data_points
    }
    assert points == {
        (("host.name", "h1"), ("ray.node.id", "aa")): 1.5e9,
        (("host.name", "h2"), ("ray.node.id", "bb")): 2e9,
    }


@pytest.mark.slow
def test_prometheus_endpoint_is_scrapeable(exported_gauge: RecordedMetric) -> None:
    handle = init_telemetry(TelemetryConfig(exporter="prometheus", prometheus_addr="127.0.0.1:0"))
    assert handle.is_exporting
    port = handle.prometheus.port
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    samples = [line for line in text.splitlines() if line.startswith("test_export_memory")]
    assert any(
        'host_name="h1"' in s and 'ray_node_id="aa"' in s and "1.5e+09" in s for s in samples
    )
    assert any('host_name="h2"' in s and "2e+09" in s for s in samples)


@pytest.mark.slow
def test_prometheus_can_restart_on_the_same_port(exported_gauge: RecordedMetric) -> None:
    from raylens.lens import shutdown_telemetry

    handle = init_telemetry(TelemetryConfig(exporter="prometheus", prometheus_addr="127.0.0.1:0"))
    port = handle.prometheus.port
    shutdown_telemetry()
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2)
    handle = init_telemetry(
        TelemetryConfig(exporter="prometheus", prometheus_addr=f"127.0.0.1:{port}")
    )
    assert "test_export_memory" in requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text


def test_prometheus_port_in_use_is_a_clear_error() -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(RuntimeError, match=f"127.0.0.1:{port}.*RAYLENS_PROMETHEUS_ADDR"):
            init_telemetry(
                TelemetryConfig(exporter="prometheus", prometheus_addr=f"127.0.0.1:{port}")
            )
