"""lens: raylens' thin layer over the OpenTelemetry SDK.

Every raylens metric is declared here (:class:`RecordedMetric`), configured here
(:class:`TelemetryConfig`) and exported through the one pipeline this module
owns per process (:func:`init_telemetry`). See :mod:`raylens.lens.runtime` for
why the pipeline uses a private meter provider and how it keeps the SDK's state
proportional to what is live.

lens imports nothing of raylens above it, and creates no instrument at import.
The driver's entry point, ``init_telemetry_driver``, lives in :mod:`raylens.driver`.
"""

from raylens.lens.config import TelemetryConfig
from raylens.lens.exporters import ConsoleLineExporter
from raylens.lens.metrics import (
    COUNTER,
    GAUGE,
    HISTOGRAM,
    OBSERVABLE_COUNTER,
    OBSERVABLE_GAUGE,
    UP_DOWN_COUNTER,
    RecordedMetric,
    recorded_metrics,
    register_recorded_metrics,
    registry_key,
)
from raylens.lens.runtime import (
    CARDINALITY_LIMIT,
    IDLE_COLLECTIONS,
    TelemetryHandle,
    add_shutdown_hook,
    declared_observables,
    get_telemetry_handle,
    init_telemetry,
    register_observable_counter,
    register_observable_gauge,
    remove_shutdown_hook,
    shutdown_telemetry,
    unregister_observable_gauge,
)
from raylens.lens.warnings import reset_warn_once, warn_once

__all__ = [
    "CARDINALITY_LIMIT",
    "COUNTER",
    "GAUGE",
    "HISTOGRAM",
    "IDLE_COLLECTIONS",
    "OBSERVABLE_COUNTER",
    "OBSERVABLE_GAUGE",
    "UP_DOWN_COUNTER",
    "ConsoleLineExporter",
    "RecordedMetric",
    "TelemetryConfig",
    "TelemetryHandle",
    "add_shutdown_hook",
    "declared_observables",
    "get_telemetry_handle",
    "init_telemetry",
    "recorded_metrics",
    "register_observable_counter",
    "register_observable_gauge",
    "register_recorded_metrics",
    "registry_key",
    "remove_shutdown_hook",
    "reset_warn_once",
    "shutdown_telemetry",
    "unregister_observable_gauge",
    "warn_once",
]
