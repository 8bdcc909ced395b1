"""What the GPU behind a worker's bundle is doing, read on the node that holds it.

Before a worker is restarted, the useful question is whether its device is still
occupied, and by whom: a replacement cannot start while the old process holds the
memory. Only the node that owns the GPU can answer, so the reading is a small Ray task
pinned to the worker's bundle (see
:meth:`~raylens.distributed.worker_groups.RayWorkerGroup.log_worker_gpu_state`). It
asks for no GPU itself, so it is never queued behind the very process it is meant to
observe, and it prints one line that Ray forwards to the driver's output.

:func:`_describe_gpu_state` turns an NVML reading (``pynvml``) into that line and is
given its NVML module and device list in tests; :func:`_log_gpu_state_on_bundle` is the
task body; :func:`_remote_log_gpu_state` is its Ray remote form, kept by a
:class:`~raylens.distributed.ray_seam.RaySeam`. Ray is imported only when the
task runs or is built, so this module imports where Ray is not installed.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from typing import Any, Protocol

from raylens.cluster import ray_call_errors
from raylens.distributed.ray_seam import DEFAULT_RAY_SEAM, RaySeam

__all__ = ["reset_remote_function_cache"]


class _MemoryInfo(Protocol):
    @property
    def used(self) -> int: ...
    @property
    def total(self) -> int: ...


class _ComputeProcess(Protocol):
    """A process on a GPU; its ``usedGpuMemory`` is an int, or None (or absent) when unknown."""

    @property
    def pid(self) -> int: ...


class _Nvml(Protocol):
    """The part of ``pynvml`` the reading uses (a module or a test's stand-in)."""

    def nvmlInit(self) -> object: ...
    def nvmlShutdown(self) -> object: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int, /) -> object: ...
    def nvmlDeviceGetName(self, handle: object, /) -> str | bytes: ...
    def nvmlDeviceGetMemoryInfo(self, handle: object, /) -> _MemoryInfo: ...
    def nvmlDeviceGetComputeRunningProcesses(
        self, handle: object, /
    ) -> Sequence[_ComputeProcess]: ...


def _nvml_errors(nvml: object, *also: type[Exception]) -> tuple[type[Exception], ...]:
    """What an NVML call raises: ``pynvml``'s ``NVMLError`` (a stand-in's RuntimeError), and
    OSError when its shared library cannot be loaded; then ``also``."""
    found = getattr(nvml, "NVMLError", None)
    named = (found,) if isinstance(found, type) and issubclass(found, Exception) else ()
    return (*named, RuntimeError, OSError, *also)


def reset_remote_function_cache() -> None:
    """Forget the Ray remote definitions of the default seam, the probe's among them."""
    DEFAULT_RAY_SEAM.reset()


def _describe_gpu_state(
    label: str,
    local_rank: int,
    *,
    node: str,
    nvml: _Nvml | None = None,
    nvidia_devices: Sequence[str] | None = None,
) -> str:
    """A one-paragraph reading of GPU ``local_rank`` on this node, taken through NVML.

    ``nvml`` is the ``pynvml`` module (imported here when None); ``nvidia_devices``
    lists the ``/dev/nvidia<N>`` device files (read from ``/dev`` when None), used to
    tell "no GPU here" from "NVML is not installed".
    """
    prefix = f"[{label}] node {node}, local rank {local_rank}:"
    if nvidia_devices is None:
        try:
            nvidia_devices = [
                name
                for name in os.listdir("/dev")
                if name.startswith("nvidia") and name[6:].isdigit()
            ]
        except OSError:
            nvidia_devices = []
    if nvml is None:
        try:
            import pynvml
        except ImportError:
            if not nvidia_devices:
                return f"{prefix} no GPU on this node (no NVIDIA device, NVML not installed)"
            return (
                f"{prefix} the node has {len(nvidia_devices)} NVIDIA device(s) but pynvml is "
                "not installed, so their state cannot be read"
            )
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except _nvml_errors(nvml) as error:
        if not nvidia_devices:
            return f"{prefix} no GPU on this node (NVML: {error})"
        return f"{prefix} NVML could not start: {error}"
    try:
        count = int(nvml.nvmlDeviceGetCount())
        if count == 0:
            return f"{prefix} no GPU on this node (NVML sees no device)"
        if not 0 <= local_rank < count:
            return f"{prefix} the node has {count} GPU(s), none with index {local_rank}"
        handle = nvml.nvmlDeviceGetHandleByIndex(local_rank)
        name = nvml.nvmlDeviceGetName(handle)
        if isinstance(name, bytes):
            name = name.decode(errors="replace")
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        mib = 1024 * 1024
        text = (
            f"{prefix} GPU {local_rank} ({name}) memory used {memory.used // mib} MiB of "
            f"{memory.total // mib} MiB"
        )
        try:
            processes = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except _nvml_errors(nvml) as error:
            return f"{text}; processes unreadable ({error})"
        if not processes:
            return f"{text}; no compute processes"
        held = ", ".join(_process_text(proc) for proc in processes)
        return f"{text}; compute processes: {held}"
    except _nvml_errors(nvml, ValueError, TypeError) as error:  # and a malformed answer
        return f"{prefix} reading GPU {local_rank} through NVML failed: {error}"
    finally:
        with contextlib.suppress(*_nvml_errors(nvml)):
            nvml.nvmlShutdown()


def _process_text(proc: _ComputeProcess) -> str:
    used = getattr(proc, "usedGpuMemory", None)
    memory = f"{used // (1024 * 1024)} MiB" if isinstance(used, int) else "(memory n/a)"
    return f"pid {proc.pid} {memory}"


def _log_gpu_state_on_bundle(label: str, local_rank: int) -> None:
    """Print the state of GPU ``local_rank`` as seen from the node this runs on.

    Runs as a Ray task pinned to a worker's bundle (see
    :meth:`RayWorkerGroup.log_worker_gpu_state`); the text goes to that node's worker
    log, which Ray forwards to the driver. The task asks for no GPU on purpose: it is
    placed by bundle, and requesting the device would queue it behind whatever still
    holds the GPU, which is exactly what it is meant to observe.
    """
    try:
        import ray

        context = ray.get_runtime_context()
        node = f"{ray.util.get_node_ip_address()} ({context.get_node_id()[:12]})"
    except ray_call_errors(None, ImportError, AttributeError):
        node = "(unknown)"
    print(_describe_gpu_state(label, local_rank, node=node), flush=True)


def _remote_log_gpu_state(seam: RaySeam | None = None) -> Any:
    """The Ray remote version of :func:`_log_gpu_state_on_bundle`, built once per seam.

    Building it inside the method that dispatches it would register a new remote
    function with the GCS on every call.
    """
    return (seam or DEFAULT_RAY_SEAM).remote(
        "log_gpu_state",
        lambda ray: ray.remote(num_cpus=0, num_gpus=0, max_retries=0)(_log_gpu_state_on_bundle),
    )
