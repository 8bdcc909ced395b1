"""One growth fit: a robust slope of a memory series over one window.

The fit follows the floor memory returns to after each release (troughs between cuts), so
an allocator's sawtooth, phase steps larger than ``step_bytes`` and spikes are not read as
growth. Invariants a maintainer must keep:

- ``Fit.confirmed`` is true only when the fit does not rest on a cut's jump alone;
- a series with releases but too few troughs has no fit (None), never a guess;
- :func:`fit_growth_batch` gives each row what :func:`fit_growth` gives it alone: rows
  never influence each other.

Cuts, troughs, the slope and what confirms it: ``docs/architecture.md``, *Memory over time*,
*The fit*.
"""

from __future__ import annotations

import bisect
import itertools
import math
from typing import NamedTuple

import numpy as np

from raylens.telemetry.history._arrays import BoolArray, FloatArray, IntArray
from raylens.telemetry.history._change_point import slope_since_change
from raylens.telemetry.history._split_steps import fold_spike_residues, joined_jumps, spike_spans
from raylens.telemetry.history._teeth import tooth_confirms

__all__ = ["MAX_POINTS", "MIN_SAMPLES", "Fit", "fit_growth", "fit_growth_batch"]


#: Troughs kept per fit: the lowest in each of this many equal slices of the window.
MAX_POINTS = 24
#: Fewest samples a window needs before it is fitted.
MIN_SAMPLES = 8
_PAIRS: dict[tuple[int, int], tuple[IntArray, IntArray]] = {}


class Fit(NamedTuple):
    """The result of fitting one window.

    ``slope`` is bytes per second. ``agreement`` is the share of the long pairs whose slope
    has the sign of ``slope`` (1.0 when every pair agrees). ``points`` is how many troughs
    or samples the slope was taken over; ``troughs`` whether they were troughs (False for
    a series without releases); ``cuts`` the times of the cuts between them, so that two
    unconfirmed fits can be told to rest on different cuts. ``restart`` is True when a cut
    may also have restarted an allocator cycle, which reads the same as growth across it
    when too few troughs surround the cut to tell. ``recent`` is the rate since the point
    where growth started inside the window, None when the window shows no such point (or
    its slope was below the ``recent_from`` it was fitted with); ``onset`` is that point's
    time.
    """

    slope: float
    confirmed: bool
    agreement: float
    points: int
    cuts: tuple[float, ...]
    troughs: bool = True
    restart: bool = False
    recent: float | None = None
    onset: float | None = None


def _pairs(m: int, apart: int = 1) -> tuple[IntArray, IntArray]:
    """Index pairs ``i < j`` of ``m`` points with ``j - i >= apart``."""
    pairs = _PAIRS.get((m, apart))
    if pairs is None:
        i, j = np.triu_indices(m, max(1, apart))
        pairs = _PAIRS[(m, apart)] = (i.astype(np.intp), j.astype(np.intp))
    return pairs


