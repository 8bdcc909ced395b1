"""MemoryHistory: the samples, growth and growing state of every node and worker group.

Invariants a maintainer must keep:

- keys are a node id, or ``(node, group)``; with groups, ``(node, None)`` is the memory
  outside them, and a node grows when one of its parts grows, at the sum of the growing
  parts' rates (a part that does not grow adds nothing, so one noisy part cannot make a
  node's time to limit);
- figures depend on the samples (and the phase boundaries marked between them) only, never
  on when they are read, and are the same whether samples come one at a time or in arrays;
- what is held is bounded by live parts: a group absent from a node's records for a window
  is forgotten, and a node holds at most :data:`MAX_GROUPS_PER_NODE` groups (the smallest
  of the rest count as memory outside the groups);
- one lock guards every call, so a sampler thread may record while another reads.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from raylens.telemetry.growth._arrays import FloatArray
from raylens.telemetry.growth._estimator import GrowthEstimator, PhaseMarks
from raylens.telemetry.growth._limit import time_to_limit
from raylens.telemetry.growth._series import Bucket, SeriesBuffer
from raylens.telemetry.growth._settings import GrowthSettings

__all__ = [
    "FULL_RESOLUTION_S",
    "MAX_GROUPS_PER_NODE",
    "Key",
    "MemoryHistory",
    "NodeGrowth",
    "SeriesGrowth",
]

#: A node id, or ``(node id, group)``; group None is the node's memory outside its groups.
Key = str | tuple[str, str | None]


def _node_of(key: Key) -> str:
    """The node a key's series belongs to (the node's own, a group's, or the rest's)."""
    return key[0] if isinstance(key, tuple) else key


#: Most worker groups kept per node; beyond it the smallest count as memory outside groups.
MAX_GROUPS_PER_NODE = 64
#: Longest span of samples kept at full resolution (what a post-mortem shows); older ones are
#: kept in buckets. The growth judgement keeps its own slices, so a long window costs nothing
#: here: a series holds at most this many seconds of samples whatever the window.
FULL_RESOLUTION_S = 900.0


@dataclass(frozen=True)
class SeriesGrowth:
    """One series as last judged.

    ``used`` and ``sampled_at`` are the newest sample. ``growth`` is bytes per second (never
    negative), None until the window has been seen. ``growing`` says whether the series
    grows now, ``rate`` is its rate while it does (None otherwise), ``growing_since`` when
    the spell began and ``spells`` how many have begun. ``peak`` is the highest sample of
    the recent scales: the level memory comes back up to, which reaches a line first.
    """

    used: float | None
    sampled_at: float | None
    growth: float | None
    growing: bool
    rate: float | None = None
    growing_since: float | None = None
    spells: int = 0
    peak: float | None = None


@dataclass(frozen=True)
class NodeGrowth:
    """A node: its used memory and growth, and those of its worker groups.

    ``groups`` holds the groups of the node's latest record; ``other`` is the memory outside
    them (None when the node was recorded without groups). With groups, the node is growing
    when a part is, and ``growth`` is then the sum of the growing parts' rates; otherwise it
    is the node's own figure. ``fastest_group`` is the group with the highest growth, None
    when no group has a figure. ``peak`` is the node's recurring peak (see
    :class:`SeriesGrowth`).
    """

    node: str
    used: float | None
    sampled_at: float | None
    growth: float | None
    growing: bool
    groups: Mapping[str, SeriesGrowth] = field(default_factory=dict)
    other: SeriesGrowth | None = None
    fastest_group: str | None = None
    peak: float | None = None

    def time_to_limit(self, limit: float | None) -> float | None:
        """Seconds until the node's recurring peak reaches ``limit`` at its growth, only while growing."""
        level = self.used if self.peak is None or self.used is None else max(self.peak, self.used)
        return time_to_limit(limit, level, self.growth, self.growing)


class _Entry:
    __slots__ = ("buffer", "estimator", "seen_at")

    def __init__(self, settings: GrowthSettings) -> None:
        full = min(settings.window_s, FULL_RESOLUTION_S)
        self.buffer = SeriesBuffer(full, settings.bucket_s, settings.buckets)
        self.estimator = GrowthEstimator(settings)
        self.seen_at = -math.inf

    def add(self, t: float, value: float) -> None:
        self.buffer.append(t, value)
        self.estimator.add(t, value)
        if math.isfinite(t) and math.isfinite(value):
            self.seen_at = max(self.seen_at, t)

    def extend(self, times: FloatArray, values: FloatArray) -> None:
        if len(times) == 1:
            self.add(float(times[0]), float(values[0]))
            return
        self.buffer.extend(times, values)
        self.buffer.trim()
        self.estimator.add_many(times, values)
        if len(times):
            self.seen_at = float(times[-1])

    def view(self) -> SeriesGrowth | None:
        est = self.estimator
        if est.last_time is None:
            return None
        return SeriesGrowth(
            est.last_value,
            est.last_time,
            est.growth,
            est.growing,
            est.rate,
            est.growing_since,
            est.spells,
            est.peak,
        )


