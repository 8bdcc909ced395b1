"""HostMemoryMonitor: deadlines, sample age and the process's monitor under awkward timing."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import responses

from raylens.telemetry import host_memory as hm
from raylens_fakes import FakeCluster, MetricsProbe, SimulatedCluster
from raylens_fakes.raylet import format_sample_value

USED = "rl.host.memory.used"

Factory = Callable[..., SimulatedCluster]


def _exported_nodes(probe: MetricsProbe) -> set[str]:
    probe.collect()
    return {dict(attributes)["ray.node.id"] for attributes in probe.points(USED)}


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


def _payload(used: float, total: float) -> bytes:
    return (
        f"ray_node_mem_used {format_sample_value(used)}\n"
        f"ray_node_mem_total {format_sample_value(total)}\n"
    ).encode()


@responses.activate
def test_sample_age_counts_from_the_answer_not_from_the_end_of_the_cycle(
    fake_cluster: FakeCluster, metrics_probe: MetricsProbe, make_monitor: Callable
) -> None:
    quick = fake_cluster.add_node(address="10.0.0.1", port=8080)
    fake_cluster.add_node(address="10.0.0.2", port=8080)
    slow_node_answers = threading.Event()

    def slow_answer(request: Any) -> tuple[int, dict, bytes]:
        slow_node_answers.wait(0.6)  # never set: a node that takes 0.6 s to fail
        return (503, {}, b"")

    responses.get("http://10.0.0.1:8080/metrics", body=_payload(1e9, 2e9))
    responses.add_callback(responses.GET, "http://10.0.0.2:8080/metrics", slow_answer)
    # One thread: the quick node answers at once, then the slow one holds the cycle open.
    monitor = make_monitor(fake_cluster, scrape_timeout=5.0, max_concurrency=1, max_age=0.3)
    started = time.monotonic()
    monitor.collect_once()
    assert time.monotonic() - started >= 0.6

    # The quick node's sample was ~0.6 s old when the cycle ended: past its max age
    # (the margins leave room for a slow wake-up of the collecting thread).
    row = {s.node_id: s for s in monitor.latest()}[quick]
    assert row.age() >= 0.5
    assert _exported_nodes(metrics_probe) == set()


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


def test_documented_defaults(fake_cluster: FakeCluster) -> None:
    monitor = hm.HostMemoryMonitor(2.0, cluster=fake_cluster)

    assert monitor.scrape_timeout == 5.0
    assert monitor.max_concurrency == 32
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
