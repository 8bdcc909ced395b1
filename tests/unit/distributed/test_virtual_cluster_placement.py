"""Reserving a virtual cluster on FakeRay: NeMo-RL's settings, retries with backoff, constraints."""

from __future__ import annotations

import pytest

from raylens.distributed.virtual_cluster import (
    DEFAULT_MASTER_PORT_RANGE_HIGH,
    DEFAULT_MASTER_PORT_RANGE_LOW,
    ClusterResourceError,
    PlacementTimeoutError,
    RayVirtualCluster,
    ResourceInsufficientError,
)
from raylens_fakes.ray import FakeRay

RETRIES = "NRL_VIRTUAL_CLUSTER_MAX_RETRIES"


class Sleeper:
    """Records the sleeps asked for; ``then`` runs after each (to change the cluster)."""

    def __init__(self, then: object = None) -> None:
        self.slept: list[float] = []
        self.then = then

    def __call__(self, seconds: float) -> None:
        self.slept.append(seconds)
        if callable(self.then):
            self.then()


def cluster(fake: FakeRay, counts: list[int], **kwargs: object) -> RayVirtualCluster:
    kwargs.setdefault("use_gpus", False)
    return RayVirtualCluster(counts, ray_seam=fake.seam(), **kwargs)  # type: ignore[arg-type]


