"""host_memory without scraping: names, parsing, nodes, and the worker-group placement map."""

from __future__ import annotations

import logging
import threading
from types import ModuleType

import pytest

from raylens.lens import OBSERVABLE_GAUGE, recorded_metrics
from raylens.telemetry import host_memory as hm
from raylens.telemetry.host_memory import SCRAPE_TIMEOUT_S
from raylens.telemetry.host_memory._monitor import SHUTDOWN_GRACE_S
from raylens.telemetry.host_memory._process_state import DEFAULT_SNAPSHOT
from raylens.telemetry.names import (
    RL_HOST_MACHINE_MEMORY_TOTAL_METRIC,
    RL_HOST_MACHINE_MEMORY_USED_METRIC,
    RL_HOST_SCRAPE_DURATION_METRIC,
    RL_HOST_SCRAPE_UP_METRIC,
)
from raylens.telemetry.raylet_payload import (
    RAY_NODE_MEM_TOTAL_HOST,
    RAY_NODE_MEM_USED_HOST,
    SERIES_BY_RAY_NAME,
    TOTAL_KEY,
    USED_KEY,
)
from raylens_fakes import FakeCluster
from raylens_fakes.raylet import load_payload

NODE_A = "a" * 56
NODE_B = "b" * 56
NODE_C = "c" * 56


# Names and declarations -------------------------------------------------------------


def test_public_names_and_values() -> None:
    assert hm.RL_HOST_MEMORY_USED_METRIC == "rl.host.memory.used"
    assert hm.RL_HOST_MEMORY_TOTAL_METRIC == "rl.host.memory.total"
    assert hm.HOST_NAME_ATTR == "host.name"
    assert hm.RL_WORKER_GROUPS_ATTR == "rl.worker_groups"
    assert hm.NO_WORKER_GROUPS == "none"
    assert hm.RAY_NODE_MEM_USED == "ray_node_mem_used"
    assert hm.RAY_NODE_MEM_TOTAL == "ray_node_mem_total"
    assert USED_KEY == "host_memory_used"
    assert TOTAL_KEY == "host_memory_total"
    assert RAY_NODE_MEM_USED_HOST == "ray_node_mem_used_host"
    assert RAY_NODE_MEM_TOTAL_HOST == "ray_node_mem_total_host"
    assert RL_HOST_MACHINE_MEMORY_USED_METRIC == "rl.host.machine.memory.used"
    assert RL_HOST_MACHINE_MEMORY_TOTAL_METRIC == "rl.host.machine.memory.total"
    assert SERIES_BY_RAY_NAME == {
        "ray_node_mem_used": "host_memory_used",
        "ray_node_mem_total": "host_memory_total",
        "ray_node_mem_used_host": "host_machine_memory_used",
        "ray_node_mem_total_host": "host_machine_memory_total",
    }
    assert hm.FALLBACK_COLLECTION_INTERVAL == 10.0
    assert SCRAPE_TIMEOUT_S == 5.0
    assert SHUTDOWN_GRACE_S > 0
    assert hm.logger.name == "raylens.telemetry.host_memory"
    assert hm._WORKER_GROUP_NODES is hm.DEFAULT_REGISTRY.nodes
    assert hm._MONITOR is None


def test_the_face_keeps_only_the_upstream_seams_among_private_names() -> None:
    private = {
        name
        for name, value in vars(hm).items()
        if name.startswith("_") and not name.startswith("__") and not isinstance(value, ModuleType)
    }

    assert private == {"_MONITOR", "_WORKER_GROUP_NODES"}


def test_recorded_metrics_are_byte_gauges_and_registered() -> None:
    rows = {row.name: row for row in hm.HOST_MEMORY_RECORDED_METRICS}

    assert set(rows) == {
        "rl.host.memory.used",
        "rl.host.memory.total",
        "rl.host.machine.memory.used",
        "rl.host.machine.memory.total",
    }
    for name, row in rows.items():
        assert row.kind == OBSERVABLE_GAUGE
        assert row.unit == "By"
        assert row.description
        assert recorded_metrics()[name] == row
    assert rows["rl.host.memory.used"].key == USED_KEY


