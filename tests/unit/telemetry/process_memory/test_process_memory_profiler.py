"""MemoryProfiler and the lens gauges it feeds, on fake /proc trees and fake collectors."""

from __future__ import annotations

import logging
import os
import threading
import time

import pytest
from process_memory_values import HOST, MB

from raylens.lens import get_telemetry_handle
from raylens.telemetry import process_memory as pm
from raylens.telemetry.process_memory import (
    HostMemory,
    MemoryProfiler,
    ProcessTreeMemory,
    ProcFS,
    ServerMemoryTarget,
    record_host_memory,
    record_server_memory,
    reset_process_memory_state,
)
from raylens_fakes.clock import ManualClock
from raylens_fakes.otel import MetricsProbe
from raylens_fakes.procfs import PAGE_SIZE, FakeProcFS

USAGE = "gym.server.memory.usage"
SAMPLED_PEAK = "gym.server.memory.sampled_peak"
POLICY = {"nemo.gym.server.name": "policy", "nemo.gym.server.type": "vllm", "process.pid": 100}


def point(attributes: dict, memory_type: str | None = None) -> frozenset:
    items = dict(attributes)
    if memory_type is not None:
        items["memory.type"] = memory_type
    return frozenset(items.items())


class CountingCollector:
    """A collector returning scripted values; ``calls`` counts, ``reached`` fires at ``target``."""

    def __init__(self, memory: ProcessTreeMemory | None = None, *, target: int = 10**9):
        self.memory = memory or ProcessTreeMemory(400, 250, 2)
        self.calls: list[tuple[int, bool]] = []
        self.target = target
        self.reached = threading.Event()
        self.fail_on: set[int] = set()

    def __call__(self, pid: int, *, include_pss: bool = True) -> ProcessTreeMemory:
        self.calls.append((pid, include_pss))
        if len(self.calls) >= self.target:
            self.reached.set()
        if len(self.calls) in self.fail_on:
            raise OSError("scripted collector failure")
        return self.memory


def _run_until_reached(profiler: MemoryProfiler, collector: CountingCollector) -> None:
    """Runs the profiler's thread until ``collector`` reached its target; the thread is alive
    then, and stopped after."""
    profiler.start()
    try:
        assert collector.reached.wait(5)
        assert profiler._thread.is_alive()
    finally:
        profiler.stop()


def _by_memory_type(probe: MetricsProbe, name: str) -> dict[str, float]:
    """``name``'s points by memory type; every one of them is the policy server's."""
    by_type = {}
    for key, value in probe.points(name).items():
        attributes = dict(key)
        memory_type = attributes.pop("memory.type")
        assert attributes == POLICY
        by_type[memory_type] = value
    return by_type


# ---------------------------------------------------------------- export


def test_server_memory_is_exported_with_its_attributes(metrics_probe, policy):
    peaks: dict = {}
    record_server_memory(policy, ProcessTreeMemory(300, 200, 3), peaks)
    assert peaks == {("policy", "rss"): 300, ("policy", "pss"): 200}
    metrics_probe.collect()
    assert _by_memory_type(metrics_probe, USAGE) == {"rss": 300, "pss": 200}
    assert _by_memory_type(metrics_probe, SAMPLED_PEAK) == {
        "rss": 300,
        "pss": 200,
    }
    assert metrics_probe.points("gym.server.processes") == {point(POLICY): 3}
    assert metrics_probe.metric("gym.server.memory.usage").unit == "By"
    assert metrics_probe.metric("gym.server.memory.sampled_peak").unit == "By"
    assert metrics_probe.metric("gym.server.processes").unit == "{process}"


def test_peak_is_the_largest_sample(metrics_probe, policy):
    peaks: dict = {}
    record_server_memory(policy, ProcessTreeMemory(300, 200, 3), peaks)
    record_server_memory(policy, ProcessTreeMemory(100, 250, 1), peaks)
    metrics_probe.collect()
    assert _by_memory_type(metrics_probe, USAGE) == {"rss": 100, "pss": 250}
    assert _by_memory_type(metrics_probe, SAMPLED_PEAK) == {
        "rss": 300,
        "pss": 250,
    }


