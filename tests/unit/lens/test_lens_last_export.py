"""The last export at shutdown still carries what the work started beside telemetry published."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from opentelemetry.metrics import Observation
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
)

from raylens.cluster import use_cluster_view
from raylens.driver import init_telemetry_driver
from raylens.lens import (
    OBSERVABLE_GAUGE,
    RecordedMetric,
    add_shutdown_hook,
    init_telemetry,
    register_observable_gauge,
    shutdown_telemetry,
    unregister_observable_gauge,
)
from raylens.telemetry import host_memory as hm
from raylens.telemetry.host_memory._monitor import SCRAPE_MODE_ENV
from raylens.telemetry.host_memory._process_state import DEFAULT_SNAPSHOT


class _Recorder(MetricExporter):
    """Keeps the metric names and attribute sets of every export it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.exports: list[dict[str, list[dict[str, Any]]]] = []

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        seen: dict[str, list[dict[str, Any]]] = {}
        for resource_metrics in metrics_data.resource_metrics:
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    seen.setdefault(metric.name, []).extend(
                        dict(point.attributes or {}) for point in metric.data.data_points
                    )
        self.exports.append(seen)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        pass


def _wait_for(condition: Any, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout} s")
        threading.Event().wait(0.02)


def test_the_final_export_of_a_driver_still_has_its_host_memory_points(
    simulated_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SCRAPE_MODE_ENV, "inprocess")
    sim = simulated_cluster(2)
    hm.register_worker_group_nodes("policy", [sim.node_id(0)])
    recorder = _Recorder()
    # Exports only at shutdown: the one export this test looks at is the last one.
    reader = PeriodicExportingMetricReader(recorder, export_interval_millis=3_600_000)
    with use_cluster_view(sim.cluster):
        # As examples/driver.py does: the driver keeps no reference to the monitor.
        init_telemetry_driver(metric_reader=reader, host_memory_interval=0.2)
        _wait_for(
            lambda: sum(r.error is None for r in DEFAULT_SNAPSHOT.records.values()) == 2,
            "both nodes sampled",
        )
        shutdown_telemetry()

    assert recorder.exports, "nothing was exported at shutdown"
    last = recorder.exports[-1]
    labels = {
        point["ray.node.id"]: point["rl.worker_groups"]
        for point in last.get(hm.RL_HOST_MEMORY_USED_METRIC, [])
    }
    assert labels == {sim.node_id(0): "policy", sim.node_id(1): "none"}


def test_shutdown_hooks_run_after_the_final_export() -> None:
    order: list[str] = []
    gauge = RecordedMetric("test.last_export.alive", OBSERVABLE_GAUGE, "1", "one point while up")
    register_observable_gauge(gauge, lambda options: [Observation(1)])

    class Noting(_Recorder):
        def export(self, metrics_data: MetricsData, *args: Any, **kwargs: Any) -> Any:
            order.append("export")
            return super().export(metrics_data, *args, **kwargs)

    init_telemetry(
        metric_reader=PeriodicExportingMetricReader(Noting(), export_interval_millis=3_600_000)
    )
    add_shutdown_hook(lambda: order.append("hook"))
    try:
        shutdown_telemetry()
    finally:
        unregister_observable_gauge(gauge.name)
    assert order == ["export", "hook"]
