"""Per-node scrape health, the machine-level memory pair, and nodes that serve no metrics."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
from host_memory_points import points_by_node

from raylens.telemetry import host_memory as hm
from raylens.telemetry.raylet_payload import TOTAL_KEY, USED_KEY
from raylens_fakes import FakeCluster, MetricsProbe, SimulatedCluster

UP = "rl.host.scrape.up"
DURATION = "rl.host.scrape.duration"
LOGGER = "raylens.telemetry.host_memory"

Factory = Callable[..., SimulatedCluster]


# The machine-level pair ----------------------------------------------------------------


def test_the_machine_pair_is_exported_beside_rays_figure(
    simulated_cluster: Factory, metrics_probe: MetricsProbe, make_monitor: Callable
) -> None:
    sim = simulated_cluster(1, schedule=lambda i, t: (1e9, 8e9))
    hm.register_worker_group_nodes("policy", [sim.node_id(0)])
    make_monitor(sim.cluster).collect_once()

    used = points_by_node(metrics_probe, "rl.host.machine.memory.used")
    total = points_by_node(metrics_probe, "rl.host.machine.memory.total")

    # The simulated raylet serves the recorded payload: its machine pair is the capture's.
    attrs = {"host.name": "sim-node-0", "rl.worker_groups": "policy", "ray.node.id": sim.node_id(0)}
    assert used == {sim.node_id(0): (attrs, 1.63254272e09)}
    assert total == {sim.node_id(0): (attrs, 2.5276063744e10)}
    assert points_by_node(metrics_probe, "rl.host.memory.used")[sim.node_id(0)][1] == 1e9
    assert metrics_probe.metric("rl.host.machine.memory.used").unit == "By"


# Scrape health -------------------------------------------------------------------------


@pytest.mark.slow
def test_the_helper_process_reports_the_same_health(
    simulated_cluster: Factory, metrics_probe: MetricsProbe, make_monitor: Callable
) -> None:
    sim = simulated_cluster(2)
    sim.raylet(1).respond_status(404)
    monitor = make_monitor(sim.cluster, scrape_mode="helper")
    monitor.collect_once()

    up = points_by_node(metrics_probe, UP)
    assert monitor.helper_pid is not None
    assert {node: value for node, (_, value) in up.items()} == {
        sim.node_id(0): 1,
        sim.node_id(1): 0,
    }
    assert up[sim.node_id(1)][0]["error.type"] == "http_status"
    assert set(points_by_node(metrics_probe, DURATION)) == set(sim.node_ids)


@pytest.mark.parametrize(
    ("result", "error_type"), [("empty", "parse"), ("raise", "internal"), ("ok", None)]
)
def test_a_replaced_scrape_reports_health_too(
    result: str,
    error_type: str | None,
    simulated_cluster: Factory,
    metrics_probe: MetricsProbe,
    make_monitor: Callable,
) -> None:
    sim = simulated_cluster(1)

    class Replaced(hm.HostMemoryMonitor):
        def _scrape(self, node: hm.RayNode) -> dict[str, float]:
            if result == "raise":
                raise RuntimeError("boom")
            return {} if result == "empty" else {USED_KEY: 1.0, TOTAL_KEY: 2.0}

    monitor = Replaced(1.0, cluster=sim.cluster, consumer=True, scrape_timeout=0.5)
    try:
        monitor.collect_once()
        attrs, value = points_by_node(metrics_probe, UP)[sim.node_id(0)]
        assert (value, attrs.get("error.type")) == (0 if error_type else 1, error_type)
        assert points_by_node(metrics_probe, DURATION)[sim.node_id(0)][1] >= 0
    finally:
        monitor.stop()


@pytest.mark.slow
def test_scrape_duration_is_per_node_in_seconds(
    simulated_cluster: Factory, metrics_probe: MetricsProbe, make_monitor: Callable
) -> None:
    sim = simulated_cluster(2)
    sim.raylet(1).hang()
    make_monitor(sim.cluster, scrape_timeout=0.3).collect_once()

    duration = points_by_node(metrics_probe, DURATION)
    assert set(duration) == set(sim.node_ids)
    assert 0 <= duration[sim.node_id(0)][1] < 0.3
    assert duration[sim.node_id(1)][1] >= 0.25  # held its request to the deadline
    assert "error.type" not in duration[sim.node_id(1)][0]
    assert metrics_probe.metric(DURATION).unit == "s"


def test_an_agent_that_answers_500_is_asked_again_next_cycle_and_is_up_without_a_reason(
    simulated_cluster: Factory, metrics_probe: MetricsProbe, make_monitor: Callable
) -> None:
    sim = simulated_cluster(1)
    sim.raylet(0).respond_status(500)
    monitor = make_monitor(sim.cluster)
    monitor.collect_once()
    ((node, (attributes, value)),) = points_by_node(metrics_probe, UP).items()
    assert (node, value, attributes["error.type"]) == (sim.node_id(0), 0, "server_error")

    sim.raylet(0).serve_normally()
    monitor.collect_once()  # the next cycle asks again, and the node is back
    ((node, (attributes, value)),) = points_by_node(metrics_probe, UP).items()
    assert (node, value) == (sim.node_id(0), 1) and "error.type" not in attributes
    assert set(points_by_node(metrics_probe, "rl.host.memory.used")) == {sim.node_id(0)}


def test_health_expires_with_the_samples_when_collection_stops(
    simulated_cluster: Factory, metrics_probe: MetricsProbe, make_monitor: Callable
) -> None:
    now = [0.0]
    sim = simulated_cluster(1)
    monitor = make_monitor(sim.cluster, clock=lambda: now[0], max_age=10.0)
    monitor.collect_once()
    assert set(points_by_node(metrics_probe, UP)) == {sim.node_id(0)}

    now[0] = 10.5
    assert points_by_node(metrics_probe, UP) == {}
    assert points_by_node(metrics_probe, DURATION) == {}


# Nodes that serve no metrics -------------------------------------------------------------


def test_a_node_without_a_metrics_port_is_listed_down_and_warned_about_once(
    simulated_cluster: Factory,
    metrics_probe: MetricsProbe,
    make_monitor: Callable,
    caplog: pytest.LogCaptureFixture,
) -> None:
    sim = simulated_cluster(1)
    plain = sim.cluster.add_node(address="10.0.0.9", port=-1, hostname="plain-ray")
    missing = sim.cluster.add_node(address="10.0.0.8", port=9000, hostname="no-port")
    sim.cluster.update_node(missing, MetricsExportPort=None)
    monitor = make_monitor(sim.cluster)

    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        monitor.collect_once()
        monitor.collect_once()
        make_monitor(sim.cluster).collect_once()

    rows = {row.node_id: row for row in monitor.latest()}
    assert set(rows) == {sim.node_id(0), plain, missing}
    for node in (plain, missing):
        assert rows[node].error is not None
        assert "serves no metrics" in rows[node].error
        assert "ray[default]" in rows[node].error
        assert (rows[node].used, rows[node].total, rows[node].metrics_url) == (None, None, "")
    assert rows[plain].host == "plain-ray" and rows[plain].ip == "10.0.0.9"

    up = points_by_node(metrics_probe, UP)
    assert up[plain] == (
        {
            "host.name": "plain-ray",
            "rl.worker_groups": "none",
            "ray.node.id": plain,
            "error.type": "no_metrics_port",
        },
        0,
    )
    assert up[missing][0]["error.type"] == "no_metrics_port"
    assert up[sim.node_id(0)][1] == 1
    assert set(points_by_node(metrics_probe, "rl.host.memory.used")) == {sim.node_id(0)}
    assert set(points_by_node(metrics_probe, DURATION)) == {sim.node_id(0)}  # nothing was asked

    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    advice = [m for m in warnings if "pip install 'ray[default]'" in m]
    assert len(advice) == 1, warnings
    assert not any(plain in m or missing in m for m in warnings if m not in advice)


def test_a_cluster_of_nodes_without_metrics_still_fills_the_table(
    fake_cluster: FakeCluster, make_monitor: Callable
) -> None:
    node = fake_cluster.add_node(address="10.0.0.1", port=-1, hostname="only")
    monitor = make_monitor(fake_cluster)
    monitor.collect_once()

    (row,) = monitor.latest()
    assert row.node_id == node and row.error is not None and "MetricsExportPort" in row.error


def test_ray_nodes_still_lists_only_scrapeable_nodes(fake_cluster: FakeCluster) -> None:
    fake_cluster.add_node(address="10.0.0.1", port=-1)
    kept = fake_cluster.add_node(address="10.0.0.2", port=8080)

    assert [n.node_id for n in hm.ray_nodes(fake_cluster)] == [kept]
    listed = hm.ray_nodes(fake_cluster, include_unscrapeable=True)
    assert {n.node_id: n.metrics_url for n in listed}[kept] == "http://10.0.0.2:8080/metrics"
    assert sorted(n.metrics_url for n in listed) == ["", "http://10.0.0.2:8080/metrics"]


def test_the_watch_table_shows_a_node_without_metrics(
    simulated_cluster: Factory, make_monitor: Callable
) -> None:
    from rich.console import Console

    from raylens.cli.cluster_views import NodeTable
    from raylens.live_table import node_table

    sim = simulated_cluster(1)
    sim.cluster.add_node(address="10.0.0.9", port=-1, hostname="plain-ray")
    monitor = make_monitor(sim.cluster)
    monitor.collect_once()

    console = Console(width=200, record=True, color_system=None)
    console.print(node_table(NodeTable(monitor).rows()))
    (row,) = [line for line in console.export_text().splitlines() if "plain-ray" in line]
    assert "serves no metrics" in row and "ray[default]" in row
