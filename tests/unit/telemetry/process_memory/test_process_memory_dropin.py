"""process_memory's drop-in seams: what NeMo-Gym's tests patch and install must keep working.

NeMo-Gym's tests replace the facade's module-level recording functions with
``monkeypatch.setattr`` and install, as the process's telemetry handle, a plain object
holding only ``is_exporting`` and ``meter``. Both must reach the profiler as they do there.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from process_memory_values import HOST, MB

from raylens.lens import runtime
from raylens.telemetry import process_memory as process_memory_module
from raylens.telemetry.process_memory import (
    MemoryProfiler,
    ProcessTreeMemory,
    ServerMemoryTarget,
    record_host_memory,
    record_server_memory,
)
from raylens_fakes.procfs import PAGE_SIZE, FakeProcFS


@pytest.fixture
def fake(tmp_path) -> FakeProcFS:
    fake = FakeProcFS(tmp_path / "proc")
    fake.add_process(100, rss_bytes=300 * PAGE_SIZE, pss_bytes=200 * PAGE_SIZE)
    return fake


def _profiler(fake: FakeProcFS, *targets: ServerMemoryTarget) -> MemoryProfiler:
    return MemoryProfiler(list(targets), 3600, host_collector=lambda: HOST, procfs=fake.procfs)


# ------------------------------------------------------------ patched recording functions


def test_sample_once_calls_the_recording_functions_patched_on_the_facade(
    raylens_state, monkeypatch, fake, policy
):
    server_calls: list[tuple[Any, ...]] = []
    host_calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(
        process_memory_module,
        "record_server_memory",
        lambda target, memory, peaks: server_calls.append((target, memory, peaks)),
    )
    monkeypatch.setattr(
        process_memory_module,
        "record_host_memory",
        lambda memory, peaks: host_calls.append((memory, peaks)),
    )

    _profiler(fake, policy).sample_once()

    assert [(target, memory) for target, memory, _peaks in server_calls] == [
        (policy, ProcessTreeMemory(300 * PAGE_SIZE, 200 * PAGE_SIZE, 1))
    ]
    assert [memory for memory, _peaks in host_calls] == [HOST]


def test_the_profiler_passes_its_own_peaks_to_the_patched_functions(
    raylens_state, monkeypatch, fake, policy
):
    seen: list[dict[Any, int]] = []
    monkeypatch.setattr(
        process_memory_module,
        "record_server_memory",
        lambda target, memory, peaks: seen.append(dict(peaks)),
    )
    profiler = _profiler(fake, policy)

    profiler.sample_once()
    fake.set_memory(100, rss_bytes=100 * PAGE_SIZE, pss_bytes=50 * PAGE_SIZE)
    profiler.sample_once()

    # The peaks already include the sample being recorded, as upstream's do after the call.
    assert seen[-1] == {("policy", "rss"): 300 * PAGE_SIZE, ("policy", "pss"): 200 * PAGE_SIZE}
    assert profiler.latest().servers[0].peak_rss_bytes == 300 * PAGE_SIZE


def test_a_patched_function_that_raises_costs_only_that_sample(
    raylens_state, monkeypatch, fake, policy
):
    def broken(*_args: Any) -> None:
        raise RuntimeError("exporter is down")

    monkeypatch.setattr(process_memory_module, "record_server_memory", broken)
    monkeypatch.setattr(process_memory_module, "record_host_memory", broken)
    profiler = _profiler(fake, policy)

    profiler.sample_once()

    assert profiler.latest().servers[0].rss_bytes == 300 * PAGE_SIZE
    assert profiler.latest().host == HOST


# ------------------------------------------------------------ a handle with only a meter


def _points(reader: InMemoryMetricReader) -> dict[str, dict[frozenset, Any]]:
    data = reader.get_metrics_data()
    found: dict[str, dict[frozenset, Any]] = {}
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found[metric.name] = {
                    frozenset((point.attributes or {}).items()): point.value
                    for point in metric.data.data_points
                }
    return found


@pytest.fixture
def plain_handle(raylens_state, monkeypatch) -> InMemoryMetricReader:
    """A handle with only ``is_exporting`` and ``meter``, installed as NeMo-Gym's tests do."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    handle = SimpleNamespace(is_exporting=True, meter=provider.get_meter("test"))
    monkeypatch.setattr(runtime, "_HANDLE", handle)
    yield reader
    provider.shutdown()


def test_a_handle_with_only_a_meter_is_enough_to_record(plain_handle, policy):
    peaks: dict[tuple[str, str], int] = {}
    record_server_memory(policy, ProcessTreeMemory(300, 200, 3), peaks)
    record_host_memory(HOST, {})

    points = _points(plain_handle)

    server = {
        "nemo.gym.server.name": "policy",
        "nemo.gym.server.type": "vllm",
        "process.pid": 100,
    }
    assert points["gym.server.memory.usage"] == {
        frozenset({**server, "memory.type": "rss"}.items()): 300,
        frozenset({**server, "memory.type": "pss"}.items()): 200,
    }
    assert points["gym.server.processes"] == {frozenset(server.items()): 3}
    assert points["gym.host.memory.usage"] == {frozenset(): 6 * MB}
    assert peaks == {("policy", "rss"): 300, ("policy", "pss"): 200}


def test_a_profiler_records_on_a_handle_with_only_a_meter(plain_handle, fake, policy):
    _profiler(fake, policy).sample_once()
    _profiler(fake, policy).sample_once()  # a second profiler: no second set of instruments

    points = _points(plain_handle)

    assert sum(points["gym.server.processes"].values()) == 1
    assert points["gym.host.memory.total"] == {frozenset(): 16 * MB}
