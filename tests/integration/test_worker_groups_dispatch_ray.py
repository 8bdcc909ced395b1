"""Dispatch on a real worker group: a 2x2 dp x tp layout made of two tied groups.

One group serves the whole module: tied groups ``[0, 1]`` on node 0 and ``[2, 3]`` on
node 1 (one placement group per node), annotated with ``[[0, 1], [2, 3]]`` over
``["dp", "tp"]``, so a tied group is one data-parallel replica.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytestmark = pytest.mark.integration
ray = pytest.importorskip("ray")

from raylens.distributed.named_sharding import NamedSharding  # noqa: E402
from raylens.distributed.virtual_cluster import RayVirtualCluster  # noqa: E402
from raylens.distributed.worker_groups import (  # noqa: E402
    MultiWorkerFuture,
    RayWorkerBuilder,
    RayWorkerGroup,
)


@pytest.fixture(scope="module")
def group(ray_cluster) -> Iterator[RayWorkerGroup]:
    cluster = RayVirtualCluster(
        [2, 2],
        use_gpus=False,
        name="dispatch",
        placement_group_strategy="STRICT_PACK",
        placement_timeout_s=60,
    )
    workers = RayWorkerGroup(
        cluster,
        RayWorkerBuilder("group_workers.EnvWorker", tag="dispatch"),
        name_prefix="dispatch",
        bundle_indices_list=[(0, [0, 1]), (1, [0, 1])],
        sharding_annotations=NamedSharding([[0, 1], [2, 3]], ["dp", "tp"]),
    )
    try:
        yield workers
    finally:
        workers.shutdown()
        cluster.shutdown()


def ranks_and_args(results: list[dict]) -> list[tuple[int, list]]:
    return [(result["rank"], result["args"]) for result in results]


def test_tied_groups_and_dp_leaders(group: RayWorkerGroup) -> None:
    assert group.tied_workers_groups == [[0, 1], [2, 3]]
    assert group.worker_to_tied_group_index == {0: 0, 1: 0, 2: 1, 3: 1}
    assert group.dp_size == 2
    assert [group.get_dp_leader_worker_idx(i) for i in range(2)] == [0, 2]
    with pytest.raises(ValueError, match=r"dp_shard_idx=2"):
        group.get_dp_leader_worker_idx(2)
    metadata = group.worker_metadata
    assert [m["bundle_indices"] for m in metadata] == [(0, [0, 1]), None, (1, [0, 1]), None]
    assert [m["dp_shard_idx"] for m in metadata] == [0, 0, 1, 1]
    envs = ray.get([w.env.remote("RANK", "NODE_RANK", "LOCAL_RANK") for w in group.workers])
    assert [(e["RANK"], e["NODE_RANK"], e["LOCAL_RANK"]) for e in envs] == [
        ("0", "0", "0"),
        ("1", "0", "1"),
        ("2", "1", "0"),
        ("3", "1", "1"),
    ]
    nodes = ray.get([w.node_id.remote() for w in group.workers])
    assert nodes[0] == nodes[1] and nodes[2] == nodes[3] and nodes[0] != nodes[2]
    # configure_worker saw the leader's bundle indices and the cluster's GPUs per node
    infos = ray.get([w.init_info.remote() for w in group.workers])
    assert infos[0]["configured_with"]["bundle_indices"] == (0, [0, 1])
    assert infos[1]["configured_with"]["bundle_indices"] is None
    assert infos[0]["configured_with"]["num_gpus_per_node"] == 8
    assert infos[0]["configured_with"]["num_gpus"] == 0


def test_sharded_on_dp_replicated_on_tp(group: RayWorkerGroup) -> None:
    future = group.run_all_workers_sharded_data(
        "echo",
        ["batch-0", "batch-1"],
        in_sharded_axes=["dp"],
        replicate_on_axes=["tp"],
        output_is_replicated=["tp"],
        common_kwargs={"step": 7},
        scale=[10, 20],
    )
    assert isinstance(future, MultiWorkerFuture)
    assert future.called_workers == [0, 1, 2, 3]
    assert future.return_from_workers == [0, 2]
    results = group.get_all_worker_results(future)
    assert ranks_and_args(results) == [(0, ["batch-0"]), (2, ["batch-1"])]
    assert [r["kwargs"] for r in results] == [{"scale": 10, "step": 7}, {"scale": 20, "step": 7}]
    # every worker was called, with its replica's slice
    everyone = ray.get(future.futures)
    assert ranks_and_args(everyone) == [
        (0, ["batch-0"]),
        (1, ["batch-0"]),
        (2, ["batch-1"]),
        (3, ["batch-1"]),
    ]


def test_free_tp_axis_calls_tp_rank_0_only(group: RayWorkerGroup) -> None:
    future = group.run_all_workers_sharded_data("echo", ["a", "b"], in_sharded_axes=["dp"])
    assert future.called_workers == [0, 2]
    assert ranks_and_args(future.get_results(group)) == [(0, ["a"]), (2, ["b"])]


def test_free_axis_dummy_calls_get_none(group: RayWorkerGroup) -> None:
    future = group.run_all_workers_sharded_data(
        "echo",
        ["a", "b"],
        in_sharded_axes=["dp"],
        make_dummy_calls_to_free_axes=True,
        flag=["x", "y"],
    )
    assert future.called_workers == [0, 1, 2, 3]
    everyone = ray.get(future.futures)
    assert [(r["rank"], r["args"], r["kwargs"]) for r in everyone] == [
        (0, ["a"], {"flag": "x"}),
        (1, [None], {"flag": None}),
        (2, ["b"], {"flag": "y"}),
        (3, [None], {"flag": None}),
    ]
    assert ranks_and_args(future.get_results(group)) == [(0, ["a"]), (2, ["b"])]


def test_results_keep_one_worker_per_tied_group(group: RayWorkerGroup) -> None:
    future = group.run_all_workers_sharded_data(
        "echo", ["a", "b"], in_sharded_axes=["dp"], replicate_on_axes=["tp"]
    )
    assert future.return_from_workers == [0, 1, 2, 3]
    assert [r["rank"] for r in future.get_results(group)] == [0, 2]


def test_sharded_slice_with_wrong_length_is_rejected(group: RayWorkerGroup) -> None:
    with pytest.raises(ValueError, match=r"argument 0 has 3 entries along axis 'dp'"):
        group.run_all_workers_sharded_data("echo", [1, 2, 3], in_sharded_axes=["dp"])


def test_generators_consumed_or_returned_as_proxies(group: RayWorkerGroup) -> None:
    future = group.run_all_workers_sharded_data("count_up", [2, 3], in_sharded_axes=["dp"])
    # NeMo-RL's streaming mode: one flat list, worker by worker
    assert future.get_results(group) == [(0, 0), (0, 1), (2, 0), (2, 1), (2, 2)]

    future = group.run_all_workers_sharded_data("count_up", [1, 2], in_sharded_axes=["dp"])
    proxies = future.get_results(group, return_generators_as_proxies=True)
    assert all(isinstance(proxy, ray.ObjectRefGenerator) for proxy in proxies)
    assert [[ray.get(ref) for ref in proxy] for proxy in proxies] == [[(0, 0)], [(2, 0), (2, 1)]]


def test_single_and_multiple_data(group: RayWorkerGroup) -> None:
    single = ray.get(group.run_single_worker_single_data("echo", 3, "only", k=1))
    assert single == {"rank": 3, "args": ["only"], "kwargs": {"k": 1}}

    everyone = ray.get(group.run_all_workers_single_data("echo", "same", k=2))
    assert ranks_and_args(everyone) == [(r, ["same"]) for r in range(4)]

    tp_leaders = ray.get(
        group.run_all_workers_single_data("echo", "lead", run_rank_0_only_axes=["tp"])
    )
    assert [r["rank"] for r in tp_leaders] == [0, 2]

    per_worker = ray.get(
        group.run_all_workers_multiple_data(
            "echo", ["w0", "w1", "w2", "w3"], common_kwargs={"c": 1}, k=[0, 1, 2, 3]
        )
    )
    assert [(r["rank"], r["args"], r["kwargs"]) for r in per_worker] == [
        (i, [f"w{i}"], {"k": i, "c": 1}) for i in range(4)
    ]
    dp_leaders_only = ray.get(
        group.run_all_workers_multiple_data("echo", ["dp0", "dp1"], run_rank_0_only_axes=["tp"])
    )
    assert ranks_and_args(dp_leaders_only) == [(0, ["dp0"]), (2, ["dp1"])]
    with pytest.raises(ValueError, match=r"argument 0 has 2 entries"):
        group.run_all_workers_multiple_data("echo", ["w0", "w1"])


def test_arguments_for_many_workers_are_stored_once(
    group: RayWorkerGroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    stored = []
    real_put = ray.put

    def counting_put(value, *args, **kwargs):
        stored.append(value)
        return real_put(value, *args, **kwargs)

    monkeypatch.setattr(ray, "put", counting_put)
    payload = list(range(1000))
    results = ray.get(group.run_all_workers_single_data("echo", payload, tag="t"))
    assert [r["args"] == [payload] for r in results] == [True] * 4
    assert len(stored) == 2  # the payload and the keyword, once each
    stored.clear()
    future = group.run_all_workers_sharded_data(
        "echo", [payload, payload], in_sharded_axes=["dp"], replicate_on_axes=["tp"]
    )
    assert len(future.get_results(group)) == 2
    assert len(stored) == 2  # one slice per replica, shared by its two workers
