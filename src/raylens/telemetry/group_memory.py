"""Memory held by each worker group's processes on a node, read from procfs.

The host-memory series say how much a node uses in all; this module says how much
of it sits in the processes of each worker group. It has two halves, joined only
by plain values:

- :class:`GroupMemoryReader` runs on the node itself (in a sampler process, see
  :mod:`raylens.distributed.group_memory_sampler`). Given the workers registered
  there as ``(group, pid, start_ticks)``, it walks each worker's process tree
  through :class:`~raylens.telemetry.process_memory.ProcFS` and sums, per group,
  the memory of the union of those trees: a process that two workers' trees share
  counts once. It needs nothing from the workers themselves, so a worker stuck in
  a long method is read like an idle one. Its result, :class:`NodeGroupMemory`,
  travels between processes as builtins (:meth:`NodeGroupMemory.as_plain`).
- :class:`GroupMemorySnapshot` lives in the driver. Each cycle publishes the
  readings of every node at once; the observable gauges read the snapshot and do
  no I/O. A node with no reading in the latest cycle (its sampler failed or it
  left) has no point, and a reading older than ``max_age`` is not exported.

What the figure means: RSS is summed per process, so a page that two processes
of a group both map counts twice; PSS divides shared pages among the processes
mapping them, so a group's PSS sum counts its share of them once. Neither covers
the object store (shared memory owned by the raylet), the raylet, the driver or
any other process on the node: those appear only in the host-memory series.

Series (registered by :func:`register_group_memory_gauges`, never at import):

- ``rl.worker_group.memory.usage`` (``By``), ``memory.type`` = ``rss`` or ``pss``;
- ``rl.worker_group.processes`` (``{process}``);

each point carrying ``rl.worker_group``, ``ray.node.id`` and ``host.name``.

State lives in :class:`GroupMemorySnapshot` objects; :data:`DEFAULT_SNAPSHOT` is the
one the module functions use, and :func:`reset_group_memory_state` clears it.
"""

from __future__ import annotations

import enum
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from opentelemetry.metrics import CallbackOptions, Observation

from raylens.lens import OBSERVABLE_GAUGE, RecordedMetric, register_observable_gauge
from raylens.lens.safe_text import encodable
from raylens.telemetry.process_memory import ProcFS

__all__ = [
    "DEFAULT_MAX_AGE_SECONDS",
    "DEFAULT_MAX_PROCESSES",
    "DEFAULT_SNAPSHOT",
    "GROUP_MEMORY_RECORDED_METRICS",
    "GROUP_MEMORY_USAGE_METRIC",
    "GROUP_PROCESSES_METRIC",
    "MEMORY_TYPE_ATTR",
    "WORKER_GROUP_ATTR",
    "GoneWorker",
    "GroupMemory",
    "GroupMemoryReader",
    "GroupMemorySnapshot",
    "GroupWorker",
    "NodeGroupMemory",
    "WorkerFate",
    "as_group_worker",
    "own_process_identity",
    "publish_group_memory",
    "register_group_memory_gauges",
    "reset_group_memory_state",
]

GROUP_MEMORY_USAGE_METRIC = "rl.worker_group.memory.usage"
GROUP_PROCESSES_METRIC = "rl.worker_group.processes"
WORKER_GROUP_ATTR = "rl.worker_group"
MEMORY_TYPE_ATTR = "memory.type"
_NODE_ID_ATTR = "ray.node.id"
_HOST_NAME_ATTR = "host.name"
_RSS = "rss"
_PSS = "pss"

DEFAULT_MAX_AGE_SECONDS = 25.0
"""How long a published reading stays exported by default: two 10 s cycles plus a 5 s
deadline, as for host memory. Callers that know their interval pass their own."""

DEFAULT_MAX_PROCESSES = 4096
"""Most processes one reading measures on a node; groups past it are skipped whole."""

GROUP_MEMORY_RECORDED_METRICS: tuple[RecordedMetric, ...] = (
    RecordedMetric(
        GROUP_MEMORY_USAGE_METRIC,
        OBSERVABLE_GAUGE,
        "By",
        "Memory of a worker group's processes on a Ray node (its workers' process trees), "
        "by memory.type; the object store, the raylet and other processes are not in it.",
    ),
    RecordedMetric(
        GROUP_PROCESSES_METRIC,
        OBSERVABLE_GAUGE,
        "{process}",
        "Processes in a worker group's process trees on a Ray node at the latest reading.",
    ),
)


# --------------------------------------------------------------------------- values


