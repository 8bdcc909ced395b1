"""The scrape engine's contract over real sockets: one request per node per cycle,
deadlines held by the HTTP library, and hostile answers turned into plain errors."""

from __future__ import annotations

import gzip
import logging
import socket
import threading
import time
from collections.abc import Callable

import pytest

from raylens.lens import warnings as lens_warnings
from raylens.telemetry import host_memory as hm
from raylens.telemetry.host_memory._monitor import ScrapeMode
from raylens.telemetry.raylet_payload import TOTAL_KEY, USED_KEY
from raylens_fakes import FakeCluster, FakeRaylet, MetricsProbe, SimulatedCluster

Factory = Callable[..., SimulatedCluster]
LOGGER = "raylens.telemetry.host_memory"


def _errors(monitor: hm.HostMemoryMonitor) -> dict[str, str | None]:
    return {s.node_id: s.error for s in monitor.latest()}


@pytest.mark.parametrize(
    ("misbehave", "timeout", "sampled"),
    [
        (lambda r: r.hang(), 0.4, False),
        (lambda r: r.trickle(0.05), 0.4, False),
        (lambda r: r.trickle(0.05, headers=True), 0.4, False),
        (lambda r: r.delay(1.2), 2.5, True),
    ],
    ids=["hang", "trickle", "trickled-headers", "slow-1.2s"],
)
@pytest.mark.slow
def test_a_node_is_asked_once_per_cycle_whatever_it_does(
    misbehave: Callable[[FakeRaylet], None],
    timeout: float,
    sampled: bool,
    simulated_cluster: Factory,
    make_monitor: Callable,
) -> None:
    sim = simulated_cluster(2)
    misbehave(sim.raylet(0))
    monitor = make_monitor(sim.cluster, scrape_timeout=timeout)

    for cycle in (1, 2):
        monitor.collect_once()
        assert sim.raylet(0).wait_for_requests(cycle, timeout=2)
        assert sim.raylet(0).requests == cycle
        assert sim.raylet(1).requests == cycle

    assert (_errors(monitor)[sim.node_id(0)] is None) is sampled
    headers = sim.raylet(0).calls[0].headers
    assert headers["Accept-Encoding"] == "identity"


def test_a_compressed_body_is_refused_unread(
    simulated_cluster: Factory, make_monitor: Callable
) -> None:
    sim = simulated_cluster(1)
    bomb = gzip.compress(gzip.compress(b"0" * 20_000_000))  # a few KB on the wire
    sim.raylet(0).respond_status(200, bomb, headers={"Content-Encoding": "gzip"})
    monitor = make_monitor(sim.cluster)

    monitor.collect_once()

    error = _errors(monitor)[sim.node_id(0)]
    assert error is not None and "refused a body with Content-Encoding 'gzip'" in error


