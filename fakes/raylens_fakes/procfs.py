"""A fake ``/proc`` tree on disk, for testing :mod:`raylens.telemetry.process_memory`.

:class:`FakeProcFS` writes the few files raylens reads (``stat``, ``statm``,
``smaps_rollup``, ``status`` with its ``VmHWM`` and ``task/<tid>/children``, and the
machine's ``meminfo``) under a directory of your choosing,
and takes the one write raylens makes (``5`` to ``clear_refs``, which resets ``VmHWM``),
in the kernel's formats, and hands out a :class:`~raylens.telemetry.process_memory.ProcFS`
reader over it (:attr:`FakeProcFS.procfs`).

What a real procfs does that a plain directory cannot (refusing a file to a
process without ptrace rights, a process exiting between being listed and being
read, a zombie whose address space is gone) is reproduced by the reader's
opener, :meth:`FakeProcFS.open`, so it works the same when the tests run as root.

Example::

    fake = FakeProcFS(tmp_path / "proc")
    fake.add_process(100, rss_bytes=64 * PAGE_SIZE)
    fake.add_process(101, parent=100)
    collect_process_tree_memory(100, procfs=fake.procfs)
"""

from __future__ import annotations

import errno
import mmap
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    from typing_extensions import Unpack

from raylens.telemetry.process_memory import ProcFS

PAGE_SIZE = mmap.PAGESIZE
"""Bytes per page, as the reader converts ``statm`` pages to bytes."""
DEFAULT_MEM_TOTAL = 64 * 1024**3
"""The machine's total memory in ``meminfo`` unless :meth:`FakeProcFS.set_machine` says otherwise."""
DEFAULT_OTHER_USED = 1024**3
"""Memory the machine uses besides the fake's processes, by default."""


class ProcessOptions(TypedDict, total=False):
    """The keyword arguments of :meth:`FakeProcFS.add_process`, for methods that pass them on."""

    parent: int | None
    tid: int | None
    threads: Iterable[int]
    rss_bytes: int
    pss_bytes: int | None
    start_ticks: int | None
    comm: str
    smaps_rollup: bool
    hwm_bytes: int | None


@dataclass
class _Process:
    pid: int
    parent: int | None
    parent_tid: int | None
    tids: list[int]
    rss_bytes: int
    pss_bytes: int
    start_ticks: int
    comm: str
    smaps_rollup: bool
    hwm_bytes: int = 0
    peak_resets: int = 0
    zombie: bool = False
    empty_smaps_rollup: bool = False
    children: dict[int, list[int]] = field(default_factory=dict)


