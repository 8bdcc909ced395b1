"""HostMemoryMonitor against fake raylets: what is exported, and what a bad node costs."""

from __future__ import annotations

import logging
import re
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from host_memory_points import points_by_node

from raylens.driver import init_telemetry_driver
from raylens.lens import shutdown_telemetry
from raylens.telemetry import host_memory as hm
from raylens.telemetry.host_memory._monitor import SHUTDOWN_GRACE_S
from raylens.telemetry.names import RL_HOST_SCRAPE_DURATION_METRIC, RL_HOST_SCRAPE_UP_METRIC
from raylens.telemetry.raylet_payload import SCRAPE_ERROR_TYPES, USED_KEY
from raylens_fakes import FakeCluster, MetricsProbe, SimulatedCluster

USED = "rl.host.memory.used"
TOTAL = "rl.host.memory.total"
LOGGER = "raylens.telemetry.host_memory"

Factory = Callable[..., SimulatedCluster]


def _warnings_about(caplog: pytest.LogCaptureFixture, text: str) -> int:
    return sum(1 for r in caplog.records if r.levelno == logging.WARNING and text in r.getMessage())


# What is exported ------------------------------------------------------------------


def test_one_point_per_node_with_host_groups_and_node_id(
    simulated_cluster: Factory, metrics_probe: MetricsProbe, make_monitor: Callable
) -> None:
    sim = simulated_cluster(3, schedule=lambda i, t: (1e9 * (i + 1), 64e9))
    hm.register_worker_group_nodes("policy", [sim.node_id(0), sim.node_id(1)])
    hm.register_worker_group_nodes("critic", [sim.node_id(1)])

    make_monitor(sim.cluster).collect_once()
    used = points_by_node(metrics_probe, USED)
    total = points_by_node(metrics_probe, TOTAL)

    assert used == {
        sim.node_id(i): (
            {
                "host.name": f"sim-node-{i}",
                "rl.worker_groups": groups,
                "ray.node.id": sim.node_id(i),
            },
            1e9 * (i + 1),
        )
        for i, groups in enumerate(["policy", "critic,policy", "none"])
    }
    assert {node: value for node, (_, value) in total.items()} == dict.fromkeys(sim.node_ids, 64e9)
    assert metrics_probe.metric(USED).unit == "By"
    assert metrics_probe.metric(TOTAL).description


def test_nodes_sharing_a_host_keep_their_own_points(
    simulated_cluster: Factory, metrics_probe: MetricsProbe, make_monitor: Callable
) -> None:
    sim = simulated_cluster(3, same_host=True)

    make_monitor(sim.cluster).collect_once()
    used = points_by_node(metrics_probe, USED)

    assert set(used) == set(sim.node_ids)
    assert {attrs["host.name"] for attrs, _ in used.values()} == {"sim-host"}
    assert len(metrics_probe.points(USED)) == 3


def test_samples_follow_the_schedule_between_cycles(
    simulated_cluster: Factory, metrics_probe: MetricsProbe, make_monitor: Callable
) -> None:
    now = [0.0]
    sim = simulated_cluster(1, schedule=lambda i, t: (1e9 + t, 8e9), clock=lambda: now[0])
    monitor = make_monitor(sim.cluster)

    monitor.collect_once()
    first = points_by_node(metrics_probe, USED)[sim.node_id(0)][1]
    now[0] = 512.0
    monitor.collect_once()
    second = points_by_node(metrics_probe, USED)[sim.node_id(0)][1]

    assert (first, second) == (1e9, 1e9 + 512)


# What a bad node costs ---------------------------------------------------------------

# How a raylet can fail a scrape: what it is made to do, the reason ``scrape.up`` gives,
# and what the node's row says.
FAILURES = {
    "hang": (lambda r: r.hang(), "timeout", "timed out"),
    "delay": (lambda r: r.delay(5), "timeout", "timed out"),
    "trickle": (lambda r: r.trickle(0.01), "timeout", "payload not complete"),
    "status": (lambda r: r.respond_status(404), "http_status", "HTTP 404"),
    "agent-busy": (lambda r: r.respond_status(500), "server_error", "HTTP 500"),
    "unavailable": (lambda r: r.respond_status(503), "server_error", "HTTP 503"),
    "reset": (lambda r: r.reset_connections(), "connection", "reset"),
    "refused": (lambda r: r.close(), "connection", "Connection refused"),
    "garbage": (lambda r: r.serve_garbage(), "parse", "no valid ray_node_mem_used"),
    "huge": (lambda r: r.serve_huge(5_000_000), "too_large", "exceeds the 1000000-byte cap"),
    "huge-announced": (
        lambda r: r.serve_huge(5_000_000, announce_length=True),
        "too_large",
        "payload of 5000000 bytes exceeds",
    ),
    "compressed": (
        lambda r: r.respond_status(200, b"x", headers={"Content-Encoding": "gzip"}),
        "encoding",
        "Content-Encoding 'gzip'",
    ),
    "omitted": (lambda r: r.omit_memory_series(), "parse", "no valid ray_node_mem_used"),
}


