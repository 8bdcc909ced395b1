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


# Placement seen from another process ----------------------------------------------------

_WATCH = """
import json, sys
import ray
from raylens.telemetry.host_memory import HostMemoryMonitor
ray.init(address=sys.argv[1], log_to_driver=False)
monitor = HostMemoryMonitor(1.0, scrape_mode="inprocess", consumer=True)
monitor.collect_once()
print(json.dumps({row.node_id: row.worker_groups for row in monitor.latest()}))
monitor.stop()
ray.shutdown()
"""

_OTHER_DRIVER = """
import os, sys
import ray
from raylens.telemetry.host_memory import register_worker_group_nodes
ray.init(address=sys.argv[1], log_to_driver=False)
register_worker_group_nodes("orphan", [sys.argv[2]])
print("registered", flush=True)
sys.stdin.readline()
os._exit(0)  # dies without shutting anything down, as a killed driver would
"""


def _watch_labels(address: str) -> dict[str, str]:
    """What a second process connected to the cluster labels each node with."""
    import json
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _WATCH, address], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_second_process_sees_the_drivers_worker_groups(ray_cluster) -> None:
    cluster = RayVirtualCluster(
        [1, 1],
        use_gpus=False,
        name="shared-vc",
        placement_group_strategy="STRICT_SPREAD",
        placement_timeout_s=60,
    )
    group = None
    try:
        group = RayWorkerGroup(
            cluster, RayWorkerBuilder("group_workers.EnvWorker"), name_prefix="shared"
        )
        expected = _expected_labels([group], ray_cluster.node_ids)
        assert sorted(expected.values()).count("shared") == 2

        assert _watch_labels(ray_cluster.address) == expected
        assert group.shutdown() is True
        group = None
        assert set(_watch_labels(ray_cluster.address).values()) == {"none"}
    finally:
        if group is not None:
            group.shutdown()
        cluster.shutdown()


def test_a_dead_drivers_worker_groups_are_not_shown(ray_cluster) -> None:
    import subprocess
    import sys

    node = ray_cluster.node_ids[0]
    driver = subprocess.Popen(
        [sys.executable, "-c", _OTHER_DRIVER, ray_cluster.address, node],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert driver.stdout is not None and driver.stdout.readline().strip() == "registered"
        assert _watch_labels(ray_cluster.address)[node] == "orphan"
    finally:
        assert driver.stdin is not None
        driver.stdin.close()
        driver.wait(60)

    wait_for(
        lambda: _watch_labels(ray_cluster.address)[node] == "none",
        60,
        "the dead driver's group to disappear",
    )