class FakeProcFS:
    """A directory laid out like ``/proc`` for a handful of made-up processes.

    Every mutation rewrites the affected files at once, so a reader sees the
    state as of its last call. Memory sizes are bytes and must be whole pages.
    ``self_pid`` is the process ``self`` links to (created with one thread and no
    children); pass None to leave ``self`` out, as on a host without procfs.
    """

    def __init__(self, root: str | os.PathLike[str], *, self_pid: int | None = 1) -> None:
        self.root = Path(root)
        self._prefix = os.fspath(self.root) + os.sep
        self.root.mkdir(parents=True, exist_ok=True)
        self._processes: dict[int, _Process] = {}
        self._denied: set[tuple[str, str]] = set()
        self._exit_on_open: set[tuple[str, str]] = set()
        self._next_ticks = 1000
        self._mem_total = DEFAULT_MEM_TOTAL
        self._other_used = DEFAULT_OTHER_USED
        self.procfs = ProcFS(self.root, opener=self.open)
        self._write_meminfo()
        if self_pid is not None:
            self.add_process(self_pid)
            os.symlink(str(self_pid), self.root / "self")

    # building the tree

    def add_process(
        self,
        pid: int,
        *,
        parent: int | None = None,
        tid: int | None = None,
        threads: Iterable[int] = (),
        rss_bytes: int = 16 * PAGE_SIZE,
        pss_bytes: int | None = None,
        start_ticks: int | None = None,
        comm: str = "python",
        smaps_rollup: bool = True,
        hwm_bytes: int | None = None,
    ) -> int:
        """Create process ``pid`` and return it.

        ``parent`` lists it among that process's children, under thread ``tid``
        (default: the parent's main thread). ``threads`` are extra thread ids
        besides the main one. ``pss_bytes`` defaults (None) to ``rss_bytes``.
        ``smaps_rollup=False`` leaves that file out, as on kernels before 4.14.
        ``start_ticks`` (field 22 of ``stat``) defaults to a value larger than
        any given so far. ``hwm_bytes``, the high-water mark in ``status``
        (``VmHWM``), defaults to ``rss_bytes`` and cannot be below it.
        """
        if pid in self._processes:
            raise ValueError(f"pid {pid} already exists in the fake procfs")
        if parent is not None and parent not in self._processes:
            raise ValueError(f"parent {parent} of pid {pid} does not exist in the fake procfs")
        if parent is not None and tid is not None and tid not in self._processes[parent].tids:
            threads = self._processes[parent].tids
            raise ValueError(f"pid {parent} has no thread {tid}; threads are {threads}")
        pss = rss_bytes if pss_bytes is None else pss_bytes
        _check_pages("rss_bytes", rss_bytes)
        _check_pages("pss_bytes", pss)
        hwm = _check_hwm(rss_bytes, rss_bytes if hwm_bytes is None else hwm_bytes)
        if start_ticks is None:
            start_ticks = self._next_ticks
        self._next_ticks = max(self._next_ticks, start_ticks) + 1
        process = _Process(
            pid=pid,
            parent=parent,
            parent_tid=None,
            tids=[pid, *threads],
            rss_bytes=rss_bytes,
            pss_bytes=pss,
            start_ticks=start_ticks,
            comm=comm,
            smaps_rollup=smaps_rollup,
            hwm_bytes=hwm,
        )
        self._processes[pid] = process
        self._write(process)
        if parent is not None:
            self.list_child(parent, pid, tid=tid)
            process.parent_tid = tid if tid is not None else parent
        return pid

    def list_child(self, parent: int, child: int, *, tid: int | None = None) -> None:
        """Add ``child`` to the children file of ``parent``'s thread ``tid`` (main by default).

        ``child`` need not exist: that is how a process that was listed and then
        exited looks to a reader.
        """
        process = self._processes[parent]
        tid = parent if tid is None else tid
        if tid not in process.tids:
            raise ValueError(f"pid {parent} has no thread {tid}; threads are {process.tids}")
        process.children.setdefault(tid, []).append(child)
        self._write_children(process, tid)

    def remove_process(self, pid: int, *, keep_listing: bool = False) -> None:
        """The process exits and is reaped: its directory goes away.

        With ``keep_listing`` its parent still lists it, as a reader that listed
        the parent a moment before the exit would have seen.
        """
        process = self._processes.pop(pid)
        shutil.rmtree(self.root / str(pid), ignore_errors=True)
        self._write_meminfo()
        parent = self._processes.get(process.parent) if process.parent is not None else None
        if parent is not None and not keep_listing:
            tid = process.parent_tid if process.parent_tid is not None else parent.pid
            listed = parent.children.get(tid, [])
            if pid in listed:
                listed.remove(pid)
                self._write_children(parent, tid)

    def reuse_pid(self, pid: int, **process: Unpack[ProcessOptions]) -> int:
        """``pid`` exits and a new, unrelated process gets the same pid (new start time)."""
        self.remove_process(pid)
        return self.add_process(pid, **process)

    def restart(self, pid: int, new_pid: int) -> int:
        """Process ``pid`` exits and starts again as ``new_pid``; return ``new_pid``.

        The new process has the old one's parent (listed in the same place), name
        and memory, and a later start time. It is cheaper than removing and adding
        a process (two renames and one write), for tests that churn through
        thousands of restarts. Only a single-threaded process without children
        can be restarted this way.
        """
        process = self._processes.get(pid)
        if process is None:
            raise ValueError(f"no pid {pid} in the fake procfs")
        if new_pid in self._processes:
            raise ValueError(f"pid {new_pid} already exists in the fake procfs")
        if any(process.children.values()):
            raise ValueError(f"pid {pid} has children; remove them before restarting it")
        if len(process.tids) > 1:
            raise ValueError(f"pid {pid} has threads {process.tids[1:]}; restart takes one thread")
        directory = self.root / str(new_pid)
        os.rename(self.root / str(pid), directory)
        os.rename(directory / "task" / str(pid), directory / "task" / str(new_pid))
        del self._processes[pid]
        process.pid = new_pid
        process.tids = [new_pid]
        process.children = {}
        process.start_ticks = self._next_ticks
        self._next_ticks += 1
        self._processes[new_pid] = process
        _put(directory / "stat", _stat_line(process))
        parent = self._processes.get(process.parent) if process.parent is not None else None
        if parent is not None:
            tid = process.parent_tid if process.parent_tid is not None else parent.pid
            listed = parent.children.get(tid, [])
            listed[:] = [new_pid if child == pid else child for child in listed]
            self._write_children(parent, tid)
        return new_pid

    def set_memory(
        self,
        pid: int,
        *,
        rss_bytes: int,
        pss_bytes: int | None = None,
        hwm_bytes: int | None = None,
    ) -> None:
        """Change a live process's RSS (and PSS, default equal to RSS).

        The high-water mark rises to ``rss_bytes`` if that is higher, as the
        kernel's does; ``hwm_bytes`` raises it further, for a peak reached and left
        between two reads.
        """
        pss = rss_bytes if pss_bytes is None else pss_bytes
        _check_pages("rss_bytes", rss_bytes)
        _check_pages("pss_bytes", pss)
        process = self._processes[pid]
        hwm = max(process.hwm_bytes, rss_bytes if hwm_bytes is None else hwm_bytes)
        process.hwm_bytes = _check_hwm(rss_bytes, hwm)
        process.rss_bytes, process.pss_bytes = rss_bytes, pss
        self._write(process)

    def set_machine(
        self, *, total_bytes: int | None = None, other_used_bytes: int | None = None
    ) -> None:
        """Change the machine's total and the memory it uses besides the fake's processes.

        ``meminfo`` says ``MemAvailable = total - other_used - every live process's RSS``.
        """
        if total_bytes is not None:
            self._mem_total = total_bytes
        if other_used_bytes is not None:
            self._other_used = other_used_bytes
        self._write_meminfo()

    def _write_meminfo(self) -> None:
        used = self._other_used + sum(p.rss_bytes for p in self._processes.values() if not p.zombie)
        available = max(0, self._mem_total - used)
        _put(
            self.root / "meminfo",
            f"MemTotal:       {self._mem_total // 1024} kB\n"
            f"MemFree:        {available // 1024} kB\n"
            f"MemAvailable:   {available // 1024} kB\n",
        )

    def make_zombie(self, pid: int, *, empty_smaps_rollup: bool = False) -> None:
        """The process has exited but is not reaped: no address space left.

        ``statm`` reads all zeros. Opening ``smaps_rollup`` fails with ESRCH, as
        current kernels do, or with ``empty_smaps_rollup`` opens and reads empty,
        as some older ones do.
        """
        process = self._processes[pid]
        process.zombie = True
        process.empty_smaps_rollup = empty_smaps_rollup
        self._write(process)

    def deny(self, pid: int | str, name: str) -> None:
        """Opening ``<pid>/<name>`` fails with EACCES (e.g. ``smaps_rollup`` without ptrace rights).

        ``name`` is relative to the process directory: ``"statm"``, ``"task"``,
        ``"task/101/children"``.
        """
        self._denied.add((str(pid), name))

    def exit_on_open(self, pid: int, name: str) -> None:
        """The process exits just as a reader opens ``<pid>/<name>``.

        The process is removed (and unlisted from its parent) and that open
        fails with ENOENT, like a read racing a real exit.
        """
        self._exit_on_open.add((str(pid), name))

    def start_ticks(self, pid: int) -> int:
        """The start time written in ``pid``'s ``stat``."""
        return self._processes[pid].start_ticks

    def peak_resets(self, pid: int) -> int:
        """How often a reader has reset ``pid``'s high-water mark through ``clear_refs``."""
        return self._processes[pid].peak_resets

    def hwm_bytes(self, pid: int) -> int:
        """The high-water mark (``VmHWM``) ``pid``'s ``status`` shows now."""
        return self._processes[pid].hwm_bytes

    # the reader's opener

    def open(self, path: str, flags: int) -> int:
        """``os.open`` over the fake tree, with denials, exit races and zombies applied."""
        if path.startswith(self._prefix):  # what the reader passes; relpath is slow
            relative = path[len(self._prefix) :]
        else:
            relative = os.path.relpath(path, self.root)
        pid, _, name = relative.partition(os.sep)
        if pid == "self" and (self.root / "self").is_symlink():
            pid = os.readlink(self.root / "self")
        key = (pid, name)
        if key in self._denied:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
        if key in self._exit_on_open:
            self._exit_on_open.discard(key)
            if pid.isdigit() and int(pid) in self._processes:
                self.remove_process(int(pid))
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
        process = self._processes.get(int(pid)) if pid.isdigit() else None
        if (
            process is not None
            and process.zombie
            and name == "smaps_rollup"
            and not process.empty_smaps_rollup
        ):
            raise ProcessLookupError(errno.ESRCH, os.strerror(errno.ESRCH), path)
        if name == "clear_refs" and flags & (os.O_WRONLY | os.O_RDWR):
            self._reset_peak(process, path)
        return os.open(path, flags)

    def _reset_peak(self, process: _Process | None, path: str) -> None:
        """A write to ``clear_refs`` is on its way: ``VmHWM`` drops to the current RSS.

        Applied at the open, since the file on disk cannot react to the write; the only
        value raylens writes is ``5``, the one that resets the mark.
        """
        if process is None:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
        if process.zombie:
            raise ProcessLookupError(errno.ESRCH, os.strerror(errno.ESRCH), path)
        process.hwm_bytes = process.rss_bytes
        process.peak_resets += 1
        _put(self.root / str(process.pid) / "status", _status_text(process))

    # files

    def _write(self, process: _Process) -> None:
        directory = self.root / str(process.pid)
        for tid in process.tids:
            (directory / "task" / str(tid)).mkdir(parents=True, exist_ok=True)
            self._write_children(process, tid)
        _put(directory / "stat", _stat_line(process))
        if process.zombie:
            statm = "0 0 0 0 0 0 0\n"
        else:
            pages = process.rss_bytes // PAGE_SIZE
            statm = f"{pages + 2048} {pages} {min(pages, 64)} 1 0 {pages} 0\n"
        _put(directory / "statm", statm)
        _put(directory / "status", _status_text(process))
        _put(directory / "clear_refs", "")
        rollup = directory / "smaps_rollup"
        if process.zombie:
            _put(rollup, "")
        elif process.smaps_rollup:
            _put(rollup, _rollup_text(process.rss_bytes, process.pss_bytes))
        elif rollup.exists():
            rollup.unlink()
        self._write_meminfo()  # the machine's used memory follows its processes'

    def _write_children(self, process: _Process, tid: int) -> None:
        listed = process.children.get(tid, [])
        text = "".join(f"{child} " for child in listed)
        _put(self.root / str(process.pid) / "task" / str(tid) / "children", text)