# These make the scrape wait out its real deadline: the slow tier.
_WAIT_OUT_THE_DEADLINE = {"hang", "delay", "trickle"}


@pytest.mark.parametrize(
    "failure",
    [
        pytest.param(name, marks=pytest.mark.slow) if name in _WAIT_OUT_THE_DEADLINE else name
        for name in sorted(FAILURES)
    ],
)
def test_a_failing_node_costs_only_its_own_sample_and_is_down_with_its_reason(
    failure: str,
    simulated_cluster: Factory,
    metrics_probe: MetricsProbe,
    make_monitor: Callable,
    caplog: pytest.LogCaptureFixture,
) -> None:
    misbehave, error_type, error = FAILURES[failure]
    sim = simulated_cluster(3)
    misbehave(sim.raylet(1))
    hm.register_worker_group_nodes("rollout", [sim.node_id(1)])
    monitor = make_monitor(sim.cluster, scrape_timeout=0.3, max_body_bytes=1_000_000)

    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        monitor.collect_once()
        monitor.collect_once()
    used = points_by_node(metrics_probe, USED)

    healthy = {sim.node_id(0), sim.node_id(2)}
    assert set(used) == healthy
    assert set(points_by_node(metrics_probe, TOTAL)) == healthy
    failed = {s.node_id: s for s in monitor.latest()}[sim.node_id(1)]
    assert failed.error is not None and error in failed.error
    assert (failed.used, failed.sampled_at) == (None, None)
    assert _warnings_about(caplog, sim.node_id(1)) == 1

    # Its scrape.up point says why; the others' say they are up, with no reason.
    def up_point(i: int, groups: str, **reason: str) -> tuple[dict[str, str], int]:
        attributes = {"host.name": f"sim-node-{i}", "rl.worker_groups": groups}
        return {**attributes, "ray.node.id": sim.node_id(i), **reason}, 0 if reason else 1

    assert points_by_node(metrics_probe, RL_HOST_SCRAPE_UP_METRIC) == {
        sim.node_id(0): up_point(0, "none"),
        sim.node_id(1): up_point(1, "rollout", **{"error.type": error_type}),
        sim.node_id(2): up_point(2, "none"),
    }
    assert error_type in SCRAPE_ERROR_TYPES


def test_a_node_that_stops_answering_loses_its_point_but_keeps_its_row(
    simulated_cluster: Factory, metrics_probe: MetricsProbe, make_monitor: Callable
) -> None:
    sim = simulated_cluster(2, schedule=lambda i, t: (2e9, 4e9))
    monitor = make_monitor(sim.cluster, scrape_timeout=0.3)
    monitor.collect_once()
    assert set(points_by_node(metrics_probe, USED)) == set(sim.node_ids)

    sim.raylet(0).respond_status(500)
    monitor.collect_once()

    assert set(points_by_node(metrics_probe, USED)) == {sim.node_id(1)}
    row = {s.node_id: s for s in monitor.latest()}[sim.node_id(0)]
    assert row.error == "HTTP 500 Internal Server Error"
    assert (row.used, row.total) == (2e9, 4e9)  # last good figures, for a table
    assert row.sampled_at is not None and row.age() >= 0

    sim.raylet(0).serve_normally()
    monitor.collect_once()
    assert set(points_by_node(metrics_probe, USED)) == set(sim.node_ids)
    assert all(s.error is None for s in monitor.latest())


