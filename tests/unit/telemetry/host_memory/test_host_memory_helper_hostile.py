"""The scrape helper under a hostile host: stopped mid-batch, forked around, raced at start.

Real processes and real deadlines: these belong to the slow tier.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from raylens.telemetry.host_memory._helper_engine import HelperEngine
from raylens.telemetry.scraping import ScrapeLimits
from raylens_fakes import SimulatedCluster

pytestmark = pytest.mark.slow


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def _in_thread(call: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    """Run ``call`` on a daemon thread; the list receives its result."""
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(call()), daemon=True)
    thread.start()
    return thread, result


@pytest.fixture
def refused_url() -> Iterator[str]:
    """A loopback URL whose connection is refused at once."""
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    yield f"http://127.0.0.1:{port}/metrics"


def test_a_stopped_helper_never_blocks_a_large_batch_and_the_next_cycles_complete(
    refused_url: str,
) -> None:
    """A batch far larger than the socket's buffer, sent to a stopped helper."""
    with SimulatedCluster(1) as sim:
        engine = HelperEngine(ScrapeLimits(timeout=1.0))
        good = ("good", sim.raylet(0).url, False)
        try:
            assert engine.scrape([good])["good"].error is None
            pid = engine.pid
            assert pid is not None
            # 20,000 nodes with 100-character host names: megabytes, far past any buffer.
            jobs = [
                (f"n{i}", f"http://{'h' * 100}{i}.invalid:1/metrics", False) for i in range(20_000)
            ]
            os.kill(pid, signal.SIGSTOP)
            try:
                thread, result = _in_thread(lambda: engine.scrape([*jobs, good]))
                thread.join(10.0)
                assert not thread.is_alive(), "scrape() blocked on a stopped helper"
                assert result == [{}]
            finally:
                os.kill(pid, signal.SIGCONT)
            answers = [engine.scrape([good]) for _ in range(4)]
            assert [a.get("good") is not None and a["good"].error is None for a in answers] == [
                True
            ] * 4
            assert engine.pid == pid  # resumed, not replaced
        finally:
            started = time.monotonic()
            engine.close(1.0)
            assert time.monotonic() - started < 1.0 + 0.5


def test_close_keeps_its_bound_while_the_helper_is_stopped_mid_batch(refused_url: str) -> None:
    with SimulatedCluster(1) as sim:
        sim.raylet(0).hang()
        engine = HelperEngine(ScrapeLimits(timeout=2.0))
        assert engine.scrape([("warm", refused_url, False)]) is not None
        pid = engine.pid
        assert pid is not None
        jobs = [(f"n{i}", f"http://{'h' * 100}{i}.invalid:1/", False) for i in range(20_000)]
        os.kill(pid, signal.SIGSTOP)
        thread, _ = _in_thread(lambda: engine.scrape([*jobs, ("hung", sim.raylet(0).url, False)]))
        deadline = time.monotonic() + 10.0
        while not (engine._channel and engine._channel.sending) and time.monotonic() < deadline:
            time.sleep(0.01)  # polling, with a deadline, until the batch is stuck in the socket
        assert engine._channel is not None and engine._channel.sending
        started = time.monotonic()
        engine.close(1.0)
        elapsed = time.monotonic() - started
        thread.join(5.0)
        assert elapsed < 1.5
        assert not thread.is_alive()
        deadline = time.monotonic() + 5.0
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)  # polling the helper's exit with a deadline
        assert not _alive(pid)


def test_a_helper_stalled_for_several_cycles_is_replaced(refused_url: str) -> None:
    """Batches too large for the socket's buffer, to a stopped helper: it is replaced."""
    from raylens.telemetry.host_memory._helper_engine import STALLED_CYCLES

    with SimulatedCluster(1) as sim:
        engine = HelperEngine(ScrapeLimits(timeout=0.5))
        good = ("good", sim.raylet(0).url, False)
        try:
            assert engine.scrape([good])["good"].error is None
            first = engine.pid
            assert first is not None
            jobs = [(f"n{i}", f"http://{'h' * 100}{i}.invalid:1/", False) for i in range(20_000)]
            os.kill(first, signal.SIGSTOP)
            for _ in range(STALLED_CYCLES):
                assert engine.scrape([*jobs, good]) == {}
            assert engine.pid is None  # the stalled helper was ended
            assert not _alive(first)
            answer = engine.scrape([good])
            assert answer["good"].error is None
            assert engine.pid not in (None, first)
        finally:
            engine.close(1.0)


