"""The GPU reading a bundle probe prints, with a scripted NVML instead of a device."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

from raylens.distributed import gpu_state


@dataclass
class FakeNvml:
    count: int = 2
    used: int = 3 * 1024**3
    total: int = 80 * 1024**3
    processes: list[Any] | None = None
    init_error: Exception | None = None
    read_error: Exception | None = None
    shutdowns: int = 0

    def nvmlInit(self) -> None:
        if self.init_error:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if self.read_error:
            raise self.read_error
        return index

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return b"NVIDIA H200"

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(used=self.used, total=self.total)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Any]:
        return self.processes or []


def describe(nvml: Any, local_rank: int = 1, devices: list[str] | None = None) -> str:
    return gpu_state._describe_gpu_state(
        "restart", local_rank, node="10.0.0.5 (abc)", nvml=nvml, nvidia_devices=devices
    )


def test_reads_memory_and_processes() -> None:
    nvml = FakeNvml(processes=[SimpleNamespace(pid=42, usedGpuMemory=2 * 1024**3)])
    text = describe(nvml, devices=["nvidia0", "nvidia1"])
    assert text.startswith("[restart] node 10.0.0.5 (abc), local rank 1:")
    assert "GPU 1 (NVIDIA H200) memory used 3072 MiB of 81920 MiB" in text
    assert "pid 42 2048 MiB" in text
    assert nvml.shutdowns == 1


def test_idle_device() -> None:
    assert "no compute processes" in describe(FakeNvml())


def test_process_memory_unavailable() -> None:
    nvml = FakeNvml(processes=[SimpleNamespace(pid=7, usedGpuMemory=None)])
    assert "pid 7 (memory n/a)" in describe(nvml)


def test_local_rank_beyond_device_count() -> None:
    assert "has 2 GPU(s), none with index 5" in describe(FakeNvml(), local_rank=5)


def test_no_device_seen_by_nvml() -> None:
    assert "no GPU on this node" in describe(FakeNvml(count=0))


def test_nvml_cannot_start_on_a_cpu_node() -> None:
    text = describe(FakeNvml(init_error=RuntimeError("driver not loaded")), devices=[])
    assert "no GPU on this node" in text and "driver not loaded" in text


def test_nvml_cannot_start_with_devices_present() -> None:
    text = describe(FakeNvml(init_error=RuntimeError("version mismatch")), devices=["nvidia0"])
    assert "NVML could not start: version mismatch" in text


def test_read_failure_is_reported_and_nvml_shut_down() -> None:
    nvml = FakeNvml(read_error=RuntimeError("GPU is lost"))
    assert "failed: GPU is lost" in describe(nvml)
    assert nvml.shutdowns == 1


def test_without_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail
    no_gpu = gpu_state._describe_gpu_state("x", 0, node="n", nvidia_devices=[])
    assert "no GPU on this node" in no_gpu
    with_devices = gpu_state._describe_gpu_state("x", 0, node="n", nvidia_devices=["nvidia0"])
    assert "1 NVIDIA device(s) but pynvml is not installed" in with_devices


def test_log_gpu_state_prints_the_reading(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setattr(gpu_state.os, "listdir", lambda path: [])
    # Outside a Ray worker the node is reported as unknown rather than failing.
    monkeypatch.setitem(sys.modules, "ray", None)
    gpu_state._log_gpu_state_on_bundle("before-restart", 0)
    out = capsys.readouterr().out
    assert out.startswith("[before-restart] node (unknown), local rank 0: no GPU on this node")
