"""A worker group behaves as NeMo-RL's where the spec is silent, checked against a stand-in Ray.

The group is built for real, on a stand-in cluster and builder that record what each
worker was created with, and a stand-in ``ray`` module plugged in through the group's
Ray seam (a :class:`~raylens.distributed.ray_seam.RaySeam` given as ``ray_seam``).
"""

from __future__ import annotations

import ast
from types import SimpleNamespace
from typing import Any

import pytest

from raylens.distributed import worker_groups as wg
from raylens.distributed.named_sharding import NamedSharding
from raylens.distributed.ray_seam import RaySeam


class ObjectRef:
    def __init__(self, value: Any) -> None:
        self.value = value


class ObjectRefGenerator:
    def __init__(self, items: list[Any]) -> None:
        self.items = items

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(ObjectRef(item) for item in self.items)


class FakeActor:
    """Records every call; a method answers with ``{"worker": name, "args", "kwargs"}``."""

    def __init__(self, ray: FakeRay, name: str, options: dict[str, Any]) -> None:
        self.ray = ray
        self.name = name
        self.options = options

    def __getattr__(self, method: str) -> Any:
        actor = self

        class Method:
            @staticmethod
            def remote(*args: Any, **kwargs: Any) -> Any:
                actor.ray.calls.append((actor.name, method, args, kwargs))
                if method == "stream":
                    return ObjectRefGenerator([f"{actor.name}:{i}" for i in range(args[0])])
                return ObjectRef({"worker": actor.name, "args": args, "kwargs": kwargs})

        return Method


class FakeRay:
    ObjectRef = ObjectRef
    ObjectRefGenerator = ObjectRefGenerator

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, tuple[Any, ...], dict[str, Any]]] = []
        self.exceptions = SimpleNamespace(RayActorError=RuntimeError)
        self.killed: list[Any] = []

    def get(self, ref: Any, timeout: float | None = None) -> Any:
        if isinstance(ref, list):
            return [self.get(item) for item in ref]
        return ref.value

    def put(self, value: Any) -> ObjectRef:
        return ObjectRef(value)

    def kill(self, actor: Any, *, no_restart: bool) -> None:
        self.killed.append(actor)


class PlacementGroup:
    def __init__(self, name: str) -> None:
        self.id = SimpleNamespace(hex=lambda: name)


class StubCluster:
    """Two nodes, one placement group each, with addresses per node."""

    use_gpus = False
    max_colocated_worker_groups = 1
    num_gpus_per_node = 8

    def __init__(self, counts: list[int]) -> None:
        self.bundle_ct_per_node_list = counts
        self.groups = [PlacementGroup(f"pg{i}") for i in range(len(counts))]
        self.next_port = 41000

    def node_and_local_index(self, node_idx: int, local_idx: int) -> tuple[int, int]:
        return node_idx, local_idx

    def get_master_address_and_port(self) -> tuple[str, int]:
        return "10.0.0.0", 29500

    def get_bundle_location(self, node_idx: int, local_idx: int) -> tuple[Any, int]:
        return self.groups[node_idx], local_idx

    def _addresses_and_ports(self, bundles: list[tuple[Any, int]]) -> list[tuple[str, int]]:
        answers = []
        for group, _ in bundles:
            self.next_port += 1
            answers.append((f"10.0.0.{self.groups.index(group)}", self.next_port))
        return answers


class StubBuilder:
    def __init__(self, ray: FakeRay, fqn: str = "pkg.workers.Policy") -> None:
        self.ray = ray
        self.ray_actor_class_fqn = fqn

    def _create_initializer(self, group: Any, bundle_index: int, *rest: Any) -> Any:
        return SimpleNamespace(group=group)

    def _submit_worker(self, initializer: Any, pg: Any, index: int, *rest: Any) -> ObjectRef:
        options = rest[-1]
        return ObjectRef(FakeActor(self.ray, options["name"], options))


class FakeSeam(RaySeam):
    """A Ray seam whose connected ray module is the stand-in (None: disconnected)."""

    def __init__(self, ray: FakeRay | None) -> None:
        super().__init__()
        self.fake = ray

    def connected_ray(self) -> FakeRay | None:
        return self.fake


