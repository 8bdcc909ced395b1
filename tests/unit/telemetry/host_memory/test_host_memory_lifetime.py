"""A monitor that collected or started exports until it is stopped, referenced or not."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest

from raylens.telemetry import host_memory as hm

# Each collection here walks only what the test made.
pytestmark = pytest.mark.usefixtures("young_heap")


def _monitor(cluster: Any) -> hm.HostMemoryMonitor:
    return hm.HostMemoryMonitor(1.0, cluster=cluster, scrape_timeout=2.0, scrape_mode="inprocess")


def test_an_unreferenced_monitor_that_collected_still_exports(
    simulated_cluster: Any, metrics_probe: Any
) -> None:
    sim = simulated_cluster(2)
    _monitor(sim.cluster).collect_once()  # nobody keeps the monitor
    gc.collect()
    points = metrics_probe.points_by(hm.RL_HOST_MEMORY_USED_METRIC, hm.RAY_NODE_ID_ATTR)
    assert set(points) == {sim.node_id(0), sim.node_id(1)}


def test_a_stopped_monitor_is_let_go_and_exports_nothing(
    simulated_cluster: Any, metrics_probe: Any
) -> None:
    sim = simulated_cluster(2)
    monitor = _monitor(sim.cluster)
    monitor.collect_once()
    monitor.stop()
    gone = weakref.ref(monitor)
    del monitor
    gc.collect()
    assert gone() is None
    assert metrics_probe.points(hm.RL_HOST_MEMORY_USED_METRIC) == {}


def test_a_monitor_never_used_is_not_held(simulated_cluster: Any) -> None:
    monitor = _monitor(simulated_cluster(1).cluster)
    gone = weakref.ref(monitor)
    del monitor
    gc.collect()
    assert gone() is None
