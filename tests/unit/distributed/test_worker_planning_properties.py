"""Worker planning agrees with a plain re-statement of its rules on generated layouts.

The oracle lays every bundle of a virtual cluster out in one flat list, node by node
(empty nodes skipped), and reads ranks, node ranks and local ranks off that list.
"""

from __future__ import annotations

import bisect
import itertools
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from raylens.distributed import worker_planning as wp
from raylens.distributed.named_sharding import NamedSharding
from raylens.distributed.virtual_cluster import RayVirtualCluster, _ranks_from_bundle_nodes

bundle_counts = st.lists(st.integers(0, 3), min_size=1, max_size=4).filter(lambda c: sum(c) > 0)


class Oracle:
    """The bundles of ``counts`` as one flat list of ``(node rank, local rank)``."""

    def __init__(self, counts: list[int]) -> None:
        self.full = list(counts)
        self.nonempty = [count for count in counts if count > 0]
        self.flat = [
            (node, local) for node, count in enumerate(self.nonempty) for local in range(count)
        ]
        self.starts = [sum(self.nonempty[:node]) for node in range(len(self.nonempty))]

    def global_index(self, node_idx: int, local_idx: int) -> int | None:
        if not 0 <= node_idx < len(self.nonempty) or local_idx < 0:
            return None
        index = self.starts[node_idx] + local_idx
        return index if index < len(self.flat) else None

    def per_node(self, workers_per_node: Any) -> list[int] | None:
        """Workers wanted on each non-empty node, or None when the request is invalid."""
        if workers_per_node is None:
            wanted = list(self.nonempty)
        elif isinstance(workers_per_node, int):
            wanted = [workers_per_node] * len(self.nonempty)
        elif len(workers_per_node) == len(self.nonempty):
            wanted = list(workers_per_node)
        elif len(workers_per_node) == len(self.full):
            if any(w != 0 for w, count in zip(workers_per_node, self.full) if count == 0):
                return None
            wanted = [w for w, count in zip(workers_per_node, self.full) if count > 0]
        else:
            return None
        if any(w < 0 or w > count for w, count in zip(wanted, self.nonempty)) or sum(wanted) == 0:
            return None
        return wanted


def make_cluster(counts: list[int]) -> RayVirtualCluster:
    return RayVirtualCluster(list(counts), use_gpus=False, placement_group_strategy="PACK")


@st.composite
def workers_per_node_requests(draw: st.DrawFn, counts: list[int]) -> Any:
    nonempty = [count for count in counts if count > 0]
    return draw(
        st.one_of(
            st.none(),
            st.integers(0, 4),
            st.lists(st.integers(0, 4), min_size=len(nonempty), max_size=len(nonempty)),
            st.tuples(*[st.integers(0, c + 1) if c else st.just(0) for c in counts]).map(list),
            st.lists(st.integers(-1, 3), min_size=len(counts), max_size=len(counts)),
            st.lists(st.integers(0, 3), max_size=6),
        )
    )


@given(st.data())
def test_workers_per_node_asks_for_the_first_bundles_of_each_node(data: st.DataObject) -> None:
    counts = data.draw(bundle_counts, label="counts")
    request = data.draw(workers_per_node_requests(counts), label="workers_per_node")
    oracle = Oracle(counts)
    wanted = oracle.per_node(request)
    if wanted is None:
        with pytest.raises(ValueError, match="workers_per_node"):
            wp._bundle_indices_from_workers_per_node(request, counts)
        return
    indices = wp._bundle_indices_from_workers_per_node(request, counts)
    assert indices == [(node, [local]) for node, w in enumerate(wanted) for local in range(w)]

    plans = wp._plan_workers(indices, make_cluster(counts).node_and_local_index, "g")
    assert [plan.global_rank for plan in plans] == list(range(sum(wanted)))
    for plan, (node, [local]) in zip(plans, indices):
        assert (plan.node_rank, plan.local_rank) == (node, local)
        assert plan.name == f"g-{node}-{local}"
        assert plan.bundle_indices == (node, [local])
    # NODE_RANK counts nodes holding bundles; LOCAL_RANK runs 0.. on each node.
    for node, w in enumerate(wanted):
        local_ranks = [plan.local_rank for plan in plans if plan.node_rank == node]
        assert local_ranks == list(range(w))


@st.composite
def tied_layouts(draw: st.DrawFn) -> tuple[list[int], list[tuple[int, list[int]]], list[list[int]]]:
    """Counts, a bundle_indices_list, and the flat bundle index of every entry's bundles.

    Each group is addressed from a node at or before its lowest bundle, so its local
    indices may run past that node's bundles onto the following ones.
    """
    counts = draw(bundle_counts)
    oracle = Oracle(counts)
    chosen = draw(st.permutations(range(len(oracle.flat))))
    chosen = chosen[: draw(st.integers(1, len(chosen)))]
    groups: list[list[int]] = []
    rest = list(chosen)
    while rest:
        size = draw(st.integers(1, len(rest)))
        groups.append(rest[:size])
        rest = rest[size:]
    entries = []
    for group in groups:
        possible = [node for node, start in enumerate(oracle.starts) if start <= min(group)]
        node_idx = draw(st.sampled_from(possible))
        entries.append((node_idx, [index - oracle.starts[node_idx] for index in group]))
    return counts, entries, groups


