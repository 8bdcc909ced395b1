"""Worker-group planning without Ray: bundles, ranks, tied groups, DP leaders."""

from __future__ import annotations

import pytest

from raylens.distributed import worker_groups as wg
from raylens.distributed import worker_planning as wp
from raylens.distributed.virtual_cluster import RayVirtualCluster
from raylens_fakes.pytest_plugin import BlockedImports


def plan(bundle_indices_list, counts=(2, 2), strategy="SPREAD"):  # type: ignore[no-untyped-def]
    cluster = RayVirtualCluster(list(counts), use_gpus=False, placement_group_strategy=strategy)
    return wp._plan_workers(bundle_indices_list, cluster.node_and_local_index, "g")


# ---- workers_per_node -----------------------------------------------------------------


def test_default_is_one_worker_per_bundle() -> None:
    assert wp._bundle_indices_from_workers_per_node(None, [2, 1]) == [
        (0, [0]),
        (0, [1]),
        (1, [0]),
    ]


def test_int_applies_to_every_node_with_bundles() -> None:
    # nodes are counted among those holding bundles, one placement group each
    assert wp._bundle_indices_from_workers_per_node(1, [2, 0, 3]) == [(0, [0]), (1, [0])]


def test_list_gives_count_per_node() -> None:
    assert wp._bundle_indices_from_workers_per_node([0, 2], [2, 2]) == [(1, [0]), (1, [1])]


def test_list_has_one_entry_per_placement_group() -> None:
    expected = [(0, [0]), (1, [0]), (1, [1])]
    assert wp._bundle_indices_from_workers_per_node([1, 2], [2, 0, 2]) == expected
    # one entry per logical node, empty ones included, is still understood
    assert wp._bundle_indices_from_workers_per_node([1, 0, 2], [2, 0, 2]) == expected
    with pytest.raises(ValueError, match=r"3 entries.*2 placement groups"):
        wp._bundle_indices_from_workers_per_node([1, 1, 2], [2, 0, 2])


def test_an_empty_middle_node_does_not_shift_node_rank() -> None:
    cluster = RayVirtualCluster([2, 0, 2], use_gpus=False)
    indices = wp._bundle_indices_from_workers_per_node(None, cluster.bundle_ct_per_node_list)
    plans = wp._plan_workers(indices, cluster.node_and_local_index, "g")
    assert [p.node_rank for p in plans] == [0, 0, 1, 1]
    assert [p.local_rank for p in plans] == [0, 1, 0, 1]


@pytest.mark.parametrize(
    ("workers_per_node", "match"),
    [
        (3, r"3 workers on node 0.*only 2 bundles"),
        ([1], r"1 entries.*2 placement groups"),
        ([1, 5], r"5 workers on node 1"),
        ([1, -1], r"-1"),
        ([0, 0], r"no workers"),
        (0, r"no workers"),
        ("2", r"int or a list"),
        (True, r"int or a list"),
    ],
)
def test_bad_workers_per_node(workers_per_node: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        wp._bundle_indices_from_workers_per_node(workers_per_node, [2, 2])  # type: ignore[arg-type]


# ---- bundle_indices_list --------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        [],
        None,
        [(0,)],
        [(0, [])],
        [(0, 1)],
        [("0", [1])],
        [(0, [1.0])],
        [(0, [True])],
    ],
)
def test_malformed_bundle_indices_list(bad: object) -> None:
    with pytest.raises(ValueError, match=r"bundle_indices_list"):
        wp._normalized_bundle_indices_list(bad)


def test_bundle_indices_list_is_copied() -> None:
    source = [(0, [0, 1])]
    normalized = wp._normalized_bundle_indices_list(source)
    source[0][1].append(5)
    assert normalized == [(0, [0, 1])]


# ---- plans ----------------------------------------------------------------------------


def test_single_worker_groups_get_ranks_in_order() -> None:
    plans = plan([(0, [0]), (0, [1]), (1, [0]), (1, [1])])
    assert [p.global_rank for p in plans] == [0, 1, 2, 3]
    assert [p.tied_group_idx for p in plans] == [0, 1, 2, 3]
    assert [(p.node_rank, p.local_rank) for p in plans] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [p.name for p in plans] == ["g-0-0", "g-0-1", "g-1-0", "g-1-1"]
    assert [p.bundle_indices for p in plans] == [(0, [0]), (0, [1]), (1, [0]), (1, [1])]


