from __future__ import annotations

import logging

import pytest
from opentelemetry.metrics import Observation
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from raylens.lens import (
    CARDINALITY_LIMIT,
    RecordedMetric,
    TelemetryConfig,
    get_telemetry_handle,
    init_telemetry,
    register_observable_gauge,
    shutdown_telemetry,
)
from raylens_fakes import MetricsProbe


def test_init_is_idempotent_and_reachable() -> None:
    assert get_telemetry_handle() is None
    first = init_telemetry(TelemetryConfig())
    assert init_telemetry(TelemetryConfig(exporter="console")) is first
    assert get_telemetry_handle() is first


def test_exporter_none_and_telemetry_off_do_not_export() -> None:
    handle = init_telemetry(TelemetryConfig(exporter="none"))
    assert handle.is_exporting is False
    shutdown_telemetry()
    handle = init_telemetry(TelemetryConfig(enabled=False, exporter="console"))
    assert handle.is_exporting is False


def test_metric_reader_replaces_the_exporter(gauge: RecordedMetric) -> None:
    reader = InMemoryMetricReader()
    handle = init_telemetry(TelemetryConfig(exporter="none"), metric_reader=reader)
    assert handle.is_exporting is True
    register_observable_gauge(gauge, lambda options: [Observation(7, {"a": "b"})])
    probe = MetricsProbe()
    probe.reader = reader
    assert probe.points(gauge.name) == {frozenset({("a", "b")}): 7}


def test_gauge_declared_before_init_and_across_reinit(gauge: RecordedMetric) -> None:
    register_observable_gauge(gauge, lambda options: [Observation(1)])
    for _ in range(2):
        with MetricsProbe() as probe:
            assert probe.points(gauge.name) == {frozenset(): 1}
            assert probe.metric(gauge.name).unit == "By"


def test_reregistering_replaces_the_callback(
    metrics_probe: MetricsProbe, gauge: RecordedMetric
) -> None:
    register_observable_gauge(gauge, lambda options: [Observation(1)])
    register_observable_gauge(gauge, lambda options: [Observation(2)])
    assert metrics_probe.points(gauge.name) == {frozenset(): 2}


def test_failing_callback_costs_its_points_and_warns_once(
    metrics_probe: MetricsProbe, gauge: RecordedMetric, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="raylens")

    def broken(options):
        raise RuntimeError("snapshot corrupt")

    register_observable_gauge(gauge, broken)
    for _ in range(3):
        metrics_probe.collect()
        assert metrics_probe.points(gauge.name) == {}
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert gauge.name in warnings[0].getMessage()


def test_register_rejects_non_gauge_kinds() -> None:
    with pytest.raises(ValueError, match="'counter'"):
        register_observable_gauge(RecordedMetric("x.y", "counter", "1", "d"), lambda o: [])


def test_points_is_empty_when_nothing_observed(
    metrics_probe: MetricsProbe, gauge: RecordedMetric
) -> None:
    register_observable_gauge(gauge, lambda options: [])
    assert metrics_probe.points(gauge.name) == {}


def test_shutdown_never_raises_and_allows_init_again() -> None:
    shutdown_telemetry()
    init_telemetry(TelemetryConfig())
    shutdown_telemetry()
    shutdown_telemetry()
    assert get_telemetry_handle() is None
    assert init_telemetry(TelemetryConfig()) is get_telemetry_handle()


def test_thousands_of_attribute_sets_never_overflow(
    metrics_probe: MetricsProbe, gauge: RecordedMetric
) -> None:
    assert CARDINALITY_LIMIT >= 100_000
    current: dict[str, list[Observation]] = {"obs": []}
    register_observable_gauge(gauge, lambda options: current["obs"])
    batch = 1_000
    for round_ in range(3):  # 3,000 sets in all, past the SDK's default limit of 2,000
        current["obs"] = [
            Observation(i, {"node": f"n{i}", "round": str(round_)}) for i in range(batch)
        ]
        metrics_probe.collect()
        points = metrics_probe.points(gauge.name)
        assert all(("otel.metric.overflow", True) not in attrs for attrs in points)
        # Every attribute set of this collection is there with its own value, and no other.
        assert points == {
            frozenset({("node", f"n{i}"), ("round", str(round_))}): i for i in range(batch)
        }


_EXIT_SCRIPT = """
import sys
from opentelemetry.metrics import Observation
from raylens.lens import (
    OBSERVABLE_GAUGE, RecordedMetric, TelemetryConfig, init_telemetry,
    register_observable_gauge, shutdown_telemetry,
)
register_observable_gauge(
    RecordedMetric("test.exit.gauge", OBSERVABLE_GAUGE, "By", "d"),
    lambda options: [Observation(5)],
)
init_telemetry(TelemetryConfig(exporter="console"))
if sys.argv[1] == "shutdown-first":
    shutdown_telemetry()
    init_telemetry(TelemetryConfig(exporter="console"))
"""


@pytest.mark.parametrize("mode", ["exit-only", "shutdown-first"])
@pytest.mark.slow
def test_exit_flushes_once_without_sdk_complaints(mode: str) -> None:
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", _EXIT_SCRIPT, mode],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    expected = 2 if mode == "shutdown-first" else 1
    assert result.stdout.count("test.exit.gauge{} 5 By") == expected
    assert "shutdown can only be called once" not in result.stderr