class GroupWorker(NamedTuple):
    """One worker registered on a node: its group, its pid, and when that process started.

    ``start_ticks`` is the pid-reuse guard (:meth:`ProcFS.start_ticks` read when the
    worker was registered). None means unknown: the reader then pins the start time
    it first sees for that pid.
    """

    group: str
    pid: int
    start_ticks: int | None


class WorkerFate(enum.Enum):
    """Why a registered worker was not measured."""

    EXITED = "exited"
    REUSED = "reused"


class GoneWorker(NamedTuple):
    """A registered worker that was not measured, and why."""

    group: str
    pid: int
    fate: WorkerFate


@dataclass(frozen=True)
class GroupMemory:
    """One group's processes on one node at one reading.

    ``rss_bytes`` sums resident memory per process. ``pss_bytes`` is None when it
    was not known (a process's ``smaps_rollup`` unreadable, or the group's workers
    changed since PSS was last read); ``pss_age_seconds`` says how old it is, 0 when
    read at this reading. ``process_count`` counts the processes measured and
    ``workers`` the registered workers found alive.
    """

    group: str
    rss_bytes: int
    pss_bytes: int | None
    pss_age_seconds: float | None
    process_count: int
    workers: int


@dataclass(frozen=True)
class NodeGroupMemory:
    """Everything one reading found on one node.

    ``groups`` holds one entry per group with at least one live worker, sorted by
    name. ``gone`` lists registered workers that were not measured; ``skipped_groups``
    the groups left out because the reading reached its process cap. ``cpu_seconds``
    and ``wall_seconds`` are what the reading cost the thread that took it.
    """

    host_name: str
    groups: tuple[GroupMemory, ...]
    gone: tuple[GoneWorker, ...] = ()
    skipped_groups: tuple[str, ...] = ()
    cpu_seconds: float = 0.0
    wall_seconds: float = 0.0

    def as_plain(self) -> dict[str, Any]:
        """This reading as builtins only (str, int, float, None, lists, dicts): cheap to pickle
        and free of raylens classes, so any process can receive it."""
        return {
            "host_name": self.host_name,
            "groups": [
                [g.group, g.rss_bytes, g.pss_bytes, g.pss_age_seconds, g.process_count, g.workers]
                for g in self.groups
            ],
            "gone": [[w.group, w.pid, w.fate.value] for w in self.gone],
            "skipped": list(self.skipped_groups),
            "cpu_seconds": self.cpu_seconds,
            "wall_seconds": self.wall_seconds,
        }

    @classmethod
    def from_plain(cls, plain: Mapping[str, Any]) -> NodeGroupMemory:
        """Rebuild a reading from :meth:`as_plain`; ValueError naming the fault if malformed."""
        if not isinstance(plain, Mapping):
            raise ValueError(f"malformed group-memory reading: expected a dict, got {plain!r:.80}")
        try:
            host = plain["host_name"]
            if not isinstance(host, str):
                raise ValueError(f"host_name is {host!r:.80}, not a str")
            groups = tuple(_plain_group(row) for row in plain["groups"])
            gone = tuple(_plain_gone(row) for row in plain["gone"])
            skipped = tuple(plain["skipped"])
            if not all(isinstance(name, str) for name in skipped):
                raise ValueError(f"skipped is {skipped!r:.80}, not a list of str")
            cpu = _plain_seconds("cpu_seconds", plain.get("cpu_seconds", 0.0))
            wall = _plain_seconds("wall_seconds", plain.get("wall_seconds", 0.0))
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"malformed group-memory reading: {error}") from None
        return cls(host, groups, gone, skipped, cpu, wall)


def _plain_count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} is {value!r:.80}, not a non-negative int")
    return value


def _plain_seconds(name: str, value: object) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise ValueError(f"{name} is {value!r:.80}, not a non-negative number of seconds")
    return float(value)


def _plain_group(row: object) -> GroupMemory:
    if not isinstance(row, (list, tuple)) or len(row) != 6:
        raise ValueError(f"group row {row!r:.80} does not have 6 fields")
    group, rss, pss, age, count, workers = row
    if not isinstance(group, str):
        raise ValueError(f"group name {group!r:.80} is not a str")
    return GroupMemory(
        group,
        _plain_count("rss_bytes", rss),
        None if pss is None else _plain_count("pss_bytes", pss),
        None if age is None else _plain_seconds("pss_age_seconds", age),
        _plain_count("process_count", count),
        _plain_count("workers", workers),
    )


