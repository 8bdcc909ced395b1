"""The samples of one memory series: the last window at full resolution, older ones in buckets.

Invariants a maintainer must keep: memory per series is bounded whatever the run's length
(full resolution only for the window and what a due fit still needs, then a fixed number of
buckets back to the horizon); samples are float32 offsets from a float64 anchor per series,
and the anchors move forward before an offset loses the precision below (about 1 KiB at
16 GiB, 4 ms at 18 hours), so it holds for runs of any length and any host size.

The layout and its memory: ``docs/architecture.md``, *Memory over time*, *Series and keys*.
"""

from __future__ import annotations

import math
from array import array
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from raylens.telemetry.growth._arrays import FloatArray

__all__ = ["Bucket", "SeriesBuffer"]


_TIME_REBASE_S = float(1 << 16)
_VALUE_REBASE = float(1 << 34)
_MIN_CAPACITY = 16
#: Scalar appends wait in raw double arrays (nothing there for the garbage collector to walk)
#: until this many, or until the window is read.
_PENDING = 64
#: Spare room over the live samples when the buffer is resized; a fuller buffer is compacted
#: (the oldest moved out) every ``_SLACK * window`` samples.
_SLACK = 0.2


class Bucket(NamedTuple):
    """The samples of one downsampled slice of time: ``[start, start + width)``."""

    start: float
    width: float
    samples: int
    minimum: float
    maximum: float
    mean: float


