"""Per-group memory wired end to end without Ray: worker groups register, the monitor's cycle collects.

The host-memory monitor runs a cycle hook; the hook asks per-node samplers (a
stand-in ``ray`` whose actors read a :class:`FakeProcFS` per node) and publishes
into the group snapshot the gauges read. Worker groups are real
:class:`RayWorkerGroup` objects on a stand-in cluster and Ray seam.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from raylens.telemetry import host_memory as hm
from raylens_fakes import FakeCluster


def _monitor(**options: Any) -> hm.HostMemoryMonitor:
    options.setdefault("scrape_mode", "inprocess")
    options.setdefault("consumer", True)
    return hm.HostMemoryMonitor(1.0, cluster=FakeCluster(), **options)


# ---- the monitor's cycle hook ----------------------------------------------------------


def test_a_cycle_hook_runs_after_every_cycle_and_its_stop_at_stop() -> None:
    monitor = _monitor()
    seen: list[Any] = []
    stopped: list[bool] = []
    monitor.add_cycle_hook(seen.append, on_stop=lambda: stopped.append(True))
    monitor.add_cycle_hook(seen.append)  # the same hook twice runs once

    monitor.collect_once()
    monitor.collect_once()
    assert seen == [monitor, monitor]
    assert stopped == []

    monitor.stop()
    assert stopped == [True]
    monitor.remove_cycle_hook(seen.append)
    monitor.collect_once()
    assert seen == [monitor, monitor]


def test_a_failing_hook_is_logged_once_and_the_cycle_carries_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    monitor = _monitor()
    after: list[int] = []

    def broken(_monitor: hm.HostMemoryMonitor) -> None:
        raise RuntimeError("sampler manager exploded")

    monitor.add_cycle_hook(broken)
    monitor.add_cycle_hook(lambda _m: after.append(1))
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            monitor.collect_once()
        monitor.stop()

    assert after == [1, 1, 1]
    failures = [r for r in caplog.records if "cycle hook" in r.getMessage()]
    assert len(failures) == 1
