"""Memory of managed server process trees (RSS, PSS, sampled peaks) and of the host.

A managed server is a root process plus everything it forked: worker pools,
tokenizer subprocesses, model runners. :class:`MemoryProfiler` samples each
server's whole tree on a background thread and exports the result through lens
observable gauges, alongside host memory from psutil.

This module is the public face; the work is done in three private modules:
:mod:`~raylens.telemetry.procfs` reads procfs and psutil (how a tree is walked
and read is described there), :mod:`~raylens.telemetry.process_memory._profiler` schedules the
samples, and :mod:`~raylens.telemetry.process_memory._profiler_series` exports them. Every name
below is importable from here.

PSS is costly: to compute it the kernel walks the process's page tables while
holding its mmap lock, which takes milliseconds per resident gigabyte (seconds
for a process holding hundreds of gigabytes) and holds up the process's own
page faults meanwhile. ``MemoryProfiler(pss_interval_seconds=...)`` therefore reads
PSS less often than RSS; in between, RSS comes from ``statm`` alone (which never
touches ``smaps_rollup``) and the last PSS is reported with its age.

Exported series (unit ``By`` unless noted), each server point carrying
``nemo.gym.server.name``, ``nemo.gym.server.type`` and ``process.pid``, the
attributes NeMo-Gym's profiler exports, so dashboards built on it keep working:

- ``gym.server.memory.usage`` and ``gym.server.memory.sampled_peak``, with
  ``memory.type`` = ``rss`` or ``pss``;
- ``gym.server.processes`` (unit ``{process}``);
- ``gym.host.memory.usage``, ``.available``, ``.total`` and ``.sampled_peak``.

A tree that is gone holds nothing and says so: ``gym.server.processes`` 0 and
memory 0, so an alert on a server with no processes fires. A value that is not
known at the latest sample (a PSS that could not be read, a collector that
failed) has no point rather than an old one. Peaks are the largest values
sampled since the profiler was last started and stay exported after the tree is
gone, until the server is removed from the profiler.

Recording never reaches the profiled server or the caller: a meter or exporter
that fails costs that sample its points and one warning. With telemetry off (no
lens handle) :func:`record_server_memory` and :func:`record_host_memory` do
nothing; a profiler still keeps its own peaks for :meth:`MemoryProfiler.latest`.
A profiler on :data:`DEFAULT_SERIES` looks both functions up on this module at each
sample: a replacement set here (``monkeypatch.setattr``) is called with each measured
server's tree and the host's memory, and the profiler's own peaks, instead of the
profiler publishing them itself. An exception it raises is logged once and costs only
that sample's points.
The gauges are declared with lens at the first sample recorded with telemetry
on; importing this module creates no instrument.

State: a :class:`ProcessMemorySeries` holds what the gauge callbacks read (one
entry per profiler and server name, dropped when the profiler forgets the server,
or replaced by the next entry of that name once the profiler is garbage-collected)
and the meters its gauges were set up on. :data:`DEFAULT_SERIES` is the one the
functions here and profilers built without ``series=`` use, and the only one lens
exports; :func:`reset_process_memory_state` resets it. The host points are one set
per series, shared by its profilers: the last to sample sets them, peak included.
"""

from __future__ import annotations

import logging
import os
import sys

import psutil as psutil  # the reader's psutil, reachable here as on NeMo-Gym

from raylens.telemetry.process_memory._profiler import (
    EXITED,
    FAILED,
    LIVE,
    REUSED,
    STOP_TIMEOUT_SECONDS,
    THREAD_NAME,
    MemoryProfiler,
    MemoryProfileSnapshot,
    SampleStatus,
    ServerMemorySample,
    record_through,
)
from raylens.telemetry.process_memory._profiler_series import (
    DEFAULT_SERIES,
    HOST_USED,
    PSS,
    RSS,
    ProcessMemorySeries,
    ServerMemoryTarget,
    record_host_memory,
    record_server_memory,
    reset_process_memory_state,
)
from raylens.telemetry.procfs import (
    PAGE_SIZE,
    HostMemory,
    Opener,
    ProcessTreeMemory,
    ProcFS,
    as_procfs,
    check_pid,
    collect_host_memory,
    sum_tree_memory,
)

logger = logging.getLogger(__name__)  # the logger of every process-memory module

# Profilers look record_server_memory and record_host_memory up here at each sample, so
# replacing either on this module (as NeMo-Gym's tests do) reaches them.
record_through(sys.modules[__name__])

_DEFAULT_PROCFS = ProcFS()

ProcFSLike = ProcFS | str | os.PathLike[str] | None


def _descendant_pids(root_pid: int, *, procfs: ProcFSLike = None) -> set[int]:
    """The pids of a process tree as it is now, root included; empty if the root is gone."""
    return (_DEFAULT_PROCFS if procfs is None else as_procfs(procfs)).descendant_pids(root_pid)


def _read_process_memory(pid: int, *, procfs: ProcFSLike = None) -> tuple[int, int | None] | None:
    """``(rss, pss)`` bytes of one process (PSS None if unreadable); None if it has exited."""
    return (_DEFAULT_PROCFS if procfs is None else as_procfs(procfs)).read_memory(pid)


def collect_process_tree_memory(
    root_pid: int, *, procfs: ProcFSLike = None, include_pss: bool = True
) -> ProcessTreeMemory:
    """Current RSS and PSS of ``root_pid`` and all its descendants.

    Processes that exit during the walk are not counted. If the root is gone the
    tree is empty and holds nothing, PSS included: ``ProcessTreeMemory(0, 0, 0)``.
    With ``include_pss=False`` only ``statm`` is read (cheap, never stalls the
    measured processes) and ``pss_bytes`` is None. ``procfs`` is a
    :class:`ProcFS` or a mount path (default ``/proc``). Raises ValueError for a
    pid that is not a positive integer.

    Without ``procfs`` and with PSS, the tree is read through this module's
    :func:`_descendant_pids` and :func:`_read_process_memory`, so a test may
    replace either, as it can on NeMo-Gym.
    """
    check_pid("root_pid", root_pid)
    if procfs is not None or not include_pss:
        reader = _DEFAULT_PROCFS if procfs is None else as_procfs(procfs)
        return reader.tree_memory(root_pid, include_pss=include_pss)
    return sum_tree_memory(map(_read_process_memory, _descendant_pids(root_pid)))


def process_tree_memory_supported(*, procfs: ProcFSLike = None) -> bool:
    """Whether process trees can be measured here: Linux with a usable procfs."""
    return (_DEFAULT_PROCFS if procfs is None else as_procfs(procfs)).supported()


__all__ = [
    "DEFAULT_SERIES",
    "EXITED",
    "FAILED",
    "HOST_USED",
    "LIVE",
    "PAGE_SIZE",
    "PSS",
    "REUSED",
    "RSS",
    "STOP_TIMEOUT_SECONDS",
    "THREAD_NAME",
    "HostMemory",
    "MemoryProfileSnapshot",
    "MemoryProfiler",
    "Opener",
    "ProcFS",
    "ProcessMemorySeries",
    "ProcessTreeMemory",
    "SampleStatus",
    "ServerMemorySample",
    "ServerMemoryTarget",
    "collect_host_memory",
    "collect_process_tree_memory",
    "process_tree_memory_supported",
    "record_host_memory",
    "record_server_memory",
    "reset_process_memory_state",
]