def _put(path: Path, text: str) -> None:
    """Write ``text`` as the whole content of ``path``, without truncating the file to zero first.

    ext4 flushes a file to disk when it is closed after an open with ``O_TRUNC`` (it guards
    the replace-by-truncate pattern against crashes), which costs milliseconds a write; a
    test churning through thousands of processes would spend its time there. Writing over
    the old content and cutting the file to the new length leaves the same bytes without it.
    """
    data = text.encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


def _check_pages(name: str, value: object) -> None:
    if not isinstance(value, int) or value < 0 or value % PAGE_SIZE:
        raise ValueError(
            f"{name} must be a non-negative whole number of {PAGE_SIZE}-byte pages, got {value!r}"
        )


def _check_hwm(rss_bytes: int, hwm_bytes: int) -> int:
    _check_pages("hwm_bytes", hwm_bytes)
    if hwm_bytes < rss_bytes:
        raise ValueError(
            f"hwm_bytes is a high-water mark and cannot be below rss_bytes {rss_bytes}, "
            f"got {hwm_bytes!r}"
        )
    return hwm_bytes


def _status_text(process: _Process) -> str:
    # The lines around the memory ones, in the kernel's layout; a zombie has no Vm lines.
    ppid = process.parent if process.parent is not None else 0
    state = "Z (zombie)" if process.zombie else "S (sleeping)"
    head = f"Name:\t{process.comm}\nState:\t{state}\nTgid:\t{process.pid}\n"
    head += f"Pid:\t{process.pid}\nPPid:\t{ppid}\n"
    tail = f"Threads:\t{len(process.tids)}\n"
    if process.zombie:
        return head + tail
    rss_kib, hwm_kib = process.rss_bytes // 1024, process.hwm_bytes // 1024
    size_kib = rss_kib + 2048 * PAGE_SIZE // 1024
    memory = [
        ("VmPeak", size_kib),
        ("VmSize", size_kib),
        ("VmHWM", hwm_kib),
        ("VmRSS", rss_kib),
        ("RssAnon", rss_kib),
    ]
    return head + "".join(f"{key}:\t{value:>8} kB\n" for key, value in memory) + tail


