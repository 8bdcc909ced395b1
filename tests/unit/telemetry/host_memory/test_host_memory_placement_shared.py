"""Worker-group placement published through the cluster's key-value store, read by other processes."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

import pytest

from raylens.cluster import use_cluster_view
from raylens.telemetry import host_memory as hm
from raylens.telemetry.host_memory._placement import (
    DEFAULT_REGISTRY,
    PLACEMENT_KEY_PREFIX,
    PlacementRegistry,
)
from raylens_fakes import FakeCluster, MetricsProbe, SimulatedCluster

LOGGER = "raylens.telemetry.host_memory"
DRIVER_JOB = FakeCluster.DEFAULT_JOB_ID
WATCH_JOB = "05000000"

Factory = Callable[..., SimulatedCluster]


def _published(cluster: FakeCluster, job: str = DRIVER_JOB) -> dict[str, list[str]] | None:
    raw = cluster.kv_get(f"{PLACEMENT_KEY_PREFIX}{job}")
    return None if raw is None else json.loads(raw)


def _labels(probe: MetricsProbe) -> dict[str, str]:
    probe.collect()
    return {
        dict(a)["ray.node.id"]: dict(a)["rl.worker_groups"]
        for a in probe.points("rl.host.memory.used")
    }


def test_a_driver_publishes_its_groups_and_unpublishes_them_at_shutdown(
    fake_cluster: FakeCluster,
) -> None:
    node_a, node_b = fake_cluster.add_node(), fake_cluster.add_node()
    with use_cluster_view(fake_cluster):
        hm.register_worker_group_nodes("policy", [node_a])
        pg = fake_cluster.create_placement_group({0: node_a, 1: node_b})
        hm.register_worker_group_placement("rollout", [(pg, -1)])
        assert _published(fake_cluster) == {"policy": [node_a], "rollout": sorted([node_a, node_b])}

        hm.forget_worker_group_nodes("policy")
        assert _published(fake_cluster) == {"rollout": sorted([node_a, node_b])}
        hm.forget_worker_group_nodes("rollout")
        assert _published(fake_cluster) is None  # nothing left: the key is gone


def test_nothing_is_published_without_a_connected_cluster(fake_cluster: FakeCluster) -> None:
    fake_cluster.initialized = False
    with use_cluster_view(fake_cluster):
        hm.register_worker_group_nodes("policy", ["a" * 56])
    assert fake_cluster.kv_keys("") == []
    assert hm.worker_groups_on_node("a" * 56) == "policy"


def test_a_process_without_groups_labels_nodes_like_the_driver(
    simulated_cluster: Factory, metrics_probe: MetricsProbe, make_monitor: Callable
) -> None:
    sim = simulated_cluster(3)
    driver = PlacementRegistry(publish=True)
    driver.register_nodes("policy", sim.node_ids[:2], cluster=sim.cluster)
    driver.register_nodes("critic", sim.node_ids[1:2], cluster=sim.cluster)
    watcher = make_monitor(sim.cluster.for_job(WATCH_JOB))  # labels from DEFAULT_REGISTRY
    assert DEFAULT_REGISTRY.nodes == {}

    watcher.collect_once()
    expected = dict(zip(sim.node_ids, ["policy", "critic,policy", "none"]))
    assert _labels(metrics_probe) == expected
    assert {row.node_id: row.worker_groups for row in watcher.latest()} == expected

    driver.forget("critic", cluster=sim.cluster)
    watcher.collect_once()
    assert _labels(metrics_probe) == dict(zip(sim.node_ids, ["policy", "policy", "none"]))


def test_a_dead_drivers_labels_go_away_and_its_entry_is_removed(
    simulated_cluster: Factory, metrics_probe: MetricsProbe, make_monitor: Callable
) -> None:
    sim = simulated_cluster(2)
    driver_view = sim.cluster.for_job("07000000")
    PlacementRegistry(publish=True).register_nodes("policy", sim.node_ids, cluster=driver_view)
    watcher = make_monitor(sim.cluster)
    watcher.collect_once()
    assert set(_labels(metrics_probe).values()) == {"policy"}

    sim.cluster.end_job("07000000")
    watcher.collect_once()
    assert set(_labels(metrics_probe).values()) == {"none"}
    assert _published(sim.cluster, "07000000") is None


def test_own_entry_is_not_read_back_so_local_changes_win(
    simulated_cluster: Factory, metrics_probe: MetricsProbe, make_monitor: Callable
) -> None:
    sim = simulated_cluster(1)
    # A stale entry under this process's own job id: the local registry is the truth.
    sim.cluster.kv_put(
        f"{PLACEMENT_KEY_PREFIX}{DRIVER_JOB}", b'{"stale": ["%s"]}' % sim.node_id(0).encode()
    )
    monitor = make_monitor(sim.cluster)
    monitor.collect_once()
    assert _labels(metrics_probe) == {sim.node_id(0): "none"}


@pytest.mark.parametrize(
    "payload",
    [
        b"not json",
        b"[1, 2]",
        b'{"policy": "abc"}',
        b'{"policy": [1]}',
        b'{"a,b": ["n"]}',
        b'{"none": ["n"]}',
        b"\xff\xfe",
    ],
)
def test_a_malformed_entry_is_ignored_with_one_warning(
    payload: bytes,
    simulated_cluster: Factory,
    metrics_probe: MetricsProbe,
    make_monitor: Callable,
    caplog: pytest.LogCaptureFixture,
) -> None:
    sim = simulated_cluster(1)
    other = sim.cluster.for_job("09000000")
    other.kv_put(f"{PLACEMENT_KEY_PREFIX}09000000", payload)
    third = sim.cluster.for_job("0a000000")
    PlacementRegistry(publish=True).register_nodes("good", sim.node_ids, cluster=third)
    monitor = make_monitor(sim.cluster)

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        monitor.collect_once()
        monitor.collect_once()

    assert _labels(metrics_probe) == {sim.node_id(0): "good"}
    warned = [r.getMessage() for r in caplog.records if "09000000" in r.getMessage()]
    assert len(warned) == 1, warned
    assert all(c.isprintable() for c in warned[0])


def test_publishing_never_raises_and_warns_once(
    fake_cluster: FakeCluster, caplog: pytest.LogCaptureFixture
) -> None:
    node = fake_cluster.add_node()
    fake_cluster.kv_error = ConnectionError("GCS unreachable")
    with caplog.at_level(logging.WARNING, logger=LOGGER), use_cluster_view(fake_cluster):
        hm.register_worker_group_nodes("policy", [node])
        hm.register_worker_group_nodes("critic", [node])
        hm.forget_worker_group_nodes("critic")

    assert hm.worker_groups_on_node(node) == "policy"  # the local registry is unaffected
    warned = [r.getMessage() for r in caplog.records if "publish" in r.getMessage()]
    assert len(warned) == 1 and "GCS unreachable" in warned[0]


def test_reading_failures_keep_the_last_published_map(
    simulated_cluster: Factory, metrics_probe: MetricsProbe, make_monitor: Callable
) -> None:
    sim = simulated_cluster(1)
    PlacementRegistry(publish=True).register_nodes(
        "policy", sim.node_ids, cluster=sim.cluster.for_job("0b000000")
    )
    monitor = make_monitor(sim.cluster)
    monitor.collect_once()
    sim.cluster.kv_error = ConnectionError("GCS unreachable")
    monitor.collect_once()  # never raises

    assert _labels(metrics_probe) == {sim.node_id(0): "policy"}


def test_a_view_without_a_store_publishes_and_reads_nothing(
    simulated_cluster: Factory, metrics_probe: MetricsProbe, make_monitor: Callable
) -> None:
    sim = simulated_cluster(1)

    class Plain:
        def is_initialized(self) -> bool:
            return True

        def nodes(self) -> list:
            return sim.cluster.nodes()

        def placement_group_table(self, pg: object) -> dict:
            return {}

    registry = PlacementRegistry(publish=True)
    registry.register_nodes("policy", sim.node_ids, cluster=Plain())
    make_monitor(Plain()).collect_once()
    assert _labels(metrics_probe) == {sim.node_id(0): "none"}
