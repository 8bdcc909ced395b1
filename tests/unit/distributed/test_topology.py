"""Topology-aware placement: node topology from resources and labels, segments, bundle order."""

from __future__ import annotations

import itertools
import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raylens.distributed import topology as topo
from raylens.distributed.topology import (
    NVLINK_DOMAIN_UNKNOWN,
    TOPO_RANK_UNKNOWN,
    BundleTopology,
    prepare_segment_topology,
    select_segment_nodes,
    sort_bundle_indices_by_topology,
    topology_of_nodes,
)
from raylens.distributed.virtual_cluster import ResourceInsufficientError
from raylens_fakes.ray import FakeRay


def node(node_id: object, resources: object = None, labels: object = None, alive: bool = True):  # type: ignore[no-untyped-def]
    return {"NodeID": node_id, "Alive": alive, "Resources": resources or {}, "Labels": labels}


def racks(**ranks: list[int]) -> dict[str, tuple[str, int]]:
    """``{node id: (domain, rank)}`` with nodes numbered in the order given."""
    built: dict[str, tuple[str, int]] = {}
    for domain, members in ranks.items():
        for rank in members:
            built[f"n{len(built):02d}"] = (domain, rank)
    return built


# ---- reading the topology ----------------------------------------------------------


def test_resources_and_labels_give_domain_and_rank() -> None:
    nodes = [
        node("a", {"CPU": 8.0, "nvlink_domain_rack1": 1.0, "topo_rank": 4.0}),
        node("b", {"CPU": 8.0}, {"nvlink_domain": "rack2", "topo_rank": "9"}),
        node("c", {"CPU": 8.0}),
        node("d", {"topo_rank": 20000000015.0}),
        node("gone", {"nvlink_domain_rack1": 1.0}, alive=False),
    ]
    assert topology_of_nodes(nodes) == {
        "a": ("nvlink_domain_rack1", 4),
        "b": ("nvlink_domain_rack2", 9),
        "c": (NVLINK_DOMAIN_UNKNOWN, TOPO_RANK_UNKNOWN),
        "d": (NVLINK_DOMAIN_UNKNOWN, 20000000015),
    }


def test_a_malformed_record_costs_only_its_own_topology(caplog: pytest.LogCaptureFixture) -> None:
    nodes = [
        node("a", {"nvlink_domain_x": 1.0, "topo_rank": "high"}),
        node("b", {"topo_rank": float("nan")}, {"topo_rank": ["3"]}),
        node(None, {"nvlink_domain_x": 1.0}),
        "not a record",
        node("c", {"nvlink_domain_x": 1.0, "topo_rank": 2.0}),
    ]
    with caplog.at_level(logging.WARNING, logger="raylens.distributed"):
        found = topology_of_nodes(nodes)  # type: ignore[arg-type]
    assert found == {
        "a": ("nvlink_domain_x", TOPO_RANK_UNKNOWN),
        "b": (NVLINK_DOMAIN_UNKNOWN, TOPO_RANK_UNKNOWN),
        "c": ("nvlink_domain_x", 2),
    }
    assert "without a node id" in caplog.text


def test_cluster_topology_is_read_through_a_cluster_view(fake_ray: FakeRay) -> None:
    first, second = fake_ray.node_ids
    fake_ray.node_labels[first] = {"nvlink_domain": "r", "topo_rank": "1"}

    class View:
        def nodes(self) -> list[dict[str, object]]:
            return fake_ray.nodes()

    assert topo.get_ray_cluster_topology(View()) == {  # type: ignore[arg-type]
        first: ("nvlink_domain_r", 1),
        second: (NVLINK_DOMAIN_UNKNOWN, TOPO_RANK_UNKNOWN),
    }


# ---- choosing nodes for segments -----------------------------------------------------


def test_segments_come_from_the_lowest_ranked_domains_whole() -> None:
    layout = racks(b=[20, 21, 22, 23], a=[1, 2, 3, 4, 5, 6], c=[10, 11, 12, 13])
    selected, remaining = select_segment_nodes(layout, segment_size=4, num_nodes=8)
    assert [layout[n] for n in selected] == [("a", r) for r in (1, 2, 3, 4)] + [
        ("c", r) for r in (10, 11, 12, 13)
    ]
    assert set(selected) | set(remaining) == set(layout)
    assert not set(selected) & set(remaining)
    assert list(remaining) == [n for n in layout if n not in selected]  # topology's order