@pytest.mark.parametrize("leave", ["kill", "remove"])
def test_a_node_that_leaves_the_cluster_has_no_point_while_a_down_one_keeps_its_health(
    leave: str, simulated_cluster: Factory, metrics_probe: MetricsProbe, make_monitor: Callable
) -> None:
    sim = simulated_cluster(3)
    monitor = make_monitor(sim.cluster)
    monitor.collect_once()
    assert len(points_by_node(metrics_probe, USED)) == 3
    assert len(points_by_node(metrics_probe, RL_HOST_SCRAPE_UP_METRIC)) == 3

    sim.raylet(1).respond_status(502)
    (sim.kill_node if leave == "kill" else sim.remove_node)(2)
    monitor.collect_once()

    assert set(points_by_node(metrics_probe, USED)) == {sim.node_id(0)}
    assert {s.node_id for s in monitor.latest()} == {sim.node_id(0), sim.node_id(1)}
    up = {
        node: value
        for node, (_, value) in points_by_node(metrics_probe, RL_HOST_SCRAPE_UP_METRIC).items()
    }
    assert up == {sim.node_id(0): 1, sim.node_id(1): 0}
    duration = points_by_node(metrics_probe, RL_HOST_SCRAPE_DURATION_METRIC)
    assert set(duration) == {sim.node_id(0), sim.node_id(1)}


@pytest.mark.slow
def test_a_trickled_body_is_cut_at_the_deadline(
    simulated_cluster: Factory, make_monitor: Callable
) -> None:
    sim = simulated_cluster(1)
    sim.raylet(0).trickle(0.01)  # the whole payload would take ~16 minutes
    monitor = make_monitor(sim.cluster, scrape_timeout=0.3)

    started = time.monotonic()
    monitor.collect_once()
    elapsed = time.monotonic() - started

    assert elapsed < 0.3 + 1.0
    assert "payload not complete" in monitor.latest()[0].error
    assert sim.raylet(0).wait_idle(timeout=2)  # the scraper hung up; the server saw it


@pytest.mark.slow
def test_wedged_nodes_are_asked_last_so_healthy_ones_are_not_starved(
    simulated_cluster: Factory, metrics_probe: MetricsProbe, make_monitor: Callable
) -> None:
    sim = simulated_cluster(5)
    sim.raylet(0).hang()
    sim.raylet(1).hang()
    # Two threads, both taken by the wedged nodes listed first: the first cycle
    # cannot reach anyone else. From then on they are asked after everyone else.
    monitor = make_monitor(sim.cluster, scrape_timeout=0.3, max_concurrency=2)

    monitor.collect_once()
    monitor.collect_once()

    assert set(points_by_node(metrics_probe, USED)) == {sim.node_id(i) for i in (2, 3, 4)}
    assert sim.raylet(2).requests >= 1


@pytest.mark.slow
def test_wedged_nodes_listed_first_beyond_the_bound_do_not_starve_healthy_ones(
    simulated_cluster: Factory, metrics_probe: MetricsProbe, make_monitor: Callable
) -> None:
    # The shape of 300 wedged nodes listed before 3 healthy ones under the default
    # bound of 256 requests in flight, scaled down: 12 wedged, 3 healthy, bound 8.
    sim = simulated_cluster(15)
    for index in range(12):
        sim.raylet(index).hang()
    monitor = make_monitor(sim.cluster, scrape_timeout=0.5, max_concurrency=8)

    monitor.collect_once()
    asked_first = [sim.raylet(i).requests for i in range(15)]
    rows = {s.node_id: s for s in monitor.latest()}
    monitor.collect_once()

    # The first cycle reached only the first 8; the nodes whose deadline passed
    # unasked count as wedged, and among wedged nodes the ones asked least
    # recently go first, so the second cycle reaches the healthy ones.
    assert asked_first == [1] * 8 + [0] * 7
    assert rows[sim.node_id(14)].error.startswith("not asked")
    assert set(points_by_node(metrics_probe, USED)) == {sim.node_id(i) for i in (12, 13, 14)}
    # One request per node per cycle: the 4 not reached in the first cycle were
    # asked once, the rest at most once more.
    assert [sim.raylet(i).requests for i in range(8, 12)] == [1] * 4
    assert all(sim.raylet(i).requests <= 2 for i in range(8))