def test_positional_order_and_defaults_are_nemo_rl_s() -> None:
    made = RayVirtualCluster([2], False, 2, 4, "gen", "STRICT_PACK", 20000, 20100, 2, [None])
    assert (made.use_gpus, made.max_colocated_worker_groups, made.num_gpus_per_node) == (
        False,
        2,
        4,
    )
    assert (made.name, made.placement_group_strategy) == ("gen", "STRICT_PACK")
    assert (made.port_range_low, made.port_range_high, made.segment_size) == (20000, 20100, 2)
    assert made.node_resource_constraints == [None]
    default = RayVirtualCluster([1], use_gpus=False)
    assert default.placement_group_strategy == "SPREAD"
    assert (default.port_range_low, default.port_range_high) == (
        DEFAULT_MASTER_PORT_RANGE_LOW,
        DEFAULT_MASTER_PORT_RANGE_HIGH,
    )
    assert default.segment_size is None and default.node_resource_constraints is None


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"port_range_low": 3000, "port_range_high": 3000}, ValueError, r"3000 must be below"),
        ({"port_range_low": -1}, ValueError, r"port_range_low=-1"),
        ({"segment_size": 0}, ValueError, r"segment_size=0"),
        ({"node_resource_constraints": [{}, {}]}, AssertionError, r"length \(2\) must match"),
        ({"node_resource_constraints": [{"x": -1}]}, ValueError, r"'x': -1"),
        ({"node_resource_constraints": ["x"]}, ValueError, r"\[0\]='x'"),
    ],
)
def test_bad_settings_are_named(kwargs: dict[str, object], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        RayVirtualCluster([1], use_gpus=False, **kwargs)  # type: ignore[arg-type]


def test_default_reserves_packed_groups_per_node(fake_ray: FakeRay) -> None:
    made = cluster(fake_ray, [2, 0, 1], name="gen")
    groups = made.get_placement_groups()
    assert [(g.name, g.strategy, g.bundle_count) for g in groups] == [
        ("gen-node0", "PACK", 2),
        ("gen-node2", "PACK", 1),
    ]
    assert made._sorted_bundle_indices is None


def test_node_constraints_join_every_bundle_of_their_node(fake_ray: FakeRay) -> None:
    pins = [{"nvlink_domain_a": 0.001}, None, {"nvlink_domain_b": 0.001}]
    made = cluster(fake_ray, [2, 1, 1], node_resource_constraints=pins, use_unified_pg=True)
    (group,) = made.get_placement_groups()
    assert group.bundle_specs == [
        {"CPU": 1, "nvlink_domain_a": 0.001},
        {"CPU": 1, "nvlink_domain_a": 0.001},
        {"CPU": 1},
        {"CPU": 1, "nvlink_domain_b": 0.001},
    ]


def test_placement_is_retried_with_backoff_until_the_cluster_grows(
    fake_ray: FakeRay, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(RETRIES, raising=False)
    fake_ray.node_resources = {node: {"CPU": 1.0} for node in fake_ray.node_ids}
    sleeper = Sleeper()

    def grow() -> None:
        if len(sleeper.slept) == 3:
            fake_ray.node_resources[fake_ray.node_ids[0]]["CPU"] = 4.0

    sleeper.then = grow
    made = cluster(fake_ray, [2, 2], sleep=sleeper)
    assert len(made.get_placement_groups()) == 2
    assert sleeper.slept == [1, 2, 4]


def test_retries_run_out_with_the_last_shortfall_named(
    fake_ray: FakeRay, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(RETRIES, "4")
    sleeper = Sleeper()
    made = cluster(fake_ray, [20], sleep=sleeper)
    with pytest.raises(
        ClusterResourceError, match=r"(?s)4 attempt.*CPU: needs 20, the cluster has 16"
    ):
        made.get_placement_groups()
    assert made._node_placement_groups is None
    assert sleeper.slept == [1, 2, 4, 8]
    assert issubclass(ClusterResourceError, ResourceInsufficientError)
    assert fake_ray.placement_groups == []  # nothing was created for a cluster that cannot fit


@pytest.mark.parametrize(("value", "match"), [("0", r"=0 must be"), ("many", r"'many' must be")])
def test_bad_retry_counts_are_refused_before_touching_ray(
    value: str, match: str, fake_ray: FakeRay, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(RETRIES, value)
    made = cluster(fake_ray, [1])
    with pytest.raises(AssertionError, match=match):
        made._init_placement_groups()
    with pytest.raises(ValueError, match=match):
        made._init_placement_groups()
    assert fake_ray.placement_groups == []


def test_a_timeout_is_not_retried_and_removes_what_was_made(
    fake_ray: FakeRay, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(RETRIES, "3")
    fake_ray.pending_placement = True
    sleeper = Sleeper()
    made = cluster(fake_ray, [1, 1], name="stuck", sleep=sleeper)
    with pytest.raises(PlacementTimeoutError, match=r"'stuck-node0'"):
        made.get_placement_groups()
    assert sleeper.slept == []
    assert [g.state for g in fake_ray.placement_groups] == ["REMOVED", "REMOVED"]


def test_init_placement_groups_takes_nemo_rl_s_arguments(fake_ray: FakeRay) -> None:
    made = cluster(fake_ray, [1, 1], name="u")
    groups = made._init_placement_groups(strategy="STRICT_SPREAD", use_unified_pg=True)
    assert [(g.name, g.strategy) for g in groups] == [("u-all", "STRICT_SPREAD")]
    assert made._init_placement_groups(use_unified_pg=False) is groups  # reserved once
    made.shutdown()
    assert made._node_placement_groups is None
    assert groups[0].state == "REMOVED"
    assert made.shutdown() is True


def test_unified_cpu_cluster_orders_bundles_by_node_labels(fake_ray: FakeRay) -> None:
    first, second = fake_ray.node_ids
    fake_ray.node_resources[first].update({"nvlink_domain_rack2": 1.0, "topo_rank": 7.0})
    fake_ray.node_labels[second] = {"nvlink_domain": "rack1", "topo_rank": "3"}
    made = cluster(fake_ray, [2, 2], use_unified_pg=True)
    made.get_placement_groups()
    # FakeRay spreads the four bundles over the two nodes in turn: first, second, ...
    assert made._sorted_bundle_indices == [1, 3, 0, 2]
    assert made._nvlink_domain_per_bundle_index == (
        "nvlink_domain_rack2",
        "nvlink_domain_rack1",
        "nvlink_domain_rack2",
        "nvlink_domain_rack1",
    )


def test_unified_cpu_cluster_without_labels_keeps_ray_s_order(fake_ray: FakeRay) -> None:
    made = cluster(fake_ray, [2, 2], use_unified_pg=True)
    made.get_placement_groups()
    assert made._sorted_bundle_indices is None


def test_every_name_nemo_rl_s_tests_import_is_here() -> None:
    from raylens.distributed import virtual_cluster as vc

    names = [
        "DEFAULT_GENERATION_PORT_RANGE_HIGH",
        "DEFAULT_GENERATION_PORT_RANGE_LOW",
        "DEFAULT_GYM_PORT_RANGE_HIGH",
        "DEFAULT_GYM_PORT_RANGE_LOW",
        "DEFAULT_MASTER_PORT_RANGE_HIGH",
        "DEFAULT_MASTER_PORT_RANGE_LOW",
        "DEFAULT_SGLANG_PROMETHEUS_PORT_RANGE_HIGH",
        "DEFAULT_SGLANG_PROMETHEUS_PORT_RANGE_LOW",
        "DEFAULT_SGLANG_ROUTER_PORT_RANGE_HIGH",
        "DEFAULT_SGLANG_ROUTER_PORT_RANGE_LOW",
        "DEFAULT_VLLM_PORT_RANGE_LOW",
        "DEFAULT_VLLM_PORTS_PER_ENGINE",
        "DEFAULT_DYNAMO_CONTROL_PORT_RANGE_LOW",
        "DEFAULT_DYNAMO_HTTP_PORT_RANGE_HIGH",
        "DEFAULT_DYNAMO_SYSTEM_PORT_RANGE_LOW",
        "PY_EXECUTABLES",
        "RayVirtualCluster",
        "ResourceInsufficientError",
        "ClusterConfig",
        "init_ray",
        "_bind_socket_in_range",
        "_get_free_consecutive_ports_local",
        "_get_free_port_local",
        "_get_node_ip_and_free_port",
        "_get_node_ip_local",
        "NVLINK_DOMAIN_PREFIX",
        "TOPO_RANK_KEY",
        "NVLINK_DOMAIN_UNKNOWN",
        "TOPO_RANK_UNKNOWN",
        "_sort_bundle_indices_by_topology",
        "select_segment_nodes",
        "prepare_segment_topology",
        "get_ray_cluster_topology",
        "get_reordered_bundle",
        "ray",
        "PlacementGroupSchedulingStrategy",
    ]
    missing = [name for name in names if not hasattr(vc, name)]
    assert missing == []
