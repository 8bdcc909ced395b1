"""How one node's worker groups are read: the values a reading produces and the reader.

The public names are re-exported by :mod:`raylens.telemetry.group_memory`; see there
for what the figures mean.
"""

from __future__ import annotations

import enum
import heapq
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from raylens.telemetry.procfs import PAGE_SIZE, ProcFS, PssSchedule, sum_tree_memory
from raylens.telemetry.raylet_payload import NodeGroupFigures
from raylens.validation import non_negative_seconds, positive_seconds

DEFAULT_MAX_PROCESSES = 4096
"""Most processes one reading measures on a node; the largest groups past it are skipped whole."""


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
    name. ``gone`` lists registered workers that were not measured (a zombie worker as
    exited); ``skipped_groups`` the groups left out, whole and sorted by name, because
    measuring them would have passed the process cap. ``cpu_seconds``
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


class PublishedReading:
    """A node's reading as its sampler published it, made a :class:`NodeGroupMemory` when read.

    The driver holds one per node per new reading: two objects in all (this and the
    figures the scrape brought), where the built reading has one per group more, and
    every object that outlives a cycle brings the collector's full passes sooner. The
    gauges read :meth:`points`; tables :meth:`reading`, built once and kept. Each group's
    ``workers`` are counted from ``workers`` (registered workers on the node, by group);
    ``registry_version`` is the registration those counts come from.
    """

    __slots__ = ("_built", "figures", "host_name", "registry_version", "workers")

    def __init__(
        self,
        host_name: str,
        figures: NodeGroupFigures,
        workers: Mapping[str, int],
        registry_version: int = 0,
    ) -> None:
        self.host_name = host_name
        self.figures = figures
        self.workers = workers
        self.registry_version = registry_version
        self._built: NodeGroupMemory | None = None

    def group_names(self) -> Iterator[str]:
        """The groups' names, in the figures' order."""
        return (row[0] for row in self.figures.rows)

    def points(self) -> Iterator[tuple[int, int | None, int]]:
        """``(rss bytes, pss bytes or None, processes)`` per group, in the figures' order."""
        for _group, rss, pss, processes, *_rates_and_ages in self.figures.rows:
            yield (round(rss), None if pss is None else round(pss), round(processes or 0))

    def pss_ages(self) -> Iterator[float | None]:
        """Per group, in the figures' order, how old its PSS was at the sampler's reading.

        None where there is no PSS; 0 where the sampler gave PSS without its age.
        """
        for row in self.figures.rows:
            yield None if row[2] is None else (row[5] if row[5] is not None else 0.0)

    def reading(self) -> NodeGroupMemory:
        """The published figures as a reading, PSS with the age its sampler gave it."""
        built = self._built
        if built is None:
            workers = self.workers
            groups = tuple(
                GroupMemory(row[0], rss, pss, age, processes, workers.get(row[0], 0))
                for row, (rss, pss, processes), age in zip(
                    self.figures.rows, self.points(), self.pss_ages()
                )
            )
            built = self._built = NodeGroupMemory(self.host_name, groups)
        return built

    def __repr__(self) -> str:
        return f"PublishedReading({self.host_name!r:.80}, {self.figures!r:.200})"


def _plain_count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} is {value!r:.80}, not a non-negative int")
    return value


def _plain_seconds(name: str, value: object) -> float:
    return non_negative_seconds(name, value)


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


def _optional_seconds(name: str, value: object) -> float | None:
    return None if value is None else check_positive_seconds(name, value)


check_positive_seconds = positive_seconds


# --------------------------------------------------------------------------- reader