class SeriesBuffer:
    """Samples of one series, appended in time order.

    A sample older than the newest one already held is ignored (a late or repeated reading
    would otherwise make time run backwards). Non-finite values are ignored too.
    """

    __slots__ = (
        "_b_count",
        "_b_id",
        "_b_max",
        "_b_mean",
        "_b_min",
        "_bucket_s",
        "_hi",
        "_lo",
        "_pending_t",
        "_pending_v",
        "_t",
        "_t0",
        "_v",
        "_v0",
        "hold_from",
        "window_s",
    )

    def __init__(self, window_s: float, bucket_s: float, buckets: int) -> None:
        self.window_s = window_s
        #: While set, samples from a window before this time are kept (a fit still due needs them).
        self.hold_from: float | None = None
        self._bucket_s = bucket_s
        self._t = np.empty(_MIN_CAPACITY, dtype=np.float32)
        self._v = np.empty(_MIN_CAPACITY, dtype=np.float32)
        self._lo = 0
        self._hi = 0
        self._t0 = math.nan
        self._v0 = 0.0
        self._pending_t = array("d")
        self._pending_v = array("d")
        self._b_id = np.full(buckets, -1, dtype=np.int64)
        self._b_count = np.zeros(buckets, dtype=np.int32)
        self._b_min = np.zeros(buckets, dtype=np.float32)
        self._b_max = np.zeros(buckets, dtype=np.float32)
        self._b_mean = np.zeros(buckets, dtype=np.float32)

    def __len__(self) -> int:
        return self._hi - self._lo + len(self._pending_t)

    @property
    def last_time(self) -> float | None:
        """Time of the newest sample, or None before the first."""
        if self._pending_t:
            return self._pending_t[-1]
        return None if self._hi == self._lo else self._t0 + float(self._t[self._hi - 1])

    @property
    def last_value(self) -> float | None:
        """The newest sample's bytes, or None before the first."""
        if self._pending_v:
            value = self._pending_v[-1]
            if math.isnan(self._t0):
                return value
            # As it will read once stored, so a figure never depends on when it was stored.
            return self._v0 + float(np.float32(value - self._v0))
        return None if self._hi == self._lo else self._v0 + float(self._v[self._hi - 1])

    def nbytes(self) -> int:
        """Bytes held by this series' arrays (numpy buffers, not the Python objects)."""
        self._flush()
        arrays = (
            self._t,
            self._v,
            self._b_id,
            self._b_count,
            self._b_min,
            self._b_max,
            self._b_mean,
        )
        return sum(a.nbytes for a in arrays)

    def append(self, t: float, value: float) -> None:
        """Add one sample (seconds, bytes); cheap, as a monitor calls it for every series every cycle."""
        if math.isfinite(t) and math.isfinite(value):
            self.append_finite(t, value)

    def append_finite(self, t: float, value: float) -> None:
        """:meth:`append` for a sample whose time and value the caller has found finite."""
        pending_t = self._pending_t
        # The newest time held, as :attr:`last_time` reads it (inlined: this runs per series per cycle).
        if pending_t:
            if t <= pending_t[-1]:
                return
        elif self._hi != self._lo and t <= self._t0 + float(self._t[self._hi - 1]):
            return
        pending_t.append(t)
        self._pending_v.append(value)
        if len(pending_t) >= _PENDING:
            self._flush()

    def _flush(self) -> None:
        pending_v = self._pending_v
        if pending_v:
            times = np.array(self._pending_t, dtype=np.float64)
            values = np.array(pending_v, dtype=np.float64)
            # Read off the few raw doubles: cheaper than numpy's reductions over them.
            low, high = min(pending_v), max(pending_v)
            del self._pending_t[:]
            del pending_v[:]
            self._store(times, values, low, high)

    def extend(self, times: FloatArray, values: FloatArray) -> None:
        """Add samples in time order; any not after the newest held (or not finite) are skipped."""
        self._flush()
        times = np.asarray(times, dtype=np.float64)
        values = np.asarray(values, dtype=np.float64)
        if len(times) == 0:
            return
        last = self.last_time
        clean = (
            bool(np.isfinite(values).all())
            and math.isfinite(float(times[0]))
            and math.isfinite(float(times[-1]))
            and (len(times) == 1 or bool((times[1:] > times[:-1]).all()))
        )
        if not clean:
            keep = np.isfinite(times) & np.isfinite(values)
            times, values = times[keep], values[keep]
            if len(times) > 1:
                ordered = np.maximum.accumulate(times)
                fresh = np.ones(len(times), dtype=bool)
                fresh[1:] = times[1:] > ordered[:-1]
                times, values = times[fresh], values[fresh]
            if len(times) == 0:
                return
        if last is not None and times[0] <= last:
            start = int(np.searchsorted(times, last, side="right"))
            times, values = times[start:], values[start:]
            if len(times) == 0:
                return
        self._store(times, values)

    def _store(
        self,
        times: FloatArray,
        values: FloatArray,
        low: float | None = None,
        high: float | None = None,
    ) -> None:
        """Append samples already checked to be finite and newer than those held.

        ``low`` and ``high`` are the least and greatest of ``values`` when the caller has them.
        """
        if math.isnan(self._t0):
            self._t0 = float(times[0])
            self._v0 = float(values[0])
        newest = float(times[-1])
        if low is None or high is None:
            low, high = float(values.min()), float(values.max())
        self._rebase(newest, low, high, float(values[-1]))
        cutoff = self._cutoff(newest)
        if times[0] < cutoff:
            # Samples already older than the window go straight to the buckets.
            old = int(np.searchsorted(times, cutoff, side="left"))
            self._fold(times[:old], (values[:old] - self._v0).astype(np.float32))
            times, values = times[old:], values[old:]
        self._make_room(len(times), newest)
        end = self._hi + len(times)
        self._t[self._hi : end] = times - self._t0
        self._v[self._hi : end] = values - self._v0
        self._hi = end

    def trim(self) -> None:
        """Shrink the buffer back to about one window when a bulk load left it much larger.

        Called when the fits that held older samples are done. Cheap when there is nothing
        to shrink.
        """
        self._flush()
        newest = self.last_time
        if newest is None:
            return
        oldest = self._t0 + float(self._t[self._lo])
        if oldest < self._cutoff(newest) - _SLACK * self.window_s:
            self._evict()
        live = self._hi - self._lo
        if len(self._t) > 2 * max(live, _MIN_CAPACITY):
            capacity = max(_MIN_CAPACITY, int(live * (1 + _SLACK)) + 1)
            new_t = np.empty(capacity, dtype=np.float32)
            new_v = np.empty(capacity, dtype=np.float32)
            new_t[:live] = self._t[self._lo : self._hi]
            new_v[:live] = self._v[self._lo : self._hi]
            self._t, self._v, self._lo, self._hi = new_t, new_v, 0, live

    def _evict(self) -> None:
        """Move samples that have left the window (and that no fit holds) to the buckets."""
        self._flush()
        newest = self.last_time
        if newest is None:
            return
        self._lo += self._fold_departed(newest)

    def _fold_departed(self, newest: float) -> int:
        """Fold the held samples that have left the window ending at ``newest`` into the buckets.

        Returns how many there were, all at the front of ``[_lo, _hi)``; the caller drops them.
        """
        t = self._t[self._lo : self._hi]
        departed = int(t.searchsorted(np.float32(self._cutoff(newest) - self._t0), side="left"))
        if departed:
            start, stop = self._lo, self._lo + departed
            self._fold(self._t[start:stop].astype(np.float64) + self._t0, self._v[start:stop])
        return departed

    def _cutoff(self, newest: float) -> float:
        """Samples before this time have left the window (and no fit still needs them)."""
        return (newest if self.hold_from is None else min(newest, self.hold_from)) - self.window_s

    def window(self, end: float | None = None) -> tuple[FloatArray, FloatArray]:
        """The samples of the window ending at ``end`` (default: the newest sample), as float64."""
        self._flush()
        if self._hi == self._lo:
            return np.empty(0), np.empty(0)
        if end is None:
            end = self.last_time
            assert end is not None
        t = self._t[self._lo : self._hi]
        first, stop = self._window_bounds(t, end)
        return (
            t[first:stop].astype(np.float64) + self._t0,
            self._v[self._lo + first : self._lo + stop].astype(np.float64) + self._v0,
        )

    def window_parts(
        self, end: float
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32], float, float]:
        """The window ending at ``end`` as stored: float32 time and byte offsets (views, valid
        until the next sample is added) and the two anchors they are offsets from."""
        self._flush()
        t = self._t[self._lo : self._hi]
        first, stop = self._window_bounds(t, end)
        return t[first:stop], self._v[self._lo + first : self._lo + stop], self._t0, self._v0

    def held_span(self) -> float:
        """Seconds from the oldest held sample to the newest, as stored; 0 with fewer than two.

        No window :meth:`window_parts` returns spans more (a fit can skip reading one that
        could not span enough).
        """
        self._flush()
        if self._hi - self._lo < 2:
            return 0.0
        return float(self._t[self._hi - 1]) - float(self._t[self._lo])

    def _window_bounds(self, t: npt.NDArray[np.float32], end: float) -> tuple[int, int]:
        """Where the window ending at ``end`` starts and stops in ``t``, the held time offsets."""
        first = int(t.searchsorted(np.float32(end - self.window_s - self._t0), side="left"))
        stop = int(t.searchsorted(np.float32(end - self._t0), side="right"))
        return first, stop

    def buckets(self) -> list[Bucket]:
        """The downsampled history, oldest first (samples that have left the window)."""
        self._evict()
        filled = np.flatnonzero(self._b_id >= 0)
        order = filled[np.argsort(self._b_id[filled])]
        width = self._bucket_s
        return [
            Bucket(
                start=float(self._b_id[k]) * width,
                width=width,
                samples=int(self._b_count[k]),
                minimum=self._v0 + float(self._b_min[k]),
                maximum=self._v0 + float(self._b_max[k]),
                mean=self._v0 + float(self._b_mean[k]),
            )
            for k in order
        ]

    # internals --------------------------------------------------------------------

    def _rebase(self, newest_t: float, low: float, high: float, last: float) -> None:
        """Move the anchors forward before offsets to ``newest_t`` or to values from ``low``
        to ``high`` (the incoming samples, ``last`` the newest of them) lose precision."""
        shift_t = 0.0
        if newest_t - self._t0 > _TIME_REBASE_S:
            oldest = self._t0 + float(self._t[self._lo]) if self._hi > self._lo else newest_t
            shift_t = min(oldest, newest_t) - self._t0
        shift_v = 0.0
        if max(high - self._v0, self._v0 - low) > _VALUE_REBASE:
            shift_v = last - self._v0
        if shift_t:
            self._t[self._lo : self._hi] -= np.float32(shift_t)
            self._t0 += shift_t
        if shift_v:
            self._v[self._lo : self._hi] -= np.float32(shift_v)
            for array in (self._b_min, self._b_max, self._b_mean):
                array -= np.float32(shift_v)
            self._v0 += shift_v

    def _make_room(self, incoming: int, newest_t: float) -> None:
        if self._hi + incoming <= len(self._t):
            return
        keep_from = self._fold_departed(newest_t)
        live = self._hi - self._lo - keep_from
        needed = live + incoming
        capacity = len(self._t)
        if needed > capacity * (1 - _SLACK / 2) or needed > capacity:
            capacity = max(_MIN_CAPACITY, int(needed * (1 + _SLACK)) + 1)
        if capacity != len(self._t):
            new_t = np.empty(capacity, dtype=np.float32)
            new_v = np.empty(capacity, dtype=np.float32)
        else:
            new_t, new_v = self._t, self._v
        new_t[:live] = self._t[self._lo + keep_from : self._hi]
        new_v[:live] = self._v[self._lo + keep_from : self._hi]
        self._t, self._v = new_t, new_v
        self._lo, self._hi = 0, live

    def _fold(self, times: FloatArray, values: npt.NDArray[np.float32]) -> None:
        """Add samples (absolute times, values as offsets from the anchor) to the buckets."""
        if not len(times):
            return
        ids = np.floor(times / self._bucket_s).astype(np.int64)
        edges = np.flatnonzero(np.diff(ids)) + 1
        starts = np.concatenate([[0], edges])
        mins = np.minimum.reduceat(values, starts)
        maxs = np.maximum.reduceat(values, starts)
        sums = np.add.reduceat(values.astype(np.float64), starts)
        counts = np.diff(np.concatenate([starts, [len(values)]]))
        slots = len(self._b_id)
        for bucket, low, high, total, count in zip(
            ids[starts].tolist(), mins.tolist(), maxs.tolist(), sums.tolist(), counts.tolist()
        ):
            slot = bucket % slots
            if int(self._b_id[slot]) != bucket:
                self._b_id[slot] = bucket
                self._b_count[slot] = count
                self._b_min[slot] = low
                self._b_max[slot] = high
                self._b_mean[slot] = total / count
                continue
            held = int(self._b_count[slot])
            self._b_mean[slot] = (float(self._b_mean[slot]) * held + total) / (held + count)
            self._b_count[slot] = held + count
            self._b_min[slot] = min(float(self._b_min[slot]), low)
            self._b_max[slot] = max(float(self._b_max[slot]), high)
