"""Read what raylens exported, as plain dictionaries.

:class:`MetricsProbe` starts lens with an in-memory reader of its own
(:meth:`MetricsProbe.install`). Every read (:meth:`~MetricsProbe.points`,
:meth:`~MetricsProbe.points_by`, :meth:`~MetricsProbe.metric`,
:meth:`~MetricsProbe.names`) takes a fresh collection, so a read always shows what
raylens exports at that moment. To look at several metrics of one and the same
collection, take a :meth:`~MetricsProbe.snapshot` and read from it.

The ``metrics_probe`` fixture's probe stays installed across
:func:`raylens_fakes.pytest_plugin.reset_raylens_state`: the reset starts lens
again with a fresh reader of the same probe (:meth:`MetricsProbe.reinstall`), so
fixtures may be listed in any order.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from opentelemetry.sdk.metrics.export import InMemoryMetricReader, Metric, MetricsData

from raylens.lens import TelemetryConfig, init_telemetry, shutdown_telemetry

Points = dict[frozenset[tuple[str, Any]], float]

__all__ = ["MetricsProbe", "Points", "Snapshot"]


def _value(point: Any) -> Any:
    value = getattr(point, "value", None)
    if value is None:
        value = getattr(point, "sum", None)
    return value


class Snapshot:
    """One collection, read as dictionaries. Reading it never collects again."""

    def __init__(self, data: MetricsData | None) -> None:
        self.data = data
        self._metrics: list[Metric] = []
        if data is not None:
            for resource_metrics in data.resource_metrics:
                for scope_metrics in resource_metrics.scope_metrics:
                    self._metrics.extend(scope_metrics.metrics)

    def metric(self, name: str) -> Metric | None:
        """The whole metric ``name`` (unit, description, points), or None."""
        for metric in self._metrics:
            if metric.name == name:
                return metric
        return None

    def names(self) -> set[str]:
        """Every metric name with points in this collection."""
        return {metric.name for metric in self._metrics}

    def points(self, name: str) -> Points:
        """``{frozenset(attribute items): value}`` of ``name``; empty when it has no points."""
        metric = self.metric(name)
        if metric is None:
            return {}
        return {
            frozenset((point.attributes or {}).items()): _value(point)
            for point in metric.data.data_points
        }

    def points_by(self, name: str, attribute: str) -> dict[Hashable, float]:
        """``{value of attribute: point value}`` of ``name``.

        Raises ValueError when a point lacks ``attribute`` or two points share its
        value, since either would make the mapping silently drop a point.
        """
        result: dict[Hashable, float] = {}
        for attributes, value in self.points(name).items():
            labels = dict(attributes)
            if attribute not in labels:
                raise ValueError(f"a point of {name!r} has no attribute {attribute!r}: {labels!r}")
            key = labels[attribute]
            if key in result:
                raise ValueError(
                    f"two points of {name!r} have {attribute}={key!r}; "
                    "use points() to see every attribute"
                )
            result[key] = value
        return result


class MetricsProbe:
    """An in-memory reader plus helpers that turn a collection into ``{attributes: value}``."""

    def __init__(self) -> None:
        self.reader = InMemoryMetricReader()
        self._config: TelemetryConfig | None = None
        self._installed_once = False

    def install(self, config: TelemetryConfig | None = None) -> MetricsProbe:
        """Start lens with this probe's reader (configuration default: telemetry on, no exporter).

        Raises RuntimeError when lens is already running with another reader: the
        probe would then read nothing, and every check that a point is absent would
        pass whatever the code under test did.
        """
        if self._installed_once:
            # A reader belongs to one meter provider for good; a new pipeline needs a new one.
            self.reader = InMemoryMetricReader()
        self._config = config or TelemetryConfig()
        handle = init_telemetry(self._config, metric_reader=self.reader)
        if not any(reader is self.reader for reader in handle.readers):
            raise RuntimeError(
                "lens is already running without this probe's reader, so the probe would "
                "see nothing; call raylens.lens.shutdown_telemetry() first, or use the "
                "metrics_probe fixture"
            )
        self._installed_once = True
        return self

    def reinstall(self) -> MetricsProbe:
        """Start lens again with a fresh reader and the configuration of the last install."""
        return self.install(self._config)

    def uninstall(self) -> None:
        """Shut lens down (never raises)."""
        shutdown_telemetry()

    def collect(self) -> MetricsData | None:
        """Take one collection now and return it as the SDK's ``MetricsData``."""
        return self.reader.get_metrics_data()

    def snapshot(self) -> Snapshot:
        """Take one collection now; read several metrics of it without collecting again."""
        return Snapshot(self.collect())

    def metric(self, name: str) -> Metric | None:
        """The whole metric ``name`` from a fresh collection (unit, description, points)."""
        return self.snapshot().metric(name)

    def names(self) -> set[str]:
        """Every metric name with points in a fresh collection."""
        return self.snapshot().names()

    def points(self, name: str) -> Points:
        """``{frozenset(attribute items): value}`` of ``name`` in a fresh collection.

        Empty when nothing was observed.
        """
        return self.snapshot().points(name)

    def points_by(self, name: str, attribute: str) -> dict[Hashable, float]:
        """``{value of attribute: point value}`` of ``name`` in a fresh collection.

        See :meth:`Snapshot.points_by` for when it raises.
        """
        return self.snapshot().points_by(name, attribute)

    def __enter__(self) -> MetricsProbe:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()
