"""What the operating system says about memory: procfs for process trees, psutil for the host.

Invariants a maintainer must keep:

- every ``/proc`` file and directory is opened through :class:`ProcFS`'s opener, so a
  test fake sees, refuses or races each read;
- a process that exits while being read is not counted, and no read raises for it;
- :func:`sum_tree_memory` is the one tree sum and :class:`PssSchedule` the one PSS
  schedule, for the profiler and the group reader alike; the schedule is the only state
  here, held by its owner.

Which files a tree is read from, and why: ``docs/architecture.md``, *``raylens.telemetry``*.
"""

from __future__ import annotations

import mmap
import os
import sys
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

import psutil

PAGE_SIZE = mmap.PAGESIZE
"""Bytes per memory page; ``statm`` counts pages."""

Opener = Callable[[str, int], int]

#: ``stat`` states of a process that has exited: zombie (not yet reaped) and dead.
_NOT_RUNNING = frozenset({b"Z", b"X", b"x"})


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


#: Most bytes :func:`read_small_file` reads: a meminfo, vmstat or cgroup file, whole.
SMALL_FILE_BYTES = 64 * 1024


def read_small_file(path: str, opener: Opener | None = None) -> bytes | None:
    """Up to :data:`SMALL_FILE_BYTES` of ``path`` in one read, or None when it cannot be read.

    For the kernel's small counter files (``/proc/meminfo``, ``/proc/vmstat``, a cgroup's
    ``memory.*``); ``opener`` stands in for :func:`os.open` (tests point it at a fake tree).
    """
    try:
        fd = (opener or os.open)(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, SMALL_FILE_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)


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

    @property
    def opener(self) -> Opener | None:
        """The opener every read goes through (None: :func:`os.open`)."""
        return self._opener

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

    def reset_peak_rss(self, pid: int) -> bool:
        """Reset the kernel's high-water mark of ``pid`` to its current RSS; whether it took.

        Writes ``5`` to ``/proc/<pid>/clear_refs`` (Linux 4.0 and later), which needs
        the rights ptrace would (the same user, or ``CAP_SYS_PTRACE``). False when the
        process is gone or the write is refused. It also resets what ``getrusage``
        reports as that process's maximum RSS (``ru_maxrss``), from then on.
        """
        try:
            fd = (self._opener or os.open)(f"{self._root}/{pid}/clear_refs", os.O_WRONLY)
        except OSError:
            return False
        try:
            return os.write(fd, b"5") == 1
        except OSError:
            return False
        finally:
            os.close(fd)

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

    def read_stat(self, pid: int) -> tuple[int, int] | None:
        """``(start ticks, resident pages)`` of a running ``pid`` from one read of ``stat``.

        The start time is what :meth:`start_ticks` returns; the resident pages
        (field 24) are the counter ``statm`` reports too, so one read serves both
        a pid-reuse guard and RSS. None when the process is gone or its ``stat``
        is refused, and for a zombie: it has exited, holds no memory and only
        waits to be reaped. Kept to one open, one read and one close, with a
        bounded split, because a reader pays it for every process at every sample.
        """
        try:
            data = self._read(f"{self._root}/{pid}/stat", 1024)
        except OSError:
            return None
        # The command name may hold spaces and parentheses; fields resume after the last ")".
        fields = data.rpartition(b")")[2].split(None, 22)
        try:
            if fields[0] in _NOT_RUNNING:
                return None
            return int(fields[19]), int(fields[21])
        except (IndexError, ValueError):
            return None

    def tree_memory(self, root_pid: int, *, include_pss: bool = True) -> ProcessTreeMemory:
        """The memory of ``root_pid``'s tree now, summed by :func:`sum_tree_memory`.

        With ``include_pss=False`` only ``statm`` is read and ``pss_bytes`` is None.
        """
        pids = self.descendant_pids(root_pid)
        if include_pss:
            return sum_tree_memory(map(self.read_memory, pids))
        return sum_tree_memory(map(self._read_rss_only, pids), include_pss=False)

    def _read_rss_only(self, pid: int) -> tuple[int, None] | None:
        rss = self.read_rss(pid)
        return None if rss is None else (rss, None)

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


def sum_tree_memory(
    readings: Iterable[tuple[int, int | None] | None], *, include_pss: bool = True
) -> ProcessTreeMemory:
    """The memory of a tree from its processes' ``(rss, pss)`` readings.

    A None reading (a process that exited before it was read) is not counted. The
    tree's PSS is None as soon as one counted process's PSS is None, since a sum
    missing a part would understate it; an empty tree holds nothing, PSS included
    (``ProcessTreeMemory(0, 0, 0)``). With ``include_pss=False`` the PSS of the
    readings is ignored and the tree's is None, for reads that never asked for it.
    Every tree sum in raylens (a profiled server's, a worker group's) is this one.
    """
    rss_total = 0
    pss_total: int | None = 0
    count = 0
    for memory in readings:
        if memory is None:
            continue
        rss, pss = memory
        rss_total += rss
        count += 1
        if pss is None:
            pss_total = None
        elif pss_total is not None:
            pss_total += pss
    return ProcessTreeMemory(rss_total, pss_total if include_pss else None, count)


class PssSchedule:
    """When PSS is next read, per key (a server's or a group's name).

    With ``interval`` None it is read at every sample. Otherwise it is due at the
    first sample of a key and then once ``interval`` seconds have passed since the
    last attempt, whether or not that attempt produced a figure, so a PSS that
    cannot be read is not retried at every sample. ``len()`` is the number of keys
    it remembers. Not thread-safe: its owner serialises calls.
    """

    __slots__ = ("_attempted", "_interval")

    def __init__(self, interval: float | None) -> None:
        self._interval = interval
        self._attempted: dict[str, float] = {}

    @property
    def interval(self) -> float | None:
        """Seconds between two PSS reads of one key; None to read it every time."""
        return self._interval

    def due(self, key: str, now: float) -> bool:
        """Whether ``key``'s PSS should be read at ``now``."""
        if self._interval is None:
            return True
        attempted = self._attempted.get(key)
        return attempted is None or now - attempted >= self._interval

    def attempted(self, key: str, now: float) -> None:
        """Note that ``key``'s PSS was read (or tried) at ``now``."""
        self._attempted[key] = now

    def forget(self, key: str) -> None:
        """Drop what is known of ``key``: its next PSS read is due at once."""
        self._attempted.pop(key, None)

    def keep_only(self, keys: Collection[str]) -> list[str]:
        """Forget every key not in ``keys``; return those forgotten."""
        stale = [key for key in self._attempted if key not in keys]
        for key in stale:
            del self._attempted[key]
        return stale

    def clear(self) -> None:
        """Forget every key."""
        self._attempted.clear()

    def __len__(self) -> int:
        return len(self._attempted)


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
