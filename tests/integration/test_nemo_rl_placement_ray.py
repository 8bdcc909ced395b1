"""NeMo-RL's placement paths on the three-raylet CPU cluster: batched ports, per-node
initializers, topology read from the nodes, and the telemetry that follows the workers."""

from __future__ import annotations

import ast

import pytest

pytestmark = pytest.mark.integration
ray = pytest.importorskip("ray")

from raylens.distributed.virtual_cluster import (  # noqa: E402
    NVLINK_DOMAIN_UNKNOWN,
    RayVirtualCluster,
    get_ray_cluster_topology,
    prepare_segment_topology,
)
from raylens.distributed.worker_groups import RayWorkerBuilder, RayWorkerGroup  # noqa: E402
from raylens.telemetry import host_memory  # noqa: E402


def test_batched_ports_initializer_pool_and_placement(ray_cluster) -> None:
    cluster = RayVirtualCluster(
        [1, 1, 1],
        use_gpus=False,
        name="nemo-batch",
        placement_group_strategy="STRICT_SPREAD",
        port_range_low=1600,
        port_range_high=1700,
        placement_timeout_s=60,
    )
    group = None
    try:
        (pg,) = cluster.get_placement_groups()
        placed = ray.util.placement_group_table(pg)["bundles_to_node_id"]
        found = cluster.get_available_addresses_and_ports_batch(
            [(0, 2), (0, 0), (0, 1)], batch_size=2
        )
        assert [address for address, _ in found] == [
            ray_cluster.node_ips[placed[i]] for i in (2, 0, 1)
        ]
        assert all(1600 <= port < 1700 for _, port in found)

        group = RayWorkerGroup(
            cluster,
            RayWorkerBuilder("group_workers.EnvWorker"),
            bundle_indices_list=[(0, [0]), (1, [0]), (2, [0])],
            name_prefix="nemo-batch",
        )
        assert sorted(group._initializer_pool) == [0, 1, 2]
        env = ray.get([w.env.remote("AVAILABLE_PORT_LIST") for w in group.workers])
        ports = ast.literal_eval(env[0]["AVAILABLE_PORT_LIST"])
        assert len(ports) == 3 and all(1600 <= p < 1700 for p in ports)
        nodes = ray.get([w.node_id.remote() for w in group.workers])
        for node_id in nodes:
            assert "nemo-batch" in host_memory.worker_group_names_on_node(node_id)
    finally:
        if group is not None:
            assert group.shutdown(force=True)
            assert group._initializer_pool == {}
        cluster.shutdown()


def test_topology_on_cpu_only_ray_reads_unknown_and_places_unordered(ray_cluster) -> None:
    topology = get_ray_cluster_topology()
    assert set(topology) == set(ray_cluster.node_ids)
    assert {domain for domain, _ in topology.values()} == {NVLINK_DOMAIN_UNKNOWN}
    constraints, remaining, seen = prepare_segment_topology(1, 2)
    assert constraints is None and set(remaining) == set(ray_cluster.node_ids)
    assert seen == topology