def _plain_gone(row: object) -> GoneWorker:
    if not isinstance(row, (list, tuple)) or len(row) != 3:
        raise ValueError(f"gone row {row!r:.80} does not have 3 fields")
    group, pid, fate = row
    if not isinstance(group, str):
        raise ValueError(f"group name {group!r:.80} is not a str")
    return GoneWorker(group, _plain_count("pid", pid), WorkerFate(fate))


def own_process_identity(procfs: ProcFS | None = None) -> tuple[int, int | None]:
    """``(pid, start_ticks)`` of the calling process, for a worker to report about itself."""
    pid = os.getpid()
    return pid, (procfs or ProcFS()).start_ticks(pid)


# --------------------------------------------------------------------------- validation


def as_group_worker(entry: object) -> GroupWorker:
    """``entry`` as a :class:`GroupWorker`; ValueError naming the fault if it is not one."""
    if not isinstance(entry, (tuple, list)) or len(entry) != 3:
        raise ValueError(
            f"each worker must be a (group, pid, start_ticks) tuple, got {entry!r:.120}"
        )
    group, pid, ticks = entry
    if not isinstance(group, str) or not group:
        raise ValueError(f"worker group must be a non-empty str, got {group!r:.80}")
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        raise ValueError(f"pid of a {group!r} worker must be a positive int, got {pid!r:.80}")
    if ticks is not None and (isinstance(ticks, bool) or not isinstance(ticks, int) or ticks < 0):
        raise ValueError(
            f"start_ticks of {group!r} worker {pid} must be None or a non-negative int, "
            f"got {ticks!r:.80}"
        )
    return GroupWorker(group, pid, ticks)


def _positive_seconds(name: str, value: object) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"{name} must be a positive, finite number of seconds, got {value!r}")
    return float(value)


# --------------------------------------------------------------------------- reader