class GroupMemoryReader:
    """Reads, on one node, the memory of each worker group's process trees.

    ``procfs`` is the :class:`ProcFS` to read (default ``/proc``); every file is
    read through it and its opener, and one it cannot read counts as a process
    gone. Every :meth:`read` reads each known process's ``stat`` once
    (:meth:`ProcFS.read_stat`): its start time (the pid-reuse guard) and its
    resident pages (``statm`` only when that reads 0). Finding a worker's
    descendants costs one read per thread of every process in its tree, so with ``tree_interval_seconds`` a tree
    is walked again only that often (every reading when None); a new worker's tree
    is walked at once, and a process spawned in between is counted from the next
    walk. PSS, which makes the kernel walk a process's page tables under its mmap
    lock, is read from ``smaps_rollup`` at most every ``pss_interval_seconds`` per
    group (every reading when None), after a fresh walk, and carried with its age
    in between for as long as the group's live workers stay the same processes.
    ``clock`` (default :func:`time.monotonic`) times both intervals. ``host_name``
    defaults to this host's name. A reading measures at most ``max_processes``
    processes; a group that would go past it is skipped whole rather than
    under-counted; the cap goes to the smallest groups first, so a big group cannot
    crowd out the others, and those left out are listed in
    :attr:`NodeGroupMemory.skipped_groups`. A zombie (a process that exited and
    waits to be reaped) is not a process here: a zombie worker is listed in
    :attr:`NodeGroupMemory.gone` as exited, and a zombie descendant is not counted.

    Not thread-safe: one reader per sampler, used by one thread at a time.
    """

    def __init__(
        self,
        procfs: ProcFS | None = None,
        *,
        pss_interval_seconds: float | None = None,
        tree_interval_seconds: float | None = None,
        clock: Callable[[], float] | None = None,
        host_name: str | None = None,
        max_processes: int = DEFAULT_MAX_PROCESSES,
    ) -> None:
        self._procfs = procfs if procfs is not None else ProcFS()
        self._pss_schedule = PssSchedule(
            _optional_seconds("pss_interval_seconds", pss_interval_seconds)
        )
        self._tree_interval = _optional_seconds("tree_interval_seconds", tree_interval_seconds)
        if isinstance(max_processes, bool) or not isinstance(max_processes, int):
            raise ValueError(f"max_processes must be a positive int, got {max_processes!r}")
        if max_processes <= 0:
            raise ValueError(f"max_processes must be a positive int, got {max_processes!r}")
        self._max_processes = max_processes
        self._clock = clock or time.monotonic
        self._host_name = host_name if host_name is not None else socket.gethostname()
        # Per group: (pss bytes, when read, the live workers it covered).
        self._pss: dict[str, tuple[int, float, frozenset[tuple[int, int]]]] = {}
        # Per live worker (pid, start): when its tree was walked, and {pid: start} of it.
        self._trees: dict[tuple[int, int], tuple[float, dict[int, int]]] = {}
        # Start times seen for workers registered without one.
        self._pinned: dict[tuple[str, int], int] = {}
        #: The largest measured processes of the latest reading, ``(pid, group, rss)``,
        #: at most :data:`LARGEST_PROCESSES` (what an OOM post-mortem lists).
        self.largest_processes: tuple[tuple[int, str, int], ...] = ()

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
        round_ = _Round(self._procfs)
        roots, gone = self._live_roots(entries, round_)
        trees: dict[tuple[int, int], tuple[float, dict[int, int]]] = {}
        found: dict[str, tuple[bool, dict[int, int], frozenset[tuple[int, int]]]] = {}
        for group in sorted(roots):
            pss_due = self._pss_schedule.due(group, now)
            members: dict[int, int] = {}
            alive: set[tuple[int, int]] = set()
            for root in roots[group]:
                tree = self._tree(root, now, pss_due, round_, trees)
                if tree:
                    members.update(tree)
                    alive.add(root)
                else:
                    gone.append(GoneWorker(group, root[0], WorkerFate.EXITED))
            if members:
                found[group] = (pss_due, members, frozenset(alive))
        measured_groups, skipped = self._within_cap(found)
        groups: list[GroupMemory] = []
        for group in measured_groups:
            due, tree_members, live_roots = found[group]
            measured = self._measure(group, tree_members, live_roots, now, due, round_)
            if measured is not None:
                groups.append(measured)
        self.largest_processes = _largest(
            ((group, found[group][1]) for group in measured_groups), round_
        )
        self._trees = trees
        for stale in self._pss_schedule.keep_only(roots):
            self._pss.pop(stale, None)
        return NodeGroupMemory(
            host_name=self._host_name,
            groups=tuple(groups),
            gone=tuple(gone),
            skipped_groups=tuple(skipped),
            cpu_seconds=max(0.0, time.thread_time() - cpu_started),
            wall_seconds=max(0.0, time.perf_counter() - wall_started),
        )

    def _within_cap(
        self, found: Mapping[str, tuple[bool, dict[int, int], frozenset[tuple[int, int]]]]
    ) -> tuple[list[str], list[str]]:
        """``(groups to measure, groups skipped)``, each in name order.

        A group is measured whole or not at all, and the cap goes to the smallest
        groups first (ties by name): that measures as many groups as the cap allows,
        and one group with hundreds of processes cannot crowd out a small one,
        whatever their names. What is left out is a group that would take more than
        remains after every smaller one.
        """
        budget = self._max_processes
        measured: list[str] = []
        skipped: list[str] = []
        for group in sorted(found, key=lambda name: (len(found[name][1]), name)):
            size = len(found[group][1])
            if size > budget:
                skipped.append(group)
            else:
                budget -= size
                measured.append(group)
        return sorted(measured), sorted(skipped)

    def _live_roots(
        self, entries: list[GroupWorker], round_: _Round
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
            current = round_.start_ticks(pid)
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

    def _tree(
        self,
        root: tuple[int, int],
        now: float,
        force: bool,
        round_: _Round,
        trees: dict[tuple[int, int], tuple[float, dict[int, int]]],
    ) -> dict[int, int]:
        """``{pid: start}`` of ``root``'s tree, walked now or remembered; empty if it is gone."""
        known = trees.get(root) or self._trees.get(root)
        interval = self._tree_interval
        if known is not None and not force and interval is not None and now - known[0] < interval:
            trees[root] = known
            return known[1]
        pid, ticks = root
        tree: dict[int, int] = {}
        for member in self._procfs.descendant_pids(pid):
            started = ticks if member == pid else round_.start_ticks(member)
            if started is not None:
                tree[member] = started
        if tree:
            trees[root] = (now, tree)
        return tree

    def _measure(
        self,
        group: str,
        members: dict[int, int],
        alive: frozenset[tuple[int, int]],
        now: float,
        pss_due: bool,
        round_: _Round,
    ) -> GroupMemory | None:
        pss_value: int | None = None
        age: float | None = None
        if pss_due:
            memory = sum_tree_memory(
                round_.memory(pid, started) for pid, started in members.items()
            )
            self._pss_schedule.attempted(group, now)
            if memory.process_count and memory.pss_bytes is not None:
                self._pss[group] = (memory.pss_bytes, now, alive)
                pss_value, age = memory.pss_bytes, 0.0
            else:
                self._pss.pop(group, None)
        else:
            memory = sum_tree_memory(
                (round_.rss(pid, started) for pid, started in members.items()),
                include_pss=False,
            )
            carried = self._pss.get(group)
            if carried is not None and carried[2] == alive:
                pss_value, age = carried[0], max(0.0, now - carried[1])
            elif carried is not None:
                # Its workers changed: the carried figure describes processes that left.
                self._pss.pop(group, None)
        if memory.process_count == 0:
            return None
        return GroupMemory(
            group, memory.rss_bytes, pss_value, age, memory.process_count, len(alive)
        )


#: How many of a reading's largest processes a reader keeps.
LARGEST_PROCESSES = 10


def _largest(
    groups: Iterable[tuple[str, dict[int, int]]], round_: _Round
) -> tuple[tuple[int, str, int], ...]:
    """The reading's largest processes by RSS, from what the round already read (no I/O)."""
    found = []
    for group, members in groups:
        for pid, started in members.items():
            rss = round_.rss(pid, started)
            if rss is not None:
                found.append((rss[0], pid, group))
    return tuple((pid, group, rss) for rss, pid, group in heapq.nlargest(LARGEST_PROCESSES, found))


class _Round:
    """What one reading learned per pid, so a process in several trees is read once."""

    __slots__ = ("_memory", "_procfs", "_rss", "_stats")

    def __init__(self, procfs: ProcFS) -> None:
        self._procfs = procfs
        self._stats: dict[int, tuple[int, int] | None] = {}
        self._rss: dict[int, tuple[int, None] | None] = {}
        self._memory: dict[int, tuple[int, int | None] | None] = {}

    def _stat(self, pid: int) -> tuple[int, int] | None:
        if pid not in self._stats:
            self._stats[pid] = self._procfs.read_stat(pid)
        return self._stats[pid]

    def start_ticks(self, pid: int) -> int | None:
        stat = self._stat(pid)
        return None if stat is None else stat[0]

    def rss(self, pid: int, started: int) -> tuple[int, None] | None:
        """``(rss, None)`` of ``pid`` if it is still the process that started at ``started``."""
        stat = self._stat(pid)
        if stat is None or stat[0] != started:
            return None
        if stat[1] > 0:
            return stat[1] * PAGE_SIZE, None
        # Nothing resident, or a procfs whose stat leaves the field at 0: ask statm.
        if pid not in self._rss:
            rss = self._procfs.read_rss(pid)
            self._rss[pid] = None if rss is None else (rss, None)
        return self._rss[pid]

    def memory(self, pid: int, started: int) -> tuple[int, int | None] | None:
        """``(rss, pss)`` of ``pid`` if it is still the process that started at ``started``."""
        if self.start_ticks(pid) != started:
            return None
        if pid not in self._memory:
            self._memory[pid] = self._procfs.read_memory(pid)
        return self._memory[pid]
