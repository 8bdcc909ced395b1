"""A node's sampler reading on its own timer and publishing per-group gauges (no Ray)."""

from __future__ import annotations

import logging
import math
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from raylens.distributed._group_memory_publishing import (
    SAMPLER_THREAD_NAME,
    RayMetricsPublisher,
)
from raylens.distributed.group_memory_sampler import (
    DEFAULT_PSS_INTERVAL_SECONDS,
    GroupMemorySamplerActor,
)
from raylens.telemetry.raylet_payload import (
    GROUP_GROWTH_GAUGE,
    GROUP_LABEL,
    GROUP_MEMORY_GAUGE,
    GROUP_PROCESSES_GAUGE,
    GROUP_PSS_AGE_GAUGE,
    MEMORY_TYPE_LABEL,
    SAMPLER_SAMPLED_AT_GAUGE,
)
from raylens_fakes.clock import ManualClock
from raylens_fakes.procfs import FakeProcFS

MB = 2**20
WAIT_S = 30.0  # a bound on waits for the sampling thread, never reached when all is well


class Recording:
    """A publisher that records every call, and can be made to fail or to signal."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.fail_next = 0
        self.stamped = threading.Condition()

    def set_group(self, group: str, rss: int, pss: int | None, processes: int) -> None:
        if self.fail_next:
            self.fail_next -= 1
            raise RuntimeError("publisher broke\x1b[2J")
        self.calls.append(("set", group, rss, pss, processes))

    def forget_group(self, group: str) -> None:
        self.calls.append(("forget", group))

    def set_sampled_at(self, seconds: float) -> None:
        with self.stamped:
            self.calls.append(("at", seconds))
            self.stamped.notify_all()

    def stamps(self) -> int:
        return sum(1 for call in self.calls if call[0] == "at")

    def wait_for_stamps(self, count: int) -> None:
        with self.stamped:
            assert self.stamped.wait_for(lambda: self.stamps() >= count, WAIT_S), self.calls

    def take(self) -> list[tuple[Any, ...]]:
        taken, self.calls = self.calls, []
        return taken


@pytest.fixture
def procfs(tmp_path: Path) -> FakeProcFS:
    return FakeProcFS(tmp_path / "node")


@pytest.fixture
def publisher() -> Recording:
    return Recording()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1_700_000_000.0)


def _actor(
    procfs: FakeProcFS, publisher: Recording, wall_clock: ManualClock, **options: Any
) -> Any:
    options.setdefault("pss_interval_seconds", None)  # PSS at every reading
    return GroupMemorySamplerActor(
        procfs_root=str(procfs.root),
        host_name="node-a",
        publisher=publisher,
        wall_clock=wall_clock,
        **options,
    )


def _worker(
    procfs: FakeProcFS, group: str, pid: int, rss: int, **more: Any
) -> tuple[str, int, int]:
    procfs.add_process(pid, rss_bytes=rss, **more)
    return (group, pid, procfs.start_ticks(pid))


def test_one_pass_publishes_each_group_then_the_time(procfs, publisher, clock):
    actor = _actor(procfs, publisher, clock)
    policy = _worker(procfs, "policy", 200, 10 * MB, pss_bytes=6 * MB)
    procfs.add_process(210, parent=200, rss_bytes=MB, pss_bytes=MB // 2)
    actor.set_workers([policy, _worker(procfs, "rollout", 300, 4 * MB, pss_bytes=3 * MB)])

    actor.sample_and_publish_once()

    assert publisher.take() == [
        ("set", "policy", 11 * MB, 6 * MB + MB // 2, 2),
        ("set", "rollout", 4 * MB, 3 * MB, 1),
        ("at", clock.now),
    ]


def test_a_group_that_leaves_is_forgotten_once_then_left_alone(procfs, publisher, clock):
    actor = _actor(procfs, publisher, clock)
    policy = _worker(procfs, "policy", 200, MB)
    rollout = _worker(procfs, "rollout", 300, MB)
    actor.set_workers([policy, rollout])
    actor.sample_and_publish_once()
    publisher.take()

    actor.set_workers([policy])  # the whole list, replacing the previous one
    clock.now += 5
    actor.sample_and_publish_once()
    assert publisher.take() == [
        ("set", "policy", MB, MB, 1),
        ("forget", "rollout"),
        ("at", clock.now),
    ]

    clock.now += 5
    actor.sample_and_publish_once()
    assert publisher.take() == [("set", "policy", MB, MB, 1), ("at", clock.now)]


def test_a_group_whose_last_worker_exited_is_forgotten(procfs, publisher, clock):
    actor = _actor(procfs, publisher, clock)
    actor.set_workers([_worker(procfs, "policy", 200, MB), _worker(procfs, "rollout", 300, MB)])
    actor.sample_and_publish_once()
    publisher.take()
    procfs.remove_process(300)

    actor.sample_and_publish_once()

    assert ("forget", "rollout") in publisher.take()


def test_pss_not_known_is_published_as_none(procfs, publisher, clock):
    actor = _actor(procfs, publisher, clock)
    actor.set_workers([_worker(procfs, "policy", 200, 2 * MB, smaps_rollup=False)])

    actor.sample_and_publish_once()

    assert publisher.take()[0] == ("set", "policy", 2 * MB, None, 1)


def test_set_workers_refuses_a_malformed_entry_and_keeps_the_list_in_force(
    procfs, publisher, clock
):
    actor = _actor(procfs, publisher, clock)
    actor.set_workers([_worker(procfs, "policy", 200, MB)])
    with pytest.raises(ValueError, match="pid"):
        actor.set_workers([("rollout", -4, None)])

    actor.sample_and_publish_once()

    assert publisher.take()[0][:2] == ("set", "policy")


def test_reading_on_demand_still_answers_in_builtins(procfs, publisher, clock):
    actor = _actor(procfs, publisher, clock)
    plain = actor.read([_worker(procfs, "policy", 200, MB)])
    assert plain["groups"][0][:2] == ["policy", MB]
    assert publisher.calls == []  # reading on demand publishes nothing


def test_the_thread_samples_every_interval_until_stopped(procfs, publisher, clock):
    actor = _actor(procfs, publisher, clock)
    actor.set_workers([_worker(procfs, "policy", 200, MB)])

    actor.start(0.001)
    publisher.wait_for_stamps(3)
    (thread,) = [t for t in threading.enumerate() if t.name == SAMPLER_THREAD_NAME]
    assert thread.daemon
    assert actor.ping() >= 3
    actor.stop()

    assert not thread.is_alive()
    stamps = publisher.stamps()
    actor.sample_and_publish_once()  # a stopped sampler publishes nothing more
    assert publisher.stamps() == stamps


def test_start_again_changes_the_interval_without_a_second_thread(procfs, publisher, clock):
    actor = _actor(procfs, publisher, clock)
    actor.start(3600.0)
    publisher.wait_for_stamps(1)  # the first pass comes at once
    actor.start(3600.0)
    try:
        assert [t.name for t in threading.enumerate()].count(SAMPLER_THREAD_NAME) == 1
    finally:
        actor.stop()


def test_a_failing_pass_is_logged_once_and_the_thread_carries_on(procfs, publisher, clock, caplog):
    actor = _actor(procfs, publisher, clock)
    actor.set_workers([_worker(procfs, "policy", 200, MB)])
    publisher.fail_next = 3

    with caplog.at_level(logging.WARNING, logger="raylens"):
        actor.start(0.001)
        try:
            publisher.wait_for_stamps(2)
        finally:
            actor.stop()

    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "publisher broke" in warnings[0] and "\x1b" not in warnings[0]


def test_stop_can_forget_every_group_so_readers_drop_them_at_once(procfs, publisher, clock):
    actor = _actor(procfs, publisher, clock)
    actor.set_workers([_worker(procfs, "policy", 200, MB), _worker(procfs, "rollout", 300, MB)])
    actor.sample_and_publish_once()
    publisher.take()

    actor.stop(forget_groups=True)
    actor.stop(forget_groups=True)

    assert publisher.take() == [("forget", "policy"), ("forget", "rollout")]


def test_the_interval_is_checked(procfs, publisher, clock):
    actor = _actor(procfs, publisher, clock)
    for bad in (0, -1.0, float("nan"), float("inf"), True, "5"):
        with pytest.raises(ValueError, match="interval_s"):
            actor.start(bad)
    assert SAMPLER_THREAD_NAME not in [t.name for t in threading.enumerate()]


def test_stop_is_bounded_while_a_reading_is_stuck(procfs, publisher, clock, monkeypatch):
    actor = _actor(procfs, publisher, clock)
    entered, release = threading.Event(), threading.Event()
    real_read = actor._reader.read

    def stuck(workers: Any) -> Any:
        entered.set()
        release.wait(WAIT_S)
        return real_read(workers)

    monkeypatch.setattr(actor._reader, "read", stuck)
    actor.start(3600.0)
    assert entered.wait(WAIT_S)
    started = time.monotonic()
    try:
        actor.stop(forget_groups=True, timeout_s=0.05)
        assert time.monotonic() - started < WAIT_S / 2
    finally:
        release.set()
    for thread in [t for t in threading.enumerate() if t.name == SAMPLER_THREAD_NAME]:
        thread.join(WAIT_S)
    assert publisher.stamps() == 0  # the stuck reading, once done, was not published


# ---- the default publisher, on Ray's gauges ------------------------------------------------


class FakeGauge:
    made: list[FakeGauge] = []

    def __init__(self, name: str, description: str = "", tag_keys: tuple[str, ...] = ()) -> None:
        assert isinstance(tag_keys, tuple) and description
        self.name, self.tag_keys = name, tag_keys
        self.values: dict[tuple[tuple[str, str], ...], float] = {}
        self.sets: list[tuple[float, dict[str, str]]] = []
        FakeGauge.made.append(self)

    def set(self, value: float, tags: dict[str, str] | None = None) -> None:
        tags = tags or {}
        assert set(tags) == set(self.tag_keys), (self.name, tags)
        assert isinstance(value, float)
        self.sets.append((value, tags))
        self.values[tuple(sorted(tags.items()))] = value


@pytest.fixture
def gauges() -> dict[str, FakeGauge]:
    FakeGauge.made = []
    return {}


def _by_name() -> dict[str, FakeGauge]:
    return {gauge.name: gauge for gauge in FakeGauge.made}


def _memory(group: str, kind: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({GROUP_LABEL: group, MEMORY_TYPE_LABEL: kind}.items()))


def test_ray_gauges_are_made_on_first_use_with_the_published_names(gauges):
    publisher = RayMetricsPublisher(gauge_class=FakeGauge)
    assert FakeGauge.made == []

    publisher.set_group("policy", 5 * MB, 3 * MB, 4)
    publisher.set_sampled_at(1_700_000_000.5)

    made = _by_name()
    assert set(made) == {
        GROUP_MEMORY_GAUGE,
        GROUP_PROCESSES_GAUGE,
        SAMPLER_SAMPLED_AT_GAUGE,
        GROUP_GROWTH_GAUGE,
        GROUP_PSS_AGE_GAUGE,
    }
    assert made[GROUP_GROWTH_GAUGE].tag_keys == (GROUP_LABEL,)
    assert made[GROUP_MEMORY_GAUGE].tag_keys == (GROUP_LABEL, MEMORY_TYPE_LABEL)
    assert made[GROUP_PROCESSES_GAUGE].tag_keys == (GROUP_LABEL,)
    assert made[SAMPLER_SAMPLED_AT_GAUGE].tag_keys == ()
    assert made[GROUP_MEMORY_GAUGE].values == {
        _memory("policy", "rss"): 5 * MB,
        _memory("policy", "pss"): 3 * MB,
    }
    assert made[GROUP_PROCESSES_GAUGE].values == {((GROUP_LABEL, "policy"),): 4.0}
    assert made[SAMPLER_SAMPLED_AT_GAUGE].values == {(): 1_700_000_000.5}
    publisher.set_group("rollout", MB, None, 1)
    assert len(FakeGauge.made) == 5  # made once


def test_a_pss_that_stops_being_known_reads_nan_once(gauges):
    publisher = RayMetricsPublisher(gauge_class=FakeGauge)
    publisher.set_group("policy", 5 * MB, None, 1)
    memory = _by_name()[GROUP_MEMORY_GAUGE]
    assert _memory("policy", "pss") not in memory.values  # never known: never set

    publisher.set_group("policy", 5 * MB, 3 * MB, 1)
    publisher.set_group("policy", 5 * MB, None, 1)
    assert math.isnan(memory.values[_memory("policy", "pss")])
    sets = len(memory.sets)
    publisher.set_group("policy", 5 * MB, None, 1)
    assert len(memory.sets) == sets + 1  # only the rss point again


def test_a_forgotten_group_reads_nan_on_every_series(gauges):
    publisher = RayMetricsPublisher(gauge_class=FakeGauge)
    publisher.set_group("policy", 5 * MB, 3 * MB, 2)
    publisher.set_group("rollout", MB, None, 1)

    publisher.forget_group("policy")
    publisher.forget_group("rollout")

    memory, counts = _by_name()[GROUP_MEMORY_GAUGE], _by_name()[GROUP_PROCESSES_GAUGE]
    assert all(math.isnan(v) for v in memory.values.values())
    assert set(memory.values) == {
        _memory("policy", "rss"),
        _memory("policy", "pss"),
        _memory("rollout", "rss"),
    }
    assert all(math.isnan(v) for v in counts.values.values())


def test_the_actor_makes_no_gauge_until_it_publishes(procfs, monkeypatch, gauges):
    import raylens.distributed._sampler_gauges as gauge_module

    monkeypatch.setattr(gauge_module, "_ray_gauge_class", lambda: FakeGauge)
    actor = GroupMemorySamplerActor(procfs_root=str(procfs.root))
    actor.set_workers([_worker(procfs, "policy", 200, MB)])
    assert FakeGauge.made == []

    actor.sample_and_publish_once()

    assert _by_name()[GROUP_MEMORY_GAUGE].values[_memory("policy", "rss")] == MB


class GrowthRecording(Recording):
    """A publisher that also takes growth rates."""

    def set_growth(self, group: str, bytes_per_second: float) -> None:
        self.calls.append(("growth", group, bytes_per_second))


def test_each_groups_growth_is_published_once_its_window_is_full(procfs, clock):
    publisher = GrowthRecording()
    ticks = ManualClock(1_700_000_000.0)  # the growth history's clock, advanced by hand
    actor = _actor(procfs, publisher, clock, clock=ticks, growth_window_s=60.0)
    leak = 2 * MB  # per second
    policy = _worker(procfs, "policy", 200, 100 * MB)
    rollout = _worker(procfs, "rollout", 300, 50 * MB)
    actor.set_workers([policy, rollout])

    for second in range(120):
        ticks.now += 1.0
        procfs.set_memory(200, rss_bytes=100 * MB + leak * second)
        actor.sample_and_publish_once()
        if second == 30:
            assert not [call for call in publisher.calls if call[0] == "growth"]

    growth = {call[1]: call[2] for call in publisher.calls if call[0] == "growth"}
    assert growth["policy"] == pytest.approx(leak, rel=0.1)
    assert abs(growth["rollout"]) < 0.05 * leak


def test_a_publisher_without_growth_is_never_asked_for_it(procfs, publisher, clock):
    actor = _actor(procfs, publisher, clock, growth_window_s=10.0)
    actor.set_workers([_worker(procfs, "policy", 200, MB)])
    for _ in range(30):
        actor.sample_and_publish_once()
    assert {call[0] for call in publisher.calls} == {"set", "at"}


# ---- PSS with its age ----------------------------------------------------------------------


class PssAgeRecording(Recording):
    """A publisher that also takes the age of each group's PSS figure."""

    def set_pss_age(self, group: str, seconds: float | None) -> None:
        self.calls.append(("pss age", group, seconds))