def test_each_exported_metric_name_is_the_name_of_a_declared_gauge() -> None:
    declared = [*hm.HOST_MEMORY_RECORDED_METRICS, *hm.SCRAPE_HEALTH_RECORDED_METRICS]

    assert [row.name for row in declared] == [
        hm.RL_HOST_MEMORY_USED_METRIC,
        hm.RL_HOST_MEMORY_TOTAL_METRIC,
        RL_HOST_MACHINE_MEMORY_USED_METRIC,
        RL_HOST_MACHINE_MEMORY_TOTAL_METRIC,
        RL_HOST_SCRAPE_UP_METRIC,
        RL_HOST_SCRAPE_DURATION_METRIC,
    ]
    assert RL_HOST_SCRAPE_UP_METRIC == "rl.host.scrape.up"
    assert RL_HOST_SCRAPE_DURATION_METRIC == "rl.host.scrape.duration"


# Parsing ----------------------------------------------------------------------------


_CAPTURES = {
    # Exact names: ray_node_mem_used_host is the machine's figure, a series of its own.
    "worker": {
        "host_memory_used": 1.194815488e09,
        "host_memory_total": 2.5276063744e10,
        "host_machine_memory_used": 1.63254272e09,
        "host_machine_memory_total": 2.5276063744e10,
    },
    # The recorded head: Ray's container-aware figure and the machine's differ.
    "head": {
        "host_memory_used": 1.169268736e09,
        "host_memory_total": 2.5276063744e10,
        "host_machine_memory_used": 1.622867968e09,
        "host_machine_memory_total": 2.5276063744e10,
    },
}


@pytest.mark.parametrize("as_text", [False, True])
@pytest.mark.parametrize("capture", list(_CAPTURES))
def test_parse_memory_samples_reads_a_real_capture_keeping_ray_and_machine_figures_apart(
    capture: str, as_text: bool
) -> None:
    payload = load_payload(capture)
    samples = hm.parse_memory_samples(payload.decode() if as_text else payload)

    assert samples == _CAPTURES[capture]


def test_parse_memory_samples_skips_missing_and_unusable_values() -> None:
    text = (
        "# TYPE ray_node_mem_used gauge\n"
        'ray_node_mem_used{ip="10.0.0.1"} NaN\n'
        "ray_node_mem_used_host 5e9\n"
        "ray_node_mem_total 6.4e+10\n"
    )
    assert hm.parse_memory_samples(text) == {
        "host_memory_total": 6.4e10,
        "host_machine_memory_used": 5e9,
    }
    assert hm.parse_memory_samples("") == {}
    assert hm.parse_memory_samples(b"\xff\xfe garbage") == {}


# Nodes ------------------------------------------------------------------------------


def test_ray_nodes_keeps_live_nodes_with_a_metrics_port(fake_cluster: FakeCluster) -> None:
    live = fake_cluster.add_node(address="10.0.0.1", port=8080, hostname="gpu-1", node_id=NODE_A)
    dead = fake_cluster.add_node(address="10.0.0.2", port=8080, node_id=NODE_B)
    fake_cluster.kill_node(dead)
    fake_cluster.add_node(address="10.0.0.3", port=-1)
    no_port = fake_cluster.add_node(address="10.0.0.4", port=9000)
    fake_cluster.update_node(no_port, MetricsExportPort=None)
    nodes = hm.ray_nodes(fake_cluster)

    assert nodes == [
        hm.RayNode(
            node_id=live, host="gpu-1", metrics_url="http://10.0.0.1:8080/metrics", ip="10.0.0.1"
        )
    ]


def test_ray_nodes_tells_apart_nodes_on_one_host(fake_cluster: FakeCluster) -> None:
    for port in (8001, 8002):
        fake_cluster.add_node(address="127.0.0.1", port=port, hostname="laptop")
    nodes = hm.ray_nodes(fake_cluster)

    assert {n.host for n in nodes} == {"laptop"}
    assert len({n.key for n in nodes}) == 2
    assert {n.metrics_url for n in nodes} == {
        "http://127.0.0.1:8001/metrics",
        "http://127.0.0.1:8002/metrics",
    }


def test_ray_nodes_brackets_ipv6_and_falls_back_to_the_address(fake_cluster: FakeCluster) -> None:
    fake_cluster.add_node(address="fd00::1", port=8080, hostname="")

    (node,) = hm.ray_nodes(fake_cluster)
    assert node.metrics_url == "http://[fd00::1]:8080/metrics"
    assert node.host == "fd00::1"
    assert node.ip == "fd00::1"


def test_ray_nodes_is_empty_when_ray_is_not_initialised(fake_cluster: FakeCluster) -> None:
    fake_cluster.add_node(port=8080)
    fake_cluster.initialized = False

    assert hm.ray_nodes(fake_cluster) == []
    assert fake_cluster.nodes_calls == 0