_FORKING_DRIVER = textwrap.dedent(
    """
    import os, socket, sys, time
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from raylens.cluster import use_cluster_view
    from raylens.driver import init_telemetry_driver
    from raylens.telemetry import host_memory
    from raylens_fakes import FakeCluster

    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(64)  # connections complete, requests are never answered
    cluster = FakeCluster()
    cluster.add_node(address="127.0.0.1", port=hung.getsockname()[1])
    with use_cluster_view(cluster):
        init_telemetry_driver(metric_reader=InMemoryMetricReader(), host_memory_interval=0.3)
        monitor = host_memory.start_host_memory_monitoring(0.3)
        deadline = time.monotonic() + 30
        while monitor.helper_pid is None and time.monotonic() < deadline:
            time.sleep(0.01)
        helper = monitor.helper_pid
        if sys.argv[1] == "between":
            time.sleep(0.05)
        child = os.fork()
        if child == 0:
            if sys.argv[2] == "stop":
                monitor.stop()
                os._exit(0)
            sys.exit(0)
        started = time.monotonic()
        while time.monotonic() - started < 10:
            done, status = os.waitpid(child, os.WNOHANG)
            if done:
                break
            time.sleep(0.01)
        else:
            os.kill(child, 9)
            os.waitpid(child, 0)
            print("child-hung", flush=True)
            sys.exit(1)
        time.sleep(0.5)  # one more cycle's worth, so a stopped helper would show
        print(f"child-exited {time.monotonic() - started:.2f} {status} "
              f"{helper} {monitor.helper_pid}", flush=True)
    """
)


