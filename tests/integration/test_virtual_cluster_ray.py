"""RayVirtualCluster on a real three-node Ray cluster (two CPUs per node, no GPUs)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.integration
ray = pytest.importorskip("ray")

from raylens.distributed.virtual_cluster import (  # noqa: E402
    ClusterResourceError,
    PlacementTimeoutError,
    RayVirtualCluster,
)


def _groups_named(prefix: str) -> dict[str, str]:
    """name -> state of every placement group whose name starts with ``prefix``."""
    return {
        record["name"]: record["state"]
        for record in ray.util.placement_group_table().values()
        if record["name"].startswith(prefix)
    }


def test_missing_gpus_are_named(ray_cluster, monkeypatch) -> None:
    monkeypatch.setenv("NRL_VIRTUAL_CLUSTER_MAX_RETRIES", "2")
    slept: list[float] = []
    cluster = RayVirtualCluster([1], use_gpus=True, name="wants-gpu", sleep=slept.append)
    with pytest.raises(ClusterResourceError, match=r"GPU: needs 1, the cluster has 0"):
        cluster.get_placement_groups()
    assert slept == [1, 2]  # retried with backoff before giving up
    assert _groups_named("wants-gpu") == {}


def test_missing_cpus_are_named(ray_cluster, monkeypatch) -> None:
    monkeypatch.setenv("NRL_VIRTUAL_CLUSTER_MAX_RETRIES", "1")
    cluster = RayVirtualCluster([4, 3], use_gpus=False, name="too-big", sleep=lambda s: None)
    with pytest.raises(ClusterResourceError, match=r"CPU: needs 7, the cluster has 6"):
        cluster.get_placement_groups()
    assert _groups_named("too-big") == {}


def test_unplaceable_group_times_out_and_is_removed(ray_cluster) -> None:
    # Six CPUs in total, but no node has three: a strictly packed group of three cannot place.
    cluster = RayVirtualCluster(
        [1, 3],
        use_gpus=False,
        name="no-fit",
        placement_group_strategy="STRICT_PACK",
        placement_timeout_s=2,
    )
    with pytest.raises(PlacementTimeoutError) as caught:
        cluster.get_placement_groups()
    message = str(caught.value)
    assert "'no-fit-node1'" in message
    assert "'no-fit-node0'" not in message  # that one placed; it is not blamed
    assert set(_groups_named("no-fit").values()) <= {"REMOVED"}
    cluster.shutdown()


def test_spread_groups_address_port_and_shutdown(ray_cluster) -> None:
    cluster = RayVirtualCluster(
        [1, 1, 1], use_gpus=False, name="spread3", placement_group_strategy="STRICT_SPREAD"
    )
    try:
        groups = cluster.get_placement_groups()
        assert len(groups) == 1
        assert cluster.get_placement_groups() == groups  # reserved once
        table = ray.util.placement_group_table(groups[0])
        placed = table["bundles_to_node_id"]
        assert sorted(placed.values()) == sorted(ray_cluster.node_ids)

        address, port = cluster.get_master_address_and_port()
        assert address == ray_cluster.node_ips[placed[0]]
        ports = {port} | {cluster.get_master_address_and_port()[1] for _ in range(3)}
        assert len(ports) == 4
        assert all(cluster.port_range_low <= p < cluster.port_range_high for p in ports)

        group, index = cluster.get_bundle_location(2, 0)
        assert group == groups[0] and index == 2
    finally:
        cluster.shutdown()
    assert _groups_named("spread3") == {"spread3-all": "REMOVED"}
    cluster.shutdown()  # idempotent


def test_strict_pack_makes_one_group_per_node(ray_cluster) -> None:
    cluster = RayVirtualCluster(
        [2, 1], use_gpus=False, name="packed", placement_group_strategy="STRICT_PACK"
    )
    try:
        groups = cluster.get_placement_groups()
        assert len(groups) == 2
        first = ray.util.placement_group_table(groups[0])["bundles_to_node_id"]
        assert len(set(first.values())) == 1  # both bundles of node 0 together
        assert cluster.get_bundle_location(1, 0) == (groups[1], 0)
    finally:
        cluster.shutdown()
    assert set(_groups_named("packed").values()) == {"REMOVED"}


def test_shutdown_after_ray_shutdown_and_at_exit(ray_cluster, tmp_path) -> None:
    script = textwrap.dedent(
        f"""
        import ray
        from raylens.distributed.virtual_cluster import RayVirtualCluster

        ray.init(address={ray_cluster.address!r}, log_to_driver=False)
        early = RayVirtualCluster([1], use_gpus=False, name="exit-early")
        early.get_placement_groups()
        ray.shutdown()
        early.shutdown()  # Ray is gone: nothing to do, nothing raised
        early.shutdown()

        ray.init(address={ray_cluster.address!r}, log_to_driver=False)
        kept = RayVirtualCluster([1], use_gpus=False, name="exit-late")
        kept.get_placement_groups()
        print("reserved", flush=True)
        # the interpreter exits with the group still reserved
        """
    )
    finished = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert finished.returncode == 0, finished.stderr
    assert "reserved" in finished.stdout
    assert "Traceback" not in finished.stderr
    states = _groups_named("exit-")
    assert states and set(states.values()) == {"REMOVED"}
