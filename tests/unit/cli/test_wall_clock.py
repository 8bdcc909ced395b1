"""Where raylens reports wall-clock time, it is the clock's time, frozen here with freezegun.

Two places read it: the ``time`` field of every JSON sample the command writes
(``simulate``, ``profile``, ``watch``), and the timestamp of every exported point,
which the OpenTelemetry SDK takes from ``time.time_ns()`` at collection. Ageing and
scheduling run on a monotonic clock and are not looked at here.

The command tests let the frozen clock tick (``tick=True``): the command waits on
deadlines, and a monotonic clock that never moved would keep it waiting forever. The
sample's time must then lie between the frozen instant and that instant plus the real
time the command took.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

import pytest
import responses
from freezegun import freeze_time
from opentelemetry.metrics import Observation
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from raylens.cli import main
from raylens.lens import (
    RecordedMetric,
    TelemetryConfig,
    init_telemetry,
    shutdown_telemetry,
)
from raylens_fakes.otel import MetricsProbe

# Far from any real "now", so that a time read from the real clock cannot pass for it.
FROZEN = datetime(2001, 2, 3, 4, 5, 6, tzinfo=timezone.utc)
FROZEN_S = FROZEN.timestamp()
FROZEN_NS = int(FROZEN_S) * 10**9
GAUGE_NAME = "test.clock.memory"


def _json_records(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def _run_frozen(argv: list[str]) -> tuple[int, float]:
    """Run ``raylens argv`` under a ticking frozen clock: its status and its real duration."""
    real_clock = time.monotonic  # held locally: freezegun patches module attributes only
    started = real_clock()
    with freeze_time(FROZEN, tick=True):
        status = main(argv)
    return status, real_clock() - started


def _assert_frozen_time(record: dict, real_duration: float) -> None:
    stamp = record["time"]
    assert isinstance(stamp, float)
    assert FROZEN_S <= stamp <= FROZEN_S + real_duration, (
        f"time {stamp} is not the frozen clock's {FROZEN_S} (+ up to {real_duration:.2f} s)"
    )


def test_simulate_json_sample_carries_the_clocks_time(capsys: pytest.CaptureFixture[str]) -> None:
    status, took = _run_frozen(["simulate", "--nodes", "2", "--once", "--json"])
    assert status == 0
    records = _json_records(capsys.readouterr().out)
    assert len(records) == 1
    assert len(records[0]["nodes"]) == 2
    _assert_frozen_time(records[0], took)


def test_unfrozen_sample_time_is_the_epoch_clock(capsys: pytest.CaptureFixture[str]) -> None:
    """Without freezegun the field is seconds since the epoch, not a monotonic reading."""
    before = time.time()
    assert main(["simulate", "--nodes", "1", "--once", "--json"]) == 0
    after = time.time()
    (record,) = _json_records(capsys.readouterr().out)
    assert before <= record["time"] <= after


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process trees need Linux /proc")
@pytest.mark.slow
def test_profile_json_sample_carries_the_clocks_time(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["profile", "--once", "--json", "--interval", "0.2", "--", sys.executable, "-c", "pass"]
    status, took = _run_frozen(argv)
    assert status == 0
    records = _json_records(capsys.readouterr().out)
    assert len(records) == 1
    _assert_frozen_time(records[0], took)


@pytest.fixture
def clock_gauge(declare_gauge: Callable[..., RecordedMetric]) -> RecordedMetric:
    return declare_gauge(
        lambda options: [Observation(1.0, {"n": "a"}), Observation(2.0, {"n": "b"})],
        name=GAUGE_NAME,
        description="memory for clock tests",
    )


def _timestamps(probe: MetricsProbe) -> list[int]:
    metric = probe.metric(GAUGE_NAME)
    assert metric is not None
    return [point.time_unix_nano for point in metric.data.data_points]


def test_exported_points_carry_the_clocks_time_at_each_collection(
    clock_gauge: RecordedMetric, metrics_probe: MetricsProbe
) -> None:
    with freeze_time(FROZEN) as clock:
        assert _timestamps(metrics_probe) == [FROZEN_NS, FROZEN_NS]
        clock.move_to(FROZEN + timedelta(seconds=90))
        assert _timestamps(metrics_probe) == [FROZEN_NS + 90 * 10**9] * 2
        # A wall clock set back (an NTP step) is reported as it is, not smoothed.
        clock.move_to(FROZEN - timedelta(seconds=30))
        assert _timestamps(metrics_probe) == [FROZEN_NS - 30 * 10**9] * 2


def test_otlp_request_carries_the_clocks_time(clock_gauge: RecordedMetric) -> None:
    url = "http://collector.test:4318/v1/metrics"
    with responses.RequestsMock() as collector:
        collector.add(responses.POST, url, status=200)
        try:
            with freeze_time(FROZEN):
                handle = init_telemetry(
                    TelemetryConfig.from_env(
                        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector.test:4318"}
                    )
                )
                assert handle.force_flush()
        finally:
            shutdown_telemetry()
        request = ExportMetricsServiceRequest()
        request.ParseFromString(collector.calls[0].request.body)
    stamps = [
        point.time_unix_nano
        for resource in request.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == GAUGE_NAME
        for point in metric.gauge.data_points
    ]
    assert stamps == [FROZEN_NS, FROZEN_NS]