@given(tied_layouts())
def test_tied_groups_get_ranks_in_order_and_the_bundles_they_name(
    layout: tuple[list[int], list[tuple[int, list[int]]], list[list[int]]],
) -> None:
    counts, entries, groups = layout
    oracle = Oracle(counts)
    normalized = wp._normalized_bundle_indices_list([(n, tuple(local)) for n, local in entries])
    assert normalized == entries
    plans = wp._plan_workers(normalized, make_cluster(counts).node_and_local_index, "g")

    rank = 0
    expected_groups = []
    for group_idx, ((node_idx, local), flat) in enumerate(zip(entries, groups)):
        expected_groups.append(list(range(rank, rank + len(flat))))
        for member_idx, (local_idx, index) in enumerate(zip(local, flat)):
            plan = plans[rank]
            assert plan.global_rank == rank
            assert (plan.tied_group_idx, plan.member_idx) == (group_idx, member_idx)
            assert (plan.node_idx, plan.local_bundle_idx) == (node_idx, local_idx)
            assert (plan.node_rank, plan.local_rank) == oracle.flat[index]
            assert plan.bundle_indices == ((node_idx, local) if member_idx == 0 else None)
            if len(local) > 1:
                assert plan.name == f"g-grp{group_idx}-{member_idx}"
            else:
                assert plan.name == f"g-{node_idx}-{local_idx}"
            rank += 1
    assert len(plans) == rank

    tied, index_of = wp._tied_groups(plans)
    assert tied == expected_groups
    assert index_of == {r: g for g, members in enumerate(expected_groups) for r in members}
    # No two workers share a bundle, so no two share (NODE_RANK, LOCAL_RANK).
    places = [(plan.node_rank, plan.local_rank) for plan in plans]
    assert len(set(places)) == len(places)


@given(tied_layouts(), st.data())
def test_a_bundle_named_twice_or_outside_the_cluster_is_rejected(
    layout: tuple[list[int], list[tuple[int, list[int]]], list[list[int]]],
    data: st.DataObject,
) -> None:
    counts, entries, _ = layout
    oracle = Oracle(counts)
    node_idx = data.draw(st.integers(-1, len(oracle.nonempty)))
    local_idx = data.draw(st.integers(-1, len(oracle.flat)))
    extra = data.draw(st.integers(0, len(entries)))
    changed = [*entries[:extra], (node_idx, [local_idx]), *entries[extra:]]
    index = oracle.global_index(node_idx, local_idx)
    taken = {oracle.starts[n] + local for n, locals_ in entries for local in locals_}
    cluster = make_cluster(counts)
    if index is None:
        match = rf"bundle \({node_idx}, {local_idx}\) is not in this virtual cluster"
    elif index in taken:
        match = "already given to worker"
    else:
        plans = wp._plan_workers(changed, cluster.node_and_local_index, "g")
        assert plans[sum(len(local) for _, local in entries[:extra])].local_bundle_idx == local_idx
        return
    with pytest.raises(ValueError, match=match):
        wp._plan_workers(changed, cluster.node_and_local_index, "g")


@given(st.lists(st.sampled_from("abcd"), min_size=1, max_size=12))
def test_node_ranks_of_a_unified_group_follow_where_bundles_landed(nodes: list[str]) -> None:
    ranks = _ranks_from_bundle_nodes(nodes)
    first_seen = list(dict.fromkeys(nodes))
    for position, (node_id, (node_rank, local_rank)) in enumerate(zip(nodes, ranks)):
        assert node_rank == first_seen.index(node_id)
        assert local_rank == nodes[:position].count(node_id)


@given(st.lists(st.integers(1, 3), min_size=1, max_size=6), st.data())
def test_dp_leaders_and_the_shard_of_every_worker(
    group_sizes: list[int], data: st.DataObject
) -> None:
    leaders = [sum(group_sizes[:g]) for g in range(len(group_sizes))]
    num_workers = sum(group_sizes)
    requested = data.draw(
        st.one_of(
            st.lists(st.sampled_from(leaders), unique=True).map(sorted),
            st.lists(st.integers(-1, num_workers), max_size=4),
        )
    )
    valid = (
        bool(requested)
        and all(worker in leaders for worker in requested)
        and all(a < b for a, b in itertools.pairwise(requested))
    )
    if not valid:
        with pytest.raises(ValueError, match="dp_leader_worker_indices"):
            wp._check_dp_leader_worker_indices(requested, leaders)
        return
    wp._check_dp_leader_worker_indices(requested, leaders)
    shards = wp._dp_shard_of_workers(num_workers, requested)
    for worker, shard in enumerate(shards):
        position = bisect.bisect_right(requested, worker) - 1
        assert shard == (None if position < 0 else position)


