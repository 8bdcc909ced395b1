"""Memory per training phase, the part that needs no Ray: each group's start, end and peak.

:class:`NodePhaseTracker` runs on a node (in its sampler, and in the driver for the driver's
own process); :class:`PhaseMemoryTable` keeps the latest run of every phase name for the
gauges (at most :data:`MAX_PHASE_NAMES`); :func:`phase_log_line` is the log line
(the JSON-lines log is :mod:`raylens.telemetry.phases.log`). Invariants a maintainer must keep:

- a peak is labelled ``kernel`` only when the kernel's marks cover the whole phase for
  every process of the group; anything less falls back to ``sampled``, never a mix;
- the table stays bounded whatever names a program makes up;
- the gauges are registered by :func:`register_phase_gauges`, never at import.

What the figures mean: the README's *Memory per phase*; how a phase runs:
``docs/architecture.md``, *Phases, in one paragraph*.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import unicodedata
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry.metrics import CallbackOptions, Observation

from raylens import forking
from raylens.lens import OBSERVABLE_GAUGE, RecordedMetric, register_observable_gauge, warn_once
from raylens.safe_text import encodable, printable
from raylens.telemetry.group_memory import NodeGroupMemory, as_group_worker
from raylens.telemetry.names import HOST_NAME_ATTR, RAY_NODE_ID_ATTR
from raylens.telemetry.procfs import PAGE_SIZE, ProcFS

__all__ = [
    "DEFAULT_TABLE",
    "DRIVER_GROUP",
    "KERNEL_PEAKS_ENV",
    "KERNEL_SOURCE",
    "MAX_PHASE_NAMES",
    "MAX_PHASE_NAME_CHARS",
    "PEAK_SOURCE_ATTR",
    "PHASE_ATTR",
    "PHASE_DELTA_METRIC",
    "PHASE_LOG_ENV",
    "PHASE_PEAK_METRIC",
    "SAMPLED_SOURCE",
    "GroupPhaseMemory",
    "NodePhaseMemory",
    "NodePhaseTracker",
    "PhaseMemoryTable",
    "PhaseRecord",
    "check_phase_name",
    "kernel_peaks_from_env",
    "phase_log_from_env",
    "phase_log_line",
    "register_phase_gauges",
    "reset_phase_memory_state",
]

logger = logging.getLogger("raylens.phases")

PHASE_PEAK_METRIC = "rl.worker_group.memory.phase_peak"
PHASE_DELTA_METRIC = "rl.worker_group.memory.phase_delta"
PHASE_ATTR = "rl.phase"
PEAK_SOURCE_ATTR = "rl.peak.source"
_WORKER_GROUP_ATTR = "rl.worker_group"
KERNEL_SOURCE = "kernel"
SAMPLED_SOURCE = "sampled"
_SOURCES = (KERNEL_SOURCE, SAMPLED_SOURCE)
#: The group the driver process counts as.
DRIVER_GROUP = "driver"

MAX_PHASE_NAMES = 64
"""Distinct phase names whose figures are kept and exported; a new one past it evicts the
name whose latest run ended longest ago, with one warning for the process."""
MAX_PHASE_NAME_CHARS = 128
"""Most characters in a phase name."""
_MAX_GROUPS_PER_NODE = 1024  # a node's report naming more is refused whole
_MAX_GROUP_NAME_CHARS = 256

KERNEL_PEAKS_ENV = "RAYLENS_KERNEL_PEAKS"
PHASE_LOG_ENV = "RAYLENS_PHASE_LOG"
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})

_METRICS = (
    RecordedMetric(
        PHASE_PEAK_METRIC,
        OBSERVABLE_GAUGE,
        "By",
        "Peak memory of a worker group's processes on a node during the latest run of a "
        "phase: the sum of each process's peak (kernel VmHWM, or the largest sample)",
    ),
    RecordedMetric(
        PHASE_DELTA_METRIC,
        OBSERVABLE_GAUGE,
        "By",
        "Memory of a worker group's processes on a node at the end of the latest run of a "
        "phase minus at its start",
    ),
)


def check_phase_name(name: object) -> str:
    """``name`` if it is a usable phase name; TypeError or ValueError saying why not.

    A phase name is a non-empty ``str`` of at most :data:`MAX_PHASE_NAME_CHARS` characters,
    without control characters (it goes into log lines, file names of tools and labels).
    """
    if not isinstance(name, str):
        raise TypeError(f"a phase name must be a str, got {type(name).__name__} {name!r:.80}")
    if not name.strip():
        raise ValueError(f"a phase name must be a non-empty str, got {name!r:.80}")
    if len(name) > MAX_PHASE_NAME_CHARS:
        raise ValueError(
            f"a phase name may have at most {MAX_PHASE_NAME_CHARS} characters, got "
            f"{len(name)}: {printable(name[:60])!r}..."
        )
    if printable(name) != name:
        raise ValueError(
            f"a phase name may not hold control or format characters, got {printable(name)!r}"
        )
    hidden = next((ch for ch in name if _invisible(ch)), None)
    if hidden is not None:
        raise ValueError(
            f"a phase name may not hold invisible characters (fillers, blanks, combining "
            f"joiners, spaces other than ' '), got U+{ord(hidden):04X} in {name!r:.80}"
        )
    return name


#: Characters that print as nothing though Unicode calls them letters or symbols.
_INVISIBLE = frozenset("\u115f\u1160\u3164\uffa0\u2800\u034f\u17b4\u17b5\u180e")


def _invisible(ch: str) -> bool:
    if ch.isascii():
        return False
    if ch in _INVISIBLE:
        return True
    category = unicodedata.category(ch)
    # Other spaces, and variation selectors (marks that only change how a glyph is drawn).
    return category == "Zs" or (
        category == "Mn" and "VARIATION SELECTOR" in unicodedata.name(ch, "")
    )


def kernel_peaks_from_env(environ: Mapping[str, str] | None = None) -> bool:
    """``RAYLENS_KERNEL_PEAKS`` as a bool (unset or empty: True); ValueError if unreadable."""
    env = os.environ if environ is None else environ
    raw = env.get(KERNEL_PEAKS_ENV, "").strip()
    if not raw:
        return True
    if raw.lower() in _TRUE:
        return True
    if raw.lower() in _FALSE:
        return False
    raise ValueError(
        f"{KERNEL_PEAKS_ENV} must be 1 or 0 (or true/false, yes/no, on/off), "
        f"got {printable(raw[:80])!r}"
    )


def phase_log_from_env(environ: Mapping[str, str] | None = None) -> str | None:
    """The JSON-lines file ``RAYLENS_PHASE_LOG`` names, or None when unset or empty."""
    env = os.environ if environ is None else environ
    raw = env.get(PHASE_LOG_ENV, "").strip()
    return raw or None


# --------------------------------------------------------------------------- values


@dataclass(frozen=True)
class GroupPhaseMemory:
    """One group's processes on one node over one phase, in bytes.

    ``peak_bytes`` is at least both ``start_bytes`` and ``end_bytes``; ``source`` says
    where it came from (:data:`KERNEL_SOURCE` or :data:`SAMPLED_SOURCE`).
    """

    group: str
    start_bytes: int
    end_bytes: int
    peak_bytes: int
    source: str

    @property
    def delta_bytes(self) -> int:
        """End minus start."""
        return self.end_bytes - self.start_bytes


@dataclass(frozen=True)
class NodePhaseMemory:
    """Every group of one node over one phase, sorted by group name."""

    host_name: str
    groups: tuple[GroupPhaseMemory, ...]

    def as_plain(self) -> dict[str, Any]:
        """Builtins only, to travel from a sampler process to the driver."""
        return {
            "host_name": self.host_name,
            "groups": [
                [g.group, g.start_bytes, g.end_bytes, g.peak_bytes, g.source] for g in self.groups
            ],
        }

    @classmethod
    def from_plain(cls, plain: object) -> NodePhaseMemory:
        """Rebuild from :meth:`as_plain`; ValueError naming the fault if malformed."""
        if not isinstance(plain, Mapping):
            raise ValueError(f"malformed phase report: expected a dict, got {plain!r:.80}")
        host = plain.get("host_name")
        rows = plain.get("groups")
        if not isinstance(host, str) or len(host) > _MAX_GROUP_NAME_CHARS:
            raise ValueError(f"malformed phase report: host_name is {host!r:.80}")
        if not isinstance(rows, list) or len(rows) > _MAX_GROUPS_PER_NODE:
            raise ValueError(
                f"malformed phase report: groups must be a list of at most "
                f"{_MAX_GROUPS_PER_NODE} rows, got {type(rows).__name__}"
            )
        return cls(host, tuple(sorted(map(_plain_row, rows), key=lambda g: g.group)))


def _plain_row(row: object) -> GroupPhaseMemory:
    if not isinstance(row, (list, tuple)) or len(row) != 5:
        raise ValueError(f"malformed phase report: row {row!r:.80} does not have 5 fields")
    group, start, end, peak, source = row
    if not isinstance(group, str) or not group or len(group) > _MAX_GROUP_NAME_CHARS:
        raise ValueError(f"malformed phase report: group name {group!r:.80}")
    figures = []
    for name, value in (("start", start), ("end", end), ("peak", peak)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"malformed phase report: {name} of {group!r:.80} is {value!r:.80}")
        figures.append(value)
    if source not in _SOURCES:
        raise ValueError(f"malformed phase report: source of {group!r:.80} is {source!r:.80}")
    start_b, end_b, peak_b = figures
    return GroupPhaseMemory(group, start_b, end_b, max(peak_b, start_b, end_b), source)


@dataclass(frozen=True)
class PhaseRecord:
    """One run of a phase as the driver learned it.

    ``nodes`` maps a node id to its figures; ``missing`` names the nodes that hosted
    workers but gave no figures (they did not confirm the start in time, or did not
    answer at the end). ``ended_at`` is wall-clock time (``time.time()``).
    """

    phase: str
    duration_s: float
    ended_at: float
    nodes: Mapping[str, NodePhaseMemory]
    missing: tuple[str, ...] = ()

    def largest_peaks(self) -> dict[str, tuple[str, GroupPhaseMemory]]:
        """Per group, the node where its peak was largest and its figures there."""
        best: dict[str, tuple[str, GroupPhaseMemory]] = {}
        for node_id in sorted(self.nodes):
            for group in self.nodes[node_id].groups:
                known = best.get(group.group)
                if known is None or group.peak_bytes > known[1].peak_bytes:
                    best[group.group] = (node_id, group)
        return dict(sorted(best.items()))

    def to_json(self) -> dict[str, Any]:
        """The whole table as builtins, for the JSON-lines log."""
        return {
            "phase": self.phase,
            "ended_at": self.ended_at,
            "duration_s": self.duration_s,
            "nodes": [
                {
                    "node_id": node_id,
                    "host_name": node.host_name,
                    "groups": [
                        {
                            "group": g.group,
                            "start_bytes": g.start_bytes,
                            "end_bytes": g.end_bytes,
                            "peak_bytes": g.peak_bytes,
                            "delta_bytes": g.delta_bytes,
                            "source": g.source,
                        }
                        for g in node.groups
                    ],
                }
                for node_id, node in sorted(self.nodes.items())
            ],
            "missing_nodes": list(self.missing),
        }


# --------------------------------------------------------------------------- tracker


@dataclass
class _GroupRun:
    start: int
    sampled_peak: int
    # {pid: start ticks} of the group's processes at the start.
    members: dict[int, int]
    # Every member's mark was reset at the start.
    reset: bool


class NodePhaseTracker:
    """One node's side of phases: start readings and peak resets, then the figures at the end.

    ``procfs`` is the reader (default ``/proc``); ``host_name`` defaults to this host's.
    With ``walk_trees`` (the default) a group's processes are its workers' whole process
    trees, as the group-memory reader counts them; without, only the registered
    processes themselves (the driver, whose children are Ray's own processes when it
    started Ray). One phase at a time: a :meth:`begin` replaces a phase not ended.
    Thread-safe: the sampler's timer thread calls :meth:`observe` while its caller begins
    and ends phases.
    """

    def __init__(
        self,
        procfs: ProcFS | None = None,
        *,
        host_name: str | None = None,
        walk_trees: bool = True,
    ) -> None:
        self._procfs = procfs if procfs is not None else ProcFS()
        self._host_name = host_name if host_name is not None else socket.gethostname()
        self._walk_trees = walk_trees
        self._lock = threading.Lock()
        self._token: str | None = None
        self._kernel = False
        self._workers: list[tuple[str, int, int | None]] = []
        self._runs: dict[str, _GroupRun] = {}

    @property
    def active(self) -> str | None:
        """The token of the phase in progress, or None."""
        return self._token

    def begin(self, token: str, workers: Iterable[object], *, kernel_peaks: bool = True) -> None:
        """Start the phase ``token`` for ``workers`` (``(group, pid, start_ticks)``).

        Reads every group's RSS and, with ``kernel_peaks``, resets the high-water mark of
        each of its processes. Raises ValueError, naming it, for a malformed worker.
        """
        checked = [(w.group, w.pid, w.start_ticks) for w in map(as_group_worker, workers)]
        with self._lock:
            runs: dict[str, _GroupRun] = {}
            for group, members in self._members(checked).items():
                reset = kernel_peaks and all(
                    self._procfs.reset_peak_rss(pid) for pid in list(members)
                )
                start = self._rss(members)
                runs[group] = _GroupRun(start, start, members, reset)
            self._token, self._kernel = token, kernel_peaks
            self._workers, self._runs = checked, runs

    def observe(self, reading: NodeGroupMemory) -> None:
        """Raise each group's sampled peak to what the sampler's ``reading`` found."""
        with self._lock:
            if self._token is None:
                return
            for group in reading.groups:
                run = self._runs.get(group.group)
                if run is not None and group.rss_bytes > run.sampled_peak:
                    run.sampled_peak = group.rss_bytes

    def end(self, token: str) -> NodePhaseMemory | None:
        """The figures of phase ``token``, ending it; None when it is not the phase in progress."""
        with self._lock:
            if self._token is None or token != self._token:
                return None
            now_members = self._members(self._workers)
            groups = []
            for group in sorted(set(self._runs) | set(now_members)):
                run = self._runs.get(group)
                members = now_members.get(group, {})
                end = self._rss(members)
                groups.append(self._figures(group, run, members, end))
            self._token, self._workers, self._runs = None, [], {}
            return NodePhaseMemory(self._host_name, tuple(groups))

    def cancel(self) -> None:
        """Drop the phase in progress without figures."""
        with self._lock:
            self._token, self._workers, self._runs = None, [], {}

    def _figures(
        self, group: str, run: _GroupRun | None, members: dict[int, int], end: int
    ) -> GroupPhaseMemory:
        start = run.start if run is not None else 0
        sampled = max(start, end, run.sampled_peak if run is not None else 0)
        # A process that joined during the phase has lived only inside it: its mark
        # counts whole. One there at the start counts only if its mark was reset then.
        kernel_ok = self._kernel and members and (run is None or run.reset)
        if kernel_ok and run is not None and not run.members.keys() <= members.keys():
            kernel_ok = False  # a process left: its peak went with it
        if kernel_ok:
            peak = 0
            for pid in members:
                mark = self._procfs.read_peak_rss(pid)
                if mark is None:
                    break
                peak += mark
            else:
                return GroupPhaseMemory(group, start, end, max(peak, start, end), KERNEL_SOURCE)
        return GroupPhaseMemory(group, start, end, sampled, SAMPLED_SOURCE)

    def _members(self, workers: list[tuple[str, int, int | None]]) -> dict[str, dict[int, int]]:
        """``{group: {pid: start ticks}}`` of every live process of each group now."""
        procfs = self._procfs
        found: dict[str, dict[int, int]] = {}
        for group, pid, expected in workers:
            started = procfs.start_ticks(pid)
            if started is None or (expected is not None and started != expected):
                continue
            members = found.setdefault(group, {})
            members[pid] = started
            if not self._walk_trees:
                continue
            for child in procfs.descendant_pids(pid) - {pid}:
                child_start = procfs.start_ticks(child)
                if child_start is not None:
                    members[child] = child_start
        return found

    def _rss(self, members: dict[int, int]) -> int:
        total = 0
        for pid, started in members.items():
            stat = self._procfs.read_stat(pid)
            if stat is None or stat[0] != started:
                continue
            if stat[1] > 0:
                total += stat[1] * PAGE_SIZE
            else:  # nothing resident, or a procfs whose stat leaves the field at 0
                total += self._procfs.read_rss(pid) or 0
        return total


# --------------------------------------------------------------------------- table


class PhaseMemoryTable:
    """The latest run of every phase name, as the gauges export it.

    At most ``max_names`` names (default :data:`MAX_PHASE_NAMES`): a run of a new name past
    it evicts the name whose latest run ended longest ago, warned once per process, so
    what is exported stays bounded whatever names a program makes up. Thread-safe.
    """

    def __init__(self, *, max_names: int = MAX_PHASE_NAMES) -> None:
        if isinstance(max_names, bool) or not isinstance(max_names, int) or max_names <= 0:
            raise ValueError(f"max_names must be a positive int, got {max_names!r:.80}")
        self.max_names = max_names
        self._lock = threading.Lock()
        self._records: OrderedDict[str, PhaseRecord] = OrderedDict()
        # Per record: (attributes, peak, delta) of every point.
        self._points: dict[str, list[tuple[dict[str, str], int, int]]] = {}
        forking.reset_after_fork_in_child(self)

    def reset_after_fork(self) -> None:
        """In a forked child: a fresh lock (an export may have held it at the fork)."""
        self._lock = threading.Lock()

    def record(self, record: PhaseRecord) -> None:
        """Make ``record`` its phase's latest run."""
        points = [
            (
                {
                    PHASE_ATTR: encodable(record.phase),
                    _WORKER_GROUP_ATTR: encodable(g.group),
                    RAY_NODE_ID_ATTR: encodable(node_id),
                    HOST_NAME_ATTR: encodable(node.host_name),
                    PEAK_SOURCE_ATTR: g.source,
                },
                g.peak_bytes,
                g.delta_bytes,
            )
            for node_id, node in sorted(record.nodes.items())
            for g in node.groups
        ]
        evicted: str | None = None
        with self._lock:
            self._records.pop(record.phase, None)
            self._records[record.phase] = record
            self._points[record.phase] = points
            if len(self._records) > self.max_names:
                evicted, _ = self._records.popitem(last=False)
                self._points.pop(evicted, None)
        if evicted is not None:
            warn_once(
                "phase_memory.names",
                f"more than {self.max_names} distinct phase names: the figures of phase "
                f"{printable(evicted[:80])!r}, whose latest run ended longest ago, are no "
                "longer exported (each new name evicts the oldest; warned once)",
                logger=logger,
            )

    def latest(self, phase: str) -> PhaseRecord | None:
        """The latest run of ``phase``, or None."""
        with self._lock:
            return self._records.get(phase)

    def phases(self) -> list[str]:
        """The phase names kept, the one ended longest ago first."""
        with self._lock:
            return list(self._records)

    def observe_peak(self, _options: CallbackOptions | None = None) -> list[Observation]:
        """Points of ``rl.worker_group.memory.phase_peak``."""
        with self._lock:
            rows = [row for points in self._points.values() for row in points]
        return [Observation(peak, dict(attributes)) for attributes, peak, _delta in rows]

    def observe_delta(self, _options: CallbackOptions | None = None) -> list[Observation]:
        """Points of ``rl.worker_group.memory.phase_delta``."""
        with self._lock:
            rows = [row for points in self._points.values() for row in points]
        return [Observation(delta, dict(attributes)) for attributes, _peak, delta in rows]

    def clear(self) -> None:
        with self._lock:
            self._records.clear()
            self._points.clear()


