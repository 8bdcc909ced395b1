"""The OpenTelemetry pipeline of one ``raylens`` run: started from the flags, flushed at the end."""

from __future__ import annotations

import dataclasses
import sys
from typing import TYPE_CHECKING

from raylens.cli.parser import CliError
from raylens.lens import (
    ConsoleLineExporter,
    TelemetryConfig,
    get_telemetry_handle,
    init_telemetry,
    shutdown_telemetry,
)
from raylens.safe_text import printable

if TYPE_CHECKING:
    from raylens.telemetry.host_memory import HostMemoryMonitor


def start_telemetry(exporter: str | None, *, as_json: bool = False) -> None:
    """Start lens; with ``--json`` the console exporter writes to stderr, stdout is for samples."""
    try:
        config = TelemetryConfig.from_env()
        if exporter is not None:
            config = dataclasses.replace(config, exporter=exporter)
        reader = None
        if as_json and config.enabled and config.exporter == "console":
            from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

            reader = PeriodicExportingMetricReader(
                ConsoleLineExporter(sys.stderr),
                export_interval_millis=config.export_interval_ms,
            )
        init_telemetry(config, metric_reader=reader)
    except (ValueError, RuntimeError) as error:
        raise CliError(str(error)) from None
    _announce_prometheus()


def _announce_prometheus() -> None:
    """Say on stderr where Prometheus can scrape this run, when that exporter is on."""
    handle = get_telemetry_handle()
    endpoint = getattr(handle, "prometheus", None)
    host, port = getattr(endpoint, "host", None), getattr(endpoint, "port", None)
    if host is None or port is None:
        return
    shown = f"[{host}]" if ":" in host else host
    print(
        printable(f"raylens: Prometheus metrics at http://{shown}:{port}/metrics"), file=sys.stderr
    )


def scrape_timeout_for(interval: float) -> float:
    """A node's scrape deadline: the monitor's default, but never longer than ``interval``."""
    from raylens.telemetry.host_memory import SCRAPE_TIMEOUT_S

    return min(SCRAPE_TIMEOUT_S, interval)


def stop_monitoring(monitor: HostMemoryMonitor) -> None:
    """Flush telemetry, then stop sampling, while the cluster and its labels still exist.

    In that order the last export still reads the monitor's latest samples.
    """
    try:
        shutdown_telemetry()
    finally:
        monitor.stop()
