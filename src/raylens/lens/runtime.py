"""The process's one telemetry pipeline: start it, reach it, stop it.

:func:`init_telemetry` builds a private ``MeterProvider`` (never the global one,
so raylens neither takes over nor is taken over by an application's own
OpenTelemetry setup) with the reader the configuration asks for, or the reader a
test passes in. Observable gauges are declared with :func:`register_observable_gauge`;
the declaration outlives any one pipeline, so a gauge registered before
``init_telemetry`` or across a shutdown and re-init is created on every new meter.

Cardinality: the SDK sends attribute sets past its default limit of 2,000 per
instrument to ``otel.metric.overflow``, and an asynchronous instrument keeps every
set it has ever seen. Relabelling a thousand nodes twice reaches that, so every
raylens instrument gets :data:`CARDINALITY_LIMIT` through a view.

State: the current handle and the gauge declarations. :func:`shutdown_telemetry`
clears the handle; :func:`reset_observable_gauges` clears the declarations.
"""

from __future__ import annotations

import atexit
import logging
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.metrics.view import View
from opentelemetry.sdk.resources import Resource

import raylens
from raylens.lens.config import TelemetryConfig
from raylens.lens.exporters import build_exporter_reader
from raylens.lens.metrics import OBSERVABLE_GAUGE, RecordedMetric, register_recorded_metrics
from raylens.lens.warnings import warn_once

logger = logging.getLogger("raylens.lens")

METER_NAME = "raylens"
CARDINALITY_LIMIT = 200_000

ObservableCallback = Callable[[CallbackOptions], Iterable[Observation]]


@dataclass
class TelemetryHandle:
    """The running pipeline: its meter, its configuration, and what it exports to."""

    config: TelemetryConfig
    meter_provider: MeterProvider | None
    meter: Meter
    readers: list[MetricReader] = field(default_factory=list)
    exporter_reader: MetricReader | None = None
    prometheus: Any = None
    _closers: list[Callable[[], None]] = field(default_factory=list, repr=False)

    @property
    def is_exporting(self) -> bool:
        """True when points leave the process: telemetry on and a reader attached."""
        return self.meter_provider is not None and bool(self.readers)

    def force_flush(self, timeout_ms: int = 5000) -> bool:
        if self.meter_provider is None:
            return True
        return self.meter_provider.force_flush(timeout_ms)


_HANDLE: TelemetryHandle | None = None
_HANDLE_LOCK = threading.RLock()

_OBSERVABLES: dict[str, tuple[RecordedMetric, ObservableCallback]] = {}
_CREATED_ON: dict[str, int] = {}


def _guarded(name: str) -> ObservableCallback:
    """The SDK-facing callback: looks the current callback up and never raises."""

    def callback(options: CallbackOptions) -> Iterable[Observation]:
        entry = _OBSERVABLES.get(name)
        if entry is None:
            return []
        try:
            return list(entry[1](options))
        except Exception:
            warn_once(f"lens.callback.{name}", f"callback for gauge {name!r} failed; no points")
            return []

    return callback


def _create_observables(handle: TelemetryHandle) -> None:
    for name, (metric, _callback) in list(_OBSERVABLES.items()):
        if _CREATED_ON.get(name) == id(handle):
            continue
        handle.meter.create_observable_gauge(
            metric.name,
            callbacks=[_guarded(name)],
            unit=metric.unit,
            description=metric.description,
        )
        _CREATED_ON[name] = id(handle)


def register_observable_gauge(metric: RecordedMetric, callback: ObservableCallback) -> None:
    """Export ``metric`` as an observable gauge whose points ``callback`` returns.

    ``callback`` must read state prepared elsewhere (no I/O); an exception inside
    it is logged once and costs that collection its points, never the SDK's loop.
    Registering the same name again replaces the callback.
    """
    if metric.kind != OBSERVABLE_GAUGE:
        raise ValueError(
            f"metric {metric.name!r} has kind {metric.kind!r}, not {OBSERVABLE_GAUGE!r}"
        )
    register_recorded_metrics([metric])
    with _HANDLE_LOCK:
        _OBSERVABLES[metric.name] = (metric, callback)
        if _HANDLE is not None:
            _create_observables(_HANDLE)


def unregister_observable_gauge(name: str) -> None:
    """Stop reporting ``name``: its instrument stays on the current meter but yields no points."""
    with _HANDLE_LOCK:
        _OBSERVABLES.pop(name, None)


