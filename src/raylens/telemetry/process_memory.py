"""Memory of managed server process trees (RSS, PSS, sampled peaks) and of the host.

A managed server is a root process plus everything it forked: worker pools,
tokenizer subprocesses, model runners. :class:`MemoryProfiler` samples each
server's whole tree on a background thread and exports the result through lens
observable gauges, alongside host memory from psutil.

How a tree is read (Linux only), through :class:`ProcFS`:

- Descendants: ``/proc/<pid>/task/<tid>/children`` for every thread of every
  process, starting at the root. Children are listed under the thread that
  forked them, so a server that spawns from a worker thread is still covered.
- Memory: ``Rss:`` and ``Pss:`` from ``/proc/<pid>/smaps_rollup``. When that file
  cannot be read (another user's process, a kernel older than 4.14), RSS comes
  from ``/proc/<pid>/statm`` and the PSS of that process, hence of the tree, is
  unknown.
- A process that exits while being read is simply not counted.

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
The gauges are declared with lens at the first sample recorded with telemetry
on, never at import.

State: the snapshot the gauge callbacks read (one entry per server name, dropped
when a profiler forgets the server), and :data:`_INSTRUMENTS`;
:func:`reset_process_memory_state` clears both.
"""

from __future__ import annotations

import inspect
import logging
import math
import mmap
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import KW_ONLY, InitVar, dataclass, field
from typing import Any

import psutil
from opentelemetry.metrics import CallbackOptions, Observation

from raylens.lens import (
    OBSERVABLE_GAUGE,
    RecordedMetric,
    get_telemetry_handle,
    register_observable_gauge,
    reset_warn_once,
    unregister_observable_gauge,
    warn_once,
)
from raylens.lens.safe_text import encodable

logger = logging.getLogger(__name__)

PAGE_SIZE = mmap.PAGESIZE
"""Bytes per memory page; ``statm`` counts pages."""

THREAD_NAME = "raylens-memory-profiler"
STOP_TIMEOUT_SECONDS = 10.0
"""How long :meth:`MemoryProfiler.stop` waits for a sample in progress to finish."""

# Memory types, the values of the ``memory.type`` attribute.
RSS = "rss"
PSS = "pss"
# Key of the host peak in ``MemoryProfiler._host_peaks``.
HOST_USED = "used"

# Target states reported by MemoryProfiler.latest().
LIVE = "live"
EXITED = "exited"
REUSED = "reused"
FAILED = "failed"

_VANISHED = (FileNotFoundError, ProcessLookupError)

Opener = Callable[[str, int], int]


# --------------------------------------------------------------------------- values


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


# --------------------------------------------------------------------------- procfs


def _check_pid(name: str, pid: object) -> int:
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


def _as_procfs(procfs: ProcFS | str | os.PathLike[str] | None) -> ProcFS:
    if procfs is None:
        return ProcFS()
    if isinstance(procfs, ProcFS):
        return procfs
    return ProcFS(procfs)


def _descendant_pids(
    root_pid: int, *, procfs: ProcFS | str | os.PathLike[str] | None = None
) -> set[int]:
    """The pids of a process tree as it is now, root included; empty if the root is gone."""
    return _as_procfs(procfs).descendant_pids(root_pid)


def _read_process_memory(
    pid: int, *, procfs: ProcFS | str | os.PathLike[str] | None = None
) -> tuple[int, int | None] | None:
    """``(rss, pss)`` bytes of one process (PSS None if unreadable); None if it has exited."""
    return _as_procfs(procfs).read_memory(pid)


def collect_process_tree_memory(
    root_pid: int,
    *,
    procfs: ProcFS | str | os.PathLike[str] | None = None,
    include_pss: bool = True,
) -> ProcessTreeMemory:
    """Current RSS and PSS of ``root_pid`` and all its descendants.

    Processes that exit during the walk are not counted. If the root is gone
    the tree is empty and holds nothing, PSS included: ``ProcessTreeMemory(0, 0, 0)``
    (``ProcessTreeMemory(0, None, 0)`` with ``include_pss=False``). With ``include_pss=False``
    only ``statm`` is read (cheap, never stalls the measured processes) and
    ``pss_bytes`` is None. ``procfs`` is a :class:`ProcFS` or a mount path.
    Raises ValueError for a pid that is not a positive integer.
    """
    _check_pid("root_pid", root_pid)
    return _as_procfs(procfs).tree_memory(root_pid, include_pss=include_pss)


