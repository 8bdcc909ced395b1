"""The scrape helper process: it scrapes, it is replaced when it dies, and it never
outlives the driver."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from raylens.telemetry import host_memory as hm
from raylens.telemetry.host_memory._helper_engine import HelperEngine
from raylens.telemetry.host_memory._monitor import SHUTDOWN_GRACE_S, ScrapeMode
from raylens.telemetry.scraping import DriverChannel
from raylens_fakes import MetricsProbe, SimulatedCluster

# Every test here starts the real scrape helper process: the slow tier.
pytestmark = pytest.mark.slow

Factory = Callable[..., SimulatedCluster]
LOGGER = "raylens.telemetry.host_memory"


def _gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (exited, or a zombie waiting for its reaper)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def test_the_helper_scrapes_and_stop_ends_it_within_the_bound(
    simulated_cluster: Factory, make_monitor: Callable, metrics_probe: MetricsProbe
) -> None:
    sim = simulated_cluster(3)
    sim.raylet(2).hang()
    monitor = make_monitor(sim.cluster, scrape_mode="helper", scrape_timeout=1.0)

    monitor.collect_once()
    pid = monitor.helper_pid
    assert pid is not None and pid != os.getpid()
    errors = {s.node_id: s.error for s in monitor.latest()}
    assert errors[sim.node_id(0)] is None and errors[sim.node_id(1)] is None
    assert "timed out" in (errors[sim.node_id(2)] or "")
    metrics_probe.collect()
    exported = {dict(a)["ray.node.id"] for a in metrics_probe.points(hm.RL_HOST_MEMORY_USED_METRIC)}
    assert exported == {sim.node_id(0), sim.node_id(1)}

    monitor.start()
    assert sim.raylet(2).wait_for_requests(2, timeout=10)  # a cycle is in flight on the hung node
    started = time.monotonic()
    monitor.stop()

    assert time.monotonic() - started < 1.0 + SHUTDOWN_GRACE_S
    assert _gone(pid)
    assert monitor.helper_pid is None


def test_a_helper_killed_mid_cycle_is_replaced_next_cycle_with_one_warning(
    simulated_cluster: Factory, make_monitor: Callable, caplog: pytest.LogCaptureFixture
) -> None:
    sim = simulated_cluster(2)
    monitor = make_monitor(sim.cluster, scrape_mode="helper", scrape_timeout=5.0)
    monitor.collect_once()
    first = monitor.helper_pid
    assert first is not None
    sim.raylet(1).hang()

    def kill_when_asked() -> None:
        if sim.raylet(1).wait_for_requests(2, timeout=10):
            os.kill(first, signal.SIGKILL)

    killer = threading.Thread(target=kill_when_asked)
    killer.start()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        started = time.monotonic()
        monitor.collect_once()  # the helper dies under it: the cycle ends at once
        assert time.monotonic() - started < 5.0
        killer.join(10)
        assert (
            "exited before answering"
            in {s.node_id: s.error for s in monitor.latest()}[sim.node_id(1)]
        )
        sim.raylet(1).serve_normally()
        monitor.collect_once()
        monitor.collect_once()

    second = monitor.helper_pid
    assert second is not None and second != first
    assert not os.path.exists(f"/proc/{first}")  # reaped by the driver: no zombie
    assert all(s.error is None for s in monitor.latest())
    restarts = [r for r in caplog.records if "started a new one" in r.getMessage()]
    assert len(restarts) == 1


_DRIVER = textwrap.dedent(
    """
    import sys
    with open(sys.argv[2], "a") as marker:  # module level, unguarded: must run once
        marker.write("ran\\n")
    from raylens.telemetry.host_memory import HostMemoryMonitor
    from raylens_fakes import FakeCluster

    cluster = FakeCluster()
    cluster.add_node(address="127.0.0.1", port=int(sys.argv[1]))
    monitor = HostMemoryMonitor(60.0, cluster=cluster, scrape_mode="helper", consumer=True,
                                scrape_timeout=0.5)
    monitor.collect_once()
    print(monitor.helper_pid, flush=True)
    sys.stdin.read()
    """
)


def test_a_driver_killed_with_sigkill_leaves_no_helper_behind(
    tmp_path: Path, wait_until: Callable[..., bool]
) -> None:
    script = tmp_path / "driver.py"
    script.write_text(_DRIVER)
    with SimulatedCluster(1) as sim:
        driver = subprocess.Popen(
            [sys.executable, str(script), str(sim.raylet(0).port), str(tmp_path / "marker")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            line = driver.stdout.readline() if driver.stdout else ""
            helper = int(line)
            assert not _gone(helper)
            assert sim.raylet(0).requests == 1
            # The helper did not re-run the driver's unguarded script.
            assert (tmp_path / "marker").read_text().splitlines() == ["ran"]
            driver.send_signal(signal.SIGKILL)
            driver.wait(10)
            assert wait_until(lambda: _gone(helper), 2.0)
        finally:
            if driver.poll() is None:
                driver.kill()
                driver.wait(10)


def test_a_helper_that_cannot_start_falls_back_to_scraping_in_process(
    simulated_cluster: Factory,
    make_monitor: Callable,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def dead_on_arrival(self: HelperEngine) -> None:
        ours, theirs = socket.socketpair()
        process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
        theirs.close()
        self._process, self._channel, self._ready = process, DriverChannel(ours), False

    monkeypatch.setattr(HelperEngine, "_start", dead_on_arrival)
    sim = simulated_cluster(2)
    monitor = make_monitor(sim.cluster, scrape_mode="helper")

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for _ in range(3):
            monitor.collect_once()

    assert monitor.scrape_mode is ScrapeMode.INPROCESS
    assert [s.error for s in monitor.latest()] == [None, None]
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert sum("scraping in this process instead" in m for m in messages) == 1


def test_group_figures_the_driver_holds_come_back_whole_without_crossing_again(
    simulated_cluster: Factory, make_monitor: Callable
) -> None:
    # One reading per sampler for the whole test: every scrape after the first carries
    # the figures the driver already holds.
    sim = simulated_cluster(2, groups=lambda _i, _t: {"policy": 3.0e9}, sampler_interval_s=3600.0)
    monitor = make_monitor(sim.cluster, scrape_mode="helper", scrape_timeout=2.0)

    monitor.collect_once()
    first = {node: figures for node, (_h, figures, _at) in monitor.group_figures().items()}
    monitor.collect_once()
    second = {node: figures for node, (_h, figures, _at) in monitor.group_figures().items()}

    assert set(first) == {sim.node_id(0), sim.node_id(1)}
    assert second == first
    assert {f.group for figures in second.values() for f in figures.groups} == {"policy"}
