"""raylens demo says how long its start takes, and --duration counts from the start."""

from __future__ import annotations

import argparse
import sys
import threading
import types
from typing import Any

import pytest

from raylens.cli import cluster_views
from raylens.cli.output import sample_loop
from raylens.cli.parser import build_parser
from raylens_fakes.clock import ManualClock


@pytest.fixture
def slow_demo(monkeypatch: pytest.MonkeyPatch) -> tuple[ManualClock, dict[str, Any]]:
    """A demo cluster that takes 25 s (on the injected clock) to start; watch_nodes recorded."""
    from raylens import demo
    from raylens.telemetry import host_memory

    clock = ManualClock(1000.0)
    seen: dict[str, Any] = {}

    class SlowDemo:
        def __init__(self, nodes: int) -> None:
            pass

        def __enter__(self) -> SlowDemo:
            clock.now += 25.0
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def describe(self) -> str:
            return "worker group 'policy': 2 workers holding 64 MiB each"

    def watch(monitor: Any, args: argparse.Namespace, **options: Any) -> None:
        seen.update(options)
        seen["left"] = options["deadline"] - clock() if options["deadline"] else None

    monkeypatch.setitem(sys.modules, "ray", types.ModuleType("ray"))
    monkeypatch.setattr(demo, "DemoCluster", SlowDemo)
    monkeypatch.setattr(cluster_views, "watch_nodes", watch)
    monkeypatch.setattr(
        host_memory, "HostMemoryMonitor", lambda *a, **k: types.SimpleNamespace(stop=lambda: None)
    )
    return clock, seen


def test_demo_duration_counts_from_the_start(
    slow_demo: tuple[ManualClock, dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    clock, seen = slow_demo
    args = build_parser().parse_args(["demo", "--duration", "30"])
    assert cluster_views.run_demo(args, threading.Event(), clock=clock) == 0
    assert seen["left"] == pytest.approx(5.0)
    out = capsys.readouterr().out
    assert "about 15 s" not in out
    assert "--duration counts from now" in out


def test_without_a_duration_the_demo_runs_until_stopped(
    slow_demo: tuple[ManualClock, dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    clock, seen = slow_demo
    args = build_parser().parse_args(["demo"])
    assert cluster_views.run_demo(args, threading.Event(), clock=clock) == 0
    assert seen["deadline"] is None
    assert "--duration" not in capsys.readouterr().out


def test_a_deadline_passed_before_the_first_sample_still_shows_one() -> None:
    clock = ManualClock(1000.0)
    samples: list[float] = []
    sample_loop(
        lambda: samples.append(clock()),
        interval=2.0,
        once=False,
        deadline=clock() - 1.0,
        stop=threading.Event(),
        clock=clock,
    )
    assert samples == [clock.now]