class GroupMemoryReader:
    """Reads, on one node, the memory of each worker group's process trees.

    ``procfs`` is the :class:`ProcFS` to read (default ``/proc``). RSS comes from
    ``statm`` at every :meth:`read`; PSS, which makes the kernel walk a process's
    page tables under its mmap lock, is read with RSS from ``smaps_rollup`` at most
    every ``pss_interval_seconds`` per group (every reading when None) and carried,
    with its age, in between, for as long as the group's live workers stay the same
    processes. ``clock`` (default :func:`time.monotonic`) times PSS. ``host_name``
    defaults to this host's name. A reading measures at most ``max_processes``
    processes; a group that would go past it is skipped whole rather than
    under-counted.

    Not thread-safe: one reader per sampler, used by one thread at a time.
    """

    def __init__(
        self,
        procfs: ProcFS | None = None,
        *,
        pss_interval_seconds: float | None = None,
        clock: Callable[[], float] | None = None,
        host_name: str | None = None,
        max_processes: int = DEFAULT_MAX_PROCESSES,
    ) -> None:
        self._procfs = procfs if procfs is not None else ProcFS()
        self._pss_interval = (
            None
            if pss_interval_seconds is None
            else _positive_seconds("pss_interval_seconds", pss_interval_seconds)
        )
        if isinstance(max_processes, bool) or not isinstance(max_processes, int):
            raise ValueError(f"max_processes must be a positive int, got {max_processes!r}")
        if max_processes <= 0:
            raise ValueError(f"max_processes must be a positive int, got {max_processes!r}")
        self._max_processes = max_processes
        self._clock = clock or time.monotonic
        self._host_name = host_name if host_name is not None else socket.gethostname()
        # Per group: (pss bytes, when read, the live workers it covered).
        self._pss: dict[str, tuple[int, float, frozenset[tuple[int, int]]]] = {}
        self._pss_attempted: dict[str, float] = {}
        # Start times seen for workers registered without one.
        self._pinned: dict[tuple[str, int], int] = {}

    def read(self, workers: Iterable[tuple[str, int, int | None]]) -> NodeGroupMemory:
        """Measure every group among ``workers`` now.

        A worker whose process has exited, or whose pid now belongs to a process
        that started later, costs only its own contribution and is listed in
        :attr:`NodeGroupMemory.gone`. Raises ValueError, naming it, for an entry
        that is not ``(non-empty str, positive int, None or int >= 0)``.
        """
        cpu_started = time.thread_time()
        wall_started = time.perf_counter()
        entries = [as_group_worker(entry) for entry in workers]
        now = self._clock()
        roots, gone = self._live_roots(entries)
        groups: list[GroupMemory] = []
        skipped: list[str] = []
        budget = self._max_processes
        rss_cache: dict[int, int | None] = {}
        memory_cache: dict[int, tuple[int, int | None] | None] = {}
        for group in sorted(roots):
            pids: set[int] = set()
            alive: set[tuple[int, int]] = set()
            for pid, ticks in roots[group]:
                tree = self._procfs.descendant_pids(pid)
                if tree:
                    pids |= tree
                    alive.add((pid, ticks))
                else:
                    gone.append(GoneWorker(group, pid, WorkerFate.EXITED))
            if not pids:
                continue
            if len(pids) > budget:
                skipped.append(group)
                continue
            budget -= len(pids)
            measured = self._measure(group, pids, frozenset(alive), now, rss_cache, memory_cache)
            if measured is not None:
                groups.append(measured)
        for stale in set(self._pss_attempted) - set(roots):
            self._pss_attempted.pop(stale, None)
            self._pss.pop(stale, None)
        return NodeGroupMemory(
            host_name=self._host_name,
            groups=tuple(groups),
            gone=tuple(gone),
            skipped_groups=tuple(skipped),
            cpu_seconds=max(0.0, time.thread_time() - cpu_started),
            wall_seconds=max(0.0, time.perf_counter() - wall_started),
        )

    def _live_roots(
        self, entries: list[GroupWorker]
    ) -> tuple[dict[str, list[tuple[int, int]]], list[GoneWorker]]:
        """Each group's workers still running as the process registered, with their start."""
        roots: dict[str, list[tuple[int, int]]] = {}
        gone: list[GoneWorker] = []
        pinned: dict[tuple[str, int], int] = {}
        seen: set[tuple[str, int]] = set()
        for group, pid, expected in entries:
            if (group, pid) in seen:
                continue
            seen.add((group, pid))
            current = self._procfs.start_ticks(pid)
            if expected is None and current is not None:
                expected = self._pinned.get((group, pid), current)
                pinned[(group, pid)] = expected
            if current is None:
                gone.append(GoneWorker(group, pid, WorkerFate.EXITED))
            elif current != expected:
                gone.append(GoneWorker(group, pid, WorkerFate.REUSED))
            else:
                roots.setdefault(group, []).append((pid, current))
        self._pinned = pinned
        return roots, gone

    def _measure(
        self,
        group: str,
        pids: set[int],
        alive: frozenset[tuple[int, int]],
        now: float,
        rss_cache: dict[int, int | None],
        memory_cache: dict[int, tuple[int, int | None] | None],
    ) -> GroupMemory | None:
        procfs = self._procfs
        rss_total = 0
        count = 0
        if self._pss_due(group, now):
            pss_total: int | None = 0
            for pid in pids:
                if pid in memory_cache:
                    memory = memory_cache[pid]
                else:
                    memory = memory_cache[pid] = procfs.read_memory(pid)
                if memory is None:
                    continue
                rss, pss = memory
                rss_total += rss
                count += 1
                if pss is None or pss_total is None:
                    pss_total = None
                else:
                    pss_total += pss
            self._pss_attempted[group] = now
            if count and pss_total is not None:
                self._pss[group] = (pss_total, now, alive)
                pss_value: int | None = pss_total
                age: float | None = 0.0
            else:
                self._pss.pop(group, None)
                pss_value = age = None
        else:
            for pid in pids:
                if pid in rss_cache:
                    rss_value = rss_cache[pid]
                else:
                    rss_value = rss_cache[pid] = procfs.read_rss(pid)
                if rss_value is not None:
                    rss_total += rss_value
                    count += 1
            carried = self._pss.get(group)
            pss_value = age = None
            if carried is not None and carried[2] == alive:
                pss_value = carried[0]
                age = max(0.0, now - carried[1])
            elif carried is not None:
                # Its workers changed: the carried figure describes processes that left.
                self._pss.pop(group, None)
        if count == 0:
            return None
        return GroupMemory(group, rss_total, pss_value, age, count, len(alive))

    def _pss_due(self, group: str, now: float) -> bool:
        if self._pss_interval is None:
            return True
        attempted = self._pss_attempted.get(group)
        return attempted is None or now - attempted >= self._pss_interval


# --------------------------------------------------------------------------- snapshot


@dataclass(frozen=True)
class _NodeEntry:
    reading: NodeGroupMemory
    received_at: float
    expires_at: float
    # Per group: (attributes without memory.type, rss, pss, process count).
    rows: tuple[tuple[dict[str, str], int, int | None, int], ...]