def test_unknown_domains_are_never_selected() -> None:
    layout = racks(**{NVLINK_DOMAIN_UNKNOWN: [-1, -1], "a": [5, 6]})
    selected, remaining = select_segment_nodes(layout, segment_size=2, num_nodes=2)
    assert {layout[n][0] for n in selected} == {"a"}
    assert {layout[n][0] for n in remaining} == {NVLINK_DOMAIN_UNKNOWN}
    with pytest.raises(ResourceInsufficientError, match=r"Cannot form 2 complete segments"):
        select_segment_nodes(layout, segment_size=2, num_nodes=4)


@pytest.mark.parametrize(
    ("segment", "count", "match"),
    [(3, 8, r"num_nodes \(8\) must be divisible by segment_size \(3\)"), (0, 4, r"segment_size=0")],
)
def test_bad_segment_requests_are_named(segment: int, count: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        select_segment_nodes(racks(a=[1, 2]), segment_size=segment, num_nodes=count)


def test_training_then_inference_take_disjoint_segments() -> None:
    layout = racks(a=list(range(8)), b=list(range(10, 18)), c=list(range(20, 28)))
    train, rest, seen = prepare_segment_topology(8, 16, topology=layout)
    assert train == [{"a": 0.001}] * 8 + [{"b": 0.001}] * 8
    assert seen == layout
    inference, left, _ = prepare_segment_topology(
        4, 8, topology={n: layout[n] for n in rest}, role="inference"
    )
    assert inference == [{"c": 0.001}] * 8 and left == []


def test_no_segment_size_or_no_domains_means_no_constraints(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert prepare_segment_topology(None, 4) == (None, [], {})
    plain = racks(**{NVLINK_DOMAIN_UNKNOWN: [-1, -1]})
    with caplog.at_level(logging.WARNING, logger="raylens.distributed"):
        assert prepare_segment_topology(2, 2, topology=plain) == (None, list(plain), plain)
    assert "no node reports an NVLink domain" in caplog.text


# ---- ordering bundles ---------------------------------------------------------------


def test_without_topology_bundles_go_by_node_then_gpu() -> None:
    data = [
        (1, NVLINK_DOMAIN_UNKNOWN, TOPO_RANK_UNKNOWN, "b"),
        (0, NVLINK_DOMAIN_UNKNOWN, TOPO_RANK_UNKNOWN, "b"),
        (0, NVLINK_DOMAIN_UNKNOWN, TOPO_RANK_UNKNOWN, "a"),
    ]
    assert sort_bundle_indices_by_topology(data) == [2, 1, 0]
    assert sort_bundle_indices_by_topology(data, segment_size=1, gpus_per_node=2) == [2, 1, 0]
    assert sort_bundle_indices_by_topology([]) == []


def test_domains_by_lowest_rank_then_node_rank_then_gpu() -> None:
    data = [
        (1, "x", 9, "n1"),
        (0, "y", 2, "n2"),
        (0, "x", 9, "n1"),
        (0, "x", 5, "n3"),
        (0, "y", 7, "n4"),
    ]
    # y's lowest rank (2) is below x's (5): y's bundles first, each domain by node rank.
    assert sort_bundle_indices_by_topology(data) == [1, 4, 3, 2, 0]


def test_segments_keep_whole_segments_of_each_domain_only() -> None:
    data = [(g, "x", rank, f"n{rank}") for rank in (3, 1, 2) for g in (0, 1)]
    kept = sort_bundle_indices_by_topology(data, segment_size=2, gpus_per_node=2)
    assert [data[i][2] for i in kept] == [1, 1, 2, 2]
    with pytest.raises(ValueError, match=r"gpus_per_node is required"):
        sort_bundle_indices_by_topology(data, segment_size=2)


@given(
    st.lists(
        st.tuples(
            st.integers(0, 7),
            st.sampled_from(["d0", "d1", "d2"]),
            st.integers(-1, 50),
            st.sampled_from(["n0", "n1", "n2", "n3"]),
        ),
        max_size=30,
    )
)
def test_order_is_a_permutation_with_each_domain_contiguous(
    data: list[tuple[int, str, int, str]],
) -> None:
    order = sort_bundle_indices_by_topology(data)
    assert sorted(order) == list(range(len(data)))
    domains = [data[i][1] for i in order]
    finished: set[str] = set()
    for before, after in itertools.pairwise(domains):
        if after != before:
            finished.add(before)
            assert after not in finished
    # Within a domain, node ranks never go down.
    for domain in set(domains):
        ranks = [data[i][2] for i in order if data[i][1] == domain]
        assert ranks == sorted(ranks)


def test_bundle_topology_from_labels_counts_bundles_per_node() -> None:
    layout = {"a": ("nvlink_domain_r", 3)}
    assert topo.bundle_topology_from_labels(["a", "b", "a"], layout) == [
        BundleTopology(0, "nvlink_domain_r", 3, "a"),
        BundleTopology(0, NVLINK_DOMAIN_UNKNOWN, TOPO_RANK_UNKNOWN, "b"),
        BundleTopology(1, "nvlink_domain_r", 3, "a"),
    ]


# ---- with GPUs (on FakeRay: the GPU id each bundle's task reports is scripted) ------


def scripted_gpu_ids(monkeypatch: pytest.MonkeyPatch, ids: list[int]) -> None:
    answers = iter(ids)
    monkeypatch.setattr(topo, "_first_gpu_id", lambda: next(answers))


def test_reordered_bundle_asks_each_bundle_for_its_gpu(
    fake_ray: FakeRay, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = fake_ray.node_ids
    fake_ray.node_labels[first] = {"nvlink_domain": "r", "topo_rank": "8"}
    fake_ray.node_labels[second] = {"nvlink_domain": "r", "topo_rank": "2"}
    # SPREAD alternates the bundles: first, second, first, second.
    pg = fake_ray.util.placement_group([{"GPU": 1}] * 4, strategy="SPREAD")
    scripted_gpu_ids(monkeypatch, [1, 1, 0, 0])
    order, gpus, domains = topo.get_reordered_bundle(pg, ray=fake_ray)
    assert order == [3, 1, 2, 0]  # the rank-2 node first, each node by GPU id
    assert gpus == [0, 1, 0, 1]
    assert domains == ("nvlink_domain_r",) * 4
    asked = [options for name, _, options in fake_ray.tasks if name == "<lambda>"]
    assert [o["scheduling_strategy"].placement_group_bundle_index for o in asked] == [0, 1, 2, 3]
    assert all(o["num_gpus"] == 0.01 for o in asked)


def test_unified_gpu_cluster_orders_bundles_and_refuses_broken_segments(
    fake_ray: FakeRay, monkeypatch: pytest.MonkeyPatch
) -> None:
    from raylens.distributed.virtual_cluster import RayVirtualCluster

    for node_id in fake_ray.node_ids:
        fake_ray.node_resources[node_id]["GPU"] = 2.0
    first, second = fake_ray.node_ids
    fake_ray.node_resources[first].update({"nvlink_domain_a": 1.0, "topo_rank": 5.0})
    fake_ray.node_resources[second].update({"nvlink_domain_b": 1.0, "topo_rank": 1.0})
    scripted_gpu_ids(monkeypatch, [0, 0, 1, 1])
    cluster = RayVirtualCluster(
        [2, 2], num_gpus_per_node=2, use_unified_pg=True, ray_seam=fake_ray.seam()
    )
    cluster.get_placement_groups()
    assert cluster._sorted_bundle_indices == [1, 3, 0, 2]
    assert cluster._nvlink_domain_per_bundle_index == ("nvlink_domain_a", "nvlink_domain_b") * 2
    cluster.shutdown()
    # Two domains of one node each cannot make segments of two nodes.
    scripted_gpu_ids(monkeypatch, [0, 0, 1, 1])
    segmented = RayVirtualCluster(
        [2, 2], num_gpus_per_node=2, segment_size=2, use_unified_pg=True, ray_seam=fake_ray.seam()
    )
    with pytest.raises(AssertionError, match=r"kept 0 of 4 bundles"):
        segmented.get_placement_groups()
    segmented.shutdown()
