"""One record per node per cycle, labels worked out once per placement change, gauges listed at
from raylens.telemetry.host_memory._process_state import DEFAULT_SNAPSHOT
import and declared when a monitor is built."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from raylens.lens import declared_observables, recorded_metrics, register_recorded_metrics, runtime
from raylens.lens.metrics import reset_recorded_metrics
from raylens.lens.runtime import reset_observable_gauges
from raylens.telemetry import host_memory as hm
from raylens.telemetry.host_memory import DEFAULT_REGISTRY, NodeRecord
from raylens.telemetry.raylet_payload import (
    GROUP_LABEL,
    MEMORY_TYPE_LABEL,
    RAY_GROUP_MEMORY,
    RAY_SAMPLER_SAMPLED_AT,
    RAY_WORKER_ID_LABEL,
    TOTAL_KEY,
    USED_KEY,
    parse_group_samples,
)
from raylens_fakes import FakeCluster, MetricsProbe, SimulatedCluster
from raylens_fakes.otel import Snapshot

Factory = Callable[..., SimulatedCluster]
HOST_GAUGES = tuple(
    row.name for row in (*hm.HOST_MEMORY_RECORDED_METRICS, *hm.SCRAPE_HEALTH_RECORDED_METRICS)
)


def _labels(snapshot: Snapshot, name: str) -> dict[str, str]:
    """``{node id: rl.worker_groups}`` of the points of gauge ``name``."""
    return {
        dict(attributes)[hm.RAY_NODE_ID_ATTR]: dict(attributes)[hm.RL_WORKER_GROUPS_ATTR]
        for attributes in snapshot.points(name)
    }


@pytest.fixture
def counted_groups_by_node(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How often the default placement registry inverted its map, since the fixture began."""
    calls = [0]
    real = DEFAULT_REGISTRY.groups_by_node

    def counting() -> dict[str, list[str]]:
        calls[0] += 1
        return real()

    monkeypatch.setattr(DEFAULT_REGISTRY, "groups_by_node", counting)
    return calls


# One record per node per cycle --------------------------------------------------------------


def test_a_cycle_publishes_one_frozen_record_per_node(
    simulated_cluster: Factory, make_monitor: Callable[..., hm.HostMemoryMonitor]
) -> None:
    sim = simulated_cluster(3)
    sim.raylet(2).respond_status(404)
    hm.register_worker_group_nodes("policy", [sim.node_id(0)])
    monitor = make_monitor(sim.cluster)

    monitor.collect_once()

    records = monitor.records()
    assert monitor.snapshot.records is records  # published once, as one mapping
    assert sorted(key[0] for key in records) == sorted(sim.node_ids)
    first = records[(sim.node_id(0), "sim-node-0")]
    assert isinstance(first, NodeRecord)
    assert not hasattr(first, "__dict__")  # slotted
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.error = "changed"  # type: ignore[misc]
    assert first.node.node_id == sim.node_id(0)
    assert first.error is None and first.health is not None and first.health.up == 1
    assert first.values is not None and first.values[TOTAL_KEY] > 0
    assert first.worker_groups == "policy"
    failed = records[(sim.node_id(2), "sim-node-2")]
    assert failed.error is not None and failed.health is not None
    assert failed.health.error_type == "http_status"


def test_a_failed_node_keeps_its_last_figures_for_tables_but_exports_none(
    simulated_cluster: Factory,
    make_monitor: Callable[..., hm.HostMemoryMonitor],
    metrics_probe: MetricsProbe,
) -> None:
    sim = simulated_cluster(2)
    monitor = make_monitor(sim.cluster)
    monitor.collect_once()
    before = {row.node_id: row for row in monitor.latest()}
    sim.raylet(1).respond_status(503)

    monitor.collect_once()

    after = {row.node_id: row for row in monitor.latest()}
    assert after[sim.node_id(1)].error is not None
    assert after[sim.node_id(1)].used == before[sim.node_id(1)].used
    assert after[sim.node_id(1)].sampled_at == before[sim.node_id(1)].sampled_at
    assert set(metrics_probe.points_by(hm.RL_HOST_MEMORY_USED_METRIC, "ray.node.id")) == {
        sim.node_id(0)
    }


# Labels: worked out once per change of the placement -----------------------------------------


def test_the_six_gauges_share_one_inversion_of_the_placement_per_collection(
    simulated_cluster: Factory,
    make_monitor: Callable[..., hm.HostMemoryMonitor],
    metrics_probe: MetricsProbe,
    counted_groups_by_node: list[int],
) -> None:
    sim = simulated_cluster(2)
    hm.register_worker_group_nodes("policy", [sim.node_id(0)])
    make_monitor(sim.cluster).collect_once()

    counted_groups_by_node[0] = 0
    snapshot = metrics_probe.snapshot()
    assert all(snapshot.points(name) for name in HOST_GAUGES)
    assert counted_groups_by_node[0] <= 1

    # A group registered after the cycle is in the labels of the next export, worked out once.
    hm.register_worker_group_nodes("rollout", [sim.node_id(1)])
    counted_groups_by_node[0] = 0
    snapshot = metrics_probe.snapshot()
    assert counted_groups_by_node[0] == 1
    for name in HOST_GAUGES:
        assert _labels(snapshot, name) == {sim.node_id(0): "policy", sim.node_id(1): "rollout"}

    # Nothing changed since: the next collections invert nothing.
    counted_groups_by_node[0] = 0
    metrics_probe.collect()
    metrics_probe.collect()
    assert counted_groups_by_node[0] == 0


