"""Reading one process tree's memory, as NeMo-Gym's module-level functions do.

:func:`collect_process_tree_memory` reads a tree (without ``procfs``, with PSS) through
``_descendant_pids`` and ``_read_process_memory`` as they are on the module given to
:func:`read_trees_through`: :mod:`raylens.telemetry.process_memory` gives itself at
import, so a replacement set there with ``monkeypatch.setattr`` is the one called, as on
NeMo-Gym. No private module imports the face.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import SimpleNamespace
from typing import Protocol

from raylens.telemetry.procfs import (
    ProcessTreeMemory,
    ProcFS,
    as_procfs,
    check_pid,
    sum_tree_memory,
)

__all__ = [
    "ProcFSLike",
    "collect_process_tree_memory",
    "process_tree_memory_supported",
    "read_trees_through",
]

_DEFAULT_PROCFS = ProcFS()

ProcFSLike = ProcFS | str | os.PathLike[str] | None


def _descendant_pids(root_pid: int, *, procfs: ProcFSLike = None) -> set[int]:
    """The pids of a process tree as it is now, root included; empty if the root is gone."""
    return (_DEFAULT_PROCFS if procfs is None else as_procfs(procfs)).descendant_pids(root_pid)


def _read_process_memory(pid: int, *, procfs: ProcFSLike = None) -> tuple[int, int | None] | None:
    """``(rss, pss)`` bytes of one process (PSS None if unreadable); None if it has exited."""
    return (_DEFAULT_PROCFS if procfs is None else as_procfs(procfs)).read_memory(pid)


class TreeReaders(Protocol):
    """Where :func:`collect_process_tree_memory` finds its two readers."""

    _descendant_pids: Callable[[int], set[int]]
    _read_process_memory: Callable[[int], tuple[int, int | None] | None]


# The face, once it has called read_trees_through; until then, this module's own readers.
_readers: TreeReaders = SimpleNamespace(
    _descendant_pids=_descendant_pids, _read_process_memory=_read_process_memory
)


def read_trees_through(module: TreeReaders) -> None:
    """Have :func:`collect_process_tree_memory` look its two readers up on ``module``."""
    global _readers
    _readers = module


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

    Without ``procfs`` and with PSS, the tree is read through the ``_descendant_pids``
    and ``_read_process_memory`` of :mod:`raylens.telemetry.process_memory`, so a test
    may replace either, as it can on NeMo-Gym.
    """
    check_pid("root_pid", root_pid)
    if procfs is not None or not include_pss:
        reader = _DEFAULT_PROCFS if procfs is None else as_procfs(procfs)
        return reader.tree_memory(root_pid, include_pss=include_pss)
    readers = _readers
    return sum_tree_memory(map(readers._read_process_memory, readers._descendant_pids(root_pid)))


def process_tree_memory_supported(*, procfs: ProcFSLike = None) -> bool:
    """Whether process trees can be measured here: Linux with a usable procfs."""
    return (_DEFAULT_PROCFS if procfs is None else as_procfs(procfs)).supported()