# Worker groups ------------------------------------------------------------------------


def test_format_worker_groups() -> None:
    assert hm.format_worker_groups([]) == "none"
    assert hm.format_worker_groups(["policy", "critic", "policy"]) == "critic,policy"


def test_register_lookup_replace_and_forget() -> None:
    hm.register_worker_group_nodes("policy", [NODE_A, NODE_B, ""])
    hm.register_worker_group_nodes("critic", {NODE_B})

    assert hm._WORKER_GROUP_NODES["policy"] == frozenset({NODE_A, NODE_B})
    assert hm.worker_group_names_on_node(NODE_B) == {"policy", "critic"}
    assert hm.worker_groups_on_node(NODE_B) == "critic,policy"
    assert hm.worker_groups_on_node(NODE_C) == "none"

    hm.register_worker_group_nodes("policy", [NODE_C])  # rebuilt elsewhere
    assert hm.worker_groups_on_node(NODE_A) == "none"
    assert hm.worker_groups_on_node(NODE_C) == "policy"

    hm.forget_worker_group_nodes("policy")
    hm.forget_worker_group_nodes("never-registered")
    assert hm.worker_group_names_on_node(NODE_C) == set()
    assert hm.worker_groups_on_node(NODE_B) == "critic"


@pytest.mark.parametrize(
    ("name", "error", "message"),
    [
        ("", ValueError, "must not be empty"),
        ("policy,critic", ValueError, "'policy,critic' contains a comma"),
        ("none", ValueError, "'none' is the label of a node with no worker group"),
        (7, TypeError, "must be a str, got int 7"),
    ],
)
def test_bad_group_names_are_refused_by_register_nodes(
    name: object, error: type, message: str
) -> None:
    with pytest.raises(error, match=message):
        hm.register_worker_group_nodes(name, [NODE_A])  # type: ignore[arg-type]
    assert hm._WORKER_GROUP_NODES == {}


@pytest.mark.parametrize("name", ["", "policy,critic", "none", 7, None])
def test_placement_with_a_bad_name_never_raises_and_warns_once(
    name: object, fake_cluster: FakeCluster, caplog: pytest.LogCaptureFixture
) -> None:
    a = fake_cluster.add_node()
    pg = fake_cluster.create_placement_group({0: a})

    with caplog.at_level(logging.DEBUG, logger="raylens.telemetry.host_memory"):
        for _ in range(3):
            hm.register_worker_group_placement(name, [(pg, 0)], cluster=fake_cluster)  # type: ignore[arg-type]

    assert hm._WORKER_GROUP_NODES == {}
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "worker group placement ignored" in warnings[0].getMessage()
    assert not warnings[0].exc_info


def test_group_and_node_names_with_lone_surrogates_are_stored_encodable() -> None:
    hm.register_worker_group_nodes("grp\ud800", [NODE_A])

    (name,) = hm.worker_group_names_on_node(NODE_A)
    assert name == "grp\ufffd"
    name.encode("utf-8")
    hm.forget_worker_group_nodes("grp\ud800")  # the name it was registered with still works
    assert hm._WORKER_GROUP_NODES == {}


def test_node_ids_must_be_an_iterable_of_strings() -> None:
    with pytest.raises(TypeError, match=r"pass \['aaa"):
        hm.register_worker_group_nodes("policy", NODE_A)
    with pytest.raises(TypeError, match="node id 3 of worker group 'policy'"):
        hm.register_worker_group_nodes("policy", [3])  # type: ignore[list-item]


def test_placement_reads_each_group_once_and_only_placed_groups(fake_cluster: FakeCluster) -> None:
    a, b, c = (fake_cluster.add_node() for _ in range(3))
    placed = fake_cluster.create_placement_group({0: a, 1: b, 2: ""}, state="CREATED")
    moving = fake_cluster.create_placement_group({0: c}, state="RESCHEDULING")
    pending = fake_cluster.create_placement_group({0: c, 1: a}, state="PENDING")
    removed = fake_cluster.create_placement_group({0: c}, state="REMOVED")
    bundles = [(placed, 0), (placed, 1), (placed, 2), (placed, 0), (moving, 0)]
    bundles += [(pending, 0), (pending, 1), (removed, 0)]

    hm.register_worker_group_placement("policy", bundles, cluster=fake_cluster)

    assert hm._WORKER_GROUP_NODES["policy"] == frozenset({a, b, c})
    assert fake_cluster.placement_group_calls == {
        placed.id: 1,
        moving.id: 1,
        pending.id: 1,
        removed.id: 1,
    }
    # The removed and pending groups contributed nothing: only `moving` put `c` there.
    fake_cluster.set_placement_group_state(moving, "REMOVED")
    hm.register_worker_group_placement("policy", bundles, cluster=fake_cluster)
    assert hm._WORKER_GROUP_NODES["policy"] == frozenset({a, b})


