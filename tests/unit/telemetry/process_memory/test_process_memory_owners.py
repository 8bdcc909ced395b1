"""Sample statuses as an enum, and the exported points of several profilers side by side."""

from __future__ import annotations

import enum
import gc
import json

import pytest
from process_memory_values import HOST

from raylens.telemetry import process_memory as pm
from raylens.telemetry.process_memory import (
    MemoryProfiler,
    ProcessTreeMemory,
    SampleStatus,
    ServerMemoryTarget,
    record_server_memory,
)
from raylens.telemetry.process_memory._profiler import EXITED, FAILED, LIVE, REUSED
from raylens_fakes.procfs import PAGE_SIZE, FakeProcFS

# Each collection here walks only what the test made.
pytestmark = pytest.mark.usefixtures("young_heap")


def pid_of(key: frozenset) -> int:
    return dict(key)["process.pid"]


@pytest.fixture
def fake(two_servers: FakeProcFS) -> FakeProcFS:
    return two_servers


def profiler_of(fake: FakeProcFS, *targets: ServerMemoryTarget) -> MemoryProfiler:
    return MemoryProfiler(list(targets), 3600, host_collector=lambda: HOST, procfs=fake.procfs)


def rss_by_pid(probe) -> dict[int, float]:
    return {
        pid_of(key): value
        for key, value in probe.points("gym.server.memory.usage").items()
        if dict(key)["memory.type"] == "rss"
    }


# ---------------------------------------------------------------- statuses


def test_statuses_are_a_str_enum_equal_to_the_old_strings() -> None:
    assert issubclass(SampleStatus, str)
    assert issubclass(SampleStatus, enum.Enum)
    assert [status.value for status in SampleStatus] == ["live", "exited", "reused", "failed"]
    assert (LIVE, EXITED, REUSED, FAILED) == (
        SampleStatus.LIVE,
        SampleStatus.EXITED,
        SampleStatus.REUSED,
        SampleStatus.FAILED,
    )
    assert LIVE is SampleStatus.LIVE
    assert LIVE == "live" and EXITED == "exited" and REUSED == "reused" and FAILED == "failed"
    assert {"live": 1}[LIVE] == 1
    assert SampleStatus("exited") is EXITED


def test_statuses_print_and_serialise_as_their_value() -> None:
    assert str(REUSED) == "reused"
    assert f"{FAILED}" == "failed"
    assert f"{LIVE:>6}" == "  live"
    assert json.dumps({"status": EXITED}) == '{"status": "exited"}'


def test_samples_carry_the_enum(fake) -> None:
    policy = ServerMemoryTarget("policy", "vllm", 100, procfs=fake.procfs)
    profiler = profiler_of(fake, policy)
    profiler.sample_once()
    assert profiler.latest().servers[0].status is SampleStatus.LIVE
    fake.remove_process(100)
    profiler.sample_once()
    assert profiler.latest().servers[0].status is SampleStatus.EXITED


def test_statuses_are_public_names() -> None:
    assert "SampleStatus" in pm.__all__


# ---------------------------------------------------------------- several profilers


def test_two_profilers_measuring_one_name_both_export(metrics_probe, fake) -> None:
    first = profiler_of(fake, ServerMemoryTarget("policy", "vllm", 100, procfs=fake.procfs))
    second = profiler_of(fake, ServerMemoryTarget("policy", "vllm", 200, procfs=fake.procfs))
    first.sample_once()
    second.sample_once()
    first.sample_once()
    assert rss_by_pid(metrics_probe) == {100: 300 * PAGE_SIZE, 200: 40 * PAGE_SIZE}
    processes = metrics_probe.points("gym.server.processes")
    assert {pid_of(key): value for key, value in processes.items()} == {100: 1, 200: 1}


def test_removing_a_server_from_one_profiler_keeps_the_others_points(metrics_probe, fake) -> None:
    mine = ServerMemoryTarget("policy", "vllm", 100, procfs=fake.procfs)
    first = profiler_of(fake, mine)
    second = profiler_of(fake, ServerMemoryTarget("policy", "vllm", 200, procfs=fake.procfs))
    second.sample_once()
    first.sample_once()
    first.remove_target(mine)
    assert rss_by_pid(metrics_probe) == {200: 40 * PAGE_SIZE}


def test_a_gone_profilers_points_stay_until_their_name_is_published_again(
    metrics_probe, fake
) -> None:
    first = profiler_of(fake, ServerMemoryTarget("policy", "vllm", 100, procfs=fake.procfs))
    second = profiler_of(fake, ServerMemoryTarget("policy", "vllm", 200, procfs=fake.procfs))
    second.sample_once()
    first.sample_once()
    del first
    gc.collect()
    # Its last sample is still exported (a profiler dropped right after stop() keeps its
    # final points), alongside the live profiler's.
    assert rss_by_pid(metrics_probe) == {100: 300 * PAGE_SIZE, 200: 40 * PAGE_SIZE}
    second.sample_once()
    assert rss_by_pid(metrics_probe) == {200: 40 * PAGE_SIZE}
    assert pm.DEFAULT_SERIES.entry_count() == 1


def test_profilers_that_come_and_go_hold_one_entry_per_name(metrics_probe, fake) -> None:
    policy = ServerMemoryTarget("policy", "vllm", 100, procfs=fake.procfs)
    for _ in range(5):  # one entry each would already be five
        profiler_of(fake, policy).sample_once()
        gc.collect()
    assert pm.DEFAULT_SERIES.entry_count() == 1
    assert len(pm.DEFAULT_SERIES._orphans) <= 1
    assert rss_by_pid(metrics_probe) == {100: 300 * PAGE_SIZE}


def test_one_server_in_two_profilers_exports_its_latest_sample_once(metrics_probe, fake) -> None:
    policy = ServerMemoryTarget("policy", "vllm", 100, procfs=fake.procfs)
    first, second = profiler_of(fake, policy), profiler_of(fake, policy)
    first.sample_once()
    fake.add_process(101, parent=100, rss_bytes=100 * PAGE_SIZE, pss_bytes=50 * PAGE_SIZE)
    second.sample_once()
    assert rss_by_pid(metrics_probe) == {100: 400 * PAGE_SIZE}
    fake.remove_process(101)
    first.sample_once()
    assert rss_by_pid(metrics_probe) == {100: 300 * PAGE_SIZE}
    # Each profiler keeps its own peak; the one sampled last is exported.
    peaks = metrics_probe.points("gym.server.memory.sampled_peak")
    assert {dict(k)["memory.type"]: v for k, v in peaks.items()}["rss"] == 300 * PAGE_SIZE


def test_recording_outside_a_profiler_keeps_the_profilers_points(metrics_probe, fake) -> None:
    profiler = profiler_of(fake, ServerMemoryTarget("policy", "vllm", 100, procfs=fake.procfs))
    profiler.sample_once()
    other = ServerMemoryTarget("policy", "vllm", 200, procfs=fake.procfs)
    record_server_memory(other, ProcessTreeMemory(7 * PAGE_SIZE, None, 1), {})
    assert rss_by_pid(metrics_probe) == {100: 300 * PAGE_SIZE, 200: 7 * PAGE_SIZE}