def test_unknown_pss_has_no_current_point_but_keeps_its_peak(metrics_probe, policy):
    peaks: dict = {}
    record_server_memory(policy, ProcessTreeMemory(300, 200, 3), peaks)
    record_server_memory(policy, ProcessTreeMemory(310, None, 3), peaks)
    metrics_probe.collect()
    assert _by_memory_type(metrics_probe, USAGE) == {"rss": 310}
    assert _by_memory_type(metrics_probe, SAMPLED_PEAK) == {
        "rss": 310,
        "pss": 200,
    }


def test_host_memory_is_exported(metrics_probe):
    peaks: dict = {}
    record_host_memory(HOST, peaks)
    record_host_memory(HostMemory(4 * MB, 12 * MB, 16 * MB), peaks)
    assert peaks == {"used": 6 * MB}
    metrics_probe.collect()
    assert metrics_probe.points("gym.host.memory.usage") == {frozenset(): 4 * MB}
    assert metrics_probe.points("gym.host.memory.available") == {frozenset(): 12 * MB}
    assert metrics_probe.points("gym.host.memory.total") == {frozenset(): 16 * MB}
    assert metrics_probe.points("gym.host.memory.sampled_peak") == {frozenset(): 6 * MB}
    for name in ("usage", "available", "total", "sampled_peak"):
        assert metrics_probe.metric(f"gym.host.memory.{name}").unit == "By"


def test_a_profiler_started_before_telemetry_exports_from_its_next_sample(fake, policy):
    reset_process_memory_state()
    profiler = MemoryProfiler([policy], 3600, CountingCollector(), lambda: HOST, procfs=fake.procfs)
    profiler.sample_once()
    with MetricsProbe() as probe:
        profiler.sample_once()
        probe.collect()
        assert probe.points("gym.server.processes") == {point(POLICY): 2}
        assert probe.points("gym.host.memory.total") == {frozenset(): 16 * MB}


def test_reset_forgets_everything(metrics_probe, policy):
    record_server_memory(policy, ProcessTreeMemory(300, 200, 3), {})
    record_host_memory(HOST, {})
    reset_process_memory_state()
    metrics_probe.collect()
    assert metrics_probe.points("gym.server.memory.usage") == {}
    assert metrics_probe.points("gym.host.memory.usage") == {}
    assert pm.DEFAULT_SERIES.exported_meters() == 0


def test_instruments_are_set_up_once_per_meter(metrics_probe, policy):
    meter = get_telemetry_handle().meter
    instruments = pm.DEFAULT_SERIES._get_instruments(meter)
    assert set(instruments) == {
        "gym_server_memory_usage",
        "gym_server_memory_sampled_peak",
        "gym_server_processes",
        "gym_host_memory_usage",
        "gym_host_memory_available",
        "gym_host_memory_total",
        "gym_host_memory_sampled_peak",
    }
    assert pm.DEFAULT_SERIES._get_instruments(meter) is instruments
    assert pm.DEFAULT_SERIES.exported_meters() == 1


# ---------------------------------------------------------------- construction


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), True, "1", None])
def test_interval_must_be_positive(bad):
    with pytest.raises(ValueError, match="interval_seconds"):
        MemoryProfiler([], bad)


@pytest.mark.parametrize("bad", [0, -5, float("nan")])
def test_pss_interval_must_be_positive(bad):
    with pytest.raises(ValueError, match="pss_interval_seconds"):
        MemoryProfiler([], 1.0, pss_interval_seconds=bad)


def test_target_names_must_be_unique(fake):
    targets = [ServerMemoryTarget("a", "x", 100, procfs=fake.procfs)] * 2
    with pytest.raises(ValueError, match="repeated: a"):
        MemoryProfiler(targets, 1.0)


def test_targets_must_be_targets():
    with pytest.raises(TypeError, match="ServerMemoryTarget"):
        MemoryProfiler([("a", "x", 1)], 1.0)  # type: ignore[list-item]


def test_pss_interval_needs_a_collector_with_an_rss_only_mode(policy):
    with pytest.raises(TypeError, match="include_pss"):
        MemoryProfiler(
            [policy], 1.0, lambda pid: ProcessTreeMemory(1, 1, 1), pss_interval_seconds=5
        )


# ---------------------------------------------------------------- lifecycle