@pytest.fixture
def ray(fake_default_cluster: object) -> FakeRay:
    # Groups record where they run through the default cluster view: a fake one, so that
    # nothing reaches for the installed Ray.
    return FakeRay()


def build(ray: FakeRay, counts: list[int] | None = None, **kwargs: Any) -> wg.RayWorkerGroup:
    cluster = StubCluster(counts or [2, 2])
    return wg.RayWorkerGroup(
        cluster,  # type: ignore[arg-type]
        StubBuilder(ray),  # type: ignore[arg-type]
        ray_seam=FakeSeam(ray),
        **kwargs,
    )


def env_of(worker: FakeActor) -> dict[str, str]:
    return worker.options["runtime_env"]["env_vars"]


# ---- run_all_workers_multiple_data with run_rank_0_only_axes -------------------------

DP_TP = NamedSharding([[0, 1], [2, 3]], ["dp", "tp"])


def test_rank_0_only_data_has_one_entry_per_called_worker(ray: FakeRay) -> None:
    group = build(ray, sharding_annotations=DP_TP, name_prefix="pol")
    futures = group.run_all_workers_multiple_data(
        "step", ["shard0", "shard1"], run_rank_0_only_axes=["tp"], k=[10, 11]
    )
    results = ray.get(futures)
    assert [(r["worker"], r["args"], r["kwargs"]) for r in results] == [
        ("pol-0-0", ("shard0",), {"k": 10}),
        ("pol-1-0", ("shard1",), {"k": 11}),
    ]


@pytest.mark.parametrize("data", [["only"], ["a", "b", "c"], ["a", "b", "c", "d"]])
def test_wrong_count_for_called_workers_is_an_assertion_error(
    ray: FakeRay, data: list[str]
) -> None:
    group = build(ray, sharding_annotations=DP_TP, name_prefix="pol")
    ray.calls.clear()
    with pytest.raises(AssertionError, match=rf"{len(data)} entries.*called worker \(2\)"):
        group.run_all_workers_multiple_data("step", data, run_rank_0_only_axes=["tp"])
    with pytest.raises(ValueError):
        group.run_all_workers_multiple_data("step", data, run_rank_0_only_axes=["tp"])
    assert ray.calls == []


def test_without_axes_every_worker_gets_its_entry(ray: FakeRay) -> None:
    group = build(ray, name_prefix="pol")
    results = ray.get(group.run_all_workers_multiple_data("step", [0, 1, 2, 3]))
    assert [r["args"] for r in results] == [(0,), (1,), (2,), (3,)]


# ---- generators ----------------------------------------------------------------------


def test_generators_without_proxies_come_back_as_one_flat_list(ray: FakeRay) -> None:
    group = build(ray, name_prefix="pol", sharding_annotations=DP_TP)
    future = group.run_all_workers_sharded_data("stream", [2, 3], in_sharded_axes=["dp"])
    flat = ["pol-0-0:0", "pol-0-0:1", "pol-1-0:0", "pol-1-0:1", "pol-1-0:2"]
    assert future.get_results(group) == flat
    assert group.get_all_worker_results(future) == future.get_results(group)


def test_generators_as_proxies_are_kept(ray: FakeRay) -> None:
    group = build(ray, name_prefix="pol", sharding_annotations=DP_TP)
    future = group.run_all_workers_sharded_data("stream", [1, 1], in_sharded_axes=["dp"])
    proxies = future.get_results(group, return_generators_as_proxies=True)
    assert len(proxies) == 2 and all(isinstance(p, ObjectRefGenerator) for p in proxies)


# ---- indices -------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [4, -1])
def test_out_of_range_worker_idx_is_an_index_error(ray: FakeRay, bad: int) -> None:
    group = build(ray, name_prefix="pol")
    with pytest.raises(IndexError, match=rf"worker_idx={bad}"):
        group.run_single_worker_single_data("step", bad)
    with pytest.raises(ValueError):
        group.run_single_worker_single_data("step", bad)


