"""`raylens watch` when its cluster stops answering: failing rows, a line saying since when, a give-up.

Everything runs on one simulated clock: the watch loop's waits advance it, the
cluster's GCS is a probe the test scripts, and the nodes answer through a canned engine.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

import pytest

from raylens.cli.cluster_views import UNREACHABLE_ERROR, ClusterLost, watch_nodes
from raylens.cli.output import Output
from raylens.cli.parser import build_parser
from raylens.cli.reachability import (
    RAY_RECONNECT_ENV,
    ClusterUnreachable,
    GuardedCluster,
    ray_reconnect_setting,
    run_bounded,
    tcp_probe,
)
from raylens.telemetry import host_memory as hm
from raylens.telemetry.scraping import Outcome
from raylens_fakes import FakeCluster
from raylens_fakes.clock import ClockedStop, ManualClock

T = TypeVar("T")
WALL_START = 1_800_000_000.0
# What every node's scrape answers: 1 GB used of 4 GB.
FIGURES = Outcome({"host_memory_used": 1e9, "host_memory_total": 4e9}, None)


class Clock(ManualClock):
    def __init__(self, start: float = 1000.0) -> None:
        super().__init__(start)

    def wall(self) -> float:
        return WALL_START + self.now - 1000.0


# A watch that never gives up stops here on the simulated clock, and its test fails.
GIVE_UP_AT = 5000.0


def run_in_place(call: Callable[[], T], timeout: float) -> T:
    return call()


class CountingCluster(FakeCluster):
    def __init__(self) -> None:
        super().__init__()
        self.node_calls = 0

    def nodes(self) -> list[dict[str, Any]]:
        self.node_calls += 1
        return super().nodes()


def _guard(cluster: FakeCluster, clock: Clock, up: list[bool], **options: Any) -> GuardedCluster:
    options.setdefault("run", run_in_place)
    return GuardedCluster(
        cluster,
        "10.0.0.1:6379",
        probe=lambda: up[0],
        call_timeout=2.0,
        clock=clock,
        wall=clock.wall,
        **options,
    )


def _since(clock_reading: float) -> str:
    return datetime.fromtimestamp(WALL_START + clock_reading - 1000.0).strftime("%H:%M:%S")


# ----------------------------------------------------------------------------- the guard


def test_a_failed_probe_refuses_every_gcs_call_without_making_it() -> None:
    cluster, clock, up = CountingCluster(), Clock(), [True]
    cluster.add_node(port=8000)
    guard = _guard(cluster, clock, up)

    assert guard.check() and len(guard.nodes()) == 1 and cluster.node_calls == 1
    up[0] = False
    clock.now += 4.0
    assert not guard.check() and guard.unreachable
    for call in (guard.nodes, lambda: guard.kv_keys("x"), guard.live_job_ids, guard.job_id):
        with pytest.raises(ClusterUnreachable, match=r"10\.0\.0\.1:6379"):
            call()
    assert cluster.node_calls == 1
    assert guard.silent_for() == pytest.approx(4.0)
    assert guard.is_initialized()  # answered by this process, not the GCS


def test_silence_counts_from_the_last_answer_and_ends_with_the_next_answer() -> None:
    cluster, clock, up = CountingCluster(), Clock(), [True]
    guard = _guard(cluster, clock, up)
    clock.now += 5.0
    guard.nodes()  # answered at 1005
    up[0] = False
    clock.now += 5.0
    guard.check()

    assert guard.silent_for() == pytest.approx(5.0)
    assert guard.give_up_at(30.0) == pytest.approx(1035.0)
    line = guard.describe(30.0)
    assert line is not None and f"since {_since(1005.0)}" in line
    assert "(5 s)" in line and "giving up in 25 s" in line

    up[0] = True
    clock.now += 1.0
    assert guard.check() and not guard.unreachable and guard.silent_for() is None
    assert guard.describe(30.0) is None and guard.give_up_at(30.0) is None


def test_a_call_past_its_deadline_marks_the_cluster_unreachable() -> None:
    cluster, clock, up = CountingCluster(), Clock(), [True]

    def deadline_passes(call: Callable[[], T], timeout: float) -> T:
        clock.now += timeout
        raise TimeoutError

    guard = _guard(cluster, clock, up, run=deadline_passes)

    with pytest.raises(ClusterUnreachable, match="within 2 s"):
        guard.nodes()
    assert guard.unreachable and guard.silent_for() == pytest.approx(2.0)


def test_an_error_of_the_call_itself_is_passed_on_and_is_not_silence() -> None:
    cluster, clock, up = CountingCluster(), Clock(), [True]
    guard = _guard(cluster, clock, up)
    cluster.kv_get = lambda key: (_ for _ in ()).throw(KeyError(key))  # type: ignore[method-assign]

    with pytest.raises(KeyError):
        guard.kv_get("k")
    assert not guard.unreachable


def test_a_call_timeout_that_is_not_positive_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=r"call_timeout .* got 0"):
        GuardedCluster(FakeCluster(), "h:1", probe=lambda: True, call_timeout=0)


@pytest.mark.parametrize(
    ("give_up", "environ", "expected"),
    [
        (30.0, {}, None),  # Ray's own minute already leaves room
        (45.0, {}, "75"),
        (120.5, {}, "151"),
        (300.0, {RAY_RECONNECT_ENV: "20"}, None),  # the user's own setting stands
    ],
)
def test_a_long_give_up_moves_rays_own_limit_unless_the_user_set_it(
    give_up: float, environ: dict[str, str], expected: str | None
) -> None:
    assert ray_reconnect_setting(give_up, environ) == expected


def test_give_up_defaults_to_30_seconds_and_refuses_less_than_one() -> None:
    parser = build_parser()
    assert parser.parse_args(["watch"]).give_up == 30.0
    assert parser.parse_args(["watch", "--give-up", "90"]).give_up == 90.0
    with pytest.raises(SystemExit):
        parser.parse_args(["watch", "--give-up", "0.5"])


# ------------------------------------------------------------------- the watch loop


def _watch_in_json(
    monitor: hm.HostMemoryMonitor,
    args: argparse.Namespace,
    stop: ClockedStop,
    guard: GuardedCluster | None = None,
) -> None:
    """The watch loop, writing JSON records, on ``stop``'s clock (and ``guard``'s, if any)."""
    on_guard = {} if guard is None else {"cluster": guard, "clock": stop.clock, "guard": guard}
    watch_nodes(monitor, args, output=Output(as_json=True), title="t", stop=stop, **on_guard)


def _watch_until_lost(
    make_monitor: Callable[..., hm.HostMemoryMonitor],
    capsys: pytest.CaptureFixture[str],
    *,
    down_at: float,
    interval: float = 5.0,
    give_up: float = 30.0,
) -> tuple[list[dict[str, Any]], ClusterLost, float, ClockedStop]:
    cluster, clock = CountingCluster(), Clock()
    cluster.add_node(port=8000, hostname="n0")
    cluster.add_node(port=8001, hostname="n1")
    guard = GuardedCluster(
        cluster,
        "10.0.0.1:6379",
        probe=lambda: clock.now < down_at,
        call_timeout=2.0,
        clock=clock,
        wall=clock.wall,
        run=run_in_place,
    )
    monitor = make_monitor(guard, clock=clock, interval=interval, answering=FIGURES)
    stop = ClockedStop(clock, until=GIVE_UP_AT)
    args = argparse.Namespace(interval=interval, duration=None, once=False, give_up=give_up)
    with pytest.raises(ClusterLost) as lost:
        _watch_in_json(monitor, args, stop, guard)
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    return records, lost.value, clock.now, stop


def test_rows_turn_failing_within_one_interval_and_say_since_when(
    make_monitor: Callable[..., hm.HostMemoryMonitor], capsys: pytest.CaptureFixture[str]
) -> None:
    # Samples at 1000, 1005, 1010: the GCS goes away at 1012, after the last answer at 1010.
    records, _lost, _at, _stop = _watch_until_lost(make_monitor, capsys, down_at=1012.0)

    healthy, first_down = records[2], records[3]
    assert healthy["unreachable"] is None and healthy["totals"]["failing"] == 0
    assert [node["error"] for node in first_down["nodes"]] == [UNREACHABLE_ERROR] * 2
    assert first_down["totals"]["failing"] == 2
    assert f"since {_since(1010.0)}" in first_down["unreachable"]
    assert "giving up in 25 s" in first_down["unreachable"]


def test_the_watch_gives_up_when_the_cluster_has_been_silent_for_give_up_seconds(
    make_monitor: Callable[..., hm.HostMemoryMonitor], capsys: pytest.CaptureFixture[str]
) -> None:
    # Samples at 1000 and 1007 are answered; the one at 1014 is not. The next would come
    # at 1021 and 1028, but the give-up falls at 1027 and the loop wakes for it.
    records, lost, at, _stop = _watch_until_lost(
        make_monitor, capsys, down_at=1012.0, interval=7.0, give_up=20.0
    )

    assert at == pytest.approx(1027.0)
    message = str(lost)
    assert "\n" not in message and lost.exit_code == 2
    assert f"since {_since(1007.0)}" in message
    assert "gave up after 20 s (--give-up)" in message
    assert all(record["unreachable"] for record in records[2:])


def test_a_watch_without_a_guard_shows_no_unreachable_line(
    make_monitor: Callable[..., hm.HostMemoryMonitor], capsys: pytest.CaptureFixture[str]
) -> None:
    cluster, clock = FakeCluster(), Clock()
    cluster.add_node(port=8000)
    monitor = make_monitor(cluster, clock=clock, answering=FIGURES)
    args = argparse.Namespace(interval=1.0, duration=None, once=True)

    _watch_in_json(monitor, args, ClockedStop(clock, until=GIVE_UP_AT))

    (record,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert record["unreachable"] is None and record["nodes"][0]["error"] is None


# --------------------------------------------------------------- real sockets, real threads


@pytest.mark.slow
def test_a_tcp_probe_tells_a_listening_port_from_a_closed_one() -> None:
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert tcp_probe("127.0.0.1", port, 1.0)
    assert not tcp_probe("127.0.0.1", port, 1.0)


@pytest.mark.slow
def test_a_call_that_never_returns_is_abandoned_at_its_deadline() -> None:
    release = threading.Event()
    started = time.monotonic()
    try:
        with pytest.raises(TimeoutError):
            run_bounded(lambda: release.wait(60), 0.2)
        assert time.monotonic() - started < 5.0
        assert run_bounded(lambda: 7, 1.0) == 7
        with pytest.raises(KeyError):
            run_bounded(lambda: {}["x"], 1.0)
    finally:
        release.set()


def test_the_unreachable_line_sits_under_the_summary_of_the_table() -> None:
    import io

    from rich.console import Console

    from raylens.live_table import NodeRow, node_table

    row = NodeRow("a" * 56, "h", 1.0, 4.0, "policy", 3.0, error=UNREACHABLE_ERROR)
    out = io.StringIO()
    Console(file=out, width=200, force_terminal=False, color_system=None).print(
        node_table([row], notes=["cluster unreachable: no answer since 10:00:00 (3 s)"])
    )
    lines = [line.rstrip() for line in out.getvalue().splitlines()]
    summary = next(i for i, line in enumerate(lines) if line.startswith("1 node on 1 host"))
    assert "1 failing" in lines[summary]
    assert lines[summary + 1] == "cluster unreachable: no answer since 10:00:00 (3 s)"
    assert any("cluster unreachable" in line and "aaaaaaaa" in line for line in lines)


def test_a_gcs_that_accepts_connections_but_answers_nothing_is_given_up_on(
    make_monitor: Callable[..., hm.HostMemoryMonitor], capsys: pytest.CaptureFixture[str]
) -> None:
    cluster, clock = CountingCluster(), Clock()
    cluster.add_node(port=8000, hostname="n0")
    hung_from = 1010.0

    def run(call: Callable[[], T], timeout: float) -> T:
        if clock.now >= hung_from:
            clock.now += timeout  # the call's deadline passes
            raise TimeoutError
        return call()

    guard = GuardedCluster(
        cluster,
        "10.0.0.1:6379",
        probe=lambda: True,  # the port still accepts connections
        call_timeout=2.0,
        clock=clock,
        wall=clock.wall,
        run=run,
    )
    monitor = make_monitor(guard, clock=clock, interval=5.0, answering=FIGURES)
    args = argparse.Namespace(interval=5.0, duration=None, once=False, give_up=20.0)

    with pytest.raises(ClusterLost, match=f"since {_since(1005.0)}"):
        _watch_in_json(monitor, args, ClockedStop(clock, until=GIVE_UP_AT), guard)

    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert records[-1]["unreachable"] is not None
    assert clock.now <= 1005.0 + 20.0 + 2 * 2.0 + 5.0  # gave up at the cycle that passed 20 s


@pytest.mark.parametrize(
    ("interval", "probe_s", "call_s"), [(5.0, 1.0, 5.0), (0.2, 0.1, 2.0), (60.0, 1.0, 10.0)]
)
def test_the_watch_bounds_its_probe_and_calls_by_the_interval(
    interval: float, probe_s: float, call_s: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    from raylens.cli import cluster_views, reachability
    from raylens.cluster import RayClusterView

    probes: list[tuple[str, int, float]] = []
    monkeypatch.setattr(
        cluster_views, "tcp_probe", lambda host, port, timeout: probes.append((host, port, timeout))
    )
    guard = cluster_views.guard_for(RayClusterView(), "10.1.2.3:6379", interval)
    guard.check()

    assert probes == [("10.1.2.3", 6379, probe_s)]
    assert guard.call_timeout == call_s
    assert reachability.DEFAULT_GIVE_UP_S + 10.0 < reachability.RAY_RECONNECT_TIMEOUT_S
