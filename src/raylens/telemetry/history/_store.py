"""MemoryHistory: the samples, growth and growing state of every node and worker group.

Invariants a maintainer must keep:

- keys are a node id, or ``(node, group)``; with groups, ``(node, None)`` is the memory
  outside them and the node's growth is the sum of its parts', not a fit of its own;
- a series is fitted every ``refit_every_s`` of its own time, so figures depend on the
  samples only, not on when they are read; due fits run together, in batches;
- one lock guards every call, so a monitor thread may record while another reads.

Why the parts are summed, and when fits run: ``docs/architecture.md``, *Memory over time*.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from raylens.telemetry.history._arrays import FloatArray
from raylens.telemetry.history._decision import GrowthTracker
from raylens.telemetry.history._estimator import fit_growth_batch
from raylens.telemetry.history._limit import time_to_limit
from raylens.telemetry.history._series import Bucket, SeriesBuffer
from raylens.telemetry.history._settings import GrowthSettings

__all__ = ["Key", "MemoryHistory", "NodeGrowth", "SeriesGrowth"]

#: A node id, or ``(node id, group)``; group None is the node's memory outside its groups.
Key = str | tuple[str, str | None]

#: A window must span this share of the window setting before it is fitted.
_FULL_WINDOW = 0.9
#: Fits one series may have waiting before every waiting fit is run (a window's worth).
_MAX_DUE = 10


@dataclass(frozen=True)
class SeriesGrowth:
    """One series as last fitted.

    ``used`` and ``sampled_at`` are the newest sample. ``growth`` is bytes per second, None
    until a window's worth of samples has been seen (and again when fits have failed for a
    whole window). ``confirmed`` says whether that figure rests on more than one step's jump
    (see :mod:`._estimator`); ``trusted`` is the latest confirmed figure of the last window.
    ``growing`` is the hysteresis decision of :mod:`._decision`, ``growing_since`` when it
    last became true, ``spells`` how many times it has become true. ``rate`` is, while it
    grows, the rate a node adds up and draws its time to the kill line from (the median of
    its last figures, see :mod:`._decision`), None otherwise.
    """

    used: float | None
    sampled_at: float | None
    growth: float | None
    confirmed: bool
    growing: bool
    trusted: float | None = None
    growing_since: float | None = None
    spells: int = 0
    rate: float | None = None


@dataclass(frozen=True)
class NodeGrowth:
    """A node: its used memory and growth, and those of its worker groups.

    ``groups`` holds the groups of the node's latest record; ``other`` is the memory outside
    them (None when the node was recorded without groups). With groups, ``growth`` adds up
    each growing part's ``rate`` and each other part's ``trusted`` figure (a part without
    one counts its figure if confirmed, else nothing), and is None while any part has no
    figure, unless a part grows: a quiet part without a figure (new, or whose fits have
    failed for a window) then counts nothing rather than hiding the growth; ``growing`` needs that sum to
    reach ``grow_slow`` and one part to be growing. ``fastest_group`` is the group with the
    highest growth, None when no group has a figure.
    """

    node: str
    used: float | None
    sampled_at: float | None
    growth: float | None
    growing: bool
    groups: Mapping[str, SeriesGrowth] = field(default_factory=dict)
    other: SeriesGrowth | None = None
    fastest_group: str | None = None

    def time_to_limit(self, limit: float | None) -> float | None:
        """Seconds until ``used`` reaches ``limit`` at the current growth, only while growing."""
        return time_to_limit(limit, self.used, self.growth, self.growing)


def _steady(part: SeriesGrowth) -> float:
    if part.rate is not None:
        return part.rate
    if part.trusted is not None:
        return part.trusted
    return part.growth if part.confirmed and part.growth is not None else 0.0


class _Entry:
    __slots__ = ("buffer", "due", "next_fit", "tracker")

    def __init__(self, settings: GrowthSettings) -> None:
        self.buffer = SeriesBuffer(settings.window_s, settings.bucket_s, settings.buckets)
        self.tracker = GrowthTracker(settings)
        self.next_fit = -math.inf
        self.due: list[float] = []


class _Node:
    """A node's group names as last recorded, and its series in the order a record adds to them.

    ``parts`` is the node's own buffer, then ``(key, entry, its buffer)`` of each group in
    ``parts_of`` order, then of the memory outside them: found once per set of groups, so recording a
    node costs no look-up per series. The entries are those of ``_series`` (only
    :meth:`MemoryHistory.forget` drops them, and it drops this too).
    """

    __slots__ = ("groups", "parts", "parts_of")

    def __init__(self) -> None:
        self.groups: tuple[str, ...] | None = None
        self.parts_of: tuple[str, ...] | None = None
        self.parts: tuple[SeriesBuffer, tuple[tuple[Key, _Entry, SeriesBuffer], ...]] | None = None


class MemoryHistory:
    """History and growth of memory series, bounded in memory per series.

    Record with :meth:`record_node` (a node and, optionally, its groups at one instant),
    :meth:`record` (one sample of any key) or :meth:`record_many` (many samples of one key,
    for replays and simulations). Read with :meth:`node`, :meth:`series`, :meth:`window`
    and :meth:`buckets`. :meth:`forget` drops a node and its groups.
    """

    def __init__(self, settings: GrowthSettings | None = None) -> None:
        self.settings = settings or GrowthSettings()
        self._lock = threading.Lock()
        self._series: dict[Key, _Entry] = {}
        self._nodes: dict[str, _Node] = {}
        self._due: dict[Key, _Entry] = {}

    # recording -----------------------------------------------------------------

    def record(self, key: Key, t: float, value: float) -> None:
        """One sample of ``key``: ``value`` bytes at ``t`` seconds (any monotonic clock)."""
        with self._lock:
            self._add_one(key, float(t), float(value))

    def record_many(self, key: Key, times: npt.ArrayLike, values: npt.ArrayLike) -> None:
        """Samples of ``key`` in time order; fitted as if they had arrived one by one."""
        t = np.asarray(times, dtype=np.float64)
        v = np.asarray(values, dtype=np.float64)
        if t.shape != v.shape or t.ndim != 1:
            raise ValueError(
                f"times and values must be 1-D and of one length, got {t.shape} and {v.shape}"
            )
        with self._lock:
            self._add(key, t, v)

    def record_node(
        self, node: str, t: float, used: float, groups: Mapping[str, float] | None = None
    ) -> None:
        """A node's used bytes at ``t`` and, when known, each worker group's bytes on it.

        With ``groups`` (even empty), the memory outside them is recorded too, and the
        node's growth becomes the sum of its parts'. Groups missing from a later record
        leave the node's figures; their history stays until :meth:`forget`.
        """
        with self._lock:
            state = self._nodes.get(node)
            if state is None:
                state = self._nodes[node] = _Node()
            t, used = float(t), float(used)
            if groups is None:
                self._add_one(node, t, used)
                state.groups = None
                return
            names = tuple(sorted(groups))
            state.groups = names
            parts = state.parts
            if parts is None or state.parts_of != names:
                keys: list[Key] = [(node, name) for name in names]
                keys.append((node, None))
                own_entry = self._entry(node)  # first: keys() lists series as they came
                entries = [(key, self._entry(key)) for key in keys]
                parts = state.parts = (
                    own_entry.buffer,
                    tuple((key, entry, entry.buffer) for key, entry in entries),
                )
                state.parts_of = names
            own, series = parts
            isfinite = math.isfinite
            if not isfinite(t):
                return  # no sample is kept, nor fit due, at a time that is not finite
            if isfinite(used):
                own.append_finite(t, used)
            values = []
            inside = 0.0
            for name in names:
                value = float(groups[name])
                if isfinite(value):
                    inside += value
                values.append(value)
            values.append(used - inside)  # the memory outside the groups
            every = self.settings.fit_interval_s
            unset = -math.inf
            for (key, entry, buffer), value in zip(series, values):
                if isfinite(value):
                    buffer.append_finite(t, value)
                # What :meth:`_add_one` does, without its look-up.
                next_fit = entry.next_fit
                if next_fit == unset:
                    entry.next_fit = t + every
                elif t >= next_fit:
                    self._mark_due(key, entry, t)

    def record_node_many(
        self,
        node: str,
        times: npt.ArrayLike,
        used: npt.ArrayLike,
        groups: Mapping[str, npt.ArrayLike] | None = None,
    ) -> None:
        """:meth:`record_node` for many instants at once (arrays of one length, time order)."""
        t = np.asarray(times, dtype=np.float64)
        u = np.asarray(used, dtype=np.float64)
        parts = (
            None
            if groups is None
            else {g: np.asarray(v, dtype=np.float64) for g, v in groups.items()}
        )
        for array in (u, *(parts or {}).values()):
            if array.shape != t.shape or t.ndim != 1:
                raise ValueError(
                    f"times, used and every group must be 1-D and of one length, got {t.shape} and {array.shape}"
                )
        with self._lock:
            self._add_node(node, t, u, parts)

    def _add_node(
        self, node: str, t: FloatArray, used: FloatArray, groups: Mapping[str, FloatArray] | None
    ) -> None:
        state = self._nodes.get(node)
        if state is None:
            state = self._nodes[node] = _Node()
        self._add(node, t, used, fit=groups is None)
        if groups is None:
            state.groups = None
            return
        names = tuple(sorted(groups))
        state.groups = names
        inside = np.zeros(len(t))
        for name in names:
            values = groups[name]
            inside += np.where(np.isfinite(values), values, 0.0)
            self._add((node, name), t, values)
        self._add((node, None), t, used - inside)

    def forget(self, node: str) -> None:
        """Drop a node, its groups and the memory outside them."""
        with self._lock:
            self._nodes.pop(node, None)
            for key in [
                k for k in self._series if k == node or (isinstance(k, tuple) and k[0] == node)
            ]:
                del self._series[key]
                self._due.pop(key, None)

    # reading -------------------------------------------------------------------

    def keys(self) -> list[Key]:
        """Every key with history."""
        with self._lock:
            self._settle()
            return list(self._series)

    def series(self, key: Key) -> SeriesGrowth | None:
        """The latest state of ``key``, or None if it has no samples."""
        with self._lock:
            self._settle()
            return self._view(key)

    def node(self, node: str) -> NodeGrowth | None:
        """The latest state of ``node`` with its groups, or None if it was never recorded."""
        with self._lock:
            self._settle()
            own = self._view(node)
            state = self._nodes.get(node)
            if own is None:
                return None
            if state is None or state.groups is None:
                return NodeGrowth(node, own.used, own.sampled_at, own.growth, own.growing)
            groups = {name: view for name in state.groups if (view := self._view((node, name)))}
            other = self._view((node, None))
            parts = [*groups.values(), *([other] if other else [])]
            growth: float | None = None
            if parts and (
                all(p.growth is not None for p in parts) or any(p.rate is not None for p in parts)
            ):
                growth = math.fsum(_steady(p) for p in parts)
            growing = (
                growth is not None
                and growth >= self.settings.grow_slow
                and any(p.growing for p in parts)
            )
            rated = [
                (view.growth, name) for name, view in groups.items() if view.growth is not None
            ]
            fastest = max(rated)[1] if rated else None
            return NodeGrowth(
                node, own.used, own.sampled_at, growth, growing, groups, other, fastest
            )

    def window(self, key: Key) -> tuple[FloatArray, FloatArray]:
        """Copies of the full-resolution samples of ``key``'s last window (times, bytes)."""
        with self._lock:
            self._settle()
            entry = self._series.get(key)
            return entry.buffer.window() if entry else (np.empty(0), np.empty(0))

    def buckets(self, key: Key) -> list[Bucket]:
        """The downsampled history of ``key`` before its window, oldest first."""
        with self._lock:
            self._settle()
            entry = self._series.get(key)
            return entry.buffer.buckets() if entry else []

    def nbytes(self) -> int:
        """Bytes held in sample and bucket arrays, over every series."""
        with self._lock:
            self._settle()
            return sum(entry.buffer.nbytes() for entry in self._series.values())

    # internals -----------------------------------------------------------------

    def _view(self, key: Key) -> SeriesGrowth | None:
        entry = self._series.get(key)
        if entry is None or entry.buffer.last_time is None:
            return None
        tracker = entry.tracker
        return SeriesGrowth(
            entry.buffer.last_value,
            entry.buffer.last_time,
            tracker.growth,
            tracker.confirmed,
            tracker.growing,
            tracker.trusted,
            tracker.growing_since,
            tracker.spells,
            tracker.rate,
        )

    def _entry(self, key: Key) -> _Entry:
        entry = self._series.get(key)
        if entry is None:
            entry = self._series[key] = _Entry(self.settings)
        return entry

    def _mark_due(self, key: Key, entry: _Entry, t: float, *, settle: bool = True) -> None:
        entry.due.append(t)
        entry.buffer.hold_from = entry.due[0]
        self._due[key] = entry
        every = self.settings.fit_interval_s
        entry.next_fit = max(entry.next_fit + every, t + every / 2)
        if settle and len(entry.due) >= _MAX_DUE:
            self._settle()

    def _add_one(self, key: Key, t: float, value: float, *, fit: bool = True) -> None:
        entry = self._entry(key)
        entry.buffer.append(t, value)
        if not fit or not math.isfinite(t):
            return
        if entry.next_fit == -math.inf:
            entry.next_fit = t + self.settings.fit_interval_s
        elif t >= entry.next_fit:
            self._mark_due(key, entry, t)

    def _add(self, key: Key, times: FloatArray, values: FloatArray, *, fit: bool = True) -> None:
        entry = self._entry(key)
        if not fit or not len(times):
            entry.buffer.extend(times, values)
            entry.buffer.trim()
            return
        finite = np.isfinite(times)
        if not finite.all():
            times, values = times[finite], values[finite]
            if not len(times):
                return
        every = self.settings.fit_interval_s
        upcoming = entry.next_fit if entry.next_fit != -math.inf else float(times[0]) + every
        entry.next_fit = upcoming
        due = []
        while True:
            at = int(np.searchsorted(times, upcoming, side="left"))
            if at >= len(times):
                break
            due.append(float(times[at]))
            upcoming = max(upcoming + every, due[-1] + every / 2)
        if due and not entry.due:
            # Keep the samples the first of these fits needs while the rest arrive.
            entry.buffer.hold_from = due[0]
        entry.buffer.extend(times, values)
        for when in due:
            self._mark_due(key, entry, when, settle=False)
        if len(entry.due) >= _MAX_DUE:
            self._settle()

    def _settle(self) -> None:
        """Run every fit that is due, oldest first for each series, many series per batch."""
        settings = self.settings
        needed = _FULL_WINDOW * settings.window_s
        while self._due:
            rounds: dict[int, list[tuple[_Entry, float, np.ndarray, np.ndarray, float, float]]] = {}
            for key, entry in list(self._due.items()):
                when = entry.due.pop(0)
                buffer = entry.buffer
                # A series whose samples span too little for a fit has no window to read.
                window = buffer.window_parts(when) if buffer.held_span() >= needed else None
                if entry.due:
                    buffer.hold_from = entry.due[0]
                else:
                    del self._due[key]
                    buffer.hold_from = None
                    buffer.trim()
                if window is None:
                    continue
                t, x, t0, v0 = window
                if len(t) < 2 or float(t[-1]) - float(t[0]) < needed:
                    continue
                rounds.setdefault(len(t), []).append((entry, when, t, x, t0, v0))
            for rows in rounds.values():
                anchors = np.array([(row[4], row[5]) for row in rows])
                # Where each window may hold a change point, and the one found before.
                asked = np.empty(len(rows))
                onsets = np.empty(len(rows))
                for n_row, row in enumerate(rows):
                    tracker = row[0].tracker
                    asked[n_row] = tracker.change_point_from(row[1])
                    onsets[n_row] = math.nan if tracker.onset is None else tracker.onset
                times = np.stack([row[2] for row in rows]).astype(np.float64) + anchors[:, :1]
                values = np.stack([row[3] for row in rows]).astype(np.float64) + anchors[:, 1:]
                fits = fit_growth_batch(
                    times,
                    values,
                    step_bytes=settings.step_bytes,
                    radius_s=settings.trough_radius_s,
                    recent_from=asked,
                    onsets=onsets,
                )
                for row, fit in zip(rows, fits):
                    row[0].tracker.update(row[1], fit)
