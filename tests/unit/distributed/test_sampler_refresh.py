"""A sampler sets its figures again between readings, as often as Ray's agent needs to keep them.

Ray's metrics agent drops a gauge value the worker has not exported again within two
report intervals; a worker that exports only what was set since its last export needs a
value set at least every half report interval, whatever the reading interval. Time here
is simulated: the stop event's waits advance the loop's clock.
"""

from __future__ import annotations

import itertools
import logging
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from raylens.distributed._group_memory_publishing import PublishingLoop, ray_gauge_refresh_s
from raylens.telemetry.group_memory import GroupMemoryReader
from raylens_fakes.clock import ClockedStop, ManualClock
from raylens_fakes.procfs import FakeProcFS

MB = 2**20


class Recording:
    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.sets: list[tuple[float, str, int]] = []

    def set_group(self, group: str, rss: int, pss: int | None, processes: int) -> None:
        self.sets.append((self.clock.now, group, rss))

    def forget_group(self, group: str) -> None:
        self.sets.append((self.clock.now, f"forget {group}", 0))

    def set_sampled_at(self, seconds: float) -> None:
        pass


def _loop(
    tmp_path: Path, refresh: float | None, publishing: type[Recording] = Recording
) -> tuple[PublishingLoop, Recording, ManualClock, FakeProcFS]:
    clock = ManualClock(100.0)
    proc = FakeProcFS(tmp_path / "node")
    proc.add_process(200, rss_bytes=10 * MB)
    publisher = publishing(clock)
    loop = PublishingLoop(
        GroupMemoryReader(proc.procfs, pss_interval_seconds=None, clock=clock),
        publisher,
        clock=clock,
        wall_clock=lambda: 1_700_000_000.0,
        refresh_s=lambda: refresh,
    )
    loop.set_workers([("policy", 200, proc.start_ticks(200))])
    return loop, publisher, clock, proc


@pytest.mark.parametrize(("refresh", "interval"), [(0.5, 1.0), (0.5, 10.0), (5.0, 30.0)])
def test_no_value_goes_longer_than_the_refresh_without_being_set_again(
    tmp_path: Path, refresh: float, interval: float
) -> None:
    loop, publisher, clock, proc = _loop(tmp_path, refresh)
    stop = ClockedStop(clock)
    for _ in range(5):
        loop.sample_and_publish_once()
        proc.set_memory(200, rss_bytes=proc_rss(publisher) + MB)
        assert not loop.wait_republishing(stop, interval)

    times = [at for at, group, _ in publisher.sets if group == "policy"]
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert max(gaps) <= refresh + 1e-9
    assert len(times) >= 5 * interval / refresh
    # Between readings the value set is the latest reading's, unchanged.
    assert [rss for _, _, rss in publisher.sets][: int(interval / refresh)] == [10 * MB] * int(
        interval / refresh
    )


def proc_rss(publisher: Recording) -> int:
    return publisher.sets[-1][2]


def test_without_a_refresh_or_with_a_long_one_the_loop_waits_in_one_piece(tmp_path: Path) -> None:
    for refresh in (None, 10.0, 20.0):
        loop, publisher, clock, _proc = _loop(tmp_path / str(refresh), refresh)
        stop = ClockedStop(clock)
        loop.sample_and_publish_once()
        assert not loop.wait_republishing(stop, 10.0)
        assert stop.waits == [10.0] and len(publisher.sets) == 1


def test_a_stop_during_the_wait_ends_it_and_nothing_is_set_after_stop(tmp_path: Path) -> None:
    loop, publisher, clock, _proc = _loop(tmp_path, 0.5)
    loop.sample_and_publish_once()

    class StopsOnThirdWait(ClockedStop):
        def wait(self, timeout: float | None = None) -> bool:
            if len(self.waits) == 2:
                self.set()
            return super().wait(timeout)

    assert loop.wait_republishing(StopsOnThirdWait(clock), 10.0)
    assert len(publisher.sets) == 3  # the reading and two refreshes
    loop.stop()
    assert not loop.republish() and len(publisher.sets) == 3


def test_nothing_is_set_again_before_the_first_reading(tmp_path: Path) -> None:
    loop, publisher, _clock, _proc = _loop(tmp_path, 0.5)
    assert not loop.republish() and publisher.sets == []


@pytest.mark.parametrize(("report_ms", "refresh"), [(1000, 0.5), (100, 0.5), (10_000, 5.0)])
def test_the_refresh_is_half_of_rays_report_interval_floored_at_one_second(
    monkeypatch: pytest.MonkeyPatch, report_ms: int, refresh: float
) -> None:
    config: Any = SimpleNamespace(metrics_report_interval_ms=lambda: report_ms)
    monkeypatch.setitem(sys.modules, "ray", SimpleNamespace(_config=config))
    assert ray_gauge_refresh_s() == refresh


def test_without_ray_there_is_no_refresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    assert ray_gauge_refresh_s() is None
    monkeypatch.setitem(sys.modules, "ray", SimpleNamespace())  # a Ray without that config
    assert ray_gauge_refresh_s() is None


def test_the_sampler_thread_warns_once_of_an_unforeseen_error_and_keeps_sampling(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    class GaugeBroke(Exception):
        """An error of a kind nothing names: Ray's metrics code may raise anything."""

    class FailsTwice(Recording):
        failures = 2

        def set_group(self, group: str, rss: int, pss: int | None, processes: int) -> None:
            if self.failures:
                self.failures -= 1
                raise GaugeBroke("gauge refused")
            super().set_group(group, rss, pss, processes)

    loop, publisher, clock, _proc = _loop(tmp_path, None, FailsTwice)

    class StopsOnFourthWait(ClockedStop):
        def wait(self, timeout: float | None = None) -> bool:
            if len(self.waits) == 3:
                self.set()
            return super().wait(timeout)

    stop = StopsOnFourthWait(clock)
    loop._interval = 5.0  # what start() sets; the thread's body runs here, on simulated time
    caplog.set_level(logging.DEBUG, logger="raylens")
    loop._run(stop)  # returns only once stopped: nothing escaped it

    assert [group for _, group, _ in publisher.sets] == ["policy", "policy"]  # readings 3 and 4
    warned = [r for r in caplog.records if "could not read or publish" in r.getMessage()]
    assert [r.levelno for r in warned] == [logging.WARNING, logging.DEBUG]
    assert "gauge refused" in warned[0].getMessage()