@pytest.mark.slow
def test_a_replaced_scrape_still_running_is_not_called_again_and_threads_stay_bounded(
    fake_cluster: FakeCluster, metrics_probe: MetricsProbe, make_monitor: Callable
) -> None:
    nodes = [fake_cluster.add_node(port=8080 + i) for i in range(15)]
    wedged = set(nodes[:10])
    release = threading.Event()
    calls: dict[str, int] = {}
    lock = threading.Lock()

    class Wedging(hm.HostMemoryMonitor):
        def _scrape(self, node: hm.RayNode) -> dict[str, float]:
            with lock:
                calls[node.node_id] = calls.get(node.node_id, 0) + 1
            if node.node_id in wedged:
                release.wait(60)
            return {"host_memory_used": 1e9, "host_memory_total": 2e9}

    monitor = Wedging(1.0, cluster=fake_cluster, scrape_timeout=0.05, consumer=True)
    baseline = threading.active_count()
    try:
        for _ in range(20):
            monitor.collect_once()
        most_threads = threading.active_count()
        used = points_by_node(metrics_probe, USED)
        latest = {s.node_id: s for s in monitor.latest()}
    finally:
        release.set()
        monitor.stop()

    assert calls == {node: 1 if node in wedged else 20 for node in nodes}
    assert set(used) == set(nodes[10:])
    assert latest[nodes[3]].error == "not asked: its previous scrape is still running"
    assert most_threads <= baseline + 15


@pytest.mark.slow
def test_hung_raylets_cost_no_thread_per_request(
    simulated_cluster: Factory, make_monitor: Callable
) -> None:
    sim = simulated_cluster(15)
    for index in range(10):
        sim.raylet(index).hang()
    monitor = make_monitor(sim.cluster, scrape_timeout=0.25)
    monitor.collect_once()
    ours_after_one = _our_threads()

    for _ in range(5):
        monitor.collect_once()
        assert _our_threads() == ours_after_one

    assert ours_after_one == ["raylens-host-memory-engine"]
    assert all(t.daemon for t in threading.enumerate() if t.name.startswith("raylens-host"))
    assert [sim.raylet(i).requests for i in range(10, 15)] == [6] * 5
    # A hung raylet may not even have read a request before the client gave up.
    assert all(1 <= sim.raylet(i).requests <= 6 for i in range(10))


def _our_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("raylens-host"))


def test_stop_is_bounded_when_every_node_hangs(
    simulated_cluster: Factory, make_monitor: Callable
) -> None:
    sim = simulated_cluster(4)
    for raylet in sim.raylets:
        raylet.hang()
    monitor = make_monitor(sim.cluster, interval=0.05, scrape_timeout=1.0)
    monitor.start()
    assert all(r.wait_for_requests(1) for r in sim.raylets)

    started = time.monotonic()
    monitor.stop()
    elapsed = time.monotonic() - started

    assert elapsed < 1.0 + SHUTDOWN_GRACE_S
    assert not monitor.running
    assert not any(t.name == "raylens-host-memory" for t in threading.enumerate())


@pytest.mark.slow
def test_start_and_stop_are_idempotent_and_restartable(
    simulated_cluster: Factory, make_monitor: Callable
) -> None:
    sim = simulated_cluster(2)
    monitor = make_monitor(sim.cluster, interval=0.05)

    monitor.start()
    monitor.start()
    assert [t.name for t in threading.enumerate()].count("raylens-host-memory") == 1
    assert sim.raylet(0).wait_for_requests(2)
    monitor.stop()
    monitor.stop()
    assert not monitor.running
    seen = sim.raylet(0).requests

    monitor.start()
    assert sim.raylet(0).wait_for_requests(seen + 2)
    assert monitor.running
    monitor.stop()


class _BrokenCluster(FakeCluster):
    def __init__(self, where: str) -> None:
        super().__init__()
        self.where = where

    def is_initialized(self) -> bool:
        if self.where == "is_initialized":
            raise RuntimeError("GCS unreachable")
        return True

    def nodes(self) -> list[dict[str, Any]]:
        raise RuntimeError("GCS unreachable")


@pytest.mark.parametrize("where", ["is_initialized", "nodes"])
def test_collect_once_never_raises_when_the_cluster_fails(
    where: str, make_monitor: Callable, caplog: pytest.LogCaptureFixture
) -> None:
    monitor = make_monitor(_BrokenCluster(where))

    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        monitor.collect_once()
        monitor.collect_once()

    assert _warnings_about(caplog, "GCS unreachable") == 1
    assert monitor.latest() == []