class MemoryHistory:
    """History and growth of memory series, bounded in memory per series.

    Record with :meth:`record_node` (a node and, optionally, its groups at one instant),
    :meth:`record` (one sample of any key) or :meth:`record_many` /
    :meth:`record_node_many` (arrays, for replays of recorded traces and simulations).
    Read with :meth:`node`, :meth:`series`, :meth:`window` and :meth:`buckets`.
    :meth:`forget` drops a node and its groups.
    """

    def __init__(self, settings: GrowthSettings | None = None) -> None:
        self.settings = settings or GrowthSettings()
        self._lock = threading.Lock()
        self._series: dict[Key, _Entry] = {}
        self._groups: dict[str, tuple[str, ...] | None] = {}
        self._limits: dict[str, float] = {}
        self._phases: dict[str, PhaseMarks] = {}
        # Bytes left before the line of the node being recorded, handed to its series.
        self._room: float | None = None

    # recording -----------------------------------------------------------------

    def record(self, key: Key, t: float, value: float) -> None:
        """One sample of ``key``: ``value`` bytes at ``t`` seconds (any monotonic clock)."""
        with self._lock:
            self._room = None
            self._entry(key).add(float(t), float(value))

    def record_many(self, key: Key, times: npt.ArrayLike, values: npt.ArrayLike) -> None:
        """Samples of ``key`` in time order; judged as if they had arrived one by one."""
        t = np.asarray(times, dtype=np.float64)
        v = np.asarray(values, dtype=np.float64)
        if t.shape != v.shape or t.ndim != 1:
            raise ValueError(
                f"times and values must be 1-D and of one length, got {t.shape} and {v.shape}"
            )
        with self._lock:
            self._room = None
            self._entry(key).extend(t, v)

    def record_node(
        self, node: str, t: float, used: float, groups: Mapping[str, float] | None = None
    ) -> None:
        """A node's used bytes at ``t`` and, when known, each worker group's bytes on it.

        With ``groups`` (even empty), the memory outside them is recorded too, and the
        node's growth comes from its parts'.
        """
        self.record_node_many(
            node,
            [t],
            [used],
            None if groups is None else {name: [value] for name, value in groups.items()},
        )

    def record_node_many(
        self,
        node: str,
        times: npt.ArrayLike,
        used: npt.ArrayLike,
        groups: Mapping[str, npt.ArrayLike] | None = None,
    ) -> None:
        """:meth:`record_node` for many instants at once (arrays of one length, time order).

        A group's NaN is a sample it does not have; the memory outside the groups counts
        only the groups' finite samples.
        """
        t = np.asarray(times, dtype=np.float64)
        u = np.asarray(used, dtype=np.float64)
        parts = (
            None
            if groups is None
            else {str(g): np.asarray(v, dtype=np.float64) for g, v in groups.items()}
        )
        for array in (u, *(parts or {}).values()):
            if array.shape != t.shape or t.ndim != 1:
                raise ValueError(
                    "times, used and every group must be 1-D and of one length, got "
                    f"{t.shape} and {array.shape}"
                )
        with self._lock:
            self._add_node(node, t, u, parts)

    def _add_node(
        self, node: str, t: FloatArray, used: FloatArray, groups: Mapping[str, FloatArray] | None
    ) -> None:
        limit = self._limits.get(node)
        room = None
        if limit is not None and len(used) and math.isfinite(float(used[-1])):
            room = limit - float(used[-1])
        self._room = room
        self._entry(node).extend(t, used)
        if groups is None:
            self._groups[node] = None
            return
        if len(groups) > MAX_GROUPS_PER_NODE:
            given = groups
            largest = sorted(given, key=lambda g: -float(np.nan_to_num(given[g]).max()))
            groups = {g: given[g] for g in largest[:MAX_GROUPS_PER_NODE]}
        names = tuple(sorted(groups))
        finite = [np.where(np.isfinite(groups[name]), groups[name], 0.0) for name in names]
        # Summed exactly, so that the memory outside the groups does not depend on their order.
        inside = np.array([math.fsum(column) for column in zip(*finite)]) if finite else 0.0
        for name in names:
            self._entry((node, name)).extend(t, groups[name])
        self._entry((node, None)).extend(t, used - inside)
        if len(t):
            self._forget_absent(node, names, float(t[-1]))
        self._groups[node] = names

    def _forget_absent(self, node: str, names: tuple[str, ...], now: float) -> None:
        """Drop the node's groups that have had no sample for a window."""
        before = self._groups.get(node) or ()
        for name in before:
            if name in names:
                continue
            entry = self._series.get((node, name))
            if entry is not None and now - entry.seen_at >= self.settings.window_s:
                del self._series[(node, name)]

    def mark_phase(self, node: str, t: float) -> None:
        """A phase of the job began or ended at ``t`` (the clock of the node's samples; place
        it before the samples that follow it). Once a node's phases are marked, fast growth in
        its series must go on across a boundary before it is flagged: what one phase fills and
        the next frees is not a leak.

        Raises:
            ValueError: for a ``t`` that is not finite or is before the node's newest mark.
        """
        with self._lock:
            marks = self._phases.get(node)
            if marks is not None:
                marks.mark(t)
                return
            marks = PhaseMarks(self.settings)
            marks.mark(t)  # a bad first mark leaves the node unmarked
            self._phases[node] = marks
            for key, entry in self._series.items():
                if _node_of(key) == node:
                    entry.estimator.phases = marks

    def set_limit(self, node: str, limit: float | None) -> None:
        """The node's kill line in bytes (None: unknown). Growth that would reach it within an
        hour is flagged on the shortest evidence; without a line, only the usual evidence counts."""
        with self._lock:
            if limit is None or not math.isfinite(limit):
                self._limits.pop(node, None)
            else:
                self._limits[node] = float(limit)

    def forget(self, node: str, *, keep_phase_marks: bool = False) -> None:
        """Drop a node, its groups and the memory outside them (and, unless
        ``keep_phase_marks``, the node's phase boundaries: the job's, not the node's memory)."""
        with self._lock:
            self._groups.pop(node, None)
            self._limits.pop(node, None)
            if not keep_phase_marks:
                self._phases.pop(node, None)
            for key in [k for k in self._series if _node_of(k) == node]:
                del self._series[key]

    # reading -------------------------------------------------------------------

    def phase_boundaries(self, node: str) -> tuple[float, ...]:
        """The node's newest phase boundaries, oldest first (empty when none was marked)."""
        with self._lock:
            marks = self._phases.get(node)
            return () if marks is None else marks.times

    def keys(self) -> list[Key]:
        """Every key with history."""
        with self._lock:
            return list(self._series)

    def series(self, key: Key) -> SeriesGrowth | None:
        """The latest state of ``key``, or None if it has no samples."""
        with self._lock:
            entry = self._series.get(key)
            return entry.view() if entry else None

    def node(self, node: str) -> NodeGrowth | None:
        """The latest state of ``node`` with its groups, or None if it was never recorded."""
        with self._lock:
            entry = self._series.get(node)
            own = entry.view() if entry else None
            if own is None:
                return None
            names = self._groups.get(node)
            if names is None:
                return NodeGrowth(
                    node, own.used, own.sampled_at, own.growth, own.growing, peak=own.peak
                )
            groups = {}
            for name in names:
                part = self._series.get((node, name))
                view = part.view() if part else None
                if view is not None:
                    groups[name] = view
            outside = self._series.get((node, None))
            other = outside.view() if outside else None
            parts = [*groups.values(), *([other] if other else [])]
            rates = [p.rate for p in parts if p.growing and p.rate is not None]
            growing = bool(rates)
            growth = math.fsum(rates) if growing else own.growth
            rated = [(view.growth, name) for name, view in groups.items() if view.growth]
            fastest = max(rated)[1] if rated else None
            return NodeGrowth(
                node, own.used, own.sampled_at, growth, growing, groups, other, fastest, own.peak
            )

    def window(self, key: Key) -> tuple[FloatArray, FloatArray]:
        """Copies of ``key``'s full-resolution samples (times, bytes): the last window, or
        :data:`FULL_RESOLUTION_S` of a longer one."""
        with self._lock:
            entry = self._series.get(key)
            return entry.buffer.window() if entry else (np.empty(0), np.empty(0))

    def buckets(self, key: Key) -> list[Bucket]:
        """The downsampled history of ``key`` before its window, oldest first."""
        with self._lock:
            entry = self._series.get(key)
            return entry.buffer.buckets() if entry else []

    def nbytes(self) -> int:
        """Bytes held in sample and bucket arrays, over every series."""
        with self._lock:
            return sum(entry.buffer.nbytes() for entry in self._series.values())

    # internals -----------------------------------------------------------------

    def _entry(self, key: Key) -> _Entry:
        entry = self._series.get(key)
        if entry is None:
            entry = self._series[key] = _Entry(self.settings)
            entry.estimator.phases = self._phases.get(_node_of(key))
        entry.estimator.room = self._room if isinstance(key, tuple) or key in self._limits else None
        return entry