def _median(values: FloatArray) -> float:
    """Median of a small 1-D array (a sort is several times cheaper than ``np.median`` here)."""
    ordered = np.sort(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return float(ordered[middle])
    return float(ordered[middle - 1] + ordered[middle]) / 2


def _masked_median(values: FloatArray, mask: BoolArray) -> FloatArray:
    """Median of each row over ``mask``; NaN for a row with nothing masked in."""
    ordered = np.sort(np.where(mask, values, np.inf), axis=1)
    count = mask.sum(axis=1)
    low = np.maximum((count - 1) // 2, 0)[:, None]
    high = np.maximum(count // 2, 0)[:, None]
    with np.errstate(invalid="ignore"):
        middle = (np.take_along_axis(ordered, low, 1) + np.take_along_axis(ordered, high, 1))[
            :, 0
        ] / 2
    return np.where(count > 0, middle, np.nan)


def _sliding_min(x: FloatArray, h: int) -> FloatArray:
    """Minimum of each row of ``x`` over ``[i - h, i + h]`` (clipped at the ends), by doubling."""
    n = x.shape[1]
    width = 2 * h + 1
    pad = np.full((x.shape[0], h), np.inf)
    acc = np.concatenate([pad, x, pad], axis=1)
    span = 1
    while span * 2 <= width:
        acc = np.minimum(acc[:, :-span], acc[:, span:])
        span *= 2
    if span < width:
        acc = np.minimum(acc[:, : acc.shape[1] - (width - span)], acc[:, width - span :])
    return acc[:, :n]


def _merge_spikes(
    cuts: list[int], d: FloatArray, within: int, tolerance: float
) -> tuple[list[int], list[tuple[int, int]]]:
    """Split cuts into steps and spikes: pairs of opposite cuts at most ``within`` samples
    apart that cancel within ``tolerance``. A spike ``(a, b)`` covers samples ``a`` to ``b - 1``.
    """
    found = []
    for a in range(len(cuts)):
        for b in range(a + 1, len(cuts)):
            if cuts[b] - cuts[a] > within:
                break
            total = abs(float(d[cuts[a] - 1] + d[cuts[b] - 1]))
            if total < tolerance:
                found.append((total, a, b))
    if not found:
        return cuts, []
    gone: set[int] = set()
    spikes = []
    for _, a, b in sorted(found):
        if a in gone or b in gone or any(k not in gone for k in range(a + 1, b)):
            continue
        gone.update((a, b))
        spikes.append((cuts[a], cuts[b]))
    return [c for k, c in enumerate(cuts) if k not in gone], spikes


def _raw_steps(d: FloatArray, rows: IntArray, cuts: IntArray, step_bytes: float) -> FloatArray:
    """The jump at each cut, less the typical change between the samples around it.

    ``rows`` and ``cuts`` list the cuts of a batch (row of ``d``, cut position); the typical
    change is the median of the five differences either side that are not cuts themselves.
    """
    if not len(cuts):
        return np.zeros(0)
    width = d.shape[1]
    offsets = np.array([-5, -4, -3, -2, -1, 1, 2, 3, 4, 5])
    at = (cuts - 1)[:, None] + offsets
    inside = (at >= 0) & (at < width)
    near = d[rows[:, None], np.clip(at, 0, width - 1)]
    usable = inside & (np.abs(near) <= step_bytes)
    typical = np.nan_to_num(_masked_median(near, usable))
    return d[rows, cuts - 1] - typical


def _restarted_steps(
    cuts: list[int],
    raw: list[float],
    x: FloatArray,
    points: list[int],
    seg: list[int],
    tolerance: float,
) -> list[float]:
    """Each cut's step as it would be had the step also restarted an allocator cycle.

    When a cycle restarts at a step, the sample just after the cut is the new floor and
    lies no higher than the first trough after the cut (within ``tolerance``); the raw jump
    then misses whatever the old cycle had built up since its last release. There the step
    is taken from the last trough before the cut to that sample, when that is the larger.
    The caller keeps these steps only where they line the troughs up better than the raw
    ones: a leak also puts later troughs higher, which this reading would take for a step.
    """
    chosen = list(raw)
    for k, c in enumerate(cuts):
        pos = bisect.bisect_right(seg, k)
        if pos == 0 or pos == len(seg) or seg[pos] != k + 1:
            continue
        after = float(x[c])
        if after > float(x[points[pos]]) + tolerance:
            continue
        last = pos - 1
        floor = after - float(x[points[last]]) - math.fsum(raw[seg[last] : k])
        chosen[k] = max(raw[k], floor)
    return chosen


def _line(
    tp: FloatArray, yp: FloatArray, ok: BoolArray, span: FloatArray
) -> tuple[FloatArray, IntArray, IntArray, IntArray, FloatArray]:
    """Theil-Sen over each row's points: slope, pairs used, rising and falling pairs, and the
    largest distance of a point from the line (its level the median of the points')."""
    i, j = _pairs(MAX_POINTS, MAX_POINTS // 6 - 1)
    gaps = tp[:, j] - tp[:, i]
    pairs = ok[:, i] & ok[:, j] & (gaps >= span[:, None] / 6)
    slopes = (yp[:, j] - yp[:, i]) / np.where(pairs, gaps, 1.0)
    slope = _masked_median(slopes, pairs)
    total = pairs.sum(axis=1)
    rising = (pairs & (slopes > 0)).sum(axis=1)
    falling = (pairs & (slopes < 0)).sum(axis=1)
    short = np.flatnonzero(total == 0)
    if len(short):
        # Troughs bunched in under a sixth of the window: every pair of distinct times.
        i, j = _pairs(MAX_POINTS)
        gaps = tp[short][:, j] - tp[short][:, i]
        near = ok[short][:, i] & ok[short][:, j] & (gaps > 0)
        steep = (yp[short][:, j] - yp[short][:, i]) / np.where(near, gaps, 1.0)
        slope[short] = _masked_median(steep, near)
        total[short] = near.sum(axis=1)
        rising[short] = (near & (steep > 0)).sum(axis=1)
        falling[short] = (near & (steep < 0)).sum(axis=1)
    residual = yp - np.nan_to_num(slope)[:, None] * tp
    centre = _masked_median(residual, ok)
    deviation = np.where(ok, np.abs(residual - np.nan_to_num(centre)[:, None]), 0.0).max(axis=1)
    return slope, total, rising, falling, deviation


def fit_growth(
    t: FloatArray,
    x: FloatArray,
    *,
    step_bytes: float,
    radius_s: float,
    recent_from: float | None = None,
    onset: float | None = None,
) -> Fit | None:
    """Fit one window of samples (``t`` seconds ascending, ``x`` bytes); see the module docstring.

    None when the window has fewer than :data:`MIN_SAMPLES` samples, spans no time, or has
    releases but too few troughs to fit.
    """
    t = np.asarray(t, dtype=np.float64)
    x = np.asarray(x, dtype=np.float64)
    return fit_growth_batch(
        t[None, :],
        x[None, :],
        step_bytes=step_bytes,
        radius_s=radius_s,
        recent_from=recent_from,
        onsets=None if onset is None else np.array([onset], dtype=np.float64),
    )[0]


def fit_growth_batch(
    times: FloatArray,
    values: FloatArray,
    *,
    step_bytes: float,
    radius_s: float,
    recent_from: float | FloatArray | None = None,
    onsets: FloatArray | None = None,
) -> list[Fit | None]:
    """Fit many windows of one length at once: row ``r`` of ``times`` and ``values`` is one.

    Each row gets exactly what :func:`fit_growth` would give it alone.
    """
    times = np.asarray(times, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    if times.ndim != 2 or times.shape != values.shape:
        raise ValueError(
            f"times and values must be 2-D of one shape, got {times.shape} and {values.shape}"
        )
    k, n = values.shape
    known = np.full(k, np.nan) if onsets is None else np.asarray(onsets, dtype=np.float64)
    asked = np.broadcast_to(
        np.asarray(np.inf if recent_from is None else recent_from, dtype=np.float64), (k,)
    )
    fits: list[Fit | None] = [None] * k
    if n < MIN_SAMPLES:
        return fits
    span = times[:, -1] - times[:, 0]
    usable = np.isfinite(span) & (span > 0) & np.isfinite(values).all(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        radius = np.where(usable, np.round(radius_s * (n - 1) / np.where(usable, span, 1.0)), 1)
    radius = np.maximum(radius, 1).astype(np.intp)
    for h in np.unique(radius[usable]):
        rows = np.flatnonzero(usable & (radius == h))
        for row, fit in zip(
            rows,
            _fit_rows(
                _Rows(times[rows], values[rows], asked[rows], known[rows]),
                int(h),
                step_bytes,
                radius_s,
            ),
        ):
            fits[int(row)] = fit
    return fits


class _Rows(NamedTuple):
    """Windows fitted together: times, values, and per row the slope from which the recent
    rate is asked for and the onset already known (NaN for none)."""

    t: FloatArray
    x: FloatArray
    recent_from: FloatArray
    known: FloatArray

    def take(self, chosen: IntArray) -> _Rows:
        return _Rows(self.t[chosen], self.x[chosen], self.recent_from[chosen], self.known[chosen])

    @property
    def span(self) -> FloatArray:
        return self.t[:, -1] - self.t[:, 0]


def _fit_rows(batch: _Rows, h: int, step_bytes: float, radius_s: float) -> list[Fit | None]:
    t, x, recent_from, known = batch
    k, n = x.shape
    span = batch.span
    d = np.diff(x, axis=1)
    cut_rows, cut_cols = np.nonzero(np.abs(d) > step_bytes)
    cuts: list[list[int]] = [[] for _ in range(k)]
    for r, c in zip(cut_rows.tolist(), cut_cols.tolist()):
        cuts[r].append(c + 1)
    hidden = spike_spans(d, h, step_bytes, step_bytes / 8)
    joined = joined_jumps(x, d, h, step_bytes, hidden)
    added = {r: set(c) for r, (c, _) in joined.items()}
    for r, row_spikes in hidden.items():
        # A spike whose one edge crosses the threshold and the other not: both are cuts.
        over = set(cuts[r])
        added.setdefault(r, set()).update(
            c for a, b in row_spikes if a in over or b in over for c in (a, b)
        )
    for r, more in added.items():
        cuts[r] = sorted(set(cuts[r]) | more)
    if any(added.values()):
        cut_rows = np.array([r for r, row in enumerate(cuts) for _ in row], dtype=np.intp)
    spikes: dict[int, list[tuple[int, int]]] = {}
    for r in np.unique(cut_rows).tolist():
        row = cuts[r]
        if len(row) > 1 and any(b - a <= h for a, b in itertools.pairwise(row)):
            cuts[r], spikes[r] = _merge_spikes(row, d[r], h, step_bytes / 8)
    flat_rows = np.array([r for r, row in enumerate(cuts) for _ in row], dtype=np.intp)
    flat_cuts = np.array([c for row in cuts for c in row], dtype=np.intp)
    flat_raw = _raw_steps(d, flat_rows, flat_cuts, step_bytes).tolist()
    raw: list[list[float]] = [[] for _ in range(k)]
    for r, step in zip(flat_rows.tolist(), flat_raw):
        raw[r].append(step)
    for r, (ends, starts) in joined.items():
        for end, start in zip(ends, starts):
            if end in cuts[r]:  # not merged away as a spike's edge
                at = cuts[r].index(end)
                typical = float(d[r, end - 1]) - raw[r][at]
                raw[r][at] = float(x[r, end] - x[r, start - 1]) - typical * (end - start + 1)
    for r, row_spikes in spikes.items():
        if cuts[r]:
            fold_spike_residues(x[r], d[r], row_spikes, cuts[r], raw[r], h)

    valid = x <= _sliding_min(x, h)
    valid[:, :h] = False
    valid[:, n - h :] = False
    for r, row_cuts in enumerate(cuts):
        for c in row_cuts:
            valid[r, max(0, c - h) : c + h] = False
    for r, row_spikes in spikes.items():
        for a, b in row_spikes:
            valid[r, a:b] = False
    for r, row_spikes in hidden.items():
        for a, b in row_spikes:
            if x[r, b] < x[r, a - 1]:  # a release under the spike: no trough near it
                valid[r, max(0, a - h) : b + h] = False
    count = valid.sum(axis=1)
    first = np.argmax(valid, axis=1)
    last = n - 1 - np.argmax(valid[:, ::-1], axis=1)
    rows = np.arange(k)
    reach = t[rows, last] - t[rows, first]
    fitted = (count >= 2) & (reach >= span / 4)

    fits: list[Fit | None] = [None] * k
    for r in np.flatnonzero(~fitted).tolist():
        edges = [c for pair in spikes.get(r, []) for c in pair]
        fits[r] = _fit_smooth(
            t[r],
            x[r],
            d[r],
            cuts[r],
            raw[r],
            edges,
            float(span[r]),
            float(recent_from[r]),
            float(known[r]),
        )
    chosen = np.flatnonzero(fitted)
    if len(chosen):
        picked = chosen.tolist()
        results = _fit_troughs(
            batch.take(chosen),
            valid[chosen],
            [cuts[r] for r in picked],
            [raw[r] for r in picked],
            [_mended_cuts(cuts[r], joined.get(r), spikes.get(r), h) for r in picked],
            h,
            step_bytes,
        )
        for r, fit in zip(chosen.tolist(), results):
            fits[r] = fit
    return fits


def _mended_cuts(
    cuts: list[int],
    joined: tuple[list[int], list[int]] | None,
    spikes: list[tuple[int, int]] | None,
    h: int,
) -> set[int]:
    """The cuts whose step was mended from more than their own jump: a step a spike split in
    two jumps, or one within ``h`` samples of a spike (whose residue was given to it)."""
    mended = set(joined[0]) if joined else set()
    for a, b in spikes or ():
        mended.update(c for c in cuts if a - h <= c <= b + h)
    return mended


def _fit_troughs(
    batch: _Rows,
    valid: BoolArray,
    cuts: list[list[int]],
    raw: list[list[float]],
    mended: list[set[int]],
    h: int,
    step_bytes: float,
) -> list[Fit | None]:
    t, x, recent_from, known = batch
    k, n = x.shape
    span = batch.span
    # The lowest trough in each of MAX_POINTS slices of equal sample count.
    width = -(-n // MAX_POINTS)
    padded = np.full((k, MAX_POINTS * width), np.inf)
    padded[:, :n] = np.where(valid, x, np.inf)
    sliced = padded.reshape(k, MAX_POINTS, width)
    lowest = np.argmin(sliced, axis=2)
    ok = np.isfinite(np.take_along_axis(sliced, lowest[:, :, None], 2)[:, :, 0])
    idx = np.minimum(lowest + np.arange(MAX_POINTS) * width, n - 1)
    tp = np.take_along_axis(t, idx, 1)
    xp = np.take_along_axis(x, idx, 1)
    marks = np.zeros((k, n), dtype=np.intp)
    for r, row_cuts in enumerate(cuts):
        marks[r, row_cuts] = 1
    seg = np.take_along_axis(np.cumsum(marks, axis=1), idx, 1)

    # Where troughs a quarter of the window apart share a segment, the slope is theirs
    # alone: the median over such pairs, which no cut's size can bias.
    i, j = _pairs(MAX_POINTS, MAX_POINTS // 4 - 1)
    gaps = tp[:, j] - tp[:, i]
    inside = ok[:, i] & ok[:, j] & (seg[:, i] == seg[:, j]) & (gaps >= span[:, None] / 4)
    confirmed = inside.any(axis=1)
    slope = np.full(k, np.nan)
    total = np.zeros(k, dtype=np.intp)
    rising = np.zeros(k, dtype=np.intp)
    falling = np.zeros(k, dtype=np.intp)
    deviation = np.zeros(k)
    some = np.flatnonzero(confirmed)
    if len(some):
        part = inside[some]
        rise = (xp[some][:, j] - xp[some][:, i]) / np.where(part, gaps[some], 1.0)
        slope[some] = _masked_median(rise, part)
        total[some] = part.sum(axis=1)
        rising[some] = (part & (rise > 0)).sum(axis=1)
        falling[some] = (part & (rise < 0)).sum(axis=1)

    # Elsewhere every cut is crossed: by its own step, or, where a step may have restarted
    # a cycle, by the floor across it if that lines the troughs up better.
    rest = np.flatnonzero(~confirmed)
    ambiguous: set[int] = set()
    if len(rest):
        yp = xp[rest].copy()
        other = yp.copy()
        restarted: list[int] = []
        for n_row, r in enumerate(rest.tolist()):
            if not cuts[r]:
                continue
            yp[n_row] = xp[r] - np.concatenate([[0.0], np.cumsum(raw[r])])[seg[r]]
            keep = ok[r]
            steps = _restarted_steps(
                cuts[r], raw[r], x[r], idx[r][keep].tolist(), seg[r][keep].tolist(), step_bytes / 32
            )
            if steps != raw[r]:
                other[n_row] = xp[r] - np.concatenate([[0.0], np.cumsum(steps)])[seg[r]]
                restarted.append(n_row)
                ambiguous.add(r)
        line = _line(tp[rest], yp, ok[rest], span[rest])
        if restarted:
            rows = np.array(restarted)
            alt = _line(tp[rest][rows], other[rows], ok[rest][rows], span[rest][rows])
            better = alt[4] < line[4][rows]
            for target, values in zip(line, alt):
                target[rows[better]] = values[better]
        for target, values in zip((slope, total, rising, falling, deviation), line):
            target[rest] = values
    points = ok.sum(axis=1)
    recent = np.full(k, np.nan)
    onset = np.full(k, np.nan)
    if np.isfinite(recent_from).any():
        with np.errstate(invalid="ignore"):
            wanted = np.flatnonzero(np.isfinite(slope) & (slope >= recent_from)).tolist()
        asked = [r for r in wanted if r not in ambiguous]
        if asked:
            rows = np.array(asked, dtype=np.intp)
            levels = np.zeros((len(rows), MAX_POINTS))
            for n_row, r in enumerate(asked):
                if cuts[r]:
                    levels[n_row] = np.concatenate([[0.0], np.cumsum(raw[r])])[seg[r]]
            recent[rows], onset[rows] = slope_since_change(
                tp[rows], xp[rows] - levels, ok[rows], span[rows], known[rows]
            )

    first = np.take_along_axis(idx, np.argmax(ok, axis=1)[:, None], 1)[:, 0].tolist()
    last = np.take_along_axis(idx, (MAX_POINTS - 1 - np.argmax(ok[:, ::-1], axis=1))[:, None], 1)[
        :, 0
    ]
    fits: list[Fit | None] = []
    table = zip(
        slope.tolist(),
        total.tolist(),
        rising.tolist(),
        falling.tolist(),
        points.tolist(),
        confirmed.tolist(),
        deviation.tolist(),
        first,
        last.tolist(),
    )
    for r, (s, count, up, down, kept, sure, spread, low, high) in enumerate(table):
        if count == 0 or not math.isfinite(s):
            fits.append(None)
            continue
        agreement = (up if s > 0 else down if s < 0 else count) / count
        crossed = [c for c in cuts[r] if low < c <= high]
        bridged = tuple(float(t[r, c]) for c in crossed)
        if not bridged:
            sure = True
        elif not sure and r not in ambiguous:
            sure = kept >= 3 and spread <= step_bytes / 16
            if not sure and s > 0 and mended[r].isdisjoint(crossed):
                sure = tooth_confirms(t[r], x[r], valid[r], cuts[r], crossed, s, h)
        since, change = float(recent[r]), float(onset[r])
        fits.append(
            Fit(
                s,
                sure,
                agreement,
                kept,
                bridged,
                True,
                r in ambiguous,
                since if math.isfinite(since) else None,
                change if math.isfinite(change) else None,
            )
        )
    return fits


def _fit_smooth(
    t: FloatArray,
    x: FloatArray,
    d: FloatArray,
    cuts: list[int],
    raw: list[float],
    spike_edges: list[int],
    span: float,
    recent_from: float,
    known: float = math.nan,
) -> Fit | None:
    """Fit a series without troughs over its samples, unless it has releases.

    Spikes are left out: their samples are not fitted and their edges are not releases.
    """
    moves = d.copy()
    moves[[c - 1 for c in (*cuts, *spike_edges)]] = 0.0
    typical = _median(np.abs(moves))
    if typical > 0 and bool(np.any(moves < -6 * typical)):
        return None
    n = len(t)
    idx = np.unique(np.linspace(0, n - 1, min(n, MAX_POINTS)).round().astype(np.intp))
    if spike_edges:
        inside = np.zeros(n + 1, dtype=np.intp)
        for a, b in zip(spike_edges[::2], spike_edges[1::2]):
            inside[a] += 1
            inside[b] -= 1
        idx = idx[np.cumsum(inside)[:n][idx] == 0]
    levels = np.concatenate([[0.0], np.cumsum(raw)])
    seg = np.searchsorted(np.asarray(cuts, dtype=np.intp), idx, side="right")
    tp = t[idx]
    yp = x[idx] - levels[seg]
    i, j = _pairs(len(idx))
    gaps = tp[j] - tp[i]
    keep = gaps >= span / 6
    if not keep.any():
        keep = gaps > 0
        if not keep.any():
            return None
    slopes = (yp[j] - yp[i])[keep] / gaps[keep]
    slope = _median(slopes)
    if slope > 0:
        agreeing = int(np.count_nonzero(slopes > 0))
    elif slope < 0:
        agreeing = int(np.count_nonzero(slopes < 0))
    else:
        agreeing = len(slopes)
    cut_times = tuple(float(t[c]) for c in cuts)
    since: float | None = None
    change: float | None = None
    if slope >= recent_from:
        found, when = slope_since_change(
            tp[None, :],
            yp[None, :],
            np.ones((1, len(idx)), dtype=np.bool_),
            np.array([span]),
            np.array([known]),
        )
        if math.isfinite(found[0]):
            since, change = float(found[0]), float(when[0])
    return Fit(
        slope, not cuts, agreeing / len(slopes), len(idx), cut_times, False, False, since, change
    )