DEFAULT_TABLE = PhaseMemoryTable()
"""The table the driver's phases write and the default gauges read."""


def register_phase_gauges(table: PhaseMemoryTable | None = None) -> None:
    """Export the two phase gauges from ``table`` (default :data:`DEFAULT_TABLE`); idempotent."""
    source = table if table is not None else DEFAULT_TABLE
    peak, delta = _METRICS
    register_observable_gauge(peak, source.observe_peak)
    register_observable_gauge(delta, source.observe_delta)


def reset_phase_memory_state() -> None:
    """Forget every phase run of the default table (tests)."""
    DEFAULT_TABLE.clear()


# --------------------------------------------------------------------------- reporting


def _size(value: int) -> str:
    sign = "-" if value < 0 else ""
    amount = float(abs(value))
    for unit in ("B", "KiB", "MiB", "GiB"):
        if amount < 1024 or unit == "GiB":
            return f"{sign}{amount:.0f} {unit}" if unit == "B" else f"{sign}{amount:.1f} {unit}"
        amount /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def phase_log_line(record: PhaseRecord) -> str:
    """One line: the phase, its duration, and per group its largest peak, where, and its delta."""
    parts = []
    for group, (node_id, figures) in record.largest_peaks().items():
        delta = figures.delta_bytes
        parts.append(
            f"{printable(group[:80])} peak {_size(figures.peak_bytes)} ({figures.source}) on "
            f"node {printable(node_id[:12])} ({printable(record.nodes[node_id].host_name[:60])}),"
            f" delta {'+' if delta >= 0 else ''}{_size(delta)}"
        )
    line = f"phase {printable(record.phase)!r} ended after {record.duration_s:.2f} s: " + (
        "; ".join(parts) if parts else "no group figures"
    )
    if record.missing:
        shown = ", ".join(printable(node[:12]) for node in record.missing[:5])
        more = f" and {len(record.missing) - 5} more" if len(record.missing) > 5 else ""
        line += f" (no figures from node(s) {shown}{more})"
    return line
