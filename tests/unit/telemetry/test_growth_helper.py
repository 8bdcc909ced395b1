"""Growth kept by the real scrape helper process: the driver records nothing itself."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

import pytest

from raylens.telemetry.growth import GrowthCycle, attach_growth
from raylens.telemetry.history import GrowthSettings, resolve_kill_line_config
from raylens_fakes import SimulatedCluster

# Every test here starts the real scrape helper process: the slow tier.
pytestmark = pytest.mark.slow

GIB = 1024**3


def _cycle() -> GrowthCycle:
    return GrowthCycle(
        settings=GrowthSettings(window_s=60.0), kill_line=resolve_kill_line_config(env={})
    )


def test_the_helper_keeps_the_history_and_the_driver_only_names_its_figures(
    simulated_cluster: Callable[..., SimulatedCluster], make_monitor: Callable
) -> None:
    sim = simulated_cluster(2)
    sim.raylet(0).set_memory(10 * GIB, 64 * GIB)
    sim.raylet(1).set_memory(3 * GIB, 32 * GIB)
    monitor = make_monitor(sim.cluster, scrape_mode="helper", scrape_timeout=2.0)
    cycle = attach_growth(monitor, _cycle())

    monitor.collect_once()
    assert cycle.snapshot.latest()[sim.node_id(0)].limit is not None  # with the first answer
    monitor.collect_once()
    monitor.collect_once()

    outlooks = cycle.snapshot.latest()
    assert outlooks[sim.node_id(0)].limit == pytest.approx(0.95 * 64 * GIB)
    assert outlooks[sim.node_id(1)].limit == pytest.approx(0.95 * 32 * GIB)
    assert monitor.kept_growth() is not None
    assert cycle.history.keys() == []  # nothing recorded in the driver
    history = cycle.recent_history(sim.node_id(0), time.monotonic())
    assert history is not None
    used = history["node_used"]
    assert used is not None and len(used["samples"]) == 3
    assert {value for _ago, value in used["samples"]} == {10 * GIB}


def test_a_monitor_that_scrapes_in_process_keeps_the_growth_itself(
    simulated_cluster: Callable[..., SimulatedCluster], make_monitor: Callable
) -> None:
    sim = simulated_cluster(1)
    sim.raylet(0).set_memory(10 * GIB, 64 * GIB)
    monitor = make_monitor(sim.cluster, scrape_mode="inprocess")
    cycle = attach_growth(monitor, _cycle())

    monitor.collect_once()
    monitor.collect_once()

    assert monitor.kept_growth() is None
    assert cycle.history.keys() == [sim.node_id(0)]
    history = cycle.recent_history(sim.node_id(0), time.monotonic())
    assert history is not None and history["node_used"] is not None
    assert cycle.snapshot.latest()[sim.node_id(0)].limit == pytest.approx(0.95 * 64 * GIB)


def test_a_new_helper_starts_a_new_history_and_sends_its_figures(
    simulated_cluster: Callable[..., SimulatedCluster], make_monitor: Callable
) -> None:
    sim = simulated_cluster(1)
    sim.raylet(0).set_memory(10 * GIB, 64 * GIB)
    monitor = make_monitor(sim.cluster, scrape_mode="helper", scrape_timeout=2.0)
    cycle = attach_growth(monitor, _cycle())
    monitor.collect_once()
    first = monitor.helper_pid
    assert first is not None

    os.kill(first, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while monitor.helper_pid in (None, first) and time.monotonic() < deadline:
        monitor.collect_once()  # a cycle that finds the helper gone starts another

    assert monitor.helper_pid not in (None, first)
    # The new helper's first figures of a node come with its first answer.
    assert cycle.snapshot.latest()[sim.node_id(0)].limit == pytest.approx(0.95 * 64 * GIB)
    history = cycle.recent_history(sim.node_id(0), time.monotonic())
    assert history is not None and history["node_used"] is not None
    assert len(history["node_used"]["samples"]) == 1