def process_tree_memory_supported(*, procfs: ProcFS | str | os.PathLike[str] | None = None) -> bool:
    """Whether process trees can be measured here: Linux with a usable procfs."""
    return _as_procfs(procfs).supported()


def collect_host_memory() -> HostMemory:
    """Host memory from psutil, on any platform; used is total minus available."""
    memory = psutil.virtual_memory()
    total = int(memory.total)
    available = int(memory.available)
    return HostMemory(used_bytes=total - available, available_bytes=available, total_bytes=total)


# --------------------------------------------------------------------------- targets


@dataclass(frozen=True)
class ServerMemoryTarget:
    """A managed server to measure: its name, its kind, and the pid of its root process.

    Build it right after spawning the server. Construction records when that
    process started (``start_ticks``, read from ``procfs``); a later sample whose
    pid shows a different start time is measuring a stranger that inherited the
    pid, so the profiler reports the server as gone instead. ``start_ticks`` is
    None when the process could not be read at construction; its identity is
    then not checked.

    A target is immutable and hashes by ``(name, server_type, pid)``, so it can key
    a dict or sit in a set. Names often come from a command line (``argv[0]``),
    where bytes that are not UTF-8 decode to lone surrogates; those are replaced
    by U+FFFD here, so every exporter can encode the name.
    """

    name: str
    server_type: str
    pid: int
    _: KW_ONLY
    procfs: InitVar[ProcFS | str | os.PathLike[str] | None] = None
    start_ticks: int | None = field(init=False, default=None, compare=False)

    def __post_init__(self, procfs: ProcFS | str | os.PathLike[str] | None) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"server name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.server_type, str) or not self.server_type:
            raise ValueError(
                f"server_type of {self.name!r} must be a non-empty string, got {self.server_type!r}"
            )
        _check_pid(f"pid of server {self.name!r}", self.pid)
        # Frozen: the constructor alone may set fields, through object.__setattr__.
        object.__setattr__(self, "name", encodable(self.name))
        object.__setattr__(self, "server_type", encodable(self.server_type))
        object.__setattr__(self, "start_ticks", _as_procfs(procfs).start_ticks(self.pid))


# --------------------------------------------------------------------------- export

_SERVER_MEMORY = RecordedMetric(
    "gym.server.memory.usage",
    OBSERVABLE_GAUGE,
    "By",
    "Memory held by a managed server's process tree at the latest sample, by memory.type.",
)
_SERVER_PEAK = RecordedMetric(
    "gym.server.memory.sampled_peak",
    OBSERVABLE_GAUGE,
    "By",
    "Largest sampled memory of a managed server's process tree since profiling started.",
)
_SERVER_PROCESSES = RecordedMetric(
    "gym.server.processes",
    OBSERVABLE_GAUGE,
    "{process}",
    "Processes in a managed server's tree at the latest sample.",
)
_HOST_USAGE = RecordedMetric(
    "gym.host.memory.usage",
    OBSERVABLE_GAUGE,
    "By",
    "Host memory in use: total minus available.",
)
_HOST_AVAILABLE = RecordedMetric(
    "gym.host.memory.available",
    OBSERVABLE_GAUGE,
    "By",
    "Host memory that can be given to processes without swapping.",
)
_HOST_TOTAL = RecordedMetric(
    "gym.host.memory.total", OBSERVABLE_GAUGE, "By", "Physical memory of the host."
)
_HOST_PEAK = RecordedMetric(
    "gym.host.memory.sampled_peak",
    OBSERVABLE_GAUGE,
    "By",
    "Largest sampled host memory in use since profiling started.",
)


@dataclass
class _ServerPoints:
    target: ServerMemoryTarget
    attributes: dict[str, Any]
    rss: int | None = None
    pss: int | None = None
    processes: int | None = None
    peak_rss: int | None = None
    peak_pss: int | None = None


@dataclass
class _HostPoints:
    memory: HostMemory | None = None
    peak_used: int | None = None


_LOCK = threading.Lock()
_SERVERS: dict[str, _ServerPoints] = {}
_HOST = _HostPoints()