def _stat_line(process: _Process) -> str:
    # Fields 3.. after "pid (comm)": state, ppid, then zeros up to starttime (field 22).
    ppid = process.parent if process.parent is not None else 0
    state = "Z" if process.zombie else "S"
    after = [state, str(ppid)] + ["0"] * 17 + [str(process.start_ticks)] + ["0"] * 30
    return f"{process.pid} ({process.comm}) {' '.join(after)}\n"


def _rollup_text(rss_bytes: int, pss_bytes: int) -> str:
    rows = [
        ("Rss", rss_bytes),
        ("Pss", pss_bytes),
        ("Pss_Dirty", pss_bytes),
        ("Pss_Anon", pss_bytes),
        ("Pss_File", 0),
        ("Pss_Shmem", 0),
        ("Shared_Clean", 0),
        ("Shared_Dirty", 0),
        ("Private_Clean", 0),
        ("Private_Dirty", rss_bytes),
        ("Referenced", rss_bytes),
        ("Anonymous", rss_bytes),
        ("Swap", 0),
        ("SwapPss", 0),
    ]
    header = "55593257c000-7ffc3bf5a000 ---p 00000000 00:00 0                          [rollup]\n"
    return header + "".join(f"{key + ':':<16}{value // 1024:>8} kB\n" for key, value in rows)
