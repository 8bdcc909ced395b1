"""An SDK whose state lens cannot reach degrades to public API: one warning, and renewals.

The installed SDK has every piece; each test here makes lens believe one is missing.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.metrics import Observation

from raylens.lens import (
    RecordedMetric,
    TelemetryConfig,
    _sdk_state,
    get_telemetry_handle,
    init_telemetry,
    register_observable_gauge,
    reset_warn_once,
    runtime,
    shutdown_telemetry,
)
from raylens_fakes import MetricsProbe


@pytest.fixture
def no_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_sdk_state, "layout_gap", lambda instrument: "MissingPiece._state")
    monkeypatch.setattr(runtime, "RENEW_AFTER_UNRELEASED", 3)


def _churn(gauge: RecordedMetric) -> Iterator[int]:
    """Register ``gauge`` reporting one steady set and one new set per collection."""
    counter = itertools.count()
    register_observable_gauge(
        gauge,
        lambda options: [
            Observation(7.0, {"node": "steady"}),
            Observation(1.0, {"node": f"n{next(counter)}"}),
        ],
    )
    return counter


def _collect_until_renewed(rounds: int) -> int:
    """Flush ``rounds`` times; returns how many renewals ran."""
    handle = get_telemetry_handle()
    assert handle is not None
    renewals, seen = 0, runtime.renewal_thread()
    for _ in range(rounds):
        handle.force_flush()
        thread = runtime.renewal_thread()
        if thread is not None and thread is not seen:
            thread.join(30)
            assert not thread.is_alive()
            renewals, seen = renewals + 1, thread
    return renewals


def test_a_missing_piece_is_named_in_one_warning_and_gone_sets_are_let_go_by_renewing(
    gauge: RecordedMetric,
    no_layout: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    warned: list[str] = []
    real_warn_once = runtime.warn_once

    def recording(key: str, message: str, **kwargs: Any) -> bool:
        first = real_warn_once(key, message, **kwargs)
        if first:
            warned.append(message)
        return first

    monkeypatch.setattr(runtime, "warn_once", recording)
    reset_warn_once()
    shutdown_telemetry()
    handle = init_telemetry(TelemetryConfig(exporter="console", export_interval_ms=3_600_000))
    provider = handle.meter_provider
    try:
        _churn(gauge)
        renewals = _collect_until_renewed(12)
        assert renewals >= 1
        assert get_telemetry_handle() is handle and handle.meter_provider is not provider
        # The new provider holds what was reported since it started, not the whole churn.
        assert runtime._sdk_state.held_attribute_sets(handle._gauges[gauge.name]) <= 8
        (warning,) = [message for message in warned if "MissingPiece" in message]
        assert "renewing its pipeline" in warning
    finally:
        shutdown_telemetry()
    lines = capsys.readouterr().out.splitlines()
    steady = [line for line in lines if gauge.name in line and "steady" in line]
    assert steady and all("7" in line for line in steady)


def test_a_pipeline_on_a_reader_from_outside_is_not_renewed(
    gauge: RecordedMetric, no_layout: None, metrics_probe: MetricsProbe
) -> None:
    _churn(gauge)
    handle = get_telemetry_handle()
    assert handle is not None
    provider = handle.meter_provider

    for _ in range(8):
        metrics_probe.collect()
    thread = runtime.renewal_thread()
    if thread is not None:
        thread.join(30)

    assert handle.meter_provider is provider
    assert runtime.renew_pipeline() is False
    assert metrics_probe.points(gauge.name)[frozenset({("node", "steady")})] == 7.0


def test_without_a_pipeline_there_is_nothing_to_renew() -> None:
    shutdown_telemetry()
    assert runtime.renew_pipeline() is False


@pytest.mark.slow
def test_a_renewed_prometheus_pipeline_keeps_its_endpoint_and_series(
    gauge: RecordedMetric,
) -> None:
    import urllib.request

    shutdown_telemetry()
    handle = init_telemetry(TelemetryConfig(exporter="prometheus", prometheus_addr="127.0.0.1:0"))
    try:
        register_observable_gauge(gauge, lambda options: [Observation(5.0, {"node": "a"})])
        assert handle.prometheus is not None
        url = f"http://127.0.0.1:{handle.prometheus.port}/metrics"
        prefix = gauge.name.replace(".", "_") + "_bytes{"

        def lines() -> list[str]:
            with urllib.request.urlopen(url, timeout=10) as answer:
                text = answer.read().decode()
            return [line for line in text.splitlines() if line.startswith(prefix)]

        before = lines()
        assert runtime.renew_pipeline() is True
        after = lines()
    finally:
        shutdown_telemetry()

    assert len(before) == 1 and before[0].endswith(" 5.0")
    assert after == before