_INSTRUMENTS: weakref.WeakKeyDictionary[Any, dict[str, RecordedMetric]] = (
    weakref.WeakKeyDictionary()
)
"""Meters this module has made sure export its gauges, with the gauges by registry key."""


def _by_memory_type(
    entries: list[tuple[dict[str, Any], int | None, int | None]],
) -> list[Observation]:
    """One point per known value of ``(attributes, rss, pss)``, tagged with its memory.type."""
    points = []
    for attributes, rss, pss in entries:
        if rss is not None:
            points.append(Observation(rss, {**attributes, "memory.type": RSS}))
        if pss is not None:
            points.append(Observation(pss, {**attributes, "memory.type": PSS}))
    return points


def _observe_server_usage(_options: CallbackOptions) -> Iterable[Observation]:
    with _LOCK:
        entries = [(e.attributes, e.rss, e.pss) for e in _SERVERS.values()]
    return _by_memory_type(entries)


def _observe_server_peak(_options: CallbackOptions) -> Iterable[Observation]:
    with _LOCK:
        entries = [(e.attributes, e.peak_rss, e.peak_pss) for e in _SERVERS.values()]
    return _by_memory_type(entries)


def _observe_server_processes(_options: CallbackOptions) -> Iterable[Observation]:
    with _LOCK:
        return [
            Observation(e.processes, dict(e.attributes))
            for e in _SERVERS.values()
            if e.processes is not None
        ]


def _host_callback(pick: Callable[[_HostPoints], int | None]) -> Callable[..., list[Observation]]:
    def callback(_options: CallbackOptions) -> list[Observation]:
        with _LOCK:
            value = pick(_HOST)
        return [] if value is None else [Observation(value)]

    return callback


_GAUGES: tuple[tuple[RecordedMetric, Callable[..., Iterable[Observation]]], ...] = (
    (_SERVER_MEMORY, _observe_server_usage),
    (_SERVER_PEAK, _observe_server_peak),
    (_SERVER_PROCESSES, _observe_server_processes),
    (_HOST_USAGE, _host_callback(lambda h: h.memory.used_bytes if h.memory else None)),
    (_HOST_AVAILABLE, _host_callback(lambda h: h.memory.available_bytes if h.memory else None)),
    (_HOST_TOTAL, _host_callback(lambda h: h.memory.total_bytes if h.memory else None)),
    (_HOST_PEAK, _host_callback(lambda h: h.peak_used)),
)


def _register_gauges() -> dict[str, RecordedMetric]:
    for metric, callback in _GAUGES:
        register_observable_gauge(metric, callback)
    return {metric.key: metric for metric, _ in _GAUGES}


def _get_instruments(meter: Any) -> dict[str, RecordedMetric]:
    """Make sure ``meter``'s pipeline exports this module's gauges; return them by key.

    Nothing is declared before the first sample is recorded with telemetry on.
    Registration with lens is idempotent and survives pipeline restarts; doing
    it again the first time each meter is seen also restores the gauges if the
    lens declarations were cleared in between. A meter is remembered only once
    its gauges were set up, so a failed attempt is tried again at the next sample.
    """
    try:
        cached = _INSTRUMENTS.get(meter)
    except TypeError:  # a meter that cannot be weakly referenced is simply not cached
        return _register_gauges()
    if cached is None:
        cached = _register_gauges()
        _INSTRUMENTS[meter] = cached
    return cached


def _ensure_exported() -> None:
    """Set up the gauges on the running pipeline, if any. Never raises.

    A meter or exporter that fails here must not reach the profiled server or the
    caller: the failure costs this sample its points and is logged once.
    """
    try:
        handle = get_telemetry_handle()
        if handle is not None:
            _get_instruments(handle.meter)
    except Exception:
        warn_once(
            "process_memory.export",
            "setting up the process-memory gauges failed; this sample exports no points",
            logger=logger,
        )


def _raise_peak(peaks: dict[Any, int], key: Any, value: int | None) -> int | None:
    if value is not None and value > peaks.get(key, -1):
        peaks[key] = value
    return peaks.get(key)


def _server_attributes(target: ServerMemoryTarget) -> dict[str, Any]:
    return {
        "nemo.gym.server.name": target.name,
        "nemo.gym.server.type": target.server_type,
        "process.pid": target.pid,
    }


