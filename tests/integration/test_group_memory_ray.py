"""Per-group memory on real Ray: a group's worker allocates, and only that group's figure grows.

Two worker groups, ``policy`` and ``rollout``, share one bundle (so one node). A
host-memory monitor with the group-memory cycle attached collects as the driver's
would; the samplers are real zero-CPU actors pinned to the node.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

pytestmark = pytest.mark.integration
ray = pytest.importorskip("ray")

from group_workers import wait_for  # noqa: E402

from raylens.distributed.group_memory_cycle import (  # noqa: E402
    GroupMemoryCycle,
    attach_group_memory,
)
from raylens.distributed.group_memory_sampler import GroupMemorySamplers  # noqa: E402
from raylens.distributed.virtual_cluster import RayVirtualCluster  # noqa: E402
from raylens.distributed.worker_groups import RayWorkerBuilder, RayWorkerGroup  # noqa: E402
from raylens.telemetry import host_memory  # noqa: E402
from raylens.telemetry.group_memory import DEFAULT_SNAPSHOT  # noqa: E402

MB = 2**20
BALLAST = 300 * MB
WORKER = "group_workers.EnvWorker"


@pytest.fixture
def groups(ray_cluster) -> Iterator[dict[str, RayWorkerGroup]]:
    cluster = RayVirtualCluster(
        [1], use_gpus=False, name="groupmem", placement_timeout_s=60, max_colocated_worker_groups=2
    )
    made: dict[str, RayWorkerGroup] = {}
    try:
        for name in ("policy", "rollout"):
            made[name] = RayWorkerGroup(cluster, RayWorkerBuilder(WORKER), name_prefix=name)
        yield made
    finally:
        for group in made.values():
            group.shutdown()
        cluster.shutdown()


@pytest.fixture
def cycle(ray_cluster) -> Iterator[tuple[host_memory.HostMemoryMonitor, GroupMemoryCycle]]:
    monitor = host_memory.HostMemoryMonitor(
        60.0, scrape_mode="inprocess", consumer=True, scrape_timeout=5.0
    )
    # The asking path: each cycle reads every sampler (the publishing path has a test of its own).
    collect = attach_group_memory(
        monitor, GroupMemoryCycle(GroupMemorySamplers(timeout_s=5.0), mode="ask")
    )
    try:
        yield monitor, collect
    finally:
        monitor.stop()


def _rss(node_id: str) -> dict[str, int] | None:
    """``{group: rss bytes}`` of ``node_id``'s latest reading, None before there is one."""
    entry = DEFAULT_SNAPSHOT.latest().get(node_id)
    return None if entry is None else {g.group: g.rss_bytes for g in entry[0].groups}


def _read(monitor: host_memory.HostMemoryMonitor, node_id: str) -> dict[str, int]:
    def fresh() -> dict[str, int] | None:
        DEFAULT_SNAPSHOT.clear()
        monitor.collect_once()
        return _rss(node_id)

    return wait_for(fresh, 90.0, f"a group-memory reading from node {node_id}")


def test_a_policy_worker_allocating_300_mb_shows_up_for_policy_only(groups, cycle) -> None:
    monitor, collect = cycle
    policy, rollout = groups["policy"], groups["rollout"]
    node_id = ray.get(policy.workers[0].node_id.remote())
    assert ray.get(rollout.workers[0].node_id.remote()) == node_id

    before = _read(monitor, node_id)
    assert set(before) == {"policy", "rollout"}

    # Defined here so that it travels by value; the bytes touch every page they hold.
    def allocate(worker: Any, size: int) -> int:
        worker._raylens_ballast = b"\x01" * size
        return len(worker._raylens_ballast)

    assert ray.get(policy.workers[0].__ray_call__.remote(allocate, BALLAST)) == BALLAST
    started = time.perf_counter()
    after = _read(monitor, node_id)
    elapsed = time.perf_counter() - started

    grew = after["policy"] - before["policy"]
    assert abs(grew - BALLAST) <= 0.1 * BALLAST, (before, after)
    assert abs(after["rollout"] - before["rollout"]) < 0.1 * BALLAST, (before, after)
    assert collect.last_cost is not None and collect.last_cost.nodes == 1
    print(
        f"group-memory cycle on one node: wall {collect.last_cost.wall_s * 1e3:.2f} ms, "
        f"driver CPU {collect.last_cost.cpu_s * 1e3:.2f} ms (whole read {elapsed:.2f} s); "
        f"policy grew {grew / MB:.1f} MiB, rollout {(after['rollout'] - before['rollout']) / MB:+.1f} MiB"
    )

    policy.shutdown()
    rollout.shutdown()
    monitor.collect_once()
    assert collect.samplers.nodes == set()