def test_out_of_range_dp_shard_idx_is_an_index_error(ray: FakeRay) -> None:
    group = build(ray, name_prefix="pol")
    assert group.get_dp_leader_worker_idx(3) == 3
    with pytest.raises(IndexError, match=r"dp_shard_idx=4"):
        group.get_dp_leader_worker_idx(4)


def test_index_errors_name_the_value_and_the_allowed_range(ray: FakeRay) -> None:
    group = build(ray, name_prefix="pol")
    with pytest.raises(wg.WorkerIndexError) as worker:
        group.run_single_worker_single_data("step", True)
    assert str(worker.value) == "worker_idx=True is out of range; this group has 4 workers"
    with pytest.raises(wg.WorkerIndexError) as shard:
        group.get_dp_leader_worker_idx("0")  # type: ignore[arg-type]
    assert str(shard.value) == (
        "dp_shard_idx='0' is out of range; this group has 4 DP shards (0..3)"
    )


# ---- what the group exposes ----------------------------------------------------------


def test_workers_is_the_groups_own_list(ray: FakeRay) -> None:
    group = build(ray, name_prefix="pol")
    replacement = FakeActor(ray, "replacement", {})
    group.workers[1] = replacement
    assert group.workers[1] is replacement
    assert ray.get(group.run_single_worker_single_data("step", 1))["worker"] == "replacement"


def test_metadata_local_rank_is_the_index_in_the_tied_group(ray: FakeRay) -> None:
    group = build(ray, name_prefix="pol", bundle_indices_list=[(0, [0, 1]), (1, [1])])
    metadata = group.worker_metadata
    assert [m["local_rank"] for m in metadata] == [0, 1, 0]
    assert [m["node_local_rank"] for m in metadata] == [0, 1, 1]
    assert [env_of(w)["LOCAL_RANK"] for w in group.workers] == ["0", "1", "1"]


def test_master_address_and_port_are_exposed(ray: FakeRay) -> None:
    group = build(ray, name_prefix="pol")
    assert group.master_address == "10.0.0.0"
    assert group.master_port == 29500
    assert {env_of(w)["MASTER_PORT"] for w in group.workers} == {"29500"}


def test_available_address_and_port_lists(ray: FakeRay) -> None:
    group = build(ray, name_prefix="pol")
    envs = [env_of(w) for w in group.workers]
    addresses = ast.literal_eval(envs[0]["AVAILABLE_ADDR_LIST"])
    ports = ast.literal_eval(envs[0]["AVAILABLE_PORT_LIST"])
    assert addresses == ["10.0.0.0", "10.0.0.0", "10.0.0.1", "10.0.0.1"]
    assert ports == [41001, 41002, 41003, 41004]
    assert all(e["AVAILABLE_ADDR_LIST"] == envs[0]["AVAILABLE_ADDR_LIST"] for e in envs)
    assert all(e["AVAILABLE_PORT_LIST"] == envs[0]["AVAILABLE_PORT_LIST"] for e in envs)


def test_workers_carry_their_group_name(ray: FakeRay) -> None:
    group = build(ray, name_prefix="policy")
    for worker in group.workers:
        assert env_of(worker)["RAYLENS_WORKER_GROUP"] == "policy"
        assert env_of(worker)["NRL_WORKER_GROUP"] == "policy"


def test_an_empty_name_prefix_gets_a_stable_name(ray: FakeRay) -> None:
    first = build(ray)
    second = build(ray)
    assert first.name_prefix == "Policy"
    assert second.name_prefix == "Policy-2"
    assert env_of(first.workers[0])["RAYLENS_WORKER_GROUP"] == "Policy"
    assert first.worker_metadata[0]["name"] == "Policy-0-0"
    assert first.shutdown() is True
    assert build(ray).name_prefix == "Policy"  # a shut-down group's name is free again
    second.shutdown()


def test_sharding_must_hold_the_group_ranks(ray: FakeRay) -> None:
    with pytest.raises(ValueError, match=r"ranks 0\.\.3 exactly once"):
        build(ray, sharding_annotations=NamedSharding([[4, 5], [6, 7]], ["dp", "tp"]))