def test_start_samples_at_once_and_stop_samples_once_more(metrics_probe, fake, policy):
    collector = CountingCollector()
    profiler = MemoryProfiler([policy], 3600, collector, lambda: HOST, procfs=fake.procfs)
    assert profiler.latest() is None
    profiler.start()
    try:
        assert collector.calls == [(100, True)]
        assert profiler.is_running
        thread = profiler._thread
        assert thread.name == "raylens-memory-profiler"
        assert thread.daemon
        metrics_probe.collect()
        assert metrics_probe.points("gym.server.processes") == {point(POLICY): 2}
        assert metrics_probe.points("gym.host.memory.usage") == {frozenset(): 6 * MB}
    finally:
        collector.memory = ProcessTreeMemory(900, 800, 5)
        profiler.stop()
    assert not thread.is_alive()
    assert not profiler.is_running
    assert len(collector.calls) == 2
    metrics_probe.collect()
    assert metrics_probe.points("gym.server.processes") == {point(POLICY): 5}


def test_samples_in_the_background(fake, policy):
    collector = CountingCollector(target=4)
    profiler = MemoryProfiler([policy], 0.01, collector, lambda: HOST, procfs=fake.procfs)
    profiler.start()
    try:
        assert collector.reached.wait(5)
    finally:
        profiler.stop()


def test_stop_returns_promptly_with_a_long_interval(fake, policy):
    profiler = MemoryProfiler([policy], 3600, CountingCollector(), lambda: HOST, procfs=fake.procfs)
    profiler.start()
    began = time.monotonic()
    profiler.stop()
    assert time.monotonic() - began < 5  # woken by stop(), not by the hour-long interval


def test_collector_failures_never_stop_the_thread(fake, policy, caplog):
    collector = CountingCollector(target=6)
    collector.fail_on = {2, 3, 4}
    profiler = MemoryProfiler([policy], 0.01, collector, lambda: HOST, procfs=fake.procfs)
    with caplog.at_level(logging.DEBUG, logger="raylens"):
        _run_until_reached(profiler, collector)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "policy" in warnings[0].getMessage()


def test_failed_collection_reports_nothing_for_that_server(metrics_probe, fake, policy):
    collector = CountingCollector()
    collector.fail_on = {2}
    profiler = MemoryProfiler([policy], 3600, collector, lambda: HOST, procfs=fake.procfs)
    profiler.sample_once()
    profiler.sample_once()
    sample = profiler.latest().servers[0]
    assert sample.status == "failed"
    assert sample.rss_bytes is None
    assert sample.peak_rss_bytes == 400
    metrics_probe.collect()
    assert metrics_probe.points("gym.server.memory.usage") == {}
    assert metrics_probe.points("gym.host.memory.usage") == {frozenset(): 6 * MB}


def test_errors_escaping_a_sample_never_stop_the_thread(fake, policy):
    profiler = MemoryProfiler([policy], 0.01, CountingCollector(), lambda: HOST, procfs=fake.procfs)
    profiler.start()
    failures: list[int] = []
    done = threading.Event()

    def broken_sample() -> None:
        failures.append(1)
        if len(failures) >= 3:
            done.set()
        raise RuntimeError("scripted")

    profiler.sample_once = broken_sample  # type: ignore[method-assign]
    try:
        assert done.wait(5)
        assert profiler._thread.is_alive()
    finally:
        del profiler.sample_once
        profiler.stop()


def test_host_collector_failure_keeps_servers_sampled(metrics_probe, fake, policy):
    peaks_before = {"used": 1}

    def broken_host() -> HostMemory:
        raise OSError("no meminfo")

    profiler = MemoryProfiler([policy], 3600, CountingCollector(), broken_host, procfs=fake.procfs)
    profiler._host_peaks.update(peaks_before)
    profiler.sample_once()
    latest = profiler.latest()
    assert latest.host is None
    assert latest.servers[0].rss_bytes == 400
    metrics_probe.collect()
    assert metrics_probe.points("gym.host.memory.usage") == {}
    assert metrics_probe.points("gym.host.memory.sampled_peak") == {frozenset(): 1}
    assert metrics_probe.points("gym.server.processes") == {point(POLICY): 2}


def test_stop_without_start_does_nothing(fake, policy):
    collector = CountingCollector()
    MemoryProfiler([policy], 1, collector, lambda: HOST, procfs=fake.procfs).stop()
    assert collector.calls == []


