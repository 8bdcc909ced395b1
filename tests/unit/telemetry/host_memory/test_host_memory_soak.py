"""Soak: a quarter of a million nodes and worker groups churn through the host-memory monitor and lens.

A thousand nodes are live at any time. A few of them stay for the whole run and are
relabelled every cycle (a worker group placed on them for that cycle only); all the
others are replaced every cycle by nodes never seen before, each with a worker group
of its own. Some nodes never answer, the cluster lists malformed records under ever
new ids, and a few groups a cycle fail to resolve their placement, so the warning
paths churn too. Each cycle must export every
answering live node exactly once, with its current label and no overflow point,
while every structure raylens keeps stays as large as what is live. Entries are
counted rather than bytes measured: a count cannot be fooled by the allocator
keeping freed memory.
"""

from __future__ import annotations

from typing import Any

import pytest

from raylens.cli.cluster_views import NodeTable
from raylens.lens import IDLE_COLLECTIONS, get_telemetry_handle, unregister_observable_gauge
from raylens.lens.warnings import remembered_warning_count
from raylens.telemetry import host_memory as hm
from raylens.telemetry.host_memory import _nodes
from raylens.telemetry.host_memory._placement import DEFAULT_REGISTRY
from raylens.telemetry.names import (
    RL_HOST_MACHINE_MEMORY_TOTAL_METRIC,
    RL_HOST_MACHINE_MEMORY_USED_METRIC,
    RL_HOST_SCRAPE_DURATION_METRIC,
    RL_HOST_SCRAPE_UP_METRIC,
)
from raylens.telemetry.raylet_payload import (
    TOTAL_KEY,
    USED_KEY,
)
from raylens_fakes import FakeCluster, MetricsProbe
from raylens_fakes.otel import Snapshot

pytestmark = pytest.mark.soak