def test_control_characters_from_a_raylet_never_reach_latest_or_the_log(
    simulated_cluster: Factory, make_monitor: Callable, caplog: pytest.LogCaptureFixture
) -> None:
    sim = simulated_cluster(1)
    sim.raylet(0).respond_status(500, reason="\x1b]0;PWNED\x07\x1b[2J oops")
    monitor = make_monitor(sim.cluster)

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        monitor.collect_once()

    error = _errors(monitor)[sim.node_id(0)]
    assert error == "HTTP 500 \\x1b]0;PWNED\\x07\\x1b[2J oops"
    (record,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "\x1b" not in record.getMessage() and "\x07" not in record.getMessage()


def test_a_redirect_is_not_followed(simulated_cluster: Factory, make_monitor: Callable) -> None:
    sim = simulated_cluster(2)
    sim.raylet(0).respond_status(302, headers={"Location": sim.raylet(1).url})
    monitor = make_monitor(sim.cluster)
    sim.cluster.kill_node(sim.node_id(1))

    monitor.collect_once()

    assert _errors(monitor)[sim.node_id(0)] == "HTTP 302 Found"
    assert sim.raylet(1).requests == 0


def test_two_node_records_on_one_host_and_port_are_both_sampled(
    make_monitor: Callable, metrics_probe: MetricsProbe
) -> None:
    cluster = FakeCluster()
    with FakeRaylet(used=5e9, total=6e9) as raylet:
        first = cluster.add_node(address=raylet.host, port=raylet.port)
        second = cluster.add_node(address=raylet.host, port=raylet.port)
        monitor = make_monitor(cluster)
        for _ in range(10):
            monitor.collect_once()
            assert _errors(monitor) == {first: None, second: None}
        assert raylet.requests == 20


def _after_a_cycle_without_consumer(
    simulated_cluster: Factory, make_monitor: Callable, nodes: int
) -> tuple[SimulatedCluster, hm.HostMemoryMonitor]:
    """A monitor of ``nodes`` simulated nodes, made with no consumer, after its first cycle."""
    sim = simulated_cluster(nodes)
    monitor = make_monitor(sim.cluster, consumer=False)
    monitor.collect_once()
    return sim, monitor


def test_no_consumer_means_nodes_are_listed_but_nobody_is_asked(
    simulated_cluster: Factory, make_monitor: Callable
) -> None:
    sim, monitor = _after_a_cycle_without_consumer(simulated_cluster, make_monitor, 2)

    assert sim.cluster.nodes_calls >= 1
    assert [r.requests for r in sim.raylets] == [0, 0]
    assert not monitor.has_consumer

    monitor.declare_consumer()
    monitor.collect_once()
    assert [r.requests for r in sim.raylets] == [1, 1]


def test_lens_exporting_is_a_consumer(
    simulated_cluster: Factory, make_monitor: Callable, metrics_probe: MetricsProbe
) -> None:
    sim, monitor = _after_a_cycle_without_consumer(simulated_cluster, make_monitor, 1)

    assert monitor.has_consumer
    assert sim.raylet(0).requests == 1


def test_reading_latest_makes_a_consumer(
    simulated_cluster: Factory, make_monitor: Callable
) -> None:
    sim, monitor = _after_a_cycle_without_consumer(simulated_cluster, make_monitor, 1)
    assert monitor.latest() == []

    monitor.collect_once()

    assert sim.raylet(0).requests == 1
    assert [s.error for s in monitor.latest()] == [None]


def test_a_monkeypatched_scrape_is_what_every_cycle_fetches(
    simulated_cluster: Factory,
    make_monitor: Callable,
    metrics_probe: MetricsProbe,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sim = simulated_cluster(2)
    asked: list[str] = []

    def fake_scrape(self: hm.HostMemoryMonitor, node: hm.RayNode) -> dict[str, float]:
        asked.append(node.node_id)
        return {USED_KEY: 7.0, TOTAL_KEY: 9.0}

    monkeypatch.setattr(hm.HostMemoryMonitor, "_scrape", fake_scrape)
    monitor = make_monitor(sim.cluster, scrape_mode="helper")
    monitor.collect_once()
    monitor.collect_once()

    metrics_probe.collect()
    values = {
        dict(a)["ray.node.id"]: v
        for a, v in metrics_probe.points(hm.RL_HOST_MEMORY_USED_METRIC).items()
    }
    assert values == dict.fromkeys(sim.node_ids, 7.0)
    assert sorted(asked) == sorted(sim.node_ids * 2)
    assert [r.requests for r in sim.raylets] == [0, 0]
    assert monitor.helper_pid is None  # a replaced _scrape runs here, never in a helper


def test_a_subclass_scrape_is_honoured(simulated_cluster: Factory) -> None:
    sim = simulated_cluster(1)

    class Fixed(hm.HostMemoryMonitor):
        def _scrape(self, node: hm.RayNode) -> dict[str, float]:
            return {USED_KEY: 1.0, TOTAL_KEY: 2.0}

    monitor = Fixed(1.0, cluster=sim.cluster, consumer=True)
    try:
        monitor.collect_once()
        assert [(s.used, s.total) for s in monitor.latest()] == [(1.0, 2.0)]
    finally:
        monitor.stop()
    assert sim.raylet(0).requests == 0


def test_what_is_held_about_a_node_ends_when_it_leaves(
    simulated_cluster: Factory, make_monitor: Callable, caplog: pytest.LogCaptureFixture
) -> None:
    sim = simulated_cluster(3)
    sim.raylet(2).respond_status(503)
    monitor = make_monitor(sim.cluster)
    key = f"host_memory.scrape.{sim.node_id(2)}"

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        monitor.collect_once()
        assert key in lens_warnings._WARNED_KEYS
        sim.kill_node(2)
        monitor.collect_once()
        assert key not in lens_warnings._WARNED_KEYS
        assert set(monitor._standing) == {n.key for n in hm.ray_nodes(sim.cluster)}
        assert len(monitor.snapshot.records) == 2
        sim.cluster.revive_node(sim.node_id(2))
        monitor.collect_once()  # back, still failing: warned about again

    warned = [r for r in caplog.records if sim.node_id(2) in r.getMessage()]
    assert len(warned) == 2


def test_scrape_mode_from_the_argument_and_the_environment(
    fake_cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("RAYLENS_SCRAPE_MODE", "inprocess")
    assert hm.HostMemoryMonitor(1.0, cluster=fake_cluster).scrape_mode is ScrapeMode.INPROCESS
    assert (
        hm.HostMemoryMonitor(1.0, cluster=fake_cluster, scrape_mode="helper").scrape_mode
        is ScrapeMode.HELPER
    )
    monkeypatch.setenv("RAYLENS_SCRAPE_MODE", "thread\x1b[2J")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        mode = hm.HostMemoryMonitor(1.0, cluster=fake_cluster).scrape_mode
    assert mode is ScrapeMode.HELPER
    assert "\x1b" not in caplog.records[0].getMessage()
    assert "RAYLENS_SCRAPE_MODE" in caplog.records[0].getMessage()
    with pytest.raises(
        ValueError, match=r"scrape_mode must be one of \['helper', 'inprocess'\], got 'fork'"
    ):
        hm.HostMemoryMonitor(1.0, cluster=fake_cluster, scrape_mode="fork")


@pytest.mark.slow
def test_slow_name_lookups_end_at_the_deadline_and_starve_no_other_name(
    make_monitor: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_getaddrinfo = socket.getaddrinfo
    release = threading.Event()
    lookups: list[str] = []

    def getaddrinfo(host: str, *args: object, **kwargs: object) -> list:
        lookups.append(host)
        if host.endswith(".slow.test"):
            release.wait(30)  # a resolver that never answers while the test runs
            raise socket.gaierror(socket.EAI_AGAIN, "temporary failure")
        return real_getaddrinfo(host, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    cluster = FakeCluster()
    with FakeRaylet() as raylet:
        slow = [cluster.add_node(address=f"n{i}.slow.test", port=9) for i in range(40)]
        good = cluster.add_node(address="localhost", port=raylet.port)
        monitor = make_monitor(cluster, scrape_timeout=0.5)
        try:
            for _ in range(2):
                started = time.monotonic()
                monitor.collect_once()
                assert time.monotonic() - started < 0.5 + 1.0
                errors = _errors(monitor)
                assert errors[good] is None
                assert all("timed out" in (errors[node] or "") for node in slow)
            # A name still being looked up is not looked up again.
            assert sorted(lookups.count(f"n{i}.slow.test") for i in range(40)) == [1] * 40
        finally:
            release.set()
