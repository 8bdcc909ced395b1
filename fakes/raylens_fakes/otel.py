"""Read what raylens exported, as plain dictionaries.

:class:`MetricsProbe` owns an ``InMemoryMetricReader``. Start lens with it
(:meth:`MetricsProbe.install`), call :meth:`collect` to take one collection, then
read any metric of that collection with :meth:`points`.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.metrics.export import InMemoryMetricReader, Metric, MetricsData

from raylens.lens import TelemetryConfig, init_telemetry, shutdown_telemetry

Points = dict[frozenset[tuple[str, Any]], float]


class MetricsProbe:
    """An in-memory reader plus helpers that turn a collection into ``{attributes: value}``."""

    def __init__(self) -> None:
        self.reader = InMemoryMetricReader()
        self._latest: MetricsData | None = None

    def install(self, config: TelemetryConfig | None = None) -> MetricsProbe:
        """Start lens with this probe's reader (configuration default: telemetry on, no exporter).

        Raises RuntimeError when lens is already running with another reader: the
        probe would then read nothing, and every check that a point is absent would
        pass whatever the code under test did.
        """
        handle = init_telemetry(config or TelemetryConfig(), metric_reader=self.reader)
        if not any(reader is self.reader for reader in handle.readers):
            raise RuntimeError(
                "lens is already running without this probe's reader, so the probe would "
                "see nothing; call raylens.lens.shutdown_telemetry() first, or use the "
                "metrics_probe fixture"
            )
        return self

    def uninstall(self) -> None:
        """Shut lens down (never raises)."""
        shutdown_telemetry()

    def collect(self) -> MetricsData | None:
        """Take one collection now; :meth:`points` reads it until the next one."""
        self._latest = self.reader.get_metrics_data()
        return self._latest

    def _metrics(self) -> list[Metric]:
        if self._latest is None:
            self.collect()
        found = []
        if self._latest is None:
            return found
        for resource_metrics in self._latest.resource_metrics:
            for scope_metrics in resource_metrics.scope_metrics:
                found.extend(scope_metrics.metrics)
        return found

    def metric(self, name: str) -> Metric | None:
        """The whole metric ``name`` from the latest collection (unit, description, points)."""
        for metric in self._metrics():
            if metric.name == name:
                return metric
        return None

    def names(self) -> set[str]:
        """Every metric name with points in the latest collection."""
        return {metric.name for metric in self._metrics()}

    def points(self, name: str) -> Points:
        """``{frozenset(attribute items): value}`` of ``name`` in the latest collection.

        Empty when nothing was observed. Collects first if nothing has been collected yet.
        """
        metric = self.metric(name)
        if metric is None:
            return {}
        result: Points = {}
        for point in metric.data.data_points:
            value = getattr(point, "value", None)
            if value is None:
                value = getattr(point, "sum", None)
            result[frozenset((point.attributes or {}).items())] = value
        return result

    def __enter__(self) -> MetricsProbe:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()