def test_collect_once_never_raises_when_a_replaced_scrape_raises(
    fake_cluster: FakeCluster, make_monitor: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    def explode(self: hm.HostMemoryMonitor, node: hm.RayNode) -> dict[str, float]:
        raise ValueError("bad \x1b]0;title\x07 scrape")

    monkeypatch.setattr(hm.HostMemoryMonitor, "_scrape", explode)
    fake_cluster.add_node(port=1)
    monitor = make_monitor(fake_cluster)
    monitor.collect_once()

    assert monitor.latest()[0].error == "ValueError: bad \\x1b]0;title\\x07 scrape"


def test_a_replaced_scrape_is_called_for_the_nodes_of_each_cycle(
    fake_cluster: FakeCluster, make_monitor: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    def by_port(self: hm.HostMemoryMonitor, node: hm.RayNode) -> dict[str, float]:
        return {USED_KEY: float(node.metrics_url.rsplit(":", 1)[1].split("/")[0])}

    monkeypatch.setattr(hm.HostMemoryMonitor, "_scrape", by_port)
    fake_cluster.add_node(port=1)
    monitor = make_monitor(fake_cluster)
    monitor.collect_once()
    fake_cluster.add_node(port=2)  # a node the first cycle did not know
    monitor.collect_once()

    assert sorted((s.error, s.used) for s in monitor.latest()) == [(None, 1.0), (None, 2.0)]


# Answers, and a thousand nodes ----------------------------------------------------------


def test_http_answers_and_a_direct_scrape(
    simulated_cluster: Factory, metrics_probe: MetricsProbe, make_monitor: Callable
) -> None:
    sim = simulated_cluster(3, schedule=lambda i, t: (3e9, 9e9))
    sim.raylet(1).respond_status(404)
    sim.raylet(2).close()
    monitor = make_monitor(sim.cluster)

    monitor.collect_once()

    assert {node: value for node, (_, value) in points_by_node(metrics_probe, USED).items()} == {
        sim.node_id(0): 3e9
    }
    errors = {s.node_id: s.error for s in monitor.latest()}
    assert errors[sim.node_id(0)] is None
    assert errors[sim.node_id(1)] == "HTTP 404 Not Found"
    assert "Connection refused" in errors[sim.node_id(2)]
    first = next(n for n in hm.ray_nodes(sim.cluster) if n.node_id == sim.node_id(0))
    assert monitor._scrape(first) == {
        "host_memory_used": 3e9,
        "host_memory_total": 9e9,
        # The capture's machine, raised to hold the node's 3e9 used.
        "host_machine_memory_used": 3e9,
        "host_machine_memory_total": 2.5276063744e10,
    }


@pytest.mark.slow
def test_a_thousand_fake_raylets_are_each_asked_once_in_one_cycle(
    simulated_cluster: Factory, metrics_probe: MetricsProbe, make_monitor: Callable
) -> None:
    # A small payload: this is about a thousand sockets, not a thousand 97 KB parses.
    sim = simulated_cluster(1000, template=b"# small\nray_node_mem_used 1\nray_node_mem_total 2\n")
    monitor = make_monitor(sim.cluster, scrape_timeout=60)

    monitor.collect_once()

    assert len(points_by_node(metrics_probe, USED)) == 1000
    assert {r.requests for r in sim.raylets} == {1}


@pytest.mark.slow
def test_relabelling_a_thousand_nodes_never_overflows(
    fake_cluster: FakeCluster,
    metrics_probe: MetricsProbe,
    make_monitor: Callable,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for index in range(1000):
        fake_cluster.add_node(address=f"10.1.{index // 250}.{index % 250}", port=8080)
    node_ids = fake_cluster.node_ids()
    monkeypatch.setattr(
        hm.HostMemoryMonitor,
        "_scrape",
        lambda self, node: {"host_memory_used": 1e9, "host_memory_total": 2e9},
    )
    make_monitor(fake_cluster, scrape_timeout=30).collect_once()

    seen: dict[str, set[frozenset]] = {USED: set(), TOTAL: set()}
    for label in ("none", "policy", "critic", "reward"):
        hm._WORKER_GROUP_NODES.clear()
        if label != "none":
            hm.register_worker_group_nodes(label, node_ids)
        metrics_probe.collect()
        for name in (USED, TOTAL):
            points = metrics_probe.points(name)
            attribute_sets = [dict(attrs) for attrs in points]
            assert len(points) == 1000
            assert not any("otel.metric.overflow" in attrs for attrs in attribute_sets)
            assert {attrs["rl.worker_groups"] for attrs in attribute_sets} == {label}
            assert {attrs["ray.node.id"] for attrs in attribute_sets} == set(node_ids)
            seen[name].update(points)

    # Each gauge saw 4,000 distinct attribute sets, twice the SDK's default limit.
    assert {name: len(sets) for name, sets in seen.items()} == {USED: 4000, TOTAL: 4000}


# Labels and age -----------------------------------------------------------------------


def test_registering_or_forgetting_a_group_relabels_the_next_export(
    simulated_cluster: Factory, metrics_probe: MetricsProbe, make_monitor: Callable
) -> None:
    sim = simulated_cluster(2)
    monitor = make_monitor(sim.cluster)
    monitor.collect_once()
    node = sim.node_id(0)

    hm.register_worker_group_nodes("policy", [node])
    labels = {
        n: attrs["rl.worker_groups"]
        for n, (attrs, _) in points_by_node(metrics_probe, USED).items()
    }
    assert labels == {node: "policy", sim.node_id(1): "none"}
    assert len(metrics_probe.points(USED)) == 2  # no leftover point under "none"
    assert {s.node_id: s.worker_groups for s in monitor.latest()}[node] == "policy"

    hm.forget_worker_group_nodes("policy")
    labels = {
        n: attrs["rl.worker_groups"]
        for n, (attrs, _) in points_by_node(metrics_probe, USED).items()
    }
    assert labels == {node: "none", sim.node_id(1): "none"}
    assert len(metrics_probe.points(USED)) == 2


class _StuckCluster(FakeCluster):
    """Lists ``inner``'s nodes while ``stuck`` is clear; blocks in ``nodes()`` once it is set."""

    def __init__(self, inner: FakeCluster) -> None:
        super().__init__()
        self.inner = inner
        self.stuck = threading.Event()
        self.blocked = threading.Event()
        self.release = threading.Event()

    def nodes(self) -> list[dict[str, Any]]:
        if self.stuck.is_set():
            self.blocked.set()
            self.release.wait(30)
        return self.inner.nodes()


def test_a_sample_past_its_max_age_is_not_exported_even_if_collection_is_stuck(
    simulated_cluster: Factory, metrics_probe: MetricsProbe, make_monitor: Callable
) -> None:
    sim = simulated_cluster(1)
    cluster = _StuckCluster(sim.cluster)
    now = [1000.0]
    monitor = make_monitor(
        cluster, interval=0.05, scrape_timeout=0.5, max_age=3.0, clock=lambda: now[0]
    )
    try:
        monitor.collect_once()
        sampled_at = monitor.latest()[0].sampled_at
        assert sampled_at is not None
        cluster.stuck.set()
        monitor.start()  # its first cycle wedges in nodes(): nothing new is published
        assert cluster.blocked.wait(5)
        assert set(points_by_node(metrics_probe, USED)) == {sim.node_id(0)}

        now[0] = sampled_at + 3.0
        assert set(points_by_node(metrics_probe, USED)) == {sim.node_id(0)}
        now[0] = sampled_at + 3.001
        assert points_by_node(metrics_probe, USED) == {}
        assert points_by_node(metrics_probe, TOTAL) == {}
        assert monitor.latest()[0].age(now[0]) == pytest.approx(3.001)
    finally:
        cluster.release.set()


@pytest.mark.slow
def test_a_loop_stuck_past_stop_does_not_come_back_after_a_restart(
    simulated_cluster: Factory, make_monitor: Callable, wait_until: Callable[..., bool]
) -> None:
    sim = simulated_cluster(1)
    cluster = _StuckCluster(sim.cluster)
    cluster.stuck.set()
    monitor = make_monitor(cluster, interval=0.05, scrape_timeout=0.2)
    try:
        monitor.start()
        assert cluster.blocked.wait(5)
        started = time.monotonic()
        monitor.stop()  # the loop thread is wedged in nodes(): stop still returns
        assert time.monotonic() - started < 0.2 + SHUTDOWN_GRACE_S

        cluster.stuck.clear()
        monitor.start()
        assert sim.raylet(0).wait_for_requests(1)
    finally:
        cluster.release.set()

    def loops() -> int:
        return sum(t.name == "raylens-host-memory" for t in threading.enumerate())

    assert wait_until(lambda: loops() == 1)
    monitor.stop()
    assert wait_until(lambda: loops() == 0)


def test_default_max_age_is_two_intervals_plus_the_timeout(fake_cluster: FakeCluster) -> None:
    monitor = hm.HostMemoryMonitor(10.0, cluster=fake_cluster, scrape_timeout=5.0)

    assert monitor.max_age == 25.0


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("collection_interval", 0),
        ("collection_interval", float("nan")),
        ("scrape_timeout", -1.0),
        ("max_age", float("inf")),
        ("max_concurrency", 0),
        ("max_body_bytes", 2.5),
    ],
)
def test_bad_monitor_options_are_refused(
    option: str, value: object, fake_cluster: FakeCluster
) -> None:
    options: dict[str, Any] = {"collection_interval": 1.0, option: value}
    interval = options.pop("collection_interval")

    with pytest.raises(ValueError, match=rf"{option} must be .*got {re.escape(repr(value))}"):
        hm.HostMemoryMonitor(interval, cluster=fake_cluster, **options)


# The process's monitor -----------------------------------------------------------------


@pytest.mark.parametrize("interval", [0, -1.0, float("nan"), float("inf"), None, "10"])
def test_start_falls_back_on_a_bad_interval(
    interval: object, fake_cluster: FakeCluster, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        hm.start_host_memory_monitoring(interval, cluster=fake_cluster)  # type: ignore[arg-type]

    assert hm._MONITOR is not None and hm._MONITOR.running
    assert hm._MONITOR.collection_interval == hm.FALLBACK_COLLECTION_INTERVAL
    assert _warnings_about(caplog, repr(interval)) == 1


def test_one_monitor_per_process(fake_cluster: FakeCluster) -> None:
    hm.start_host_memory_monitoring(1.0, cluster=fake_cluster)
    first = hm._MONITOR
    hm.start_host_memory_monitoring(2.0, cluster=fake_cluster)

    assert hm._MONITOR is first
    assert [t.name for t in threading.enumerate()].count("raylens-host-memory") == 1
    hm.stop_host_memory_monitoring()
    hm.stop_host_memory_monitoring()
    assert hm._MONITOR is None
    assert first is not None and not first.running


def test_start_never_raises(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise RuntimeError("cannot build")

    monkeypatch.setattr(hm, "HostMemoryMonitor", refuse)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        hm.start_host_memory_monitoring(1.0)

    assert hm._MONITOR is None
    assert _warnings_about(caplog, "could not start host-memory monitoring") == 1


@pytest.mark.slow
def test_driver_telemetry_starts_and_stops_the_monitor_without_importing_ray() -> None:
    ray_was_imported = "ray" in sys.modules
    init_telemetry_driver(metric_reader=MetricsProbe().reader, host_memory_interval=0.5)

    assert hm._MONITOR is not None and hm._MONITOR.running
    assert hm._MONITOR.collection_interval == 0.5
    shutdown_telemetry()
    assert hm._MONITOR is None
    assert ("ray" in sys.modules) == ray_was_imported


def test_a_node_two_monitors_report_exports_the_newest_sample_and_health(
    simulated_cluster: Factory, metrics_probe: MetricsProbe, make_monitor: Callable
) -> None:
    now = [100.0]
    used = [1e9]
    sim = simulated_cluster(1, schedule=lambda i, t: (used[0], 64e9), clock=lambda: now[0])
    first = make_monitor(sim.cluster, clock=lambda: now[0])
    second = make_monitor(sim.cluster, clock=lambda: now[0])
    first.collect_once()
    now[0], used[0] = 101.0, 2e9
    second.collect_once()

    assert points_by_node(metrics_probe, USED)[sim.node_id(0)][1] == 2e9
    assert len(metrics_probe.points(RL_HOST_SCRAPE_UP_METRIC)) == 1

    now[0], used[0] = 102.0, 3e9
    first.collect_once()

    assert points_by_node(metrics_probe, USED)[sim.node_id(0)][1] == 3e9
    sim.raylet(0).respond_status(503)
    now[0] = 103.0
    second.collect_once()  # the latest observation of the node's health is a failure
    metrics_probe.collect()
    assert [dict(a)["error.type"] for a in metrics_probe.points(RL_HOST_SCRAPE_UP_METRIC)] == [
        "server_error"
    ]
