"""The driver entry point never takes the job down, and lens stops what was started above it."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator

import pytest

import raylens.driver
import raylens.lens
from raylens.driver import DRIVER_CONSOLE_INTERVAL_MS, driver_config_from_env, init_telemetry_driver
from raylens.lens import (
    TelemetryConfig,
    add_shutdown_hook,
    get_telemetry_handle,
    remove_shutdown_hook,
    shutdown_telemetry,
)
from raylens.telemetry import host_memory


@pytest.fixture
def monitor_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Record the driver's calls into host_memory instead of starting a real monitor."""
    calls: list[str] = []
    monkeypatch.setattr(
        host_memory,
        "start_host_memory_monitoring",
        lambda interval: calls.append(f"start {interval}"),
    )
    monkeypatch.setattr(host_memory, "stop_host_memory_monitoring", lambda: calls.append("stop"))
    yield calls


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def test_the_driver_entry_point_lives_in_the_driver_module_only() -> None:
    assert callable(raylens.driver.init_telemetry_driver)
    assert not hasattr(raylens.lens, "init_telemetry_driver")


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("RAYLENS_EXPORTER", "jaeger"),
        ("OTEL_METRIC_EXPORT_INTERVAL", "soon"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://[::1"),
        ("RAYLENS_PROMETHEUS_ADDR", "nowhere"),
    ],
)
def test_a_malformed_variable_is_one_error_and_the_driver_carries_on(
    variable: str,
    value: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    monitor_calls: list[str],
) -> None:
    monkeypatch.setenv(variable, value)
    with caplog.at_level(logging.ERROR, logger="raylens"):
        handle = init_telemetry_driver(host_memory_interval=3.0)

    assert handle is get_telemetry_handle()
    assert handle.is_exporting is False
    (error,) = _errors(caplog)
    assert variable in error and repr(value) in error
    assert monitor_calls == ["start 3.0"]
    with pytest.raises(ValueError, match=variable):
        TelemetryConfig.from_env()


def test_a_prometheus_port_in_use_is_one_error_and_the_driver_carries_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, monitor_calls: list[str]
) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        monkeypatch.setenv("RAYLENS_EXPORTER", "prometheus")
        monkeypatch.setenv("RAYLENS_PROMETHEUS_ADDR", f"127.0.0.1:{port}")
        with caplog.at_level(logging.ERROR, logger="raylens"):
            handle = init_telemetry_driver()

    assert handle.is_exporting is False
    (error,) = _errors(caplog)
    assert f"127.0.0.1:{port}" in error and "prometheus" in error
    assert monitor_calls == [f"start {host_memory.FALLBACK_COLLECTION_INTERVAL}"]


def test_the_monitor_stops_when_telemetry_shuts_down(monitor_calls: list[str]) -> None:
    init_telemetry_driver(TelemetryConfig(), host_memory_interval=1.0)
    shutdown_telemetry()
    shutdown_telemetry()
    assert monitor_calls == ["start 1.0", "stop"]


def test_the_driver_prints_to_the_console_every_few_seconds_by_default() -> None:
    config = driver_config_from_env({"RAYLENS_EXPORTER": "console"})
    assert config.export_interval_ms == DRIVER_CONSOLE_INTERVAL_MS <= 10_000
    assert TelemetryConfig.from_env({"RAYLENS_EXPORTER": "console"}).export_interval_ms == 60_000


def test_an_explicit_interval_wins_over_the_driver_default() -> None:
    config = driver_config_from_env(
        {"RAYLENS_EXPORTER": "console", "OTEL_METRIC_EXPORT_INTERVAL": "60000"}
    )
    assert config.export_interval_ms == 60_000
    otlp = driver_config_from_env({"RAYLENS_EXPORTER": "otlp"})
    assert otlp.export_interval_ms == 60_000


# Shutdown hooks ---------------------------------------------------------------------------


def test_hooks_run_newest_first_once_each_and_then_are_forgotten() -> None:
    ran: list[str] = []

    def first() -> None:
        ran.append("first")

    def second() -> None:
        ran.append("second")

    add_shutdown_hook(first)
    add_shutdown_hook(second)
    add_shutdown_hook(first)
    shutdown_telemetry()
    shutdown_telemetry()
    assert ran == ["second", "first"]


def test_a_removed_hook_does_not_run() -> None:
    ran: list[str] = []

    def hook() -> None:
        ran.append("hook")

    add_shutdown_hook(hook)
    remove_shutdown_hook(hook)
    remove_shutdown_hook(hook)
    shutdown_telemetry()
    assert ran == []


def test_a_failing_hook_does_not_stop_the_others(caplog: pytest.LogCaptureFixture) -> None:
    ran: list[str] = []

    def broken() -> None:
        raise RuntimeError("hook broke")

    add_shutdown_hook(lambda: ran.append("last"))
    add_shutdown_hook(broken)
    with caplog.at_level(logging.WARNING, logger="raylens"):
        shutdown_telemetry()
    assert ran == ["last"]
    assert any("broken" in r.getMessage() for r in caplog.records)