LIVE = 1_000
DISTINCT = 250_000
STAYING = 10  # nodes 0 .. STAYING - 1 live through the whole run, relabelled every cycle
CHURNING = LIVE - STAYING  # nodes replaced by new ones every cycle
CYCLES = -(-(DISTINCT - STAYING) // CHURNING)
TABLE_EVERY = 10  # cycles between two refreshes of the CLI's node table
FAILING_EVERY = 97  # node i never answers when i % FAILING_EVERY == 0
MALFORMED_PER_CYCLE = 4
UNPLACED_PER_CYCLE = 2  # groups per cycle whose placement lookup fails, shut down the next
TOTAL_BYTES = 2.0**40
#: Warning keys that name neither a node nor a record (a failed collection and the like).
OTHER_WARNINGS = 8
OVERFLOW_ATTR = "otel.metric.overflow"
#: The gauge checked. Every other host-memory gauge goes through the same lens callback
#: wrapper (and the memory pair through the same snapshot read), and each would cost the SDK
#: another quarter of a million observations over the run, so they report nothing here and
#: the soak stays within a minute on a two-core machine.
CHECKED = hm.RL_HOST_MEMORY_USED_METRIC
SILENCED = (
    hm.RL_HOST_MEMORY_TOTAL_METRIC,
    RL_HOST_SCRAPE_UP_METRIC,
    RL_HOST_SCRAPE_DURATION_METRIC,
    RL_HOST_MACHINE_MEMORY_USED_METRIC,
    RL_HOST_MACHINE_MEMORY_TOTAL_METRIC,
)


def node_id(index: int) -> str:
    return f"{index:056x}"


def live_nodes(cycle: int) -> list[int]:
    first = STAYING + cycle * CHURNING
    return [*range(STAYING), *range(first, first + CHURNING)]


def label_of(index: int, cycle: int) -> str:
    """The ``rl.worker_groups`` value node ``index`` carries in ``cycle``."""
    return f"relabel-{cycle}" if index < STAYING else f"wg-{index}"


class ChurningCluster(FakeCluster):
    """A FakeCluster that also lists this cycle's malformed records."""

    def __init__(self) -> None:
        super().__init__()
        self.malformed: list[dict[str, Any]] = []
        self.unreadable = self.create_placement_group({0: ""})
        self.fail_placement_group_table(self.unreadable)

    def nodes(self) -> list[dict[str, Any]]:
        return [*self.malformed, *super().nodes()]


class NumbersMonitor(hm.HostMemoryMonitor):
    """Answers from the node id instead of a socket; every FAILING_EVERY-th node gives nothing."""

    def _scrape(self, node: hm.RayNode) -> dict[str, float]:
        index = int(node.node_id, 16)
        if index % FAILING_EVERY == 0:
            return {}
        return {USED_KEY: float(index), TOTAL_KEY: TOTAL_BYTES}


def exported(snapshot: Snapshot, name: str) -> tuple[int, dict[str, tuple[float, str]], bool]:
    """``(points, {node id: (value, label)}, any overflow point)`` of gauge ``name``."""
    metric = snapshot.metric(name)
    points = list(metric.data.data_points) if metric is not None else []
    by_node = {
        p.attributes[hm.RAY_NODE_ID_ATTR]: (p.value, p.attributes[hm.RL_WORKER_GROUPS_ATTR])
        for p in points
        if hm.RAY_NODE_ID_ATTR in p.attributes
    }
    return len(points), by_node, any(OVERFLOW_ATTR in p.attributes for p in points)


def held_entries(monitor: hm.HostMemoryMonitor, table: NodeTable) -> dict[str, int]:
    """Every per-node structure of the monitor, its snapshot, the registry and the CLI table."""
    return {
        "monitor standing": len(monitor._standing),
        "monitor records": len(monitor.records()),
        "monitor warned nodes": len(monitor._warned),
        "snapshot records": len(monitor.snapshot.records),
        "placement registry": len(DEFAULT_REGISTRY.nodes),
        "table trends": len(table.history),
    }


def churn_to(cluster: ChurningCluster, cycle: int) -> None:
    """Make the cluster and the placement registry look as they do in ``cycle``."""
    if cycle == 0:
        for index in range(STAYING):
            cluster.add_node(node_id=node_id(index), hostname=f"host-{index}", port=20_000 + index)
    else:
        for index in live_nodes(cycle - 1)[STAYING:]:
            cluster.remove_node(node_id(index))
            hm.forget_worker_group_nodes(f"wg-{index}")
        hm.forget_worker_group_nodes(f"relabel-{cycle - 1}")
        for k in range(UNPLACED_PER_CYCLE):
            hm.forget_worker_group_nodes(f"unplaced-{cycle - 1}-{k}")
    for index in live_nodes(cycle)[STAYING:]:
        cluster.add_node(
            node_id=node_id(index), hostname=f"host-{index}", port=20_000 + index % 40_000
        )
        hm.register_worker_group_nodes(f"wg-{index}", [node_id(index)])
    hm.register_worker_group_nodes(f"relabel-{cycle}", [node_id(i) for i in range(STAYING)])
    for k in range(UNPLACED_PER_CYCLE):  # warned about once each
        hm.register_worker_group_placement(
            f"unplaced-{cycle}-{k}", [(cluster.unreadable, 0)], cluster=cluster
        )
    cluster.malformed = [
        {
            "NodeID": f"malformed-{cycle}-{k}",
            "Alive": True,
            "MetricsExportPort": 9000,
            "NodeManagerAddress": 12345,  # not a str
        }
        for k in range(MALFORMED_PER_CYCLE)
    ]


def test_churning_nodes_and_groups_stay_exported_and_bounded(
    raylens_state: None, metrics_probe: MetricsProbe
) -> None:
    cluster = ChurningCluster()
    now = [0.0]
    monitor = NumbersMonitor(
        10.0, cluster=cluster, clock=lambda: now[0], consumer=True, scrape_timeout=30.0
    )
    table = NodeTable(monitor, clock=lambda: now[0])
    handle = get_telemetry_handle()
    assert handle is not None
    for name in SILENCED:
        unregister_observable_gauge(name)  # the reset after the test declares them again
    largest: dict[str, int] = {}
    failing_most = answering_most = 0
    held_most = 0
    warnings_most = 0
    try:
        for cycle in range(CYCLES):
            churn_to(cluster, cycle)
            now[0] += monitor.collection_interval
            monitor.collect_once()
            snapshot = metrics_probe.snapshot()
            if cycle % TABLE_EVERY == 0:
                table.rows()  # drops the trend of every node that left since the last refresh

            live = live_nodes(cycle)
            answering = [i for i in live if i % FAILING_EVERY]
            failing_most = max(failing_most, len(live) - len(answering))
            answering_most = max(answering_most, len(answering))
            count, by_node, overflow = exported(snapshot, CHECKED)
            assert count == len(answering), cycle  # one point per answering node
            assert not overflow, cycle
            assert by_node == {node_id(i): (float(i), label_of(i, cycle)) for i in answering}
            held_most = max(held_most, handle.held_attribute_sets(CHECKED))
            for what, entries in held_entries(monitor, table).items():
                largest[what] = max(largest.get(what, 0), entries)
            warnings_most = max(warnings_most, remembered_warning_count())
    finally:
        monitor.stop()

    assert live_nodes(CYCLES - 1)[-1] + 1 >= DISTINCT  # every distinct node went through
    assert largest == {
        "monitor standing": LIVE,
        "monitor records": LIVE,
        "monitor warned nodes": failing_most,
        "snapshot records": LIVE,
        "placement registry": CHURNING + 1,
        "table trends": LIVE,
    }
    assert warnings_most <= (
        failing_most + UNPLACED_PER_CYCLE + _nodes.MAX_REMEMBERED_MALFORMED + OTHER_WARNINGS
    )
    assert held_most <= LIVE * IDLE_COLLECTIONS