def test_tied_groups_leader_carries_bundle_indices() -> None:
    plans = plan([(0, [0, 1]), (1, [0, 1])])
    assert [p.tied_group_idx for p in plans] == [0, 0, 1, 1]
    assert [p.member_idx for p in plans] == [0, 1, 0, 1]
    assert [p.bundle_indices for p in plans] == [(0, [0, 1]), None, (1, [0, 1]), None]
    assert [p.name for p in plans] == ["g-grp0-0", "g-grp0-1", "g-grp1-0", "g-grp1-1"]


def test_tied_group_spilling_onto_the_next_node() -> None:
    plans = plan([(0, [0, 1, 2])], counts=(2, 2), strategy="PACK")
    assert [(p.node_rank, p.local_rank) for p in plans] == [(0, 0), (0, 1), (1, 0)]
    assert all(p.node_idx == 0 for p in plans)


def test_bundle_used_twice_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"bundle \(1, 0\).*already given to worker 0"):
        plan([(0, [2]), (1, [0])])


def test_unknown_bundle_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"\(1, 2\)"):
        plan([(1, [2])])
    with pytest.raises(ValueError, match=r"\(5, 0\)"):
        plan([(5, [0])])


def test_tied_groups_index() -> None:
    groups, index = wp._tied_groups(plan([(0, [0, 1]), (1, [0]), (1, [1])]))
    assert groups == [[0, 1], [2], [3]]
    assert index == {0: 0, 1: 0, 2: 1, 3: 2}


# ---- DP leaders -----------------------------------------------------------------------


def test_dp_leaders_subset_accepted() -> None:
    wp._check_dp_leader_worker_indices([0, 4], [0, 2, 4, 6])
    wp._check_dp_leader_worker_indices([0, 2, 4, 6], [0, 2, 4, 6])


def test_dp_leaders_not_group_leaders_are_named() -> None:
    with pytest.raises(ValueError, match=r"\[1, 3\] are not tied-group leaders.*\[0, 2, 4\]"):
        wp._check_dp_leader_worker_indices([0, 1, 3], [0, 2, 4])


def test_dp_leaders_must_ascend() -> None:
    with pytest.raises(ValueError, match=r"ascending.*\[0\]"):
        wp._check_dp_leader_worker_indices([2, 0], [0, 2])
    with pytest.raises(ValueError, match=r"ascending.*\[2\]"):
        wp._check_dp_leader_worker_indices([2, 2], [0, 2])


@pytest.mark.parametrize("bad", [[], None, [0.0], [True], "0"])
def test_dp_leaders_bad_shapes(bad: object) -> None:
    with pytest.raises(ValueError, match=r"dp_leader_worker_indices"):
        wp._check_dp_leader_worker_indices(bad, [0, 2])  # type: ignore[arg-type]


def test_dp_shard_of_workers() -> None:
    assert wp._dp_shard_of_workers(4, [0, 1, 2, 3]) == [0, 1, 2, 3]
    assert wp._dp_shard_of_workers(6, [0, 4]) == [0, 0, 0, 0, 1, 1]
    assert wp._dp_shard_of_workers(4, [2]) == [None, None, 0, 0]


# ---- the group checks its arguments before touching Ray --------------------------------


def _group(**kwargs):  # type: ignore[no-untyped-def]
    cluster = RayVirtualCluster([2, 2], use_gpus=False)
    return wg.RayWorkerGroup(cluster, wg.RayWorkerBuilder("pkg.mod.Worker"), **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"name_prefix": "a,b"}, r"'a,b'.*commas"),
        ({"name_prefix": "none"}, r"'none'.*no worker group"),
        ({"dp_leader_worker_indices": [2, 1]}, r"ascending.*\[1\]"),
        (
            {"bundle_indices_list": [(0, [0, 1]), (1, [0, 1])], "dp_leader_worker_indices": [0, 1]},
            r"\[1\] are not tied-group leaders.*\[0, 2\]",
        ),
        ({"workers_per_node": 3}, r"only 2 bundles"),
        ({"env_vars": {"A": 1}}, r"'A': 1"),
        (
            {"sharding_annotations": wg.NamedSharding([[0, 1]], ["dp", "tp"])},
            r"covers 2 ranks.*4 workers",
        ),
    ],
)
def test_group_rejects_bad_arguments_before_using_ray(
    kwargs: dict[str, object], match: str, ray_absent: BlockedImports
) -> None:
    with pytest.raises(ValueError, match=match):
        _group(**kwargs)
    assert ray_absent.attempts == []


def test_group_without_a_ray_connection_says_so(ray_absent: BlockedImports) -> None:
    with pytest.raises(RuntimeError, match=r"ray\.init"):
        _group()
    assert ray_absent.attempts == []