def test_restart_works_and_resets_peaks(metrics_probe, fake, policy):
    collector = CountingCollector(ProcessTreeMemory(500, 400, 2), target=3)
    profiler = MemoryProfiler([policy], 0.01, collector, lambda: HOST, procfs=fake.procfs)
    profiler.start()
    assert collector.reached.wait(5)
    profiler.stop()
    assert profiler._peaks == {("policy", "rss"): 500, ("policy", "pss"): 400}

    collector.memory = ProcessTreeMemory(100, 90, 1)
    collector.reached.clear()
    collector.target = len(collector.calls) + 3
    _run_until_reached(profiler, collector)
    assert profiler._peaks == {("policy", "rss"): 100, ("policy", "pss"): 90}
    metrics_probe.collect()
    assert metrics_probe.points("gym.server.memory.sampled_peak") == {
        point(POLICY, "rss"): 100,
        point(POLICY, "pss"): 90,
    }


def test_start_declines_without_procfs(tmp_path, fake, policy):
    bare = FakeProcFS(tmp_path / "bare", self_pid=None)
    profiler = MemoryProfiler([policy], 3600, CountingCollector(), lambda: HOST, procfs=bare.procfs)
    with pytest.raises(RuntimeError, match="cannot measure process trees"):
        profiler.start()
    assert not profiler.is_running
    assert profiler.latest() is None


def test_host_only_profiling_needs_no_procfs(tmp_path):
    profiler = MemoryProfiler([], 3600, host_collector=lambda: HOST, procfs=tmp_path / "none")
    profiler.start()
    profiler.stop()
    assert profiler.latest().host == HOST
    assert profiler.latest().host_peak_used_bytes == 6 * MB


# ---------------------------------------------------------------- identity and gone trees


def test_reused_pid_is_reported_gone_and_not_measured(metrics_probe, fake, policy):
    collector = CountingCollector()
    profiler = MemoryProfiler([policy], 3600, collector, lambda: HOST, procfs=fake.procfs)
    profiler.sample_once()
    fake.reuse_pid(100)
    profiler.sample_once()
    assert len(collector.calls) == 1
    sample = profiler.latest().servers[0]
    assert sample.status == "reused"
    assert (sample.rss_bytes, sample.pss_bytes, sample.process_count) == (None, None, None)
    metrics_probe.collect()
    assert metrics_probe.points("gym.server.memory.usage") == {
        point(POLICY, "rss"): 0,
        point(POLICY, "pss"): 0,
    }
    assert metrics_probe.points("gym.server.processes") == {point(POLICY): 0}


def test_exited_root_is_reported_gone(metrics_probe, fake, policy):
    profiler = MemoryProfiler([policy], 3600, host_collector=lambda: HOST, procfs=fake.procfs)
    profiler.sample_once()
    fake.remove_process(101)
    fake.remove_process(100)
    profiler.sample_once()
    assert profiler.latest().servers[0].status == "exited"
    metrics_probe.collect()
    assert set(metrics_probe.points("gym.server.memory.usage").values()) == {0}
    assert metrics_probe.points("gym.server.memory.sampled_peak") == {
        point(POLICY, "rss"): 400 * PAGE_SIZE,
        point(POLICY, "pss"): 250 * PAGE_SIZE,
    }


def test_tree_reported_empty_by_the_collector_is_gone(fake, policy):
    collector = CountingCollector(ProcessTreeMemory(0, None, 0))
    profiler = MemoryProfiler([policy], 3600, collector, lambda: HOST, procfs=fake.procfs)
    profiler.sample_once()
    assert profiler.latest().servers[0].status == "exited"


def test_target_without_start_time_is_trusted(fake):
    target = ServerMemoryTarget("late", "x", 300, procfs=fake.procfs)  # not there yet
    fake.add_process(300, rss_bytes=8 * PAGE_SIZE)
    profiler = MemoryProfiler([target], 3600, host_collector=lambda: HOST, procfs=fake.procfs)
    profiler.sample_once()
    sample = profiler.latest().servers[0]
    assert (sample.status, sample.rss_bytes) == ("live", 8 * PAGE_SIZE)


# ---------------------------------------------------------------- PSS rate


def recording_profiler(fake, target, clock, **kwargs):
    opener_paths: list[str] = []

    def opener(path: str, flags: int) -> int:
        opener_paths.append(os.path.relpath(path, fake.root))
        return fake.open(path, flags)

    procfs = ProcFS(fake.root, opener=opener)
    profiler = MemoryProfiler(
        [target], 1.0, host_collector=lambda: HOST, procfs=procfs, clock=clock, **kwargs
    )
    return profiler, opener_paths