class GroupMemorySnapshot:
    """The latest per-node group readings the driver received, as the gauges export them.

    :meth:`publish` replaces the whole content with one cycle's results, keyed by node
    id: a node whose result is not a :class:`NodeGroupMemory` (an error, a timeout)
    or that is missing has no point from then on. A reading is exported until
    ``max_age`` seconds of ``clock`` (default :func:`time.monotonic`) after it was
    published, even if no later cycle replaces it.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] | None = None,
        max_age: float = DEFAULT_MAX_AGE_SECONDS,
    ) -> None:
        self._clock = clock or time.monotonic
        self.max_age = _positive_seconds("max_age", max_age)
        self._lock = threading.Lock()
        self._entries: dict[str, _NodeEntry] = {}

    def publish(self, results: Mapping[str, object], *, max_age: float | None = None) -> None:
        """Make ``results`` (``{node id: reading or error}``) the snapshot's whole content.

        ``max_age`` overrides the snapshot's own for these readings.
        """
        limit = self.max_age if max_age is None else _positive_seconds("max_age", max_age)
        now = self._clock()
        entries: dict[str, _NodeEntry] = {}
        for node_id, reading in results.items():
            if not isinstance(reading, NodeGroupMemory):
                continue
            node = encodable(str(node_id))
            host = encodable(reading.host_name)
            rows = tuple(
                (
                    {
                        WORKER_GROUP_ATTR: encodable(g.group),
                        _NODE_ID_ATTR: node,
                        _HOST_NAME_ATTR: host,
                    },
                    g.rss_bytes,
                    g.pss_bytes,
                    g.process_count,
                )
                for g in reading.groups
            )
            entries[node] = _NodeEntry(reading, now, now + limit, rows)
        with self._lock:
            self._entries = entries

    def _fresh(self) -> list[_NodeEntry]:
        now = self._clock()
        with self._lock:
            entries = list(self._entries.values())
        return [entry for entry in entries if now <= entry.expires_at]

    def observe_usage(self, _options: CallbackOptions | None = None) -> list[Observation]:
        """Points of ``rl.worker_group.memory.usage`` for every fresh reading."""
        points = []
        for entry in self._fresh():
            for attributes, rss, pss, _count in entry.rows:
                points.append(Observation(rss, {**attributes, MEMORY_TYPE_ATTR: _RSS}))
                if pss is not None:
                    points.append(Observation(pss, {**attributes, MEMORY_TYPE_ATTR: _PSS}))
        return points

    def observe_processes(self, _options: CallbackOptions | None = None) -> list[Observation]:
        """Points of ``rl.worker_group.processes`` for every fresh reading."""
        return [
            Observation(count, dict(attributes))
            for entry in self._fresh()
            for attributes, _rss, _pss, count in entry.rows
        ]

    def latest(self) -> dict[str, tuple[NodeGroupMemory, float]]:
        """``{node id: (reading, seconds since published)}`` for every fresh reading, for tables."""
        now = self._clock()
        with self._lock:
            entries = dict(self._entries)
        return {
            node: (entry.reading, max(0.0, now - entry.received_at))
            for node, entry in entries.items()
            if now <= entry.expires_at
        }

    def clear(self) -> None:
        """Forget every reading."""
        with self._lock:
            self._entries = {}


DEFAULT_SNAPSHOT = GroupMemorySnapshot()
"""The snapshot :func:`publish_group_memory` writes and the default gauges read."""


def register_group_memory_gauges(snapshot: GroupMemorySnapshot | None = None) -> None:
    """Export the two group-memory gauges from ``snapshot`` (default :data:`DEFAULT_SNAPSHOT`).

    Idempotent; a later call with another snapshot points the gauges at it.
    """
    source = snapshot if snapshot is not None else DEFAULT_SNAPSHOT
    usage, processes = GROUP_MEMORY_RECORDED_METRICS
    register_observable_gauge(usage, source.observe_usage)
    register_observable_gauge(processes, source.observe_processes)


def publish_group_memory(results: Mapping[str, object], *, max_age: float | None = None) -> None:
    """:meth:`GroupMemorySnapshot.publish` on :data:`DEFAULT_SNAPSHOT`."""
    DEFAULT_SNAPSHOT.publish(results, max_age=max_age)


def reset_group_memory_state() -> None:
    """Forget the default snapshot's readings (tests call this)."""
    DEFAULT_SNAPSHOT.clear()
