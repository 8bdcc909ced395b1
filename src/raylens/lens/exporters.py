"""The metric readers behind each ``RAYLENS_EXPORTER`` choice.

``console`` prints one line per point; ``otlp`` pushes OTLP/HTTP protobuf;
``prometheus`` serves a scrape endpoint from a registry of its own, so starting
and stopping lens twice in one process never collides on the global registry.
The optional exporters are imported only when chosen, and a missing package is
reported with the extra that provides it.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable, Mapping
from typing import IO, Any

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    MetricExporter,
    MetricExportResult,
    MetricReader,
    MetricsData,
    PeriodicExportingMetricReader,
)

from raylens.lens.config import TelemetryConfig
from raylens.lens.warnings import call_or_warn_once
from raylens.safe_text import encodable


def _escape(value: object) -> str:
    """``value`` as Prometheus escapes a label value: backslash, double quote and newline.

    Lone surrogates become U+FFFD, so the line always encodes as UTF-8.
    """
    text = encodable(str(value))
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def format_point_line(
    name: str, unit: str | None, attributes: Mapping[str, object] | None, value: object
) -> str:
    """``name{key="value",...} value unit``: one human-readable line for one point.

    Attribute values are escaped as in Prometheus text, so a value holding a
    newline or a quote still gives exactly one line that can be read back.
    """
    present = attributes or {}
    labels = ",".join(f'{encodable(str(key))}="{_escape(present[key])}"' for key in sorted(present))
    unit_part = f" {encodable(unit)}" if unit else ""
    return f"{encodable(name)}{{{labels}}} {value}{unit_part}"


class ConsoleLineExporter(MetricExporter):
    """Writes every exported point as one line to a stream (stdout by default).

    Each point is formatted on its own: one that cannot be turned into text is
    skipped (and logged once), never the rest of the export.
    """

    def __init__(self, stream: IO[str] | None = None) -> None:
        super().__init__(preferred_temporality={}, preferred_aggregation={})
        self._stream = stream
        self._lock = threading.Lock()

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        lines = []
        for resource_metrics in metrics_data.resource_metrics:
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    for point in metric.data.data_points:
                        value = getattr(point, "value", None)
                        if value is None:
                            value = getattr(point, "sum", "?")
                        # A recorded value's own __str__ may raise anything.
                        formatted, line = call_or_warn_once(
                            functools.partial(
                                format_point_line, metric.name, metric.unit, point.attributes, value
                            ),
                            f"lens.console.point.{encodable(metric.name)}",
                            "console exporter skipped a point it could not format",
                        )
                        if formatted and line is not None:
                            lines.append(line)
        if lines:
            stream = self._stream or sys.stdout
            with self._lock:
                stream.write("\n".join(lines) + "\n")
                stream.flush()
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        return None


def _missing(extra: str, package: str, error: ImportError) -> RuntimeError:
    return RuntimeError(
        f"the {extra} exporter needs the {package} package; install it with "
        f"`pip install 'raylens[{extra}]'` ({error})"
    )


class PrometheusEndpoint:
    """A Prometheus reader with its own registry and HTTP server; ``close()`` stops both."""

    def __init__(self, host: str, port: int) -> None:
        try:
            from opentelemetry.exporter.prometheus import PrometheusMetricReader
            from prometheus_client import CollectorRegistry, start_http_server
        except ImportError as error:  # pragma: no cover - depends on the environment
            raise _missing("prometheus", "opentelemetry-exporter-prometheus", error) from error
        self.registry = CollectorRegistry(auto_describe=True)
        self.reader = PrometheusMetricReader(registry=self.registry)
        try:
            self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as error:
            self.reader.shutdown()
            raise RuntimeError(
                f"cannot serve Prometheus metrics on {host}:{port}: {error}; "
                "set RAYLENS_PROMETHEUS_ADDR to a free host:port"
            ) from error
        self._thread.name = "raylens-prometheus-exporter"
        self.host = host
        self.port = self._server.server_address[1]

    def renew_reader(self) -> MetricReader:
        """A new reader on the same registry and server, for a renewed pipeline.

        The one it replaces leaves the registry when its provider shuts down.
        """
        from opentelemetry.exporter.prometheus import PrometheusMetricReader

        self.reader = PrometheusMetricReader(registry=self.registry)
        return self.reader

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def build_exporter_reader(
    config: TelemetryConfig,
) -> tuple[MetricReader | None, Callable[[], None] | None, PrometheusEndpoint | None]:
    """The reader for ``config.exporter``, a closer for anything it started, and extras.

    Returns ``(None, None, None)`` for ``none``. The third item is the
    :class:`PrometheusEndpoint` for ``prometheus`` (so callers can learn its port).
    """
    if config.exporter == "none":
        return None, None, None
    if config.exporter == "console":
        reader = PeriodicExportingMetricReader(
            ConsoleLineExporter(), export_interval_millis=config.export_interval_ms
        )
        return reader, None, None
    if config.exporter == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        except ImportError as error:  # pragma: no cover - depends on the environment
            raise _missing("otlp", "opentelemetry-exporter-otlp-proto-http", error) from error
        exporter = OTLPMetricExporter(
            endpoint=config.otlp_endpoint,
            preferred_temporality={},
        )
        reader = PeriodicExportingMetricReader(
            exporter, export_interval_millis=config.export_interval_ms
        )
        return reader, None, None
    if config.exporter == "prometheus":
        host, port = config.prometheus_host_port
        endpoint = PrometheusEndpoint(host, port)
        return endpoint.reader, endpoint.close, endpoint
    raise ValueError(f"exporter {config.exporter!r} is not known")  # guarded by TelemetryConfig


__all__ = [
    "AggregationTemporality",
    "ConsoleLineExporter",
    "PrometheusEndpoint",
    "build_exporter_reader",
    "format_point_line",
]