def reset_observable_gauges() -> None:
    """Forget every gauge declaration (tests only)."""
    with _HANDLE_LOCK:
        _OBSERVABLES.clear()
        _CREATED_ON.clear()


def init_telemetry(
    config: TelemetryConfig | None = None, *, metric_reader: MetricReader | None = None
) -> TelemetryHandle:
    """Start this process's pipeline, or return the one already running.

    ``config`` defaults to :meth:`TelemetryConfig.from_env`. A ``metric_reader``
    replaces the configured exporter (tests pass an in-memory reader this way).
    With telemetry off and no reader, instruments are no-ops and nothing exports.
    """
    global _HANDLE
    with _HANDLE_LOCK:
        if _HANDLE is not None:
            return _HANDLE
        config = config if config is not None else TelemetryConfig.from_env()
        closers: list[Callable[[], None]] = []
        prometheus = None
        if metric_reader is not None:
            reader = metric_reader
        elif config.enabled:
            reader, closer, prometheus = build_exporter_reader(config)
            if closer is not None:
                closers.append(closer)
        else:
            reader = None

        if reader is None:
            from opentelemetry.metrics import NoOpMeterProvider

            handle = TelemetryHandle(
                config=config,
                meter_provider=None,
                meter=NoOpMeterProvider().get_meter(METER_NAME),
            )
        else:
            attributes = dict(config.resource_attributes)
            attributes["service.name"] = config.service_name
            provider = MeterProvider(
                metric_readers=[reader],
                resource=Resource.create(attributes),
                views=[View(instrument_name="*", aggregation_cardinality_limit=CARDINALITY_LIMIT)],
                shutdown_on_exit=False,
            )
            _register_exit_flush()
            handle = TelemetryHandle(
                config=config,
                meter_provider=provider,
                meter=provider.get_meter(METER_NAME, raylens.__version__),
                readers=[reader],
                exporter_reader=None if metric_reader is not None else reader,
                prometheus=prometheus,
                _closers=closers,
            )
        _HANDLE = handle
        _create_observables(handle)
        return handle


_EXIT_FLUSH_REGISTERED = False


def _register_exit_flush() -> None:
    """Flush and stop the pipeline at interpreter exit, once per process.

    The SDK's own exit hook is turned off: it holds every provider ever made and
    complains at exit about the ones :func:`shutdown_telemetry` already stopped.
    """
    global _EXIT_FLUSH_REGISTERED
    if not _EXIT_FLUSH_REGISTERED:
        atexit.register(shutdown_telemetry)
        _EXIT_FLUSH_REGISTERED = True


def get_telemetry_handle() -> TelemetryHandle | None:
    """The running pipeline, or None before :func:`init_telemetry`."""
    return _HANDLE


def init_telemetry_driver(
    config: TelemetryConfig | None = None,
    *,
    metric_reader: MetricReader | None = None,
    host_memory_interval: float | None = None,
) -> TelemetryHandle:
    """Start telemetry in the driver process, including host-memory monitoring.

    The worker-group placement map lives in the driver (that is where worker
    groups are built), so the monitor that labels nodes with it must run there
    too. ``host_memory_interval`` defaults to the host-memory module's fallback.
    """
    handle = init_telemetry(config, metric_reader=metric_reader)
    from raylens.telemetry import host_memory  # lazy: lens must import without telemetry

    interval = (
        host_memory.FALLBACK_COLLECTION_INTERVAL
        if host_memory_interval is None
        else host_memory_interval
    )
    host_memory.start_host_memory_monitoring(interval)
    return handle


def shutdown_telemetry(timeout_ms: int = 5000) -> None:
    """Flush and stop the pipeline. Never raises; always leaves lens uninitialised."""
    global _HANDLE
    host_memory = sys.modules.get("raylens.telemetry.host_memory")
    if host_memory is not None:
        try:
            host_memory.stop_host_memory_monitoring()
        except Exception:
            warn_once("lens.shutdown.host_memory", "stopping host-memory monitoring failed")
    with _HANDLE_LOCK:
        handle, _HANDLE = _HANDLE, None
        _CREATED_ON.clear()
    if handle is None:
        return
    if handle.meter_provider is not None:
        try:
            handle.meter_provider.shutdown(timeout_millis=timeout_ms)
        except Exception:
            warn_once("lens.shutdown.provider", "shutting the meter provider down failed")
    for closer in handle._closers:
        try:
            closer()
        except Exception:
            warn_once("lens.shutdown.closer", "closing an exporter endpoint failed")
