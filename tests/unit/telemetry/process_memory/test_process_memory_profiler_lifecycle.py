"""MemoryProfiler lifecycle edges: a wedged sample, a thread that cannot start."""

from __future__ import annotations

import threading

import pytest

from raylens.telemetry.process_memory import (
    HostMemory,
    MemoryProfiler,
    ProcessTreeMemory,
    _profiler,
)
from raylens_fakes.procfs import PAGE_SIZE, FakeProcFS

HOST = HostMemory(used_bytes=6, available_bytes=10, total_bytes=16)
BOUND_S = 10.0  # far above the shortened stop timeout; reached only if something hangs


@pytest.fixture
def fake(tmp_path) -> FakeProcFS:
    fake = FakeProcFS(tmp_path / "proc")
    fake.add_process(100, rss_bytes=30 * PAGE_SIZE)
    return fake


class WedgingCollector:
    """Blocks the ``wedge_on``-th call until ``release`` is set (a read stuck in the kernel)."""

    def __init__(self, wedge_on: int) -> None:
        self.wedge_on = wedge_on
        self.calls = 0
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, pid: int, *, include_pss: bool = True) -> ProcessTreeMemory:
        self.calls += 1
        if self.calls == self.wedge_on:
            self.entered.set()
            self.release.wait(60)
        return ProcessTreeMemory(400, 250, 1)


def _in_thread(fn) -> tuple[threading.Thread, list[BaseException]]:  # type: ignore[no-untyped-def]
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as error:
            errors.append(error)

    thread = threading.Thread(target=run, name="raylens-test-caller", daemon=True)
    thread.start()
    return thread, errors


@pytest.mark.slow
def test_stop_and_restart_are_bounded_while_a_sample_is_wedged(
    monkeypatch: pytest.MonkeyPatch, fake, policy
) -> None:
    monkeypatch.setattr(_profiler, "STOP_TIMEOUT_SECONDS", 0.2)
    collector = WedgingCollector(wedge_on=2)  # call 1 is start()'s own sample
    profiler = MemoryProfiler([policy], 0.01, collector, lambda: HOST, procfs=fake.procfs)
    profiler.start()
    old_thread = profiler._thread
    try:
        assert collector.entered.wait(BOUND_S)

        stopper, errors = _in_thread(profiler.stop)
        stopper.join(BOUND_S)
        assert not stopper.is_alive(), "stop() waited on the wedged sample without bound"
        assert errors == []
        assert not profiler.is_running

        starter, errors = _in_thread(profiler.start)
        starter.join(BOUND_S)
        assert not starter.is_alive(), "start() waited on the wedged sample without bound"
        assert len(errors) == 1 and isinstance(errors[0], RuntimeError)
        assert "still in progress" in str(errors[0])
        assert not profiler.is_running
    finally:
        collector.release.set()
    old_thread.join(BOUND_S)
    assert not old_thread.is_alive()
    profiler.start()  # once the stuck sample is over, the profiler works again
    try:
        assert profiler.is_running
    finally:
        profiler.stop()
    assert profiler.latest().servers[0].rss_bytes == 400


def test_a_thread_that_cannot_start_leaves_the_profiler_stopped(
    monkeypatch: pytest.MonkeyPatch, fake, policy
) -> None:
    class Unstartable(threading.Thread):
        def start(self) -> None:
            raise RuntimeError("can't start new thread")

    profiler = MemoryProfiler(
        [policy],
        3600,
        lambda pid, **_: ProcessTreeMemory(1, 1, 1),
        lambda: HOST,
        procfs=fake.procfs,
    )
    monkeypatch.setattr(threading, "Thread", Unstartable)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        profiler.start()
    assert not profiler.is_running
    profiler.stop()  # nothing to stop, and no error about an unstarted thread
    monkeypatch.undo()
    profiler.start()
    try:
        assert profiler._thread.is_alive()
    finally:
        profiler.stop()


def test_an_interval_too_long_to_wait_on_is_refused() -> None:
    # threading cannot wait that long: the sampling thread would die on its first wait.
    too_long = threading.TIMEOUT_MAX * 2
    with pytest.raises(ValueError, match=rf"interval_seconds.*{too_long!r}"):
        MemoryProfiler([], too_long)
    MemoryProfiler([], threading.TIMEOUT_MAX)
