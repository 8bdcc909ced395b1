"""lens: raylens' thin layer over the OpenTelemetry SDK.

Every raylens metric is declared here (:class:`RecordedMetric`), configured here
(:class:`TelemetryConfig`) and exported through the one pipeline this module
owns per process (:func:`init_telemetry`). See :mod:`raylens.lens.runtime` for
why the pipeline uses a private meter provider and a raised cardinality limit.
"""

from raylens.lens.config import EXPORTERS, TelemetryConfig
from raylens.lens.exporters import ConsoleLineExporter
from raylens.lens.metrics import (
    COUNTER,
    GAUGE,
    HISTOGRAM,
    METRIC_KINDS,
    OBSERVABLE_GAUGE,
    UP_DOWN_COUNTER,
    RecordedMetric,
    recorded_metrics,
    register_recorded_metrics,
    registry_key,
    reset_recorded_metrics,
)
from raylens.lens.runtime import (
    CARDINALITY_LIMIT,
    TelemetryHandle,
    get_telemetry_handle,
    init_telemetry,
    init_telemetry_driver,
    register_observable_gauge,
    reset_observable_gauges,
    shutdown_telemetry,
    unregister_observable_gauge,
)
from raylens.lens.warnings import reset_warn_once, warn_once

__all__ = [
    "CARDINALITY_LIMIT",
    "COUNTER",
    "EXPORTERS",
    "GAUGE",
    "HISTOGRAM",
    "METRIC_KINDS",
    "OBSERVABLE_GAUGE",
    "UP_DOWN_COUNTER",
    "ConsoleLineExporter",
    "RecordedMetric",
    "TelemetryConfig",
    "TelemetryHandle",
    "get_telemetry_handle",
    "init_telemetry",
    "init_telemetry_driver",
    "recorded_metrics",
    "register_observable_gauge",
    "register_recorded_metrics",
    "registry_key",
    "reset_observable_gauges",
    "reset_recorded_metrics",
    "reset_warn_once",
    "shutdown_telemetry",
    "unregister_observable_gauge",
    "warn_once",
]
