"""Sample statuses as an enum."""

from __future__ import annotations

import enum
import json

import pytest

from raylens.telemetry import process_memory as pm
from raylens.telemetry.process_memory import (
    EXITED,
    FAILED,
    LIVE,
    REUSED,
    HostMemory,
    MemoryProfiler,
    SampleStatus,
    ServerMemoryTarget,
)
from raylens_fakes.procfs import PAGE_SIZE, FakeProcFS

MB = 2**20
HOST = HostMemory(used_bytes=6 * MB, available_bytes=10 * MB, total_bytes=16 * MB)


def pid_of(key: frozenset) -> int:
    return dict(key)["process.pid"]


@pytest.fixture
def fake(tmp_path) -> FakeProcFS:
    fake = FakeProcFS(tmp_path / "proc")
    fake.add_process(100, rss_bytes=300 * PAGE_SIZE, pss_bytes=200 * PAGE_SIZE)
    fake.add_process(200, rss_bytes=40 * PAGE_SIZE, pss_bytes=30 * PAGE_SIZE)
    return fake


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
