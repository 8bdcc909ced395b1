"""What the operating system says about memory: procfs for process trees, psutil for the host.

Platform code lives here, apart from the profiler that schedules it and the
series it feeds, as ``psutil`` and ``prometheus_client`` keep theirs.

How a tree is read (Linux only), through :class:`ProcFS`:

- Descendants: ``/proc/<pid>/task/<tid>/children`` for every thread of every
  process, starting at the root. Children are listed under the thread that
  forked them, so a server that spawns from a worker thread is still covered.
- Memory: ``Rss:`` and ``Pss:`` from ``/proc/<pid>/smaps_rollup``. When that file
  cannot be read (another user's process, a kernel older than 4.14), RSS comes
  from ``/proc/<pid>/statm`` and the PSS of that process, hence of the tree, is
  unknown.
- Peak: ``VmHWM:`` from ``/proc/<pid>/status``, the most the kernel has seen
  resident for that one process since it started. It is per process; the tree's
  figure is the largest of them (see :meth:`ProcFS.tree_peak_rss`).
- A process that exits while being read is simply not counted.

Nothing here keeps state between calls.
"""

from __future__ import annotations

import mmap
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

import psutil

PAGE_SIZE = mmap.PAGESIZE
"""Bytes per memory page; ``statm`` counts pages."""

Opener = Callable[[str, int], int]


@dataclass(frozen=True)
class HostMemory:
    """Host memory at one instant, in bytes. ``used_bytes`` is total minus available."""

    used_bytes: int
    available_bytes: int
    total_bytes: int


@dataclass(frozen=True)
class ProcessTreeMemory:
    """Memory of one process tree at one instant.

    ``rss_bytes`` sums resident memory, so pages shared between processes of the
    tree count once per process. ``pss_bytes`` divides each shared page among the
    processes mapping it, so the tree's sum counts it once; it is None when any
    counted process's PSS could not be read. ``process_count`` is the number of
    processes measured; 0 means the root is gone.
    """

    rss_bytes: int
    pss_bytes: int | None
    process_count: int


def check_pid(name: str, pid: object) -> int:
    """``pid`` if it is a positive int; ValueError naming ``name`` and the value otherwise."""
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        raise ValueError(f"{name} must be a positive integer process id, got {pid!r}")
    return pid