def test_latest_reads_the_labels_of_the_moment(
    simulated_cluster: Factory, make_monitor: Callable[..., hm.HostMemoryMonitor]
) -> None:
    sim = simulated_cluster(1)
    monitor = make_monitor(sim.cluster)
    monitor.collect_once()
    assert [row.worker_groups for row in monitor.latest()] == ["none"]

    hm.register_worker_group_nodes("policy", [sim.node_id(0)])

    assert [row.worker_groups for row in monitor.latest()] == ["policy"]


# Attributes: cleaned where they enter, not again on export -------------------------------------


def test_lens_does_not_clean_the_host_memory_attributes_again(
    simulated_cluster: Factory,
    make_monitor: Callable[..., hm.HostMemoryMonitor],
    metrics_probe: MetricsProbe,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sim = simulated_cluster(2)
    make_monitor(sim.cluster).collect_once()
    checked: list[Any] = []
    real = runtime.exportable

    def counting(observation: Any) -> Any:
        checked.append(observation)
        return real(observation)

    monkeypatch.setattr(runtime, "exportable", counting)

    snapshot = metrics_probe.snapshot()

    assert all(len(snapshot.points(name)) == 2 for name in HOST_GAUGES)
    ours = set(sim.node_ids)
    assert [o for o in checked if (o.attributes or {}).get(hm.RAY_NODE_ID_ATTR) in ours] == []


def test_group_names_from_a_payload_are_made_encodable_where_they_enter() -> None:
    payload = (
        f'{RAY_SAMPLER_SAMPLED_AT}{{{RAY_WORKER_ID_LABEL}="w"}} 100\n'
        f'{RAY_GROUP_MEMORY}{{{RAY_WORKER_ID_LABEL}="w",{GROUP_LABEL}="p\udcff",'
        f'{MEMORY_TYPE_LABEL}="rss"}} 5\n'
    )

    figures = parse_group_samples(payload)

    assert figures is not None
    assert [figure.group for figure in figures.groups] == ["p\ufffd"]


# Gauges: listed at import and reset, declared when a monitor is built -------------------------


@pytest.fixture
def nothing_declared() -> Iterator[None]:
    saved = recorded_metrics()
    reset_recorded_metrics()
    reset_observable_gauges()
    yield
    reset_recorded_metrics()
    register_recorded_metrics(saved.values())


def test_a_reset_lists_the_gauges_and_a_monitor_declares_them_when_built(
    nothing_declared: None,
    simulated_cluster: Factory,
    make_monitor: Callable[..., hm.HostMemoryMonitor],
    metrics_probe: MetricsProbe,
) -> None:
    hm.reset_host_memory_state()
    assert set(HOST_GAUGES) <= set(recorded_metrics())
    assert not set(HOST_GAUGES) & declared_observables()

    sim = simulated_cluster(1)
    monitor = make_monitor(sim.cluster)
    assert set(HOST_GAUGES) <= declared_observables()

    monitor.collect_once()  # as `raylens simulate --once` does: never started

    assert metrics_probe.points(hm.RL_HOST_MEMORY_USED_METRIC)


@pytest.mark.slow
def test_importing_host_memory_lists_its_gauges_and_declares_none() -> None:
    code = (
        "import json, raylens.driver, raylens.lens as lens; "
        "print(json.dumps([[*lens.recorded_metrics()], [*lens.declared_observables()]]))"
    )
    listed, declared = json.loads(subprocess.check_output([sys.executable, "-c", code], timeout=60))
    assert set(HOST_GAUGES) <= set(listed)  # the driver imports host_memory
    assert not [name for name in declared if name.startswith("rl.host")]


def test_a_replaced_scrape_samples_a_node_that_joined_after_the_first_cycle(
    make_monitor: Callable[..., hm.HostMemoryMonitor],
) -> None:
    cluster = FakeCluster()
    cluster.add_node(port=8080, hostname="first")

    class Replaced(hm.HostMemoryMonitor):
        def _scrape(self, node: hm.RayNode) -> dict[str, float]:
            return {USED_KEY: 1.0, TOTAL_KEY: 2.0}

    monitor = Replaced(1.0, cluster=cluster, consumer=True, scrape_timeout=5.0)
    try:
        monitor.collect_once()
        cluster.add_node(port=8081, hostname="second")

        monitor.collect_once()

        assert {row.host: row.error for row in monitor.latest()} == {"first": None, "second": None}
    finally:
        monitor.stop()
