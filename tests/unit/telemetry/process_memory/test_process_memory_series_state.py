"""The profiler's exported series live in a ProcessMemorySeries; the module uses a default one."""

from __future__ import annotations

import gc

import pytest
from process_memory_values import HOST, MB

from raylens.telemetry import process_memory as pm
from raylens.telemetry.process_memory import (
    DEFAULT_SERIES,
    HostMemory,
    MemoryProfiler,
    ProcessMemorySeries,
    ProcessTreeMemory,
    ServerMemoryTarget,
    record_host_memory,
    record_server_memory,
    reset_process_memory_state,
)
from raylens_fakes.procfs import PAGE_SIZE, FakeProcFS

# Each collection here walks only what the test made.
pytestmark = pytest.mark.usefixtures("young_heap")

SMALLER_HOST = HostMemory(used_bytes=2 * MB, available_bytes=14 * MB, total_bytes=16 * MB)


@pytest.fixture
def fake(two_servers: FakeProcFS) -> FakeProcFS:
    return two_servers


def profiler_on(
    series: ProcessMemorySeries | None, fake: FakeProcFS, *targets: ServerMemoryTarget, host=HOST
) -> MemoryProfiler:
    return MemoryProfiler(
        list(targets), 3600, host_collector=lambda: host, procfs=fake.procfs, series=series
    )


def rss_by_name(points: dict[frozenset, float]) -> dict[str, float]:
    return {
        dict(key)["nemo.gym.server.name"]: value
        for key, value in points.items()
        if dict(key)["memory.type"] == "rss"
    }


def test_the_module_names_one_default_series():
    assert isinstance(DEFAULT_SERIES, ProcessMemorySeries)
    assert pm.DEFAULT_SERIES is DEFAULT_SERIES
    assert "ProcessMemorySeries" in pm.__all__


def test_two_isolated_series_do_not_see_each_other(fake):
    first, second = ProcessMemorySeries(), ProcessMemorySeries()
    profiler_on(
        first, fake, ServerMemoryTarget("policy", "vllm", 100, procfs=fake.procfs)
    ).sample_once()
    profiler_on(
        second,
        fake,
        ServerMemoryTarget("judge", "vllm", 200, procfs=fake.procfs),
        host=SMALLER_HOST,
    ).sample_once()

    assert rss_by_name(first.points("gym.server.memory.usage")) == {"policy": 300 * PAGE_SIZE}
    assert rss_by_name(second.points("gym.server.memory.usage")) == {"judge": 40 * PAGE_SIZE}
    assert first.points("gym.host.memory.usage") == {frozenset(): 6 * MB}
    assert second.points("gym.host.memory.usage") == {frozenset(): 2 * MB}
    assert DEFAULT_SERIES.points("gym.server.memory.usage") == {}
    assert DEFAULT_SERIES.points("gym.host.memory.usage") == {}


def test_an_isolated_series_exports_nothing_through_lens(metrics_probe, fake):
    isolated = ProcessMemorySeries()
    policy = ServerMemoryTarget("policy", "vllm", 100, procfs=fake.procfs)
    profiler_on(isolated, fake, policy).sample_once()
    assert metrics_probe.points("gym.server.memory.usage") == {}
    assert metrics_probe.points("gym.host.memory.usage") == {}
    # The default series still exports as before once something is published to it.
    profiler_on(None, fake, policy).sample_once()
    assert rss_by_name(metrics_probe.points("gym.server.memory.usage")) == {
        "policy": 300 * PAGE_SIZE
    }


def test_a_profiler_without_a_series_publishes_to_the_default_one(fake):
    profiler_on(
        None, fake, ServerMemoryTarget("policy", "vllm", 100, procfs=fake.procfs)
    ).sample_once()
    assert rss_by_name(DEFAULT_SERIES.points("gym.server.memory.usage")) == {
        "policy": 300 * PAGE_SIZE
    }
    assert DEFAULT_SERIES.points("gym.server.processes") != {}


