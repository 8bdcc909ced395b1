"""HostMemoryMonitor: deadlines, sample age and the process's monitor under awkward timing."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import pytest

from raylens.telemetry import host_memory as hm
from raylens.telemetry.host_memory._monitor import ScrapeMode
from raylens_fakes import FakeCluster, MetricsProbe, SimulatedCluster

USED = "rl.host.memory.used"

Factory = Callable[..., SimulatedCluster]


def _exported_nodes(probe: MetricsProbe) -> set[str]:
    probe.collect()
    return {dict(attributes)["ray.node.id"] for attributes in probe.points(USED)}


@pytest.mark.slow
def test_headers_trickled_a_byte_at_a_time_are_cut_at_the_deadline(
    simulated_cluster: Factory, make_monitor: Callable
) -> None:
    sim = simulated_cluster(2)
    # ~150 header bytes at 0.05 s each: several seconds before there is even a response.
    sim.raylet(0).trickle(0.05, headers=True)
    monitor = make_monitor(sim.cluster, scrape_timeout=0.3)

    monitor.collect_once()

    rows = {s.node_id: s for s in monitor.latest()}
    # The scrape itself gave up at the deadline and reported it within the cycle;
    # it did not run on past the cycle holding a thread and the node's in-flight mark.
    assert rows[sim.node_id(0)].error == "timed out waiting for the raylet to answer"
    assert rows[sim.node_id(1)].error is None
    assert sim.raylet(0).wait_idle(timeout=2)

    monitor.collect_once()  # asked again, not skipped as still in flight
    assert sim.raylet(0).requests == 2


@pytest.mark.slow
def test_sample_age_counts_from_the_answer_not_from_the_end_of_the_cycle(
    simulated_cluster: Factory, metrics_probe: MetricsProbe, make_monitor: Callable
) -> None:
    sim = simulated_cluster(2)
    sim.raylet(1).delay(0.6)  # holds the cycle open well after the quick node answered
    now = [500.0]
    monitor = make_monitor(sim.cluster, scrape_timeout=5.0, max_age=10.0, clock=lambda: now[0])

    monitor.collect_once()

    rows = {s.node_id: s for s in monitor.latest()}
    quick, slow = rows[sim.node_id(0)].sampled_at, rows[sim.node_id(1)].sampled_at
    assert quick is not None and slow is not None
    assert slow - quick >= 0.5  # each stamped when it answered, on the monitor's clock
    now[0] = quick + 10.0 + 1e-6  # past the quick node's max age, within the slow one's
    assert _exported_nodes(metrics_probe) == {sim.node_id(1)}


@pytest.mark.slow
def test_stopping_while_the_process_monitor_starts_leaves_none_running(
    fake_cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    entered, go = threading.Event(), threading.Event()
    real_start = hm.HostMemoryMonitor.start

    def slow_start(self: hm.HostMemoryMonitor) -> None:
        entered.set()
        go.wait(5)
        real_start(self)

    monkeypatch.setattr(hm.HostMemoryMonitor, "start", slow_start)
    starter = threading.Thread(target=hm.start_host_memory_monitoring, args=(1.0,))
    starter.start()
    assert entered.wait(5)
    monitor = hm._MONITOR
    stopper = threading.Thread(target=hm.stop_host_memory_monitoring)
    stopper.start()
    # A stop that does not wait for the start in progress ends here, before it.
    stopper.join(0.5)
    go.set()
    starter.join(5)
    stopper.join(5)

    assert hm._MONITOR is None
    assert monitor is not None and not monitor.running


def test_stopping_mid_cycle_does_not_report_the_unanswered_nodes_as_timed_out(
    simulated_cluster: Factory, make_monitor: Callable, caplog: pytest.LogCaptureFixture
) -> None:
    sim = simulated_cluster(2)
    sim.raylet(1).hang()
    monitor = make_monitor(sim.cluster, scrape_timeout=5.0)
    monitor.start()
    assert sim.raylet(1).wait_for_requests(1)

    with caplog.at_level(logging.WARNING, logger="raylens.telemetry.host_memory"):
        monitor.stop()

    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    rows = {s.node_id: s for s in monitor.latest()}
    assert rows[sim.node_id(1)].error == "not answered before monitoring stopped"


def test_documented_defaults(fake_cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAYLENS_SCRAPE_MODE", raising=False)
    monitor = hm.HostMemoryMonitor(2.0, cluster=fake_cluster)

    assert monitor.scrape_timeout == 5.0
    assert monitor.max_concurrency == 256
    assert monitor.scrape_mode is ScrapeMode.HELPER
    assert monitor.max_body_bytes == 16 * 1024 * 1024
    assert monitor.max_age == 2 * 2.0 + 5.0


def test_stop_monitoring_never_raises_and_forgets_the_monitor(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken:
        def stop(self) -> None:
            raise RuntimeError("stuck")

    hm._MONITOR = Broken()  # type: ignore[assignment]
    with caplog.at_level(logging.WARNING, logger="raylens.telemetry.host_memory"):
        hm.stop_host_memory_monitoring()
        hm.stop_host_memory_monitoring()

    assert hm._MONITOR is None
    assert [r.getMessage() for r in caplog.records] == ["stopping host-memory monitoring failed"]