@pytest.mark.parametrize("when", ["during", "between"])
@pytest.mark.parametrize("how", ["exit", "stop"])
def test_a_forked_child_exits_promptly_and_leaves_the_parents_helper_alone(
    tmp_path: Path, when: str, how: str
) -> None:
    script = tmp_path / "driver.py"
    script.write_text(_FORKING_DRIVER)
    run = subprocess.run(
        [sys.executable, str(script), when, how],
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = [line for line in run.stdout.splitlines() if line.startswith("child-")]
    assert lines and lines[0].startswith("child-exited"), run.stdout + run.stderr
    _, seconds, status, helper_before, helper_after = lines[0].split()
    assert float(seconds) < 5.0
    assert int(status) == 0
    assert helper_before != "None"
    assert helper_after == helper_before  # the parent's helper neither stopped nor replaced
    assert "AssertionError" not in run.stderr
    assert run.returncode == 0, run.stderr


_SPAWNING_APP = textwrap.dedent(
    """
    import multiprocessing, sys, threading
    from raylens.telemetry.scraping import ScrapeLimits
    from raylens.telemetry.host_memory._helper_engine import HelperEngine

    def work(queue):
        queue.put("ok")

    if __name__ == "__main__":
        context = multiprocessing.get_context("spawn")
        engines = [HelperEngine(ScrapeLimits(1.0)) for _ in range(4)]
        starters = [threading.Thread(target=engine.prestart) for engine in engines]
        queue = context.Queue()
        for thread in starters:
            thread.start()
        workers = [context.Process(target=work, args=(queue,)) for _ in range(4)]
        for process in workers:
            process.start()
        for thread in starters:
            thread.join()
        got = [queue.get(timeout=60) for _ in workers]
        for process in workers:
            process.join(60)
        for engine in engines:
            engine.close(1.0)
        print(got.count("ok"), [p.exitcode for p in workers], flush=True)
    """
)


def test_starting_the_helper_leaves_other_threads_spawns_alone(tmp_path: Path) -> None:
    script = tmp_path / "app.py"
    script.write_text(_SPAWNING_APP)
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert run.stdout.strip() == "4 [0, 0, 0, 0]", run.stdout + run.stderr
    assert "Can't get attribute" not in run.stderr


def _status_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def test_many_large_bodies_at_once_cost_the_helper_a_bounded_amount() -> None:
    with SimulatedCluster(24) as sim:
        engine = HelperEngine(ScrapeLimits(timeout=60.0))
        try:
            engine.scrape([("warm", sim.raylet(0).url, False)])
            pid = engine.pid
            assert pid is not None
            before = _status_kib(pid, "VmRSS")
            for index in range(24):
                sim.raylet(index).serve_huge(15 * 1024 * 1024)
            results = engine.scrape([(i, sim.raylet(i).url, False) for i in range(24)])
            assert len(results) == 24
            assert all(outcome.error is not None for outcome in results.values())
            grown_mib = (_status_kib(pid, "VmHWM") - before) / 1024
            # 24 x 15 MiB arrived at once; what was held at the peak is far less.
            assert grown_mib < 48, f"the helper's peak grew by {grown_mib:.0f} MiB"
        finally:
            engine.close(1.0)


def test_ctrl_c_in_the_drivers_terminal_leaves_the_helper_quiet_and_running(
    capfd: pytest.CaptureFixture[str],
) -> None:
    with SimulatedCluster(1) as sim:
        engine = HelperEngine(ScrapeLimits(timeout=2.0))
        try:
            good = ("good", sim.raylet(0).url, False)
            assert engine.scrape([good])["good"].error is None
            pid = engine.pid
            assert pid is not None
            os.kill(pid, signal.SIGINT)  # what a Ctrl-C sends to the whole foreground group
            assert engine.scrape([good])["good"].error is None
            assert engine.pid == pid
        finally:
            engine.close(1.0)
    assert "KeyboardInterrupt" not in capfd.readouterr().err


def test_the_helper_program_imports_neither_lens_nor_opentelemetry() -> None:
    probe = (
        "import sys; from raylens.telemetry.scraping._helper_program import main; "
        "print(sorted(m for m in sys.modules if m.startswith(('raylens.lens', 'opentelemetry'))))"
    )
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert run.stdout.strip() == "[]", run.stdout + run.stderr


def test_a_stopped_helper_given_small_batches_is_replaced_after_a_few_cycles() -> None:
    """A stopped helper's socket buffer holds many small batches: silence counts, not bytes."""
    from raylens.telemetry.host_memory._helper_engine import STALLED_CYCLES

    with SimulatedCluster(1) as sim:
        engine = HelperEngine(ScrapeLimits(timeout=0.3))
        good = ("good", sim.raylet(0).url, False)
        try:
            assert engine.scrape([good])["good"].error is None
            first = engine.pid
            assert first is not None
            os.kill(first, signal.SIGSTOP)
            for _ in range(STALLED_CYCLES):
                assert engine.scrape([good]) == {}
            answer = engine.scrape([good])
            assert answer["good"].error is None
            assert engine.pid not in (None, first)
        finally:
            engine.close(1.0)


def test_a_peer_that_only_writes_cannot_grow_what_flush_holds() -> None:
    from raylens.telemetry.scraping import DriverChannel
    from raylens.telemetry.scraping._channel import encode

    ours, theirs = socket.socketpair()
    channel = DriverChannel(ours)
    stop = threading.Event()
    message = encode(("result", 0, {"x": b"y" * 60_000}))

    def flood() -> None:
        with contextlib.suppress(OSError):
            while not stop.is_set():
                theirs.sendall(message)

    writer = threading.Thread(target=flood, daemon=True)
    writer.start()
    try:
        channel.queue(("scrape", 1, [("k", "u", False)] * 200_000, 0.0))  # never read back
        assert not channel.flush(time.monotonic() + 1.0)
        assert len(channel._incoming) < 2 * len(message)
    finally:
        stop.set()
        channel.close()
        theirs.close()
        writer.join(5.0)


def test_the_helper_runs_in_a_session_of_its_own_and_imports_nothing_from_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "imported"
    (tmp_path / "struct.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.chdir(tmp_path)
    engine = HelperEngine(ScrapeLimits(timeout=1.0))
    try:
        engine.scrape([("warm", "http://127.0.0.1:1/metrics", False)])
        pid = engine.pid
        assert pid is not None
        assert os.getsid(pid) != os.getsid(0)  # Ctrl-C in the driver's terminal never reaches it
        assert not marker.exists()
    finally:
        engine.close(1.0)
