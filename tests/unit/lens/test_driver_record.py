"""``init_telemetry_driver(record=...)``: one frame per monitor cycle, with the driver's phase."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import raylens.driver
from raylens.distributed import phases
from raylens.driver import init_telemetry_driver
from raylens.lens import TelemetryConfig, shutdown_telemetry
from raylens.telemetry import host_memory
from raylens.telemetry.host_memory import NodeSample
from raylens.telemetry.memory_record import read_record


class _Monitor:
    def __init__(self) -> None:
        self.hooks: list[object] = []
        self.samples = [
            NodeSample("aa" * 28, "gpu-1", "10.0.0.1", 3e9, 8e9, "policy", 1.0),
            NodeSample("bb" * 28, "gpu-2", "10.0.0.2", None, None, "", None, error="timed out"),
        ]

    def add_cycle_hook(self, hook: object, *, on_stop: object = None) -> None:
        self.hooks.append(hook)

    def latest(self) -> list[NodeSample]:
        return self.samples

    def cycle(self) -> None:
        for hook in self.hooks:
            if isinstance(hook, raylens.driver._CycleRecorder):
                hook(self)  # type: ignore[arg-type]


@pytest.fixture
def monitor(monkeypatch: pytest.MonkeyPatch) -> _Monitor:
    stand_in = _Monitor()
    monkeypatch.setattr(host_memory, "start_host_memory_monitoring", lambda interval: stand_in)
    monkeypatch.setattr(raylens.driver, "_attach_group_memory", lambda monitor: None)
    return stand_in


def test_each_cycle_appends_the_live_nodes_and_the_phase_in_progress(
    monitor: _Monitor, tmp_path: Path
) -> None:
    path = tmp_path / "driver.jsonl"
    init_telemetry_driver(TelemetryConfig(exporter="none"), record=path)
    monitor.cycle()
    with phases.phase("rollout"):
        monitor.cycle()
    monitor.cycle()
    shutdown_telemetry()

    run = read_record(path)
    assert list(run.nodes) == ["aa" * 28]  # the failing node is left out
    assert run.nodes["aa" * 28].used == [3e9] * 3
    (span,) = run.phases
    assert span.name == "rollout" and span.end == run.nodes["aa" * 28].times[2]


def test_no_record_is_kept_unless_asked(monitor: _Monitor) -> None:
    init_telemetry_driver(TelemetryConfig(exporter="none"))
    shutdown_telemetry()
    assert not any(isinstance(h, raylens.driver._CycleRecorder) for h in monitor.hooks)


def test_an_empty_record_path_is_one_error_and_the_driver_carries_on(
    monitor: _Monitor, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="raylens"):
        init_telemetry_driver(TelemetryConfig(exporter="none"), record="")
    shutdown_telemetry()
    (error,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert "record path must be a non-empty path" in error