def _publish_host(memory: HostMemory | None, peak_used: int | None) -> None:
    global _HOST
    with _LOCK:
        _HOST = _HostPoints(memory=memory, peak_used=peak_used)
    _ensure_exported()


def _publish_server(
    target: ServerMemoryTarget,
    memory: ProcessTreeMemory | None,
    peak_rss: int | None,
    peak_pss: int | None,
) -> None:
    """Make ``memory`` (None: not known this sample) the exported values of ``target``."""
    entry = _ServerPoints(
        target=target,
        attributes=_server_attributes(target),
        rss=None if memory is None else memory.rss_bytes,
        pss=None if memory is None else memory.pss_bytes,
        processes=None if memory is None else memory.process_count,
        peak_rss=peak_rss,
        peak_pss=peak_pss,
    )
    with _LOCK:
        _SERVERS[target.name] = entry
    _ensure_exported()


def _forget_server(target: ServerMemoryTarget) -> None:
    """Drop the exported values of ``target``, unless its name now belongs to another target."""
    with _LOCK:
        entry = _SERVERS.get(target.name)
        if entry is not None and entry.target == target:
            del _SERVERS[target.name]


def record_host_memory(memory: HostMemory, peaks: dict[str, int]) -> None:
    """Publish ``memory`` as the current host memory and raise ``peaks["used"]`` to it.

    ``peaks`` belongs to the caller (a profiler keeps one per run) and is
    updated in place; the exported peak is whatever it holds afterwards. With
    telemetry off (no lens handle) nothing is published and ``peaks`` is left
    alone. Never raises for a failing meter or exporter.
    """
    if get_telemetry_handle() is None:
        return
    _publish_host(memory, _raise_peak(peaks, HOST_USED, memory.used_bytes))


def record_server_memory(
    target: ServerMemoryTarget,
    memory: ProcessTreeMemory,
    peaks: dict[tuple[str, str], int],
) -> None:
    """Publish ``memory`` as the current memory of ``target`` and raise its peaks.

    ``peaks`` is keyed ``(server name, "rss" | "pss")`` and updated in place. A
    tree that is gone (``ProcessTreeMemory(0, 0, 0)``) publishes zeros, so an alert
    on ``gym.server.processes == 0`` fires; a None PSS publishes no PSS value.
    Peaks already reached stay. With telemetry off (no lens handle) nothing is
    published and ``peaks`` is left alone. Never raises for a failing meter or
    exporter.
    """
    if get_telemetry_handle() is None:
        return
    peak_rss = _raise_peak(peaks, (target.name, RSS), memory.rss_bytes)
    peak_pss = _raise_peak(peaks, (target.name, PSS), memory.pss_bytes)
    _publish_server(target, memory, peak_rss, peak_pss)


def reset_process_memory_state() -> None:
    """Forget every exported value, the gauge declarations and which meters were set up."""
    global _HOST
    with _LOCK:
        _SERVERS.clear()
        _HOST = _HostPoints()
    _INSTRUMENTS.clear()
    for metric, _callback in _GAUGES:
        unregister_observable_gauge(metric.name)


# --------------------------------------------------------------------------- profiler


@dataclass(frozen=True)
class ServerMemorySample:
    """What a profiler last measured for one server.

    ``status`` is ``"live"``, ``"exited"`` (the root is gone), ``"reused"`` (its
    pid now belongs to another process) or ``"failed"`` (the collector raised).
    Values not known at that sample are None. ``pss_bytes`` may come from an
    earlier sample when PSS is read less often than RSS; ``pss_age_seconds``
    says how much earlier (0 when read at this sample).
    """

    target: ServerMemoryTarget
    status: str
    rss_bytes: int | None
    pss_bytes: int | None
    pss_age_seconds: float | None
    process_count: int | None
    peak_rss_bytes: int | None
    peak_pss_bytes: int | None


@dataclass(frozen=True)
class MemoryProfileSnapshot:
    """A profiler's latest sample of the host and of every server, for display."""

    taken_at: float
    host: HostMemory | None
    host_peak_used_bytes: int | None
    servers: tuple[ServerMemorySample, ...]


