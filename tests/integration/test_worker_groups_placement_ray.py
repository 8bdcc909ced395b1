"""Where workers land on the three-raylet cluster, and what their environment says about it.

``NODE_RANK`` must name a machine: workers that share it share a Ray node, and workers
with different ones sit on different nodes, whether the cluster reserves one PACK
group per node (the default) or a single SPREAD group whose bundles Ray places freely.
"""

from __future__ import annotations

import ast
import time
from collections.abc import Iterator

import pytest

pytestmark = pytest.mark.integration
ray = pytest.importorskip("ray")

from raylens.distributed.virtual_cluster import RayVirtualCluster  # noqa: E402
from raylens.distributed.worker_groups import RayWorkerBuilder, RayWorkerGroup  # noqa: E402

NAMES = (
    "NODE_RANK",
    "LOCAL_RANK",
    "RAYLENS_WORKER_GROUP",
    "NRL_WORKER_GROUP",
    "AVAILABLE_ADDR_LIST",
    "AVAILABLE_PORT_LIST",
)


def _wait_until_every_cpu_is_free(deadline_s: float = 60.0) -> None:
    """Wait for the actors of earlier tests to give their CPUs back.

    Ray frees a killed actor's resources a little after the kill returns. A PACK group
    placed while a raylet still counts one of its CPUs as taken packs what fits and puts
    the rest elsewhere, which is PACK's documented best effort, not what these tests check.
    """
    deadline = time.monotonic() + deadline_s
    total = ray.cluster_resources().get("CPU", 0)
    while ray.available_resources().get("CPU", 0) < total:
        if time.monotonic() > deadline:
            pytest.fail(
                f"the cluster still had CPUs taken after {deadline_s:g} s: "
                f"{ray.available_resources().get('CPU', 0)} of {total} free"
            )
        time.sleep(0.2)


def _placed_group(
    counts: list[int], strategy: str | None, name: str
) -> Iterator[tuple[RayWorkerGroup, list]]:
    _wait_until_every_cpu_is_free()
    options = {} if strategy is None else {"placement_group_strategy": strategy}
    cluster = RayVirtualCluster(
        counts, use_gpus=False, name=name, placement_timeout_s=60, **options
    )
    group = None
    try:
        group = RayWorkerGroup(
            cluster, RayWorkerBuilder("group_workers.EnvWorker"), name_prefix=name
        )
        envs = ray.get([worker.env.remote(*NAMES) for worker in group.workers])
        nodes = ray.get([worker.node_id.remote() for worker in group.workers])
        yield group, list(zip(envs, nodes))
    finally:
        if group is not None:
            assert group.shutdown() is True
        cluster.shutdown()


@pytest.fixture
def default_placed(ray_cluster) -> Iterator[tuple[RayWorkerGroup, list]]:
    # Two bundles per logical node fill a raylet's two CPUs, so each group has a node.
    yield from _placed_group([2, 2], None, "placed-pack")


@pytest.fixture
def spread_placed(ray_cluster) -> Iterator[tuple[RayWorkerGroup, list]]:
    # Three bundles spread over three raylets: bundles 0 and 1 of logical node 0 are
    # on different machines, which arithmetic over the counts would not know.
    yield from _placed_group([2, 1], "SPREAD", "placed-spread")


def _check_node_ranks_name_machines(placed: list) -> None:
    node_of_rank: dict[str, set[str]] = {}
    local_ranks: dict[str, list[str]] = {}
    for env, node in placed:
        node_of_rank.setdefault(env["NODE_RANK"], set()).add(node)
        local_ranks.setdefault(env["NODE_RANK"], []).append(env["LOCAL_RANK"])
    assert sorted(node_of_rank) == [str(rank) for rank in range(len(node_of_rank))]
    # same NODE_RANK, same node; different NODE_RANKs, different nodes
    assert all(len(nodes) == 1 for nodes in node_of_rank.values()), node_of_rank
    assert len({next(iter(nodes)) for nodes in node_of_rank.values()}) == len(node_of_rank)
    for ranks in local_ranks.values():
        assert sorted(ranks) == [str(rank) for rank in range(len(ranks))], local_ranks


def test_default_per_node_groups_give_node_ranks_that_name_machines(
    default_placed, ray_cluster
) -> None:
    group, placed = default_placed
    _check_node_ranks_name_machines(placed)
    assert [env["NODE_RANK"] for env, _ in placed] == ["0", "0", "1", "1"]
    assert [env["LOCAL_RANK"] for env, _ in placed] == ["0", "1"] * 2
    # one PACK group per logical node
    names = {
        record["name"]: record["strategy"]
        for record in ray.util.placement_group_table().values()
        if record["name"].startswith("placed-pack-") and record["state"] == "CREATED"
    }
    assert names == {f"placed-pack-node{i}": "PACK" for i in range(2)}

    envs = [env for env, _ in placed]
    assert {env["RAYLENS_WORKER_GROUP"] for env in envs} == {"placed-pack"}
    assert {env["NRL_WORKER_GROUP"] for env in envs} == {"placed-pack"}
    addresses = ast.literal_eval(envs[0]["AVAILABLE_ADDR_LIST"])
    ports = ast.literal_eval(envs[0]["AVAILABLE_PORT_LIST"])
    assert addresses == [ray_cluster.node_ips[node] for _, node in placed]
    assert len(ports) == 4 and len(set(ports)) == 4
    assert all(isinstance(port, int) and port > 0 for port in ports)
    assert group.master_address == addresses[0]
    assert group.master_port not in ports


def test_spread_group_node_ranks_follow_where_ray_put_the_bundles(spread_placed) -> None:
    _, placed = spread_placed
    _check_node_ranks_name_machines(placed)


def test_decorator_env_overrides_and_class_objects_reach_the_workers(ray_cluster) -> None:
    @ray.remote
    class LocalEcho:  # not importable by name on the workers: sent as the class itself
        def env(self, name: str) -> str | None:
            import os

            return os.environ.get(name)

    cluster = RayVirtualCluster(
        [1],
        use_gpus=False,
        name="nemo-style",
        placement_timeout_s=60,
        max_colocated_worker_groups=2,
    )
    groups = []
    try:
        groups.append(
            RayWorkerGroup(
                cluster, RayWorkerBuilder("group_workers.NemoStyleWorker"), name_prefix="nemo"
            )
        )
        env = ray.get(
            groups[0].workers[0].env.remote("FROM_DECORATOR", "FROM_CONFIGURE", "FROM_OVERRIDES")
        )
        groups.append(RayWorkerGroup(cluster, RayWorkerBuilder(LocalEcho)))
        local_group = ray.get(groups[1].workers[0].env.remote("RAYLENS_WORKER_GROUP"))
    finally:
        for group in groups:
            group.shutdown()
        cluster.shutdown()
    assert env == {"FROM_DECORATOR": "decorator", "FROM_CONFIGURE": "yes", "FROM_OVERRIDES": "yes"}
    assert local_group == "LocalEcho"