def test_placement_bundle_index_minus_one_means_every_bundle(fake_cluster: FakeCluster) -> None:
    a, b = fake_cluster.add_node(), fake_cluster.add_node()
    pg = fake_cluster.create_placement_group({0: a, 1: b})

    hm.register_worker_group_placement("policy", [(pg, -1)], cluster=fake_cluster)

    assert hm._WORKER_GROUP_NODES["policy"] == frozenset({a, b})


def test_placement_failure_warns_once_and_keeps_the_previous_entry(
    fake_cluster: FakeCluster, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = fake_cluster.add_node(), fake_cluster.add_node()
    good = fake_cluster.create_placement_group({0: a})
    flaky = fake_cluster.create_placement_group({0: b})
    hm.register_worker_group_placement("policy", [(good, 0)], cluster=fake_cluster)
    fake_cluster.fail_placement_group_table(flaky)

    with caplog.at_level(logging.DEBUG, logger="raylens.telemetry.host_memory"):
        for _ in range(3):
            hm.register_worker_group_placement(
                "policy", [(good, 0), (flaky, 0)], cluster=fake_cluster
            )

    assert hm._WORKER_GROUP_NODES["policy"] == frozenset({a})
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "'policy'" in warnings[0].getMessage()


def test_placement_never_raises_on_malformed_input(fake_cluster: FakeCluster) -> None:
    def broken() -> object:
        yield ("pg", 0)
        raise RuntimeError("iterator broke")

    hm.register_worker_group_placement("policy", broken(), cluster=fake_cluster)
    hm.register_worker_group_placement("critic", [("not-a-pair",)], cluster=fake_cluster)  # type: ignore[list-item]

    assert hm._WORKER_GROUP_NODES == {}


def test_concurrent_placement_registration_loses_nothing(fake_cluster: FakeCluster) -> None:
    nodes = [fake_cluster.add_node() for _ in range(16)]
    groups = [fake_cluster.create_placement_group({0: n, 1: nodes[0]}) for n in nodes]
    barrier = threading.Barrier(len(groups))
    errors: list[BaseException] = []

    def register(index: int) -> None:
        try:
            barrier.wait(timeout=10)
            for _ in range(20):
                hm.register_worker_group_placement(
                    f"group-{index}", [(groups[index], 0), (groups[index], 1)], cluster=fake_cluster
                )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=register, args=(i,)) for i in range(len(groups))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert errors == []
    assert {
        f"group-{i}": frozenset({nodes[i], nodes[0]}) for i in range(len(groups))
    } == hm._WORKER_GROUP_NODES
    assert hm.worker_group_names_on_node(nodes[0]) == {f"group-{i}" for i in range(16)}


def test_reset_clears_the_placement_map_and_snapshot() -> None:
    hm.register_worker_group_nodes("policy", [NODE_A])
    node = hm.RayNode(NODE_A, "h", "http://127.0.0.1:1/metrics", "127.0.0.1")
    record = hm.NodeRecord(node, {"host_memory_used": 1.0}, None, None, None, "policy", 0, {})
    DEFAULT_SNAPSHOT.publish({(NODE_A, "h"): record})

    hm.reset_host_memory_state()

    assert hm._WORKER_GROUP_NODES == {}
    assert DEFAULT_SNAPSHOT.records == {}
    assert hm._MONITOR is None


def test_the_payload_keys_are_the_registry_keys_of_the_exported_series() -> None:
    from raylens.lens import registry_key
    from raylens.telemetry import raylet_payload

    assert registry_key(hm.RL_HOST_MEMORY_USED_METRIC) == raylet_payload.USED_KEY
    assert registry_key(hm.RL_HOST_MEMORY_TOTAL_METRIC) == raylet_payload.TOTAL_KEY
    assert registry_key(RL_HOST_MACHINE_MEMORY_USED_METRIC) == raylet_payload.MACHINE_USED_KEY
    assert registry_key(RL_HOST_MACHINE_MEMORY_TOTAL_METRIC) == raylet_payload.MACHINE_TOTAL_KEY
