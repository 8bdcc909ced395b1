"""Host memory of real raylets, labelled with the worker groups that run on each node.

Two worker groups are spread over the three-node session cluster so that they cover
different nodes. The monitor scrapes every raylet's metrics endpoint and the points
exported through lens must carry, per node, exactly the groups whose workers report
that node as their own; after a worker is rebuilt the labels stay right, and once the
groups shut down every node reads ``none``.
"""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.integration
ray = pytest.importorskip("ray")

from group_workers import wait_for  # noqa: E402

from raylens.distributed.virtual_cluster import RayVirtualCluster  # noqa: E402
from raylens.distributed.worker_groups import RayWorkerBuilder, RayWorkerGroup  # noqa: E402
from raylens.telemetry.host_memory import HostMemoryMonitor  # noqa: E402

USED = "rl.host.memory.used"
TOTAL = "rl.host.memory.total"


def _labels_by_node(metrics_probe, monitor: HostMemoryMonitor, name: str) -> dict[str, dict]:
    monitor.collect_once()
    metrics_probe.collect()
    return {
        dict(attributes)["ray.node.id"]: {**dict(attributes), "value": value}
        for attributes, value in metrics_probe.points(name).items()
    }


def _expected_labels(groups: list[RayWorkerGroup], node_ids: list[str]) -> dict[str, str]:
    """Per node, the groups whose workers say they run there (asked of the workers)."""
    on_node: dict[str, set[str]] = {node: set() for node in node_ids}
    for group in groups:
        for node in ray.get([worker.node_id.remote() for worker in group.workers]):
            on_node[node].add(group.name_prefix)
    return {node: ",".join(sorted(names)) or "none" for node, names in on_node.items()}


def test_memory_per_node_labelled_with_its_worker_groups(ray_cluster, metrics_probe) -> None:
    monitor = HostMemoryMonitor(1.0)
    clusters = [
        RayVirtualCluster(
            [1, 1],
            use_gpus=False,
            name=f"{name}-vc",
            placement_group_strategy="STRICT_SPREAD",
            placement_timeout_s=60,
        )
        for name in ("alpha", "beta")
    ]
    groups: list[RayWorkerGroup] = []
    try:
        for name, cluster in zip(("alpha", "beta"), clusters):
            groups.append(
                RayWorkerGroup(
                    cluster, RayWorkerBuilder("group_workers.EnvWorker"), name_prefix=name
                )
            )
        expected = _expected_labels(groups, ray_cluster.node_ids)
        # two groups of two workers, each on two different nodes, on three nodes:
        # at least one node holds both groups
        assert sum("," in label for label in expected.values()) >= 1
        assert {"alpha", "beta"} <= {n for label in expected.values() for n in label.split(",")}

        def every_node_labelled() -> dict[str, dict] | None:
            points = _labels_by_node(metrics_probe, monitor, USED)
            labels = {node: point["rl.worker_groups"] for node, point in points.items()}
            return points if labels == expected else None

        # metrics of a freshly started raylet can take a moment to appear
        used = wait_for(every_node_labelled, 60, f"{USED} labelled {expected}")
        total = _labels_by_node(metrics_probe, monitor, TOTAL)
        assert set(total) == set(ray_cluster.node_ids)
        # scraped by the helper process, the default, from a driver connected to Ray
        assert monitor.helper_pid is not None
        for node, point in used.items():
            assert point["host.name"]
            assert 0 < point["value"] <= total[node]["value"]
            assert total[node]["rl.worker_groups"] == expected[node]

        # rebuilding a worker keeps it on its bundle, and the labels with it
        groups[0].recreate_worker(1)
        assert _expected_labels(groups, ray_cluster.node_ids) == expected
        after_restart = _labels_by_node(metrics_probe, monitor, USED)
        assert {n: p["rl.worker_groups"] for n, p in after_restart.items()} == expected

        # one group gone: its nodes no longer mention it
        assert groups.pop(0).shutdown() is True
        only_beta = _expected_labels(groups, ray_cluster.node_ids)
        points = _labels_by_node(metrics_probe, monitor, USED)
        assert {n: p["rl.worker_groups"] for n, p in points.items()} == only_beta
        assert all("alpha" not in label for label in only_beta.values())
    finally:
        for group in groups:
            group.shutdown()
        for cluster in clusters:
            cluster.shutdown()

    points = _labels_by_node(metrics_probe, monitor, USED)
    assert set(points) == set(ray_cluster.node_ids)
    assert {point["rl.worker_groups"] for point in points.values()} == {"none"}
    helper = monitor.helper_pid
    monitor.stop()
    assert monitor.helper_pid is None
    assert helper is not None and not os.path.exists(f"/proc/{helper}")
