"""Memory of managed server process trees (RSS, PSS, sampled peaks) and of the host.

The public face of the process-memory package: :class:`MemoryProfiler` (``_profiler``)
samples each server's tree on a background thread, :class:`ProcessMemorySeries`
(``_profiler_series``) holds what the ``gym.*`` gauges export, and
:mod:`raylens.telemetry.procfs` reads the trees. The series are described in the README's
metric reference, the modules in ``docs/architecture.md``.

Invariants, the drop-in seams NeMo-Gym's tests rely on: profilers on :data:`DEFAULT_SERIES`
look :func:`record_server_memory` and :func:`record_host_memory` up on this module at each
sample (the :func:`record_through` call below), and :func:`collect_process_tree_memory`
reads a tree (without ``procfs``, with PSS) through this module's :func:`_descendant_pids`
and :func:`_read_process_memory`, so a replacement set here with ``monkeypatch.setattr`` is
the one called. Importing creates no instrument; recording never raises into the profiled
server or the caller.
:func:`reset_process_memory_state` resets :data:`DEFAULT_SERIES`, the only series lens exports.
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