def rollups(paths: list[str]) -> int:
    return sum(path.endswith("smaps_rollup") for path in paths)


def test_pss_is_read_at_most_every_pss_interval(metrics_probe, fake, policy):
    clock = ManualClock(1000.0)
    profiler, paths = recording_profiler(fake, policy, clock, pss_interval_seconds=10)

    profiler.sample_once()
    assert rollups(paths) == 2
    first = profiler.latest().servers[0]
    assert (first.pss_bytes, first.pss_age_seconds) == (250 * PAGE_SIZE, 0.0)

    fake.set_memory(100, rss_bytes=350 * PAGE_SIZE, pss_bytes=210 * PAGE_SIZE)
    clock.now += 4
    paths.clear()
    profiler.sample_once()
    assert rollups(paths) == 0
    between = profiler.latest().servers[0]
    assert between.rss_bytes == 450 * PAGE_SIZE
    assert (between.pss_bytes, between.pss_age_seconds) == (250 * PAGE_SIZE, 4.0)
    metrics_probe.collect()
    assert metrics_probe.points("gym.server.memory.usage") == {
        point(POLICY, "rss"): 450 * PAGE_SIZE,
        point(POLICY, "pss"): 250 * PAGE_SIZE,
    }

    clock.now += 6
    paths.clear()
    profiler.sample_once()
    assert rollups(paths) == 2
    fresh = profiler.latest().servers[0]
    assert (fresh.pss_bytes, fresh.pss_age_seconds) == (260 * PAGE_SIZE, 0.0)


def test_pss_every_sample_without_a_pss_interval(fake, policy):
    clock = ManualClock(1000.0)
    profiler, paths = recording_profiler(fake, policy, clock)
    for _ in range(3):
        profiler.sample_once()
        clock.now += 1
    assert rollups(paths) == 6


def test_unreadable_pss_is_retried_only_at_the_pss_interval(metrics_probe, fake, policy):
    fake.deny(101, "smaps_rollup")
    clock = ManualClock(1000.0)
    profiler, paths = recording_profiler(fake, policy, clock, pss_interval_seconds=10)
    profiler.sample_once()
    assert profiler.latest().servers[0].pss_bytes is None
    clock.now += 5
    paths.clear()
    profiler.sample_once()
    assert rollups(paths) == 0
    sample = profiler.latest().servers[0]
    assert (sample.pss_bytes, sample.pss_age_seconds) == (None, None)
    metrics_probe.collect()
    assert metrics_probe.points("gym.server.memory.usage") == {
        point(POLICY, "rss"): 400 * PAGE_SIZE
    }
    clock.now += 5
    paths.clear()
    profiler.sample_once()
    assert rollups(paths) == 2  # both tried again, 101 refused again


def test_a_gone_tree_drops_its_previous_pss(fake, policy):
    clock = ManualClock(1000.0)
    profiler, _ = recording_profiler(fake, policy, clock, pss_interval_seconds=10)
    profiler.sample_once()
    fake.remove_process(101)
    fake.remove_process(100)
    clock.now += 1
    profiler.sample_once()
    assert profiler.latest().servers[0].pss_bytes is None
    # a new process under the same pid is a stranger: never measured, never given the old PSS
    fake.add_process(100)
    clock.now += 1
    profiler.sample_once()
    assert profiler.latest().servers[0].status == "reused"
    assert profiler._pss == {}


def test_latest_reports_peaks_counts_and_host(fake, policy):
    clock = ManualClock(1000.0)
    profiler = MemoryProfiler(
        [policy], 1.0, host_collector=lambda: HOST, procfs=fake.procfs, clock=clock
    )
    profiler.sample_once()
    fake.set_memory(101, rss_bytes=10 * PAGE_SIZE, pss_bytes=10 * PAGE_SIZE)
    clock.now += 1
    profiler.sample_once()
    latest = profiler.latest()
    assert latest.taken_at == 1001.0
    assert latest.host == HOST
    assert latest.host_peak_used_bytes == 6 * MB
    (sample,) = latest.servers
    assert sample.target is policy
    assert sample.status == "live"
    assert sample.process_count == 2
    assert sample.rss_bytes == 310 * PAGE_SIZE
    assert sample.peak_rss_bytes == 400 * PAGE_SIZE
    assert sample.peak_pss_bytes == 250 * PAGE_SIZE
    assert profiler.targets == [policy]