class ProcFS:
    """Reads process trees and their memory from a procfs mount.

    ``root`` is where procfs is mounted (``/proc``; a container may see the
    host's at another path). ``opener`` replaces :func:`os.open` for every file
    and directory read, with the same ``(path, flags) -> fd`` contract as the
    ``opener`` of :func:`open`; test fakes use it to refuse or race reads.

    No method raises for a process that is missing, exiting or unreadable: each
    says in its return value what it could not read.
    """

    __slots__ = ("_opener", "_root")

    def __init__(self, root: str | os.PathLike[str] = "/proc", *, opener: Opener | None = None):
        path = os.fspath(root)
        if not isinstance(path, str) or not path:
            raise ValueError(f"procfs root must be a non-empty str path, got {root!r}")
        self._root = path.rstrip("/") or "/"
        self._opener = opener

    @property
    def root(self) -> str:
        """The mount point this reader reads, as given (without a trailing slash)."""
        return self._root

    def __repr__(self) -> str:
        return f"ProcFS({self._root!r})"

    # low-level reads: one syscall each for the small files; kept lean on purpose
    # because a sample of a large tree is thousands of them.

    def _read(self, path: str, chunk: int = 4096, *, until_eof: bool = False) -> bytes:
        """The file at ``path``; a short first read is taken as the whole file
        unless ``until_eof``. That holds for files the kernel renders in one piece
        (``statm``, ``stat``, ``smaps_rollup``), but not for ``children``, which it
        serves a record at a time: a read there can stop short at a record
        boundary with more to come, so only an empty read ends it."""
        fd = (self._opener or os.open)(path, os.O_RDONLY)
        try:
            data = os.read(fd, chunk)
            if not data or (len(data) < chunk and not until_eof):
                return data
            parts = [data]
            while True:
                data = os.read(fd, chunk)
                if not data:
                    return b"".join(parts)
                parts.append(data)
        finally:
            os.close(fd)

    def _tasks(self, pid: int | str) -> list[str]:
        path = f"{self._root}/{pid}/task"
        if self._opener is None:
            return os.listdir(path)
        fd = self._opener(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            return os.listdir(fd)
        finally:
            os.close(fd)

    # processes

    def descendant_pids(self, root_pid: int) -> set[int]:
        """``root_pid`` and every process below it, or an empty set if the root is gone.

        A process whose task directory cannot be listed (it exited after its
        parent listed it, or it is hidden) is left out with its subtree; a
        thread whose children file cannot be read contributes no children.
        """
        root = self._root
        read = self._read
        tasks = self._tasks
        found: set[int] = set()
        pending = [root_pid]
        while pending:
            pid = pending.pop()
            if pid in found:
                continue
            try:
                tids = tasks(pid)
            except OSError:
                continue
            found.add(pid)
            for tid in tids:
                try:
                    listed = read(f"{root}/{pid}/task/{tid}/children", until_eof=True)
                except OSError:
                    continue
                for child in listed.split():
                    child_pid = int(child)
                    if child_pid not in found:
                        pending.append(child_pid)
        return found

    def read_rss(self, pid: int) -> int | None:
        """Resident bytes of ``pid`` from ``statm``, or None if it cannot be read (exited).

        Never opens ``smaps_rollup``. A process without an address space (a
        zombie) reads 0.
        """
        try:
            fd = (self._opener or os.open)(f"{self._root}/{pid}/statm", os.O_RDONLY)
        except OSError:
            return None
        try:
            data = os.read(fd, 512)
        except OSError:
            return None
        finally:
            os.close(fd)
        fields = data.split(None, 2)
        if len(fields) < 2:
            return None
        return int(fields[1]) * PAGE_SIZE

    def _read_statm(self, pid: int) -> tuple[int, int] | None:
        try:
            fields = self._read(f"{self._root}/{pid}/statm", 512).split(None, 2)
        except OSError:
            return None
        if len(fields) < 2:
            return None
        return int(fields[0]), int(fields[1]) * PAGE_SIZE

    def read_memory(self, pid: int) -> tuple[int, int | None] | None:
        """``(rss, pss)`` bytes of ``pid``, or None if it exited before it could be read.

        PSS is None when ``smaps_rollup`` cannot be read (permission, an old
        kernel): RSS then comes from ``statm``. A process with no address space
        left (a zombie, whose ``smaps_rollup`` is empty or refused and whose
        ``statm`` is all zeros) holds nothing, so it reads ``(0, 0)``.
        """
        try:
            rollup = self._read(f"{self._root}/{pid}/smaps_rollup", 8192)
        except OSError:
            rollup = b""
        if rollup:
            rss = pss = None
            for line in rollup.splitlines():
                if line.startswith(b"Rss:"):
                    rss = int(line.split()[1]) * 1024
                elif line.startswith(b"Pss:"):
                    pss = int(line.split()[1]) * 1024
                    break
            if rss is not None:
                return rss, pss
        statm = self._read_statm(pid)
        if statm is None:
            return None
        size_pages, rss = statm
        if size_pages == 0:
            return 0, 0
        return rss, None

    def read_peak_rss(self, pid: int) -> int | None:
        """The kernel's high-water mark of resident bytes for ``pid`` (``VmHWM`` of ``status``).

        None when the process is gone, its ``status`` cannot be read, or it has no
        address space (a zombie or a kernel thread, whose ``status`` has no ``Vm``
        lines).
        """
        try:
            status = self._read(f"{self._root}/{pid}/status", 4096)
        except OSError:
            return None
        for line in status.splitlines():
            if line.startswith(b"VmHWM:"):
                fields = line.split()
                if len(fields) >= 2 and fields[1].isdigit():
                    return int(fields[1]) * 1024
                return None
        return None

    def tree_peak_rss(self, root_pid: int) -> int | None:
        """The largest ``VmHWM`` among ``root_pid`` and its live descendants, or None.

        The largest, not the sum: each process's mark is its own peak, reached at
        its own moment, so a sum could claim more than was ever resident at once,
        while the largest is a peak one process really reached. Processes already
        gone take their marks with them.
        """
        read = self.read_peak_rss
        peaks = [peak for peak in map(read, self.descendant_pids(root_pid)) if peak is not None]
        return max(peaks) if peaks else None

    def start_ticks(self, pid: int) -> int | None:
        """When ``pid`` started (field 22 of ``stat``, clock ticks since boot), or None if gone.

        Two processes that held the same pid at different times have different
        start times, which is how a reused pid is told apart from the original.
        """
        try:
            stat = self._read(f"{self._root}/{pid}/stat", 1024)
        except OSError:
            return None
        # The command name may hold spaces and parentheses; fields resume after the last ")".
        fields = stat.rpartition(b")")[2].split()
        try:
            return int(fields[19])
        except (IndexError, ValueError):
            return None

    def tree_memory(self, root_pid: int, *, include_pss: bool = True) -> ProcessTreeMemory:
        """Sum the memory of ``root_pid``'s tree; see :func:`collect_process_tree_memory`."""
        pids = self.descendant_pids(root_pid)
        rss_total = 0
        count = 0
        if not include_pss:
            read_rss = self.read_rss
            for pid in pids:
                rss = read_rss(pid)
                if rss is not None:
                    rss_total += rss
                    count += 1
            return ProcessTreeMemory(rss_total, None, count)
        pss_total: int | None = 0
        for pid in pids:
            memory = self.read_memory(pid)
            if memory is None:
                continue
            rss, pss = memory
            rss_total += rss
            count += 1
            if pss is None:
                pss_total = None
            elif pss_total is not None:
                pss_total += pss
        return ProcessTreeMemory(rss_total, pss_total, count)

    def supported(self) -> bool:
        """True on Linux when this mount shows ``statm`` and per-thread ``children`` files."""
        if not sys.platform.startswith("linux"):
            return False
        try:
            if not self._read(f"{self._root}/self/statm", 512):
                return False
            tids = self._tasks("self")
            if not tids:
                return False
            self._read(f"{self._root}/self/task/{tids[0]}/children")
        except OSError:
            return False
        return True


def as_procfs(procfs: ProcFS | str | os.PathLike[str] | None) -> ProcFS:
    """A reader for ``procfs``: a :class:`ProcFS` as is, a mount path, or None for ``/proc``."""
    if procfs is None:
        return ProcFS()
    if isinstance(procfs, ProcFS):
        return procfs
    return ProcFS(procfs)


def collect_host_memory() -> HostMemory:
    """Host memory from psutil, on any platform; used is total minus available."""
    memory = psutil.virtual_memory()
    total = int(memory.total)
    available = int(memory.available)
    return HostMemory(used_bytes=total - available, available_bytes=available, total_bytes=total)