def test_module_level_recording_goes_to_the_default_series(metrics_probe):
    target = ServerMemoryTarget("policy", "vllm", 4242)
    record_server_memory(target, ProcessTreeMemory(300, 200, 3), {})
    record_host_memory(HOST, {})
    assert rss_by_name(DEFAULT_SERIES.points("gym.server.memory.usage")) == {"policy": 300}
    assert DEFAULT_SERIES.points("gym.host.memory.sampled_peak") == {frozenset(): 6 * MB}


def test_an_isolated_series_records_only_with_telemetry_on(metrics_probe):
    isolated = ProcessMemorySeries()
    target = ServerMemoryTarget("policy", "vllm", 4242)
    peaks: dict[tuple[str, str], int] = {}
    isolated.record_server_memory(target, ProcessTreeMemory(0, 0, 0), peaks)
    assert isolated.points("gym.server.processes") == {
        frozenset(
            {
                "nemo.gym.server.name": "policy",
                "nemo.gym.server.type": "vllm",
                "process.pid": 4242,
            }.items()
        ): 0
    }
    assert rss_by_name(isolated.points("gym.server.memory.usage")) == {"policy": 0}
    assert metrics_probe.points("gym.server.processes") == {}


def test_recording_with_telemetry_off_leaves_a_series_and_its_peaks_alone():
    isolated = ProcessMemorySeries()
    peaks: dict[str, int] = {}
    isolated.record_host_memory(HOST, peaks)
    assert peaks == {}
    assert isolated.points("gym.host.memory.usage") == {}


def test_reset_clears_the_default_series_only(fake):
    isolated = ProcessMemorySeries()
    policy = ServerMemoryTarget("policy", "vllm", 100, procfs=fake.procfs)
    profiler_on(isolated, fake, policy).sample_once()
    profiler_on(None, fake, policy).sample_once()
    reset_process_memory_state()
    assert DEFAULT_SERIES.points("gym.server.memory.usage") == {}
    assert rss_by_name(isolated.points("gym.server.memory.usage")) == {"policy": 300 * PAGE_SIZE}
    isolated.reset()
    assert isolated.points("gym.server.memory.usage") == {}
    assert isolated.points("gym.host.memory.total") == {}


def test_profilers_on_one_series_share_its_host_points_the_last_sample_wins(fake):
    series = ProcessMemorySeries()
    big = profiler_on(series, fake, host=HOST)
    small = profiler_on(series, fake, host=SMALLER_HOST)
    big.sample_once()
    small.sample_once()
    # The host has one set of points per series: the smaller profiler sampled last, and its
    # own peak (2 MB) replaces the larger one's.
    assert series.points("gym.host.memory.usage") == {frozenset(): 2 * MB}
    assert series.points("gym.host.memory.sampled_peak") == {frozenset(): 2 * MB}


def test_a_collected_profiler_leaves_its_points_in_its_own_series_only(fake):
    first, second = ProcessMemorySeries(), ProcessMemorySeries()
    policy = ServerMemoryTarget("policy", "vllm", 100, procfs=fake.procfs)
    gone = profiler_on(first, fake, policy)
    gone.sample_once()
    kept = profiler_on(second, fake, ServerMemoryTarget("policy", "vllm", 200, procfs=fake.procfs))
    kept.sample_once()
    del gone
    gc.collect()
    # The collected profiler's last word stays in its series; the other series is untouched.
    assert rss_by_name(first.points("gym.server.memory.usage")) == {"policy": 300 * PAGE_SIZE}
    assert rss_by_name(second.points("gym.server.memory.usage")) == {"policy": 40 * PAGE_SIZE}
    # The next entry of that name in the first series replaces it.
    profiler_on(
        first, fake, ServerMemoryTarget("policy", "vllm", 200, procfs=fake.procfs)
    ).sample_once()
    assert first.entry_count() == 1
    assert rss_by_name(first.points("gym.server.memory.usage")) == {"policy": 40 * PAGE_SIZE}


def test_points_of_an_unknown_series_name_is_an_error_naming_the_known_ones():
    with pytest.raises(ValueError, match=r"'gym\.nope'.*gym\.server\.processes"):
        ProcessMemorySeries().points("gym.nope")


def test_after_a_reset_the_default_series_has_set_up_no_meter():
    assert DEFAULT_SERIES.exported_meters() == 0
