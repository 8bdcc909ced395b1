"""The samplers a monitor believes reach the engine that parses, in the helper or in process.

Simulated raylets on real sockets serve each node's sampler series (sampler ``simulated-<i>``
under Ray worker id ``<i>`` in 56 hex digits): the slow tier.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from raylens_fakes import SimulatedCluster

pytestmark = pytest.mark.slow

Factory = Callable[..., SimulatedCluster]


@pytest.mark.parametrize("mode", ["helper", "inprocess"])
def test_only_the_believed_samplers_figures_come_back_from_a_scrape(
    simulated_cluster: Factory, make_monitor: Callable, mode: str
) -> None:
    sim = simulated_cluster(3, groups=lambda _i, _t: {"policy": 3.0e9})
    monitor = make_monitor(sim.cluster, scrape_mode=mode, scrape_timeout=2.0)

    monitor.collect_once()
    assert set(monitor.group_figures()) == {sim.node_id(i) for i in range(3)}

    monitor.trust_samplers({"simulated-0": f"{0:056x}", "simulated-1": "another-worker"})
    monitor.collect_once()

    believed = monitor.group_figures()
    assert set(believed) == {sim.node_id(0)}
    assert [g.group for g in believed[sim.node_id(0)][1].groups] == ["policy"]

    monitor.trust_samplers(None)
    monitor.collect_once()
    assert set(monitor.group_figures()) == {sim.node_id(i) for i in range(3)}
