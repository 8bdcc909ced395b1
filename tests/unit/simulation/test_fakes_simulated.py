"""SimulatedCluster and the pytest fixtures built on the fakes."""

from __future__ import annotations

import resource
import threading
from collections.abc import Callable

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from raylens.cluster import ClusterView
from raylens.simulation.kill_script import KillScript
from raylens.simulation.phase_script import PhaseScript
from raylens.telemetry.raylet_payload import NodeOomCounts
from raylens.telemetry.scraping import ScrapeLimits, fetch_once
from raylens_fakes import FakeCluster, SimulatedCluster
from raylens_fakes.clock import ManualClock
from raylens_fakes.pytest_plugin import simulated_clusters
from raylens_fakes.simulated import constant_schedule, ensure_open_file_limit


def _memory(url: str) -> tuple[float, float]:
    values = {}
    for family in text_string_to_metric_families(requests.get(url, timeout=5).text):
        for sample in family.samples:
            values[sample.name] = sample.value
    return values["ray_node_mem_used"], values["ray_node_mem_total"]


def test_nodes_are_listed_and_served(
    simulated_cluster: Callable[..., SimulatedCluster],
) -> None:
    sim = simulated_cluster(3)

    assert isinstance(sim.cluster, ClusterView)
    nodes = sim.cluster.nodes()
    assert [n["NodeID"] for n in nodes] == sim.node_ids
    assert [n["NodeManagerHostname"] for n in nodes] == ["sim-node-0", "sim-node-1", "sim-node-2"]
    for index, node in enumerate(nodes):
        assert node["MetricsExportPort"] == sim.raylet(index).port
        assert _memory(sim.raylet(index).url) == constant_schedule(index, 0.0)
    assert sim.index_of(sim.node_id(2)) == 2


def test_memory_follows_the_schedule_on_the_injected_clock(
    simulated_cluster: Callable[..., SimulatedCluster],
) -> None:
    clock = ManualClock(100.0)
    sim = simulated_cluster(
        2, schedule=lambda i, t: (1000.0 * (i + 1) + t, 1e6), clock=clock, same_host=True
    )

    assert _memory(sim.raylet(1).url) == (2000.0, 1e6)
    clock.now += 30
    assert _memory(sim.raylet(1).url) == (2030.0, 1e6)
    assert sim.expected(0) == (1030.0, 1e6)
    assert {n["NodeManagerHostname"] for n in sim.cluster.nodes()} == {"sim-host"}


def test_kill_remove_and_add(simulated_cluster: Callable[..., SimulatedCluster]) -> None:
    sim = simulated_cluster(2)
    sim.kill_node(0)
    sim.remove_node(1)

    assert [n["Alive"] for n in sim.cluster.nodes()] == [False]
    assert sim.raylet(1).closed
    index = sim.add_node()
    assert index == 2 and len(sim) == 3
    assert _memory(sim.raylet(2).url) == constant_schedule(2, 0.0)


def test_close_returns_with_hung_requests_in_flight() -> None:
    sim = SimulatedCluster(2)
    sim.raylet(0).hang()
    errors: list[Exception] = []

    def fetch() -> None:
        try:
            requests.get(sim.raylet(0).url, timeout=30)
        except requests.RequestException as exc:
            errors.append(exc)

    client = threading.Thread(target=fetch, daemon=True)
    client.start()
    assert sim.raylet(0).wait_for_requests(1)

    sim.close()
    client.join(timeout=5)

    assert not client.is_alive()
    assert len(errors) == 1
    assert all(r.closed for r in sim.raylets)


def test_bad_node_count_is_refused() -> None:
    with pytest.raises(ValueError, match=r"n_nodes.*-1"):
        SimulatedCluster(-1)


def test_open_file_limit_is_raised_only_when_needed() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert ensure_open_file_limit(16) == soft
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == (soft, hard)


@pytest.mark.slow
def test_a_thousand_raylets_start_serve_and_close() -> None:
    threads_before = threading.active_count()
    with SimulatedCluster(1000) as sim:
        assert len(sim.cluster.nodes()) == 1000
        assert len({r.port for r in sim.raylets}) == 1000
        assert threading.active_count() <= threads_before + 1
        for index in (0, 499, 999):
            assert _memory(sim.raylet(index).url) == constant_schedule(index, 0.0)
    assert all(r.closed for r in sim.raylets)


def test_fake_cluster_fixture_is_fresh(fake_cluster: FakeCluster) -> None:
    assert fake_cluster.nodes() == []
    assert fake_cluster.is_initialized()


def test_simulated_cluster_factory_closes_what_it_started() -> None:
    with simulated_clusters() as start:
        sims = [start(1), start(2)]
        assert not any(r.closed for sim in sims for r in sim.raylets)
    assert all(r.closed for sim in sims for r in sim.raylets)


def test_simulated_cluster_fixture_is_the_factory(
    simulated_cluster: Callable[..., SimulatedCluster],
) -> None:
    sim = simulated_cluster()
    assert len(sim) == 3
    assert len(simulated_cluster(1, same_host=True)) == 1


def test_the_fakes_paths_hand_out_the_simulation_objects() -> None:
    import raylens_fakes
    import raylens_fakes.cluster
    import raylens_fakes.raylet
    import raylens_fakes.simulated
    from raylens import simulation
    from raylens.simulation import raylet, scripted_cluster, simulated_cluster

    pairs = (
        (raylens_fakes.raylet, raylet),
        (raylens_fakes.cluster, scripted_cluster),
        (raylens_fakes.simulated, simulated_cluster),
    )
    for old, new in pairs:
        assert set(new.__all__) <= set(old.__all__), old.__name__
        for name in old.__all__:
            assert getattr(old, name) is getattr(new, name), f"{old.__name__}.{name}"
    for name in simulation.__all__:
        assert getattr(raylens_fakes, name) is getattr(simulation, name), name


@pytest.mark.slow
def test_a_simulated_raylet_serves_its_scripted_kills() -> None:
    t = [0.0]
    with SimulatedCluster(1, clock=lambda: t[0], kills=KillScript([(0, 5.0, "ray")])) as cluster:
        url = cluster.cluster.nodes()[0]
        address = f"http://{url['NodeManagerAddress']}:{url['MetricsExportPort']}/metrics"
        # As Ray's raylet: no eviction counter before the node's first kill.
        assert fetch_once(address, ScrapeLimits(5.0)).oom == NodeOomCounts(None, 0.0)
        t[0] = 6.0
        assert fetch_once(address, ScrapeLimits(5.0)).oom == NodeOomCounts(
            1.0, 0.0, (("MemoryWorker", 1.0),)
        )


def test_a_simulated_sampler_marks_the_scripted_phase_boundaries_as_they_pass(
    simulated_cluster: Callable[..., SimulatedCluster],
) -> None:
    clock = ManualClock(0.0)
    script = PhaseScript([("generation", 10.0, 40.0), ("training", 40.0, 55.0)], repeat_s=60.0)
    sim = simulated_cluster(1, clock=clock, groups=lambda i, t: {"policy": 1e9}, phases=script)
    sim.group_series(0)
    clock.now = 70.5
    sim.group_series(0)
    keeper = sim._samplers[0]._keeper
    assert keeper.history.phase_boundaries("node") == (10.0, 40.0, 55.0, 70.0)
