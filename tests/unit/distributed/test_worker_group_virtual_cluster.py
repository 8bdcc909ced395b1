"""RayVirtualCluster bookkeeping that needs no Ray: validation, layout, resources, ports."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from raylens.distributed import virtual_cluster as vc
from raylens.distributed.virtual_cluster import RayVirtualCluster
from raylens_fakes.pytest_plugin import BlockedImports


@pytest.mark.slow
def test_modules_import_without_importing_ray() -> None:
    code = (
        "import sys\n"
        "import raylens.distributed\n"
        "import raylens.distributed.named_sharding\n"
        "import raylens.distributed.virtual_cluster\n"
        "import raylens.distributed.worker_groups\n"
        "assert 'ray' not in sys.modules, 'ray was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# ---- construction --------------------------------------------------------------------


def test_defaults_and_sizes() -> None:
    cluster = RayVirtualCluster([2, 0, 3], use_gpus=False)
    assert cluster.world_size() == 5
    assert cluster.node_count() == 2
    assert cluster.bundle_ct_per_node_list == [2, 0, 3]
    assert cluster.placement_group_strategy == "SPREAD"  # NeMo-RL's default
    assert cluster.max_colocated_worker_groups == 1
    assert cluster.num_gpus_per_node == 8
    assert cluster.use_gpus is False


def test_bundle_counts_are_copied() -> None:
    counts = [1, 1]
    cluster = RayVirtualCluster(counts, use_gpus=False)
    counts.append(4)
    cluster.bundle_ct_per_node_list.append(7)
    assert cluster.bundle_ct_per_node_list == [1, 1]


@pytest.mark.parametrize(
    ("counts", "match"),
    [
        ([], r"at least one"),
        ([0, 0], r"at least one"),
        ([1, -1], r"-1"),
        ([1, 1.5], r"1\.5"),
        ([True], r"True"),
        ("12", r"list"),
    ],
)
def test_bad_bundle_counts(counts: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        RayVirtualCluster(counts, use_gpus=False)  # type: ignore[arg-type]


def test_gpu_bundles_cannot_exceed_gpus_per_node() -> None:
    with pytest.raises(ValueError, match=r"node 1.*3 bundles.*num_gpus_per_node=2"):
        RayVirtualCluster([2, 3], use_gpus=True, num_gpus_per_node=2)
    RayVirtualCluster([3], use_gpus=False, num_gpus_per_node=2)


def test_bad_strategy_lists_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match=r"'BEST'.*PACK.*STRICT_PACK.*SPREAD.*STRICT_SPREAD"):
        RayVirtualCluster([1], use_gpus=False, placement_group_strategy="BEST")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_colocated_worker_groups": 0}, r"max_colocated_worker_groups=0"),
        ({"num_gpus_per_node": 0, "use_gpus": True}, r"num_gpus_per_node=0"),
        ({"placement_timeout_s": 0}, r"placement_timeout_s.*got 0"),
    ],
)
def test_bad_numbers(kwargs: dict[str, object], match: str) -> None:
    kwargs.setdefault("use_gpus", False)
    with pytest.raises(ValueError, match=match):
        RayVirtualCluster([1], **kwargs)  # type: ignore[arg-type]


def test_unconnected_process_gets_a_clear_error_without_importing_ray(
    ray_absent: BlockedImports,
) -> None:
    cluster = RayVirtualCluster([1], use_gpus=False)
    with pytest.raises(RuntimeError, match=r"ray\.init"):
        cluster.get_placement_groups()
    with pytest.raises(RuntimeError, match=r"ray\.init"):
        cluster.get_master_address_and_port()
    assert ray_absent.attempts == []


def test_shutdown_before_use_is_harmless_and_repeatable() -> None:
    cluster = RayVirtualCluster([1], use_gpus=False)
    cluster.shutdown()
    cluster.shutdown()


# ---- bundle shapes and layout --------------------------------------------------------


def test_bundle_resources() -> None:
    assert RayVirtualCluster([1], use_gpus=False).bundle_resources() == {"CPU": 1}
    assert RayVirtualCluster([1], use_gpus=True).bundle_resources() == {"CPU": 1, "GPU": 1}
    colocated = RayVirtualCluster([1], use_gpus=True, max_colocated_worker_groups=2)
    assert colocated.bundle_resources() == {"CPU": 2, "GPU": 1}


def test_required_resources() -> None:
    assert RayVirtualCluster([2, 1], use_gpus=False).required_resources() == {"CPU": 3}
    gpus = RayVirtualCluster([2, 2], use_gpus=True, max_colocated_worker_groups=2)
    assert gpus.required_resources() == {"CPU": 8, "GPU": 4}


def test_missing_resources_names_each_shortfall() -> None:
    missing = vc._missing_resources({"CPU": 4, "GPU": 2}, {"CPU": 6.0, "memory": 1e9})
    assert missing == {"GPU": (2, 0.0)}
    missing = vc._missing_resources({"CPU": 4, "GPU": 2}, {"CPU": 3.0, "GPU": 1.0})
    assert missing == {"CPU": (4, 3.0), "GPU": (2, 1.0)}
    assert vc._missing_resources({"CPU": 2}, {"CPU": 2.0}) == {}


def test_missing_resources_message() -> None:
    cluster = RayVirtualCluster([2, 2], use_gpus=True, name="train")
    message = cluster._missing_resources_message({"GPU": (4, 0.0), "CPU": (4, 2.0)})
    assert "'train'" in message
    assert "GPU: needs 4, the cluster has 0" in message
    assert "CPU: needs 4, the cluster has 2" in message
    assert "use_gpus=False" in message


@pytest.mark.parametrize("strategy", ["PACK", "STRICT_PACK"])
def test_pack_strategies_make_one_group_per_node(strategy: str) -> None:
    cluster = RayVirtualCluster([2, 0, 3], use_gpus=False, placement_group_strategy=strategy)
    plan = cluster._group_plan()
    assert [(group.nodes, group.bundle_count) for group in plan] == [([0], 2), ([2], 3)]
    assert all(group.strategy == strategy for group in plan)


def test_default_is_one_pack_group_per_node() -> None:
    # NeMo-RL's default strategy is SPREAD, yet by default it reserves packed groups per node.
    cluster = RayVirtualCluster([2, 0, 3], use_gpus=False, name="gen")
    assert cluster.placement_group_strategy == "SPREAD"
    assert cluster.use_unified_pg is False
    plan = cluster._group_plan()
    assert [(g.name, g.bundle_count, g.strategy) for g in plan] == [
        ("gen-node0", 2, "PACK"),
        ("gen-node2", 3, "PACK"),
    ]


@pytest.mark.parametrize("strategy", ["SPREAD", "STRICT_SPREAD"])
def test_spread_strategies_make_one_unified_group(strategy: str) -> None:
    cluster = RayVirtualCluster([2, 0, 3], use_gpus=False, placement_group_strategy=strategy)
    assert cluster.use_unified_pg is True
    plan = cluster._group_plan()
    assert [(group.nodes, group.bundle_count) for group in plan] == [([0, 1, 2], 5)]


def test_unified_group_only_when_asked() -> None:
    unified = RayVirtualCluster([1, 1], use_gpus=False, use_unified_pg=True)
    assert [(g.bundle_count, g.strategy) for g in unified._group_plan()] == [(2, "SPREAD")]
    per_node = RayVirtualCluster(
        [1, 1], use_gpus=False, placement_group_strategy="SPREAD", use_unified_pg=False
    )
    assert [g.bundle_count for g in per_node._group_plan()] == [1, 1]
    with pytest.raises(ValueError, match=r"use_unified_pg='yes'.*True, False or None"):
        RayVirtualCluster([1], use_gpus=False, use_unified_pg="yes")  # type: ignore[arg-type]


def test_group_names_come_from_the_cluster_name() -> None:
    named = RayVirtualCluster([1, 1], use_gpus=False, name="gen")
    assert [group.name for group in named._group_plan()] == ["gen-node0", "gen-node1"]
    unified = RayVirtualCluster([1, 1], use_gpus=False, name="gen", use_unified_pg=True)
    assert [group.name for group in unified._group_plan()] == ["gen-all"]
    anonymous = RayVirtualCluster([1], use_gpus=False)
    assert anonymous.name.startswith("raylens-cluster-")
    assert RayVirtualCluster([1], use_gpus=False).name != anonymous.name


def test_bundle_address_unified() -> None:
    cluster = RayVirtualCluster([2, 0, 3], use_gpus=False, use_unified_pg=True)
    assert cluster._bundle_address(0, 0) == (0, 0, 0)
    assert cluster._bundle_address(0, 1) == (0, 1, 0)
    assert cluster._bundle_address(1, 0) == (0, 2, 1)
    assert cluster._bundle_address(1, 2) == (0, 4, 1)


def test_bundle_address_per_node_groups_skips_empty_nodes() -> None:
    # nodes are counted among those that hold bundles: [2, 0, 3] has nodes 0 and 1
    cluster = RayVirtualCluster([2, 0, 3], use_gpus=False)
    assert cluster._bundle_address(0, 1) == (0, 1, 0)
    assert cluster._bundle_address(1, 0) == (1, 0, 1)
    assert cluster._bundle_address(1, 2) == (1, 2, 1)
    assert cluster.node_and_local_index(1, 2) == (1, 2)


def test_bundle_address_spills_onto_following_nodes() -> None:
    cluster = RayVirtualCluster([2, 2], use_gpus=False, placement_group_strategy="PACK")
    # a tied group starting on node 0 that spans four bundles
    assert cluster._bundle_address(0, 2) == (1, 0, 1)
    assert cluster._bundle_address(0, 3) == (1, 1, 1)


def test_node_and_local_index_of_a_bundle() -> None:
    cluster = RayVirtualCluster([2, 0, 3], use_gpus=False)
    assert cluster.node_and_local_index(0, 1) == (0, 1)
    assert cluster.node_and_local_index(0, 2) == (1, 0)
    assert cluster.node_and_local_index(1, 0) == (1, 0)


def test_ranks_from_where_ray_put_the_bundles() -> None:
    assert vc._ranks_from_bundle_nodes(["b", "a", "b", "c", "a"]) == [
        (0, 0),
        (1, 0),
        (0, 1),
        (2, 0),
        (1, 1),
    ]


def test_unified_node_rank_follows_placement_once_known() -> None:
    cluster = RayVirtualCluster([2, 2], use_gpus=False, use_unified_pg=True)
    assert cluster.node_and_local_index(1, 0) == (1, 0)  # not placed yet: by arithmetic
    cluster._bundle_nodes = ["x", "y", "x", "y"]  # as Ray spread them
    assert cluster.node_and_local_index(0, 1) == (1, 0)
    assert cluster.node_and_local_index(1, 0) == (0, 1)
    assert cluster.node_and_local_index(1, 1) == (1, 1)


@pytest.mark.parametrize(("node", "local"), [(2, 0), (-1, 0), (0, 5), (1, 3), (0, -1)])
def test_bundle_address_out_of_range(node: int, local: int) -> None:
    cluster = RayVirtualCluster([2, 0, 3], use_gpus=False)
    with pytest.raises(ValueError, match=rf"\({node}, {local}\)"):
        cluster._bundle_address(node, local)


def test_upstream_positional_arguments_keep_their_order() -> None:
    # NeMo-RL's order: counts, use_gpus, max_colocated_worker_groups, num_gpus_per_node, name.
    cluster = RayVirtualCluster([2], False, 2, 4, "trainer")
    assert cluster.use_gpus is False
    assert cluster.max_colocated_worker_groups == 2
    assert cluster.num_gpus_per_node == 4
    assert cluster.name == "trainer"


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), -1, "30", None, True])
def test_placement_timeout_must_be_a_finite_positive_number(bad: object) -> None:
    # An infinite wait would overflow Ray's millisecond timeout after the groups were made.
    with pytest.raises(
        ValueError, match=rf"placement_timeout_s.*positive.*finite.*{re.escape(repr(bad))}"
    ):
        RayVirtualCluster([1], use_gpus=False, placement_timeout_s=bad)  # type: ignore[arg-type]


def test_placement_timeout_accepts_ints_and_floats() -> None:
    assert RayVirtualCluster([1], use_gpus=False, placement_timeout_s=5).placement_timeout_s == 5.0
    assert (
        RayVirtualCluster([1], use_gpus=False, placement_timeout_s=0.5).placement_timeout_s == 0.5
    )


def test_num_gpus_per_node_is_not_a_bool() -> None:
    with pytest.raises(ValueError, match=r"num_gpus_per_node=True"):
        RayVirtualCluster([1], use_gpus=True, num_gpus_per_node=True)  # type: ignore[arg-type]
