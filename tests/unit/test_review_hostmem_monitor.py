"""HostMemoryMonitor: deadlines, sample age and the process's monitor under awkward timing."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from raylens.telemetry import host_memory as hm
from raylens_fakes import MetricsProbe, SimulatedCluster

USED = "rl.host.memory.used"

Factory = Callable[..., SimulatedCluster]


@pytest.fixture
def make_monitor() -> Iterator[Callable[..., hm.HostMemoryMonitor]]:
    made: list[hm.HostMemoryMonitor] = []

    def make(cluster: Any, **options: Any) -> hm.HostMemoryMonitor:
        options.setdefault("scrape_timeout", 0.5)
        monitor = hm.HostMemoryMonitor(options.pop("interval", 1.0), cluster=cluster, **options)
        made.append(monitor)
        return monitor

    yield make
    for monitor in made:
        monitor.stop()


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