def test_pss_is_published_with_its_age_between_its_readings(procfs, clock):
    publisher = PssAgeRecording()
    ticks = ManualClock(1_700_000_000.0)  # the reader's clock, which times the PSS interval
    # The default PSS interval, which is longer than the 20 s between these readings.
    actor = _actor(
        procfs, publisher, clock, clock=ticks, pss_interval_seconds=DEFAULT_PSS_INTERVAL_SECONDS
    )
    assert DEFAULT_PSS_INTERVAL_SECONDS > 20.0
    actor.set_workers([_worker(procfs, "policy", 200, 10 * MB, pss_bytes=6 * MB)])

    actor.sample_and_publish_once()
    ticks.now += 20.0
    actor.sample_and_publish_once()

    ages = [call[2] for call in publisher.calls if call[0] == "pss age"]
    assert ages == [0.0, 20.0]


def test_a_group_without_pss_has_no_age(procfs, clock):
    publisher = PssAgeRecording()
    actor = _actor(procfs, publisher, clock)
    actor.set_workers([_worker(procfs, "policy", 200, 10 * MB, smaps_rollup=False)])

    actor.sample_and_publish_once()

    assert ("pss age", "policy", None) in publisher.calls


def test_ray_publisher_serves_the_pss_age_and_clears_it_with_the_pss(gauges):
    publisher = RayMetricsPublisher(gauge_class=FakeGauge)
    publisher.set_group("policy", 5 * MB, 3 * MB, 1)
    publisher.set_pss_age("policy", 12.5)
    age = _by_name()[GROUP_PSS_AGE_GAUGE]
    assert age.tag_keys == (GROUP_LABEL,)
    assert age.values == {((GROUP_LABEL, "policy"),): 12.5}

    publisher.set_pss_age("policy", None)
    assert math.isnan(age.values[((GROUP_LABEL, "policy"),)])
    sets = len(age.sets)
    publisher.set_pss_age("policy", None)  # already cleared: nothing more to say
    assert len(age.sets) == sets

    publisher.set_pss_age("policy", 3.0)
    publisher.forget_group("policy")
    assert math.isnan(age.values[((GROUP_LABEL, "policy"),)])