@given(st.lists(st.integers(1, 3), min_size=1, max_size=5), st.data())
def test_results_come_back_once_per_tied_group(group_sizes: list[int], data: st.DataObject) -> None:
    groups = []
    for size in group_sizes:
        start = sum(len(g) for g in groups)
        groups.append(list(range(start, start + size)))
    group_of = {worker: g for g, members in enumerate(groups) for worker in members}
    workers = list(group_of)
    called = data.draw(st.permutations(workers))
    called = called[: data.draw(st.integers(0, len(called)))]
    wanted = data.draw(st.none() | st.lists(st.sampled_from(workers), unique=True))
    results = [f"result of {worker}" for worker in called]

    seen: set[int] = set()
    expected = []
    for worker in called if wanted is None else [w for w in wanted if w in called]:
        if group_of[worker] not in seen:
            seen.add(group_of[worker])
            expected.append(f"result of {worker}")
    assert wp._select_results(results, called, wanted, group_of) == expected


@st.composite
def group_shardings(draw: st.DrawFn) -> tuple[np.ndarray, list[str]]:
    """A layout holding the ranks 0..n-1 once each, as a group's sharding must."""
    shape = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
    ranks = draw(st.permutations(range(int(np.prod(shape)))))
    names = ["dp", "tp", "pp"][: len(shape)]
    return np.array(ranks).reshape(shape), names


@given(group_shardings(), st.data())
def test_sharded_dispatch_calls_the_workers_numpy_selects(
    grid: tuple[np.ndarray, list[str]], data: st.DataObject
) -> None:
    layout, names = grid
    sharding = NamedSharding(layout, names)
    roles = data.draw(st.lists(st.sampled_from("srf"), min_size=len(names), max_size=len(names)))
    sharded = [name for name, role in zip(names, roles) if role == "s"]
    sharded = data.draw(st.permutations(sharded))
    replicated = [name for name, role in zip(names, roles) if role == "r"]
    free = [name for name, role in zip(names, roles) if role == "f"]
    output_replicated = data.draw(st.lists(st.sampled_from(names), unique=True))
    dummies = data.draw(st.booleans())

    calls, returned = wp._plan_sharded_calls(
        sharding, sharded, replicated, output_replicated, dummies
    )
    with_data = layout[tuple(0 if name in free else slice(None) for name in names)]
    expected_real = sorted(np.asarray(with_data).reshape(-1).tolist())
    assert [call.worker_idx for call in calls if call.data_coords is not None] == expected_real
    if dummies:
        assert [call.worker_idx for call in calls] == list(range(layout.size))
    else:
        assert all(call.data_coords is not None for call in calls)
    for call in calls:
        if call.data_coords is not None:
            where = dict(zip(names, np.argwhere(layout == call.worker_idx)[0].tolist()))
            assert call.data_coords == tuple(where[name] for name in sharded)
    kept = layout[
        tuple(0 if name in free or name in output_replicated else slice(None) for name in names)
    ]
    assert returned == sorted(np.asarray(kept).reshape(-1).tolist())


@given(group_shardings(), st.data())
def test_rank_0_only_axes_keep_the_workers_at_index_0(
    grid: tuple[np.ndarray, list[str]], data: st.DataObject
) -> None:
    layout, names = grid
    axes = data.draw(st.lists(st.sampled_from(names), unique=True))
    selected = wp._rank0_only_workers(NamedSharding(layout, names), layout.size, axes)
    kept = layout[tuple(0 if name in axes else slice(None) for name in names)]
    assert selected == sorted(np.asarray(kept).reshape(-1).tolist())


@given(group_shardings(), st.data())
def test_each_sharded_call_gets_the_slice_at_its_coordinates(
    grid: tuple[np.ndarray, list[str]], data: st.DataObject
) -> None:
    layout, names = grid
    sharding = NamedSharding(layout, names)
    axes = data.draw(st.lists(st.sampled_from(names), unique=True, min_size=1))
    sizes = [sharding.get_axis_size(axis) for axis in axes]
    # Nested lists, one level per sharded axis, each leaf naming its own position.
    nested = np.empty(sizes, dtype=object)
    for position in np.ndindex(*sizes):
        nested[position] = f"slice {position}"
    value = nested.tolist()
    calls, _ = wp._plan_sharded_calls(sharding, axes, [], [], False)
    for call in calls:
        assert call.data_coords is not None
        got = wp._slice_sharded(value, axes, call.data_coords, sharding, "data")
        assert got == f"slice {tuple(call.data_coords)}"

    # One entry too few or too many along any level is refused, naming that axis.
    level = data.draw(st.integers(0, len(axes) - 1))
    wrong = sizes[level] + data.draw(st.sampled_from([-1, 1]))
    bad_shape = [*sizes[:level], wrong, *sizes[level + 1 :]]
    bad = np.empty(bad_shape, dtype=object)
    bad.fill("x")
    target = [0] * len(axes)
    with pytest.raises(
        ValueError, match=f"along axis {axes[level]!r}, which has size {sizes[level]}"
    ):
        wp._slice_sharded(bad.tolist(), axes, target, sharding, "data")
