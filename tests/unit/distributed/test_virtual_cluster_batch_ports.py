"""Batched address and port discovery on FakeRay, and the worker groups that use it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from raylens.cluster import use_cluster_view
from raylens.distributed import virtual_cluster as vc
from raylens.distributed.virtual_cluster import RayVirtualCluster
from raylens.distributed.worker_groups import RayWorkerBuilder, RayWorkerGroup
from raylens.telemetry import host_memory
from raylens_fakes.ray import FakeRay, PlacementGroupSchedulingStrategy


class PortBook:
    """Answers the port tasks in order from ``answers``; records each range asked for."""

    def __init__(self, answers: list[tuple[str, int]]) -> None:
        self.answers: Iterator[tuple[str, int]] = iter(answers)
        self.ranges: list[tuple[int, int]] = []

    def __call__(self, port_range_low: int, port_range_high: int) -> tuple[str, int]:
        self.ranges.append((port_range_low, port_range_high))
        return next(self.answers)


def with_ports(fake: FakeRay, answers: list[tuple[str, int]]) -> tuple[Any, PortBook]:
    """A seam over ``fake`` whose port task answers from ``answers``."""
    seam = fake.seam()
    book = PortBook(answers)

    def node_ip_and_free_port(low: int, high: int) -> tuple[str, int]:
        return book(low, high)

    seam.remote("node_ip_and_free_port", lambda ray: ray.remote(node_ip_and_free_port))
    return seam, book


def port_tasks(fake: FakeRay) -> list[tuple[Any, int]]:
    """``(placement group, bundle index)`` of every port task submitted, in order."""
    placed = []
    for name, _, options in fake.tasks:
        if name == "node_ip_and_free_port":
            strategy = options["scheduling_strategy"]
            assert isinstance(strategy, PlacementGroupSchedulingStrategy)
            assert options["num_cpus"] == 0
            placed.append((strategy.placement_group, strategy.placement_group_bundle_index))
    return placed


def test_one_task_per_bundle_fetched_in_batches_in_input_order(fake_ray: FakeRay) -> None:
    answers = [("10.0.0.1", 1500 + i) for i in range(5)]
    seam, book = with_ports(fake_ray, answers)
    cluster = RayVirtualCluster(
        [3, 2], use_gpus=False, port_range_low=1500, port_range_high=1600, ray_seam=seam
    )
    groups = cluster.get_placement_groups()
    waits_before = len(fake_ray.wait_timeouts)
    pairs = [(1, 1), (0, 0), (0, 2), (1, 0), (0, 1)]
    assert cluster.get_available_addresses_and_ports_batch(pairs, batch_size=2) == answers
    assert port_tasks(fake_ray) == [(groups[pg], bundle) for pg, bundle in pairs]
    assert book.ranges == [(1500, 1600)] * 5
    waits = fake_ray.wait_timeouts[waits_before:]
    assert waits == [cluster.placement_timeout_s] * 3  # 2 + 2 + 1, each wait bounded


def test_a_batch_that_fits_is_fetched_with_one_get(fake_ray: FakeRay) -> None:
    seam, _ = with_ports(fake_ray, [("10.0.0.1", 1401), ("10.0.0.2", 1402)])
    cluster = RayVirtualCluster([2], use_gpus=False, ray_seam=seam)
    cluster.get_placement_groups()
    waits = len(fake_ray.wait_timeouts)
    assert cluster.get_available_addresses_and_ports_batch([(0, 0), (0, 1)]) == [
        ("10.0.0.1", 1401),
        ("10.0.0.2", 1402),
    ]
    assert len(fake_ray.wait_timeouts) == waits


def test_a_port_repeated_on_one_address_is_asked_for_again(fake_ray: FakeRay) -> None:
    answers = [("10.0.0.1", 1401), ("10.0.0.1", 1401), ("10.0.0.2", 1401), ("10.0.0.1", 1402)]
    seam, _ = with_ports(fake_ray, answers)
    cluster = RayVirtualCluster([3], use_gpus=False, ray_seam=seam)
    cluster.get_placement_groups()
    got = cluster.get_available_addresses_and_ports_batch([(0, 0), (0, 1), (0, 2)])
    assert got == [("10.0.0.1", 1401), ("10.0.0.1", 1402), ("10.0.0.2", 1401)]
    assert [bundle for _, bundle in port_tasks(fake_ray)] == [0, 1, 2, 1]


def test_ports_that_never_stop_repeating_fail_with_advice(fake_ray: FakeRay) -> None:
    seam, _ = with_ports(fake_ray, [("10.0.0.1", 1401)] * 30)
    cluster = RayVirtualCluster([2], use_gpus=False, ray_seam=seam)
    cluster.get_placement_groups()
    with pytest.raises(vc.PortRangeError, match=r"1 bundle\(s\).*widen the port range"):
        cluster.get_available_addresses_and_ports_batch([(0, 0), (0, 1)])


def test_master_ports_are_never_handed_out_twice(fake_ray: FakeRay) -> None:
    answers = [("10.0.0.1", 1401), ("10.0.0.1", 1401), ("10.0.0.1", 1402), ("10.0.0.1", 1401)]
    answers += [("10.0.0.1", 1403)]
    seam, _ = with_ports(fake_ray, answers)
    cluster = RayVirtualCluster([1], use_gpus=False, ray_seam=seam)
    assert cluster.get_master_address_and_port() == ("10.0.0.1", 1401)
    assert cluster.get_master_address_and_port() == ("10.0.0.1", 1402)
    # A worker port never takes a master port either.
    assert cluster.get_available_address_and_port(0, 0) == ("10.0.0.1", 1403)


def test_single_address_goes_through_the_batch(
    fake_ray: FakeRay, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = RayVirtualCluster([1], use_gpus=False, ray_seam=fake_ray.seam())
    asked: list[tuple[list[tuple[int, int]], int]] = []

    def batch(pairs: list[tuple[int, int]], batch_size: int = 256) -> list[tuple[str, int]]:
        asked.append((pairs, batch_size))
        return [("10.9.9.9", 1999)]

    monkeypatch.setattr(cluster, "get_available_addresses_and_ports_batch", batch)
    assert cluster.get_available_address_and_port(3, 4) == ("10.9.9.9", 1999)
    assert asked == [([(3, 4)], 256)]


def test_bad_indices_and_batch_sizes_are_named(fake_ray: FakeRay) -> None:
    seam, _ = with_ports(fake_ray, [])
    cluster = RayVirtualCluster([1, 1], use_gpus=False, ray_seam=seam)
    with pytest.raises(IndexError, match=r"pg_idx=5 is out of range; this cluster has 2"):
        cluster.get_available_addresses_and_ports_batch([(5, 0)])
    with pytest.raises(ValueError, match=r"batch_size=0"):
        cluster.get_available_addresses_and_ports_batch([(0, 0)], batch_size=0)


def test_a_hung_port_task_times_out(fake_ray: FakeRay) -> None:
    seam, _ = with_ports(fake_ray, [("10.0.0.1", 1401)] * 3)
    fake_ray.hung_tasks.add("node_ip_and_free_port")
    cluster = RayVirtualCluster([3], use_gpus=False, ray_seam=seam, placement_timeout_s=5)
    cluster.get_placement_groups()
    with pytest.raises(TimeoutError, match=r"did not report an address and port within 5s"):
        cluster.get_available_addresses_and_ports_batch([(0, 0), (0, 1), (0, 2)], batch_size=1)
    with pytest.raises(TimeoutError, match=r"within 5s"):
        cluster.get_available_addresses_and_ports_batch([(0, 0)])


class Worker:
    def __init__(self) -> None:
        self.started = True


class FakeRayView:
    """raylens' cluster view over a FakeRay: its nodes and its placement groups' tables."""

    def __init__(self, fake: FakeRay) -> None:
        self.fake = fake

    def is_initialized(self) -> bool:
        return True

    def nodes(self) -> list[dict[str, object]]:
        return self.fake.nodes()

    def placement_group_table(self, placement_group: Any) -> dict[str, object]:
        table: dict[str, object] = placement_group.table()
        return table


@pytest.fixture
def fake_ray_view(fake_ray: FakeRay) -> Iterator[FakeRayView]:
    view = FakeRayView(fake_ray)
    with use_cluster_view(view):  # type: ignore[arg-type]
        yield view


def test_worker_group_shares_one_initializer_per_node_and_registers_its_placement(
    fake_ray: FakeRay, fake_ray_view: FakeRayView, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_ray.install(monkeypatch)
    answers = [("10.0.0.1", 1401 + i) for i in range(12)]
    seam, _ = with_ports(fake_ray, answers)
    cluster = RayVirtualCluster([2, 2], use_gpus=False, ray_seam=seam)
    group = RayWorkerGroup(
        cluster,
        RayWorkerBuilder(Worker),
        bundle_indices_list=[(0, [0, 1]), (1, [0]), (1, [1])],
        name_prefix="policy",
    )
    assert len(group.workers) == 4
    initializers = dict(group._initializer_pool)
    assert sorted(initializers) == [0, 1]  # three tied groups, two nodes, two initializers
    made = [actor for actor in fake_ray.actors if "IsolatedWorkerInitializer" in actor.name]
    assert len(made) == 2
    # Every worker was placed on the bundle its own port was discovered on.
    workers = [actor for actor in fake_ray.actors if actor.name.startswith("policy")]
    assert len(workers) == 4
    # Per-node groups are packed: FakeRay puts them on its first node.
    node = fake_ray.node_ids[0]
    assert host_memory.worker_group_names_on_node(node) == {"policy"}
    assert group.shutdown() is True
    assert group._initializer_pool == {}
    assert all(actor.killed for actor in made)
    assert host_memory.worker_group_names_on_node(node) == set()
    cluster.shutdown()