def test_a_hook_must_be_callable() -> None:
    with pytest.raises(TypeError, match="'later'"):
        add_shutdown_hook("later")  # type: ignore[arg-type]


class _RecordingMonitor:
    def __init__(self) -> None:
        self.hooks: list[object] = []

    def add_cycle_hook(self, hook: object, *, on_stop: object = None) -> None:
        self.hooks.append(hook)


class _GrowthSettingsTaken:
    """The samplers of a stand-in group-memory cycle: what growth settings they were given."""

    def __init__(self) -> None:
        self.windows: list[float | None] = []
        self.kill_lines: list[object] = []

    def configure_growth(self, *, window_s: float | None = None, kill_line: object = None) -> None:
        self.windows.append(window_s)
        self.kill_lines.append(kill_line)

    def recent_history(self, node_id: str, at_wall: float) -> None:
        return None

    def start_early(self, node_ids: object) -> list[str]:
        self.started_early = True
        return []


@pytest.mark.parametrize(
    ("keyword", "env", "window"),
    [
        (None, None, 300.0),
        (None, "45", 45.0),
        (40.0, "45", 40.0),
        ("soon", None, 300.0),
        (None, "10", 300.0),  # shorter than 40 readings at 1 s: refused
        (20.0, None, 300.0),
    ],
)
def test_the_driver_gives_its_samplers_the_window_it_was_given(
    keyword: object,
    env: str | None,
    window: float,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from types import SimpleNamespace

    from raylens.telemetry.growth_outlook import GrowthCycle

    monitor = _RecordingMonitor()
    samplers = _GrowthSettingsTaken()
    groups = SimpleNamespace(samplers=samplers, every_node=False)
    monkeypatch.setattr(host_memory, "start_host_memory_monitoring", lambda interval: monitor)
    monkeypatch.setattr(raylens.driver, "_attach_group_memory", lambda monitor: groups)
    if env is None:
        monkeypatch.delenv("RAYLENS_GROWTH_WINDOW", raising=False)
    else:
        monkeypatch.setenv("RAYLENS_GROWTH_WINDOW", env)
    with caplog.at_level(logging.ERROR):
        init_telemetry_driver(TelemetryConfig(exporter="none"), growth_window=keyword)  # type: ignore[arg-type]
    shutdown_telemetry()
    cycles = [hook for hook in monitor.hooks if isinstance(hook, GrowthCycle)]
    assert len(cycles) == 1
    assert samplers.windows == [window]
    assert samplers.kill_lines == [cycles[0].kill_line]
    assert cycles[0].node_history == samplers.recent_history
    assert groups.every_node  # set once the samplers have their settings
    assert samplers.started_early  # and started then, ahead of any group's workers
    errors = _errors(caplog)
    refused = keyword == "soon" or window != (keyword or float(env or 300.0))
    assert bool(errors) == refused
    if env == "10" or keyword == 20.0:
        (line,) = errors
        assert "shortest growth window allowed" in line and "40 s" in line and "\n" not in line


def test_the_driver_exports_phases_and_takes_their_settings(
    monitor_calls: list[str], tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from raylens.distributed import phases
    from raylens.telemetry.phases.memory import PHASE_PEAK_METRIC

    log = tmp_path / "phases.jsonl"
    reader = InMemoryMetricReader()
    init_telemetry_driver(
        host_memory_interval=1.0, metric_reader=reader, kernel_peaks=False, phase_log=log
    )
    assert phases.DEFAULT_MARKER.kernel_peaks is False
    assert phases.DEFAULT_MARKER.log_path == str(log)
    with phases.phase("gen"):
        pass
    data = reader.get_metrics_data()
    points = [
        point
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == PHASE_PEAK_METRIC
        for point in metric.data.data_points
    ]
    assert {point.attributes["rl.peak.source"] for point in points} <= {"sampled"}
    assert log.read_text().count("\n") == 1
    shutdown_telemetry()
    with caplog.at_level(logging.ERROR, logger="raylens"):
        init_telemetry_driver(host_memory_interval=1.0, kernel_peaks="no")  # type: ignore[arg-type]
    assert any("kernel_peaks must be a bool" in message for message in _errors(caplog))


def test_the_drivers_post_mortems_name_the_phase_in_progress(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import raylens
    from raylens.telemetry.oom import OomWatch

    hooks: list[object] = []

    class RecordingMonitor:
        has_consumer = False

        def add_cycle_hook(self, hook: object, *, on_stop: object = None) -> None:
            hooks.append(hook)

        def remove_cycle_hook(self, hook: object) -> None:
            pass

    monkeypatch.setattr(
        host_memory, "start_host_memory_monitoring", lambda *_a, **_k: RecordingMonitor()
    )
    monkeypatch.setattr(host_memory, "stop_host_memory_monitoring", lambda: None)
    init_telemetry_driver(TelemetryConfig(), host_memory_interval=1.0)
    (watch,) = [hook for hook in hooks if isinstance(hook, OomWatch)]

    assert watch.phase_of() is None
    with raylens.phase("checkpoint"):
        assert watch.phase_of() == "checkpoint"
    assert watch.phase_of() is None
