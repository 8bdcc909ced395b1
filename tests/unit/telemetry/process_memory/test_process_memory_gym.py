"""process_memory as a drop-in for NeMo-Gym's memory profiler: series, gone trees, lifecycle.

Series are read through :class:`MetricsProbe` by the attribute names NeMo-Gym exports, so a
dashboard built on NeMo-Gym's points finds raylens' points unchanged.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from process_memory_values import HOST, MB

from raylens.telemetry import process_memory as pm
from raylens.telemetry.process_memory import (
    MemoryProfiler,
    ProcessTreeMemory,
    ServerMemoryTarget,
    _profiler_series,
    collect_process_tree_memory,
    record_host_memory,
    record_server_memory,
)
from raylens_fakes.otel import MetricsProbe
from raylens_fakes.procfs import PAGE_SIZE, FakeProcFS


def gym_point(name: str, server_type: str, pid: int, memory_type: str | None = None) -> frozenset:
    attributes: dict[str, Any] = {
        "nemo.gym.server.name": name,
        "nemo.gym.server.type": server_type,
        "process.pid": pid,
    }
    if memory_type is not None:
        attributes["memory.type"] = memory_type
    return frozenset(attributes.items())


@pytest.fixture
def probe(raylens_state) -> Any:
    with MetricsProbe() as probe:
        yield probe


def profiler_for(fake: FakeProcFS, *targets: ServerMemoryTarget, **options: Any) -> MemoryProfiler:
    options.setdefault("host_collector", lambda: HOST)
    return MemoryProfiler(list(targets), 3600, procfs=fake.procfs, **options)


# ---------------------------------------------------------------- attribute names


def test_server_points_carry_nemo_gym_attribute_names(probe, policy):
    record_server_memory(policy, ProcessTreeMemory(300, 200, 3), {})
    probe.collect()
    assert probe.points("gym.server.memory.usage") == {
        gym_point("policy", "vllm", 100, "rss"): 300,
        gym_point("policy", "vllm", 100, "pss"): 200,
    }
    assert probe.points("gym.server.memory.sampled_peak") == {
        gym_point("policy", "vllm", 100, "rss"): 300,
        gym_point("policy", "vllm", 100, "pss"): 200,
    }
    assert probe.points("gym.server.processes") == {gym_point("policy", "vllm", 100): 3}


def test_profiled_tree_is_exported_under_nemo_gym_names(probe, fake, policy):
    profiler_for(fake, policy).sample_once()
    probe.collect()
    assert probe.points("gym.server.memory.usage") == {
        gym_point("policy", "vllm", 100, "rss"): 400 * PAGE_SIZE,
        gym_point("policy", "vllm", 100, "pss"): 250 * PAGE_SIZE,
    }


# ---------------------------------------------------------------- gone trees


def test_tree_of_a_gone_root_is_empty_with_known_pss(fake):
    assert collect_process_tree_memory(4242, procfs=fake.procfs) == ProcessTreeMemory(0, 0, 0)


def test_unreadable_pss_stays_unknown(fake):
    fake.deny(101, "smaps_rollup")
    memory = collect_process_tree_memory(100, procfs=fake.procfs)
    assert (memory.rss_bytes, memory.pss_bytes, memory.process_count) == (
        400 * PAGE_SIZE,
        None,
        2,
    )


def test_gone_tree_reports_zero_processes_and_zero_rss(probe, policy):
    peaks: dict = {}
    record_server_memory(policy, ProcessTreeMemory(300, 200, 3), peaks)
    record_server_memory(policy, ProcessTreeMemory(0, 0, 0), peaks)
    probe.collect()
    assert probe.points("gym.server.processes") == {gym_point("policy", "vllm", 100): 0}
    usage = probe.points("gym.server.memory.usage")
    assert usage[gym_point("policy", "vllm", 100, "rss")] == 0
    assert usage[gym_point("policy", "vllm", 100, "pss")] == 0
    assert probe.points("gym.server.memory.sampled_peak") == {
        gym_point("policy", "vllm", 100, "rss"): 300,
        gym_point("policy", "vllm", 100, "pss"): 200,
    }


def test_unknown_pss_has_no_point(probe, policy):
    record_server_memory(policy, ProcessTreeMemory(0, None, 0), {})
    probe.collect()
    assert probe.points("gym.server.memory.usage") == {gym_point("policy", "vllm", 100, "rss"): 0}
    assert probe.points("gym.server.processes") == {gym_point("policy", "vllm", 100): 0}


@pytest.mark.parametrize("how", ["exited", "reused"])
def test_profiled_server_whose_tree_is_gone_still_reports(probe, fake, policy, how):
    profiler = profiler_for(fake, policy)
    profiler.sample_once()
    if how == "exited":
        fake.remove_process(101)
        fake.remove_process(100)
    else:
        fake.reuse_pid(100)
    profiler.sample_once()
    assert profiler.latest().servers[0].status == how
    probe.collect()
    assert probe.points("gym.server.processes") == {gym_point("policy", "vllm", 100): 0}
    usage = probe.points("gym.server.memory.usage")
    assert usage[gym_point("policy", "vllm", 100, "rss")] == 0


# ---------------------------------------------------------------- lifecycle


def test_start_on_a_running_profiler_does_nothing(fake, policy):
    calls: list[int] = []

    def collector(pid: int, *, include_pss: bool = True) -> ProcessTreeMemory:
        calls.append(pid)
        return ProcessTreeMemory(400, 250, 2)

    profiler = profiler_for(fake, policy, collector=collector)
    profiler.start()
    try:
        thread = profiler._thread
        peaks = dict(profiler._peaks)
        profiler.start()
        assert profiler._thread is thread
        assert calls == [100]  # no second first-sample
        assert profiler._peaks == peaks
    finally:
        profiler.stop()
    profiler.stop()
    assert len(calls) == 2
    assert not profiler.is_running


# ---------------------------------------------------------------- a broken meter


class _BreakableMeter:
    """Wraps a real meter; while ``broken``, creating any ``gym.*`` instrument raises."""

    def __init__(self, meter: Any) -> None:
        self._meter = meter
        self.broken = True
        self.attempts = 0

    def create_observable_gauge(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("gym."):
            self.attempts += 1
            if self.broken:
                raise RuntimeError("exporter queue is full")
        return self._meter.create_observable_gauge(name, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._meter, name)


@pytest.fixture
def breakable(monkeypatch, raylens_state) -> Any:
    made: list[_BreakableMeter] = []
    real_get_meter = MeterProvider.get_meter

    def get_meter(self: MeterProvider, *args: Any, **kwargs: Any) -> _BreakableMeter:
        made.append(_BreakableMeter(real_get_meter(self, *args, **kwargs)))
        return made[-1]

    monkeypatch.setattr(MeterProvider, "get_meter", get_meter)
    with MetricsProbe() as probe:
        probe.meter = made[-1]
        yield probe


def test_a_meter_that_cannot_create_instruments_costs_only_that_samples_points(
    breakable, fake, policy, caplog
):
    with caplog.at_level(logging.WARNING, logger="raylens"):
        peaks: dict = {}
        record_server_memory(policy, ProcessTreeMemory(300, 200, 3), peaks)
        record_host_memory(HOST, {})
        profiler = profiler_for(fake, policy)
        profiler.start()
        profiler.sample_once()
        profiler.stop()
    assert breakable.meter.attempts >= 1
    assert peaks == {("policy", "rss"): 300, ("policy", "pss"): 200}
    latest = profiler.latest()
    assert latest.host == HOST  # the host values of the sample are kept
    assert latest.servers[0].rss_bytes == 400 * PAGE_SIZE
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]

    breakable.meter.broken = False
    profiler.sample_once()
    breakable.collect()
    assert breakable.points("gym.server.processes") == {gym_point("policy", "vllm", 100): 2}
    assert breakable.points("gym.host.memory.usage") == {frozenset(): 6 * MB}


def test_a_failing_registration_never_reaches_the_caller(probe, monkeypatch, policy, caplog):
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise ValueError("metric already declared differently")

    monkeypatch.setattr(_profiler_series, "register_observable_gauge", refuse)
    pm.reset_process_memory_state()
    with caplog.at_level(logging.WARNING, logger="raylens"):
        record_server_memory(policy, ProcessTreeMemory(300, 200, 3), {})
        record_host_memory(HOST, {})
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


# ---------------------------------------------------------------- telemetry off


def test_without_a_handle_recording_is_a_no_op(raylens_state, policy):
    peaks = {("policy", "rss"): 7}
    host_peaks = {"used": 1}
    record_server_memory(policy, ProcessTreeMemory(300, 200, 3), peaks)
    record_host_memory(HOST, host_peaks)
    assert peaks == {("policy", "rss"): 7}
    assert host_peaks == {"used": 1}
    with MetricsProbe() as probe:
        probe.collect()
        assert probe.points("gym.server.processes") == {}
        assert probe.points("gym.host.memory.usage") == {}


def test_profiler_keeps_its_own_peaks_without_a_handle(raylens_state, fake, policy):
    profiler = profiler_for(fake, policy)
    profiler.sample_once()
    sample = profiler.latest().servers[0]
    assert sample.peak_rss_bytes == 400 * PAGE_SIZE
    assert profiler.latest().host_peak_used_bytes == 6 * MB


# ---------------------------------------------------------------- targets


def test_target_is_a_frozen_hashable_dataclass(fake, policy):
    assert dataclasses.is_dataclass(ServerMemoryTarget)
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.pid = 5  # type: ignore[misc]
    same = ServerMemoryTarget("policy", "vllm", 100, procfs=fake.procfs)
    assert {policy: 1}[same] == 1
    assert len({policy, same, ServerMemoryTarget("other", "vllm", 100)}) == 2


def test_names_with_lone_surrogates_are_made_encodable(probe, fake):
    target = ServerMemoryTarget("\udcffprog", "com\ud800mand", 100, procfs=fake.procfs)
    assert target.name == "\ufffdprog"
    assert target.server_type == "com\ufffdmand"
    record_server_memory(target, ProcessTreeMemory(300, 200, 3), {})
    probe.collect()
    assert probe.points("gym.server.processes") == {
        gym_point("\ufffdprog", "com\ufffdmand", 100): 3
    }


# ---------------------------------------------------------------- module surface


def test_a_tree_is_read_through_the_module_seams_tests_replace(monkeypatch):
    monkeypatch.setattr(pm, "_descendant_pids", lambda root_pid: {1, 2, 3})
    memory = {1: (10, 5), 2: (20, 7), 3: None}  # 3 exited between the walk and the read
    monkeypatch.setattr(pm, "_read_process_memory", lambda pid: memory[pid])
    assert collect_process_tree_memory(1) == ProcessTreeMemory(30, 12, 2)
    memory[2] = (20, None)
    assert collect_process_tree_memory(1) == ProcessTreeMemory(30, None, 2)


@pytest.mark.slow
def test_importing_creates_no_instrument(declared_on_import: Callable[..., list[str]]):
    assert declared_on_import("raylens.telemetry.process_memory", prefix="gym.") == []


def test_every_module_stays_small():
    import raylens.telemetry.process_memory._profiler as profiler_module
    import raylens.telemetry.procfs as procfs_module

    for module in (pm, procfs_module, profiler_module, _profiler_series):
        with open(module.__file__, encoding="utf-8") as source:
            assert sum(1 for _ in source) < 600, module.__name__