def _check_interval(name: str, value: object) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
        or value > threading.TIMEOUT_MAX
    ):
        raise ValueError(
            f"{name} must be a positive, finite number of seconds of at most "
            f"{threading.TIMEOUT_MAX:g}, got {value!r}"
        )
    return float(value)


def _check_target(target: object) -> None:
    if not isinstance(target, ServerMemoryTarget):
        raise TypeError(f"targets must be ServerMemoryTarget objects, got {target!r}")


def _collector_warning_key(name: str) -> str:
    return f"process_memory.collector.{name}"


def _accepts_include_pss(collector: Callable[..., Any]) -> bool:
    try:
        parameters = inspect.signature(collector).parameters
    except (TypeError, ValueError):
        return False
    return "include_pss" in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
    )


class MemoryProfiler:
    """Sample host memory and the process trees of managed servers, on a background thread.

    ``start()`` takes a first sample at once, then one every ``interval_seconds``
    on a daemon thread named ``raylens-memory-profiler``; ``stop()`` ends the
    thread and takes a last sample, and the profiler can be started again.
    Each sample is exported through lens (see the module docs) and readable with
    :meth:`latest`.

    ``collector(pid)`` measures one tree, ``host_collector()`` the host; both
    default to the procfs and psutil readers. ``pss_interval_seconds`` limits how
    often PSS is read (every sample when None); it needs a collector that
    takes ``include_pss=False`` for the samples in between, as the default does.
    ``clock`` (default :func:`time.monotonic`) times PSS reads. ``procfs`` is
    where process trees are read and pid reuse is checked.

    Nothing raised while sampling escapes the thread: it is logged once (see
    :func:`raylens.lens.warn_once`) and the next sample runs as usual.
    """

    def __init__(
        self,
        targets: list[ServerMemoryTarget],
        interval_seconds: float,
        collector: Callable[[int], ProcessTreeMemory] = collect_process_tree_memory,
        host_collector: Callable[[], HostMemory] = collect_host_memory,
        *,
        pss_interval_seconds: float | None = None,
        clock: Callable[[], float] | None = None,
        procfs: ProcFS | str | os.PathLike[str] | None = None,
    ) -> None:
        self._interval = _check_interval("interval_seconds", interval_seconds)
        self._pss_interval = (
            None
            if pss_interval_seconds is None
            else _check_interval("pss_interval_seconds", pss_interval_seconds)
        )
        targets = list(targets)
        for target in targets:
            _check_target(target)
        names = [t.name for t in targets]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"server names must be unique; repeated: {', '.join(duplicates)}")
        self._targets = {target.name: target for target in targets}
        self._procfs = _as_procfs(procfs)
        if collector is collect_process_tree_memory:
            procfs_reader = self._procfs

            def collector(pid: int, *, include_pss: bool = True) -> ProcessTreeMemory:
                return collect_process_tree_memory(
                    pid, procfs=procfs_reader, include_pss=include_pss
                )

        elif self._pss_interval is not None and not _accepts_include_pss(collector):
            raise TypeError(
                "pss_interval_seconds needs a collector that accepts include_pss=False "
                f"for RSS-only samples; {collector!r} does not"
            )
        self._collector = collector
        self._host_collector = host_collector
        self._clock = clock
        self._peaks: dict[tuple[str, str], int] = {}
        self._host_peaks: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Reentrant so that start() and stop() can hold it, with a bounded wait, around
        # the sample_once() they take themselves.
        self._sample_lock = threading.RLock()
        self._pss: dict[str, tuple[int, float]] = {}
        self._pss_attempted: dict[str, float] = {}
        self._latest: MemoryProfileSnapshot | None = None
        # Guards the targets and everything kept per target (peaks, carried PSS, the
        # exported entry), so a target removed while it is being measured leaves nothing.
        self._state_lock = threading.Lock()

    @property
    def targets(self) -> list[ServerMemoryTarget]:
        """The servers this profiler measures (a copy)."""
        with self._state_lock:
            return list(self._targets.values())

    def add_target(self, target: ServerMemoryTarget) -> None:
        """Measure ``target`` too, from the next sample on; running or not.

        Raises ValueError if a server of that name is already measured (remove it
        first: a restarted server is a new target, with its new pid).
        """
        _check_target(target)
        with self._state_lock:
            if target.name in self._targets:
                raise ValueError(
                    f"a server named {target.name!r} is already measured "
                    f"({self._targets[target.name]!r}); remove it before adding {target!r}"
                )
            self._targets[target.name] = target

    def remove_target(self, target: ServerMemoryTarget | str) -> ServerMemoryTarget:
        """Stop measuring a server (given as a target or by name) and forget it; return it.

        Its peaks, its carried PSS, its exported series and its remembered warning
        go with it, so what a profiler holds follows the servers it measures now,
        however many have come and gone. Raises ValueError for a server it does
        not measure.
        """
        name = target if isinstance(target, str) else getattr(target, "name", None)
        with self._state_lock:
            current = self._targets.get(name) if isinstance(name, str) else None
            if current is None or (not isinstance(target, str) and current != target):
                measured = ", ".join(repr(n) for n in self._targets) or "none"
                raise ValueError(
                    f"{target!r} is not measured by this profiler; measured: {measured}"
                )
            del self._targets[current.name]
            for memory_type in (RSS, PSS):
                self._peaks.pop((current.name, memory_type), None)
            self._pss.pop(current.name, None)
            self._pss_attempted.pop(current.name, None)
            _forget_server(current)
        reset_warn_once(_collector_warning_key(current.name))
        return current

    @property
    def is_running(self) -> bool:
        """True between :meth:`start` and :meth:`stop`."""
        return self._thread is not None

    def _now(self) -> float:
        return self._clock() if self._clock is not None else time.monotonic()

    def start(self) -> None:
        """Reset the peaks, take a first sample now, then sample in the background.

        Does nothing on a profiler that is already running. Raises RuntimeError
        if a sample of the previous run is still stuck in progress after
        :data:`STOP_TIMEOUT_SECONDS`, or if there are servers to measure and this
        host has no usable Linux procfs (see :func:`process_tree_memory_supported`).
        Host memory alone works anywhere.
        """
        if self._thread is not None:
            return
        if self._targets and not self._procfs.supported():
            raise RuntimeError(
                f"cannot measure process trees on platform {sys.platform!r} with procfs at "
                f"{self._procfs.root!r}: Linux with /proc/<pid>/statm and "
                "/proc/<pid>/task/<tid>/children is needed (check "
                "process_tree_memory_supported() first, or profile host memory only "
                "with no targets)"
            )
        if not self._sample_lock.acquire(timeout=STOP_TIMEOUT_SECONDS):
            raise RuntimeError(
                "memory profiler cannot start: a sample of its previous run is still in "
                f"progress after {STOP_TIMEOUT_SECONDS} s (a collector or a procfs read is "
                "stuck); try again once it returns"
            )
        try:
            self._peaks.clear()
            self._host_peaks.clear()
            self._pss.clear()
            self._pss_attempted.clear()
            self._stop = threading.Event()
            self.sample_once()
        finally:
            self._sample_lock.release()
        thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        thread.start()
        self._thread = thread

    def stop(self) -> None:
        """Stop the background thread, then take and export one last sample.

        Waits up to :data:`STOP_TIMEOUT_SECONDS` in all for a sample in progress;
        if that sample is still stuck, the last sample is skipped (warned once)
        rather than waited for. Does nothing if the profiler is not running.
        """
        thread = self._thread
        if thread is None:
            return
        deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
        self._stop.set()
        thread.join(STOP_TIMEOUT_SECONDS)
        self._thread = None
        if thread.is_alive():
            warn_once(
                "process_memory.stop",
                f"memory profiler thread did not stop within {STOP_TIMEOUT_SECONDS} s",
                logger=logger,
            )
        if not self._sample_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            warn_once(
                "process_memory.stop.final_sample",
                "memory profiler skipped its last sample: the sample in progress is stuck",
                logger=logger,
            )
            return
        try:
            self.sample_once()
        finally:
            self._sample_lock.release()

    def _run(self) -> None:
        stop = self._stop  # this run's event; a later start() makes a new one
        while not stop.wait(self._interval):
            try:
                self.sample_once()
            except Exception:
                warn_once("process_memory.sample", "memory profiler sample failed", logger=logger)

    def sample_once(self) -> None:
        """Measure the host and every server once, export the results, keep them for :meth:`latest`.

        A failing collector costs only its own values for this sample (logged
        once); the other servers and the host are still measured. Exporting never
        raises: a broken meter costs the sample its points, not its values.
        """
        with self._sample_lock:
            now = self._now()
            host: HostMemory | None
            try:
                host = self._host_collector()
            except Exception:
                host = None
                warn_once(
                    "process_memory.host_collector",
                    "collecting host memory failed; no host values this sample",
                    logger=logger,
                )
            peak = _raise_peak(
                self._host_peaks, HOST_USED, None if host is None else host.used_bytes
            )
            _publish_host(host, peak)
            with self._state_lock:
                targets = list(self._targets.values())
            sampled = (self._sample_target(target, now) for target in targets)
            servers = tuple(sample for sample in sampled if sample is not None)
            self._latest = MemoryProfileSnapshot(
                taken_at=now,
                host=host,
                host_peak_used_bytes=self._host_peaks.get(HOST_USED),
                servers=servers,
            )

    def _sample_target(self, target: ServerMemoryTarget, now: float) -> ServerMemorySample | None:
        """Measure one server and keep the result; None if it was removed meanwhile."""
        name = target.name
        gone = ProcessTreeMemory(0, 0, 0)
        status = LIVE
        read_pss = False
        memory: ProcessTreeMemory | None
        current_ticks = None if target.start_ticks is None else self._procfs.start_ticks(target.pid)
        if current_ticks != target.start_ticks:
            # The root exited, or its pid now belongs to a process that started later.
            status = EXITED if current_ticks is None else REUSED
            memory = gone
        else:
            read_pss = self._pss_due(name, now)
            try:
                if read_pss:
                    memory = self._collector(target.pid)
                else:
                    memory = self._collector(target.pid, include_pss=False)  # type: ignore[call-arg]
            except Exception:
                warn_once(
                    _collector_warning_key(name),
                    f"measuring server {name!r} (pid {target.pid}) failed; no values this sample",
                    logger=logger,
                )
                memory = None
                status = FAILED
            if memory is not None and memory.process_count <= 0:
                status, memory = EXITED, gone
        with self._state_lock:
            if self._targets.get(name) is not target:
                return None
            pss_age: float | None = None
            if status != LIVE:
                self._pss.pop(name, None)
                self._pss_attempted.pop(name, None)
            elif read_pss and memory is not None:
                self._pss_attempted[name] = now
                if memory.pss_bytes is None:
                    self._pss.pop(name, None)
                else:
                    self._pss[name] = (memory.pss_bytes, now)
                    pss_age = 0.0
            elif memory is not None:
                carried = self._pss.get(name)
                pss = None
                if carried is not None:
                    pss, read_at = carried
                    pss_age = max(0.0, now - read_at)
                memory = ProcessTreeMemory(memory.rss_bytes, pss, memory.process_count)
            peak_rss = _raise_peak(self._peaks, (name, RSS), memory and memory.rss_bytes)
            peak_pss = _raise_peak(self._peaks, (name, PSS), memory and memory.pss_bytes)
            _publish_server(target, memory, peak_rss, peak_pss)
        live = memory if status == LIVE else None
        return ServerMemorySample(
            target=target,
            status=status,
            rss_bytes=live and live.rss_bytes,
            pss_bytes=live and live.pss_bytes,
            pss_age_seconds=pss_age if live and live.pss_bytes is not None else None,
            process_count=live and live.process_count,
            peak_rss_bytes=peak_rss,
            peak_pss_bytes=peak_pss,
        )

    def _pss_due(self, name: str, now: float) -> bool:
        if self._pss_interval is None:
            return True
        attempted = self._pss_attempted.get(name)
        return attempted is None or now - attempted >= self._pss_interval

    def latest(self) -> MemoryProfileSnapshot | None:
        """The most recent sample (None before the first), e.g. for a live table."""
        return self._latest


__all__ = [
    "HostMemory",
    "MemoryProfileSnapshot",
    "MemoryProfiler",
    "ProcFS",
    "ProcessTreeMemory",
    "ServerMemorySample",
    "ServerMemoryTarget",
    "collect_host_memory",
    "collect_process_tree_memory",
    "process_tree_memory_supported",
    "record_host_memory",
    "record_server_memory",
    "reset_process_memory_state",
]
