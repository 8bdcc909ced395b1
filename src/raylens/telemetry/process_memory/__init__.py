"""Memory of managed server process trees (RSS, PSS, sampled peaks) and of the host.

The public face of the process-memory package: :class:`MemoryProfiler` (``_profiler``)
samples each server's tree on a background thread, :class:`ProcessMemorySeries`
(``_profiler_series``) holds what the ``gym.*`` gauges export, and
:mod:`raylens.telemetry.procfs` reads the trees. The series are described in the README's
metric reference, the modules in ``docs/architecture.md``.

Invariants, the drop-in seams NeMo-Gym's tests rely on: profilers on :data:`DEFAULT_SERIES`
look :func:`record_server_memory` and :func:`record_host_memory` up on this module at each
sample (the :func:`record_through` call below), and :func:`collect_process_tree_memory`
(``_trees``) reads a tree (without ``procfs``, with PSS) through this module's
:func:`_descendant_pids` and :func:`_read_process_memory` (the :func:`read_trees_through`
call), so a replacement set here with ``monkeypatch.setattr`` is the one called. Importing creates no instrument; recording never raises into the profiled
server or the caller.
:func:`reset_process_memory_state` resets :data:`DEFAULT_SERIES`, the only series lens exports.
"""

from __future__ import annotations

import logging
import sys

import psutil as psutil  # the reader's psutil, reachable here as on NeMo-Gym

from raylens.telemetry.process_memory._profiler import (
    MemoryProfiler,
    MemoryProfileReading,
    SampleStatus,
    ServerMemorySample,
    record_through,
)
from raylens.telemetry.process_memory._profiler_series import (
    DEFAULT_SERIES,
    ProcessMemorySeries,
    ServerMemoryTarget,
    record_host_memory,
    record_server_memory,
    reset_process_memory_state,
)
from raylens.telemetry.process_memory._trees import (
    _descendant_pids as _descendant_pids,
)
from raylens.telemetry.process_memory._trees import (
    _read_process_memory as _read_process_memory,
)
from raylens.telemetry.process_memory._trees import (
    collect_process_tree_memory,
    process_tree_memory_supported,
    read_trees_through,
)
from raylens.telemetry.procfs import HostMemory, ProcessTreeMemory, ProcFS, collect_host_memory

logger = logging.getLogger(__name__)  # the logger of every process-memory module

# Profilers look record_server_memory and record_host_memory up here at each sample, so
# replacing either on this module (as NeMo-Gym's tests do) reaches them.
record_through(sys.modules[__name__])

# collect_process_tree_memory reads a tree through _descendant_pids and
# _read_process_memory as they are here, so replacing either here reaches it.
read_trees_through(sys.modules[__name__])

__all__ = [
    "DEFAULT_SERIES",
    "HostMemory",
    "MemoryProfileReading",
    "MemoryProfiler",
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
