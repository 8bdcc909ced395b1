"""Servers come and go: what a profiler holds follows the servers it measures now."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from raylens.telemetry import process_memory as pm
from raylens.telemetry.process_memory import (
    HostMemory,
    MemoryProfiler,
    ProcessTreeMemory,
    ServerMemoryTarget,
)
from raylens_fakes.otel import MetricsProbe
from raylens_fakes.procfs import PAGE_SIZE, FakeProcFS

HOST = HostMemory(used_bytes=6, available_bytes=10, total_bytes=16)
BOUND_S = 10.0  # reached only if something hangs


@pytest.fixture
def fake(tmp_path) -> FakeProcFS:
    fake = FakeProcFS(tmp_path / "proc")
    fake.add_process(100, rss_bytes=30 * PAGE_SIZE)
    fake.add_process(200, rss_bytes=20 * PAGE_SIZE)
    return fake


@pytest.fixture
def probe(raylens_state) -> Any:
    with MetricsProbe() as probe:
        yield probe


def names_exported(probe: MetricsProbe) -> set[str]:
    probe.collect()
    return {
        dict(attributes)["nemo.gym.server.name"]
        for attributes in probe.points("gym.server.processes")
    }


def test_a_removed_server_is_forgotten(probe, fake):
    policy = ServerMemoryTarget("policy", "vllm", 100, procfs=fake.procfs)
    judge = ServerMemoryTarget("judge", "vllm", 200, procfs=fake.procfs)
    profiler = MemoryProfiler(
        [policy, judge], 3600, host_collector=lambda: HOST, procfs=fake.procfs
    )
    profiler.sample_once()
    assert names_exported(probe) == {"policy", "judge"}

    assert profiler.remove_target("judge") is judge
    assert profiler.targets == [policy]
    assert set(profiler._peaks) == {("policy", "rss"), ("policy", "pss")}
    assert set(profiler._pss) <= {"policy"}
    assert names_exported(probe) == {"policy"}  # gone at once, not at the next sample
    profiler.sample_once()
    assert [s.target for s in profiler.latest().servers] == [policy]


def test_an_added_server_is_measured_from_the_next_sample(probe, fake):
    policy = ServerMemoryTarget("policy", "vllm", 100, procfs=fake.procfs)
    profiler = MemoryProfiler([policy], 3600, host_collector=lambda: HOST, procfs=fake.procfs)
    profiler.start()
    try:
        profiler.add_target(ServerMemoryTarget("judge", "vllm", 200, procfs=fake.procfs))
        profiler.sample_once()
        assert names_exported(probe) == {"policy", "judge"}
        judge = [s for s in profiler.latest().servers if s.target.name == "judge"]
        assert judge[0].rss_bytes == 20 * PAGE_SIZE
    finally:
        profiler.stop()


def test_a_restart_is_a_new_target_with_fresh_peaks(probe, fake):
    old = ServerMemoryTarget("policy", "vllm", 100, procfs=fake.procfs)
    profiler = MemoryProfiler([old], 3600, host_collector=lambda: HOST, procfs=fake.procfs)
    profiler.sample_once()
    fake.remove_process(100)
    fake.add_process(300, rss_bytes=5 * PAGE_SIZE)
    profiler.remove_target(old)
    profiler.add_target(ServerMemoryTarget("policy", "vllm", 300, procfs=fake.procfs))
    profiler.sample_once()
    (sample,) = profiler.latest().servers
    assert sample.peak_rss_bytes == 5 * PAGE_SIZE
    probe.collect()
    pids = {dict(a)["process.pid"] for a in probe.points("gym.server.memory.sampled_peak")}
    assert pids == {300}


def test_adding_a_name_already_measured_is_refused(fake):
    policy = ServerMemoryTarget("policy", "vllm", 100, procfs=fake.procfs)
    profiler = MemoryProfiler([policy], 3600, procfs=fake.procfs)
    with pytest.raises(ValueError, match="'policy' is already measured"):
        profiler.add_target(ServerMemoryTarget("policy", "sglang", 200, procfs=fake.procfs))
    with pytest.raises(TypeError, match="ServerMemoryTarget"):
        profiler.add_target(("judge", "vllm", 200))  # type: ignore[arg-type]
    assert profiler.targets == [policy]


def test_removing_a_server_not_measured_names_it(fake):
    policy = ServerMemoryTarget("policy", "vllm", 100, procfs=fake.procfs)
    profiler = MemoryProfiler([policy], 3600, procfs=fake.procfs)
    with pytest.raises(ValueError, match=r"'judge' is not measured.*measured: 'policy'"):
        profiler.remove_target("judge")
    stranger = ServerMemoryTarget("policy", "vllm", 200, procfs=fake.procfs)
    with pytest.raises(ValueError, match="not measured"):
        profiler.remove_target(stranger)  # same name, another process
    assert profiler.targets == [policy]


def test_a_server_removed_while_being_measured_leaves_nothing(probe, fake):
    entered = threading.Event()
    release = threading.Event()

    def collector(pid: int, *, include_pss: bool = True) -> ProcessTreeMemory:
        if pid == 200:
            entered.set()
            release.wait(BOUND_S)
        return ProcessTreeMemory(400, 250, 1)

    policy = ServerMemoryTarget("policy", "vllm", 100, procfs=fake.procfs)
    judge = ServerMemoryTarget("judge", "vllm", 200, procfs=fake.procfs)
    profiler = MemoryProfiler([policy, judge], 3600, collector, lambda: HOST, procfs=fake.procfs)
    sampler = threading.Thread(target=profiler.sample_once, name="raylens-test-sampler")
    sampler.start()
    try:
        assert entered.wait(BOUND_S)
        profiler.remove_target(judge)
    finally:
        release.set()
        sampler.join(BOUND_S)
    assert not sampler.is_alive()
    assert [s.target for s in profiler.latest().servers] == [policy]
    assert {key[0] for key in profiler._peaks} == {"policy"}
    assert names_exported(probe) == {"policy"}


def test_a_new_server_of_a_removed_name_warns_again(fake, caplog):
    def broken(pid: int, *, include_pss: bool = True) -> ProcessTreeMemory:
        raise OSError("scripted")

    policy = ServerMemoryTarget("policy", "vllm", 100, procfs=fake.procfs)
    profiler = MemoryProfiler([policy], 3600, broken, lambda: HOST, procfs=fake.procfs)
    with caplog.at_level(logging.WARNING, logger="raylens"):
        profiler.sample_once()
        profiler.sample_once()
        profiler.remove_target(policy)
        profiler.add_target(ServerMemoryTarget("policy", "vllm", 200, procfs=fake.procfs))
        profiler.sample_once()
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 2
    assert "pid 100" in warned[0] and "pid 200" in warned[1]


def test_exported_state_follows_the_live_servers_of_every_profiler(probe, fake):
    policy = ServerMemoryTarget("policy", "vllm", 100, procfs=fake.procfs)
    profiler = MemoryProfiler([policy], 3600, host_collector=lambda: HOST, procfs=fake.procfs)
    profiler.sample_once()
    profiler.remove_target(policy)
    assert pm.DEFAULT_SERIES.entry_count() == 0
