"""One growth fit: a robust slope of a memory series over one window.

Host and worker memory is not a line plus noise. Allocators and caches grow memory and give
it back in cycles (a sawtooth of hundreds of MiB, periods of seconds to minutes); training
phases move the level by gigabytes at once (steps); short transients add spikes. A leak is
none of these: it is what keeps rising *after* each release. So the fit follows the floor
the memory returns to:

1. **Cuts.** A change between two consecutive samples larger than ``step_bytes`` is a phase
   step or the edge of a spike. Two opposite edges close together that cancel are a spike and
   are ignored; every other one splits the window into segments.
2. **Troughs.** Points that are the lowest within ``radius`` on both sides, with that whole
   neighbourhood inside one segment. After every release the series passes through one.
3. **Levels.** Segments are put back on one level before fitting: where troughs inside one
   segment give a slope, by lining up the troughs on either side of each cut with it;
   otherwise by taking each cut's own jump as the step.
4. **Slope.** Theil-Sen (the median of pairwise slopes) over the troughs, using pairs at
   least a sixth of the window apart.

A series without releases (a smooth rise, a constant) has no troughs; it is fitted over its
samples instead. A series with releases but fewer than two troughs a quarter of the window
apart cannot be fitted: the result is None.

A fit is *confirmed* when it does not rest on a cut's jump alone: two troughs inside one
segment a quarter of the window apart support it, or three or more troughs across cuts lie
on one line within ``step_bytes / 16``. An unconfirmed fit can be wrong when a release and a
step land on the same sample, which no single window can tell apart.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt

__all__ = ["MAX_POINTS", "Fit", "fit_growth"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.intp]

#: Troughs kept per fit (the lowest in each of this many slices of the window).
MAX_POINTS = 30
#: Fewest samples a window needs before it is fitted.
MIN_SAMPLES = 8
_PAIRS: dict[int, tuple[IntArray, IntArray]] = {}


class Fit(NamedTuple):
    """The result of :func:`fit_growth`.

    ``slope`` is bytes per second. ``agreement`` is the share of the long pairs whose slope
    has the sign of ``slope`` (1.0 when every pair agrees). ``points`` is how many troughs
    or samples the slope was taken over; ``troughs`` whether they were troughs (False for
    a series without releases); ``cuts`` the times of the cuts between them, so that two
    unconfirmed fits can be told to rest on different cuts.
    """

    slope: float
    confirmed: bool
    agreement: float
    points: int
    cuts: tuple[float, ...]
    troughs: bool = True


def _median(values: FloatArray) -> float:
    """Median of a small array (a sort is several times cheaper than ``np.median`` here)."""
    ordered = np.sort(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return float(ordered[middle])
    return float(ordered[middle - 1] + ordered[middle]) / 2


def _pairs(m: int) -> tuple[IntArray, IntArray]:
    pairs = _PAIRS.get(m)
    if pairs is None:
        i, j = np.triu_indices(m, 1)
        pairs = _PAIRS[m] = (i.astype(np.intp), j.astype(np.intp))
    return pairs


def _sliding_min(x: FloatArray, h: int) -> FloatArray:
    """Minimum of ``x`` over ``[i - h, i + h]`` (clipped at the ends), by doubling."""
    n = len(x)
    width = 2 * h + 1
    padded = np.concatenate([np.full(h, np.inf), x, np.full(h, np.inf)])
    acc = padded
    span = 1
    while span * 2 <= width:
        acc = np.minimum(acc[:-span], acc[span:])
        span *= 2
    if span < width:
        acc = np.minimum(acc[: len(acc) - (width - span)], acc[width - span :])
    return acc[:n]


def _merge_spikes(cuts: IntArray, d: FloatArray, within: int, tolerance: float) -> IntArray:
    """Drop pairs of opposite cuts at most ``within`` samples apart that cancel within ``tolerance``."""
    if len(cuts) < 2:
        return cuts
    found = []
    for a in range(len(cuts)):
        for b in range(a + 1, len(cuts)):
            if cuts[b] - cuts[a] > within:
                break
            total = abs(float(d[cuts[a] - 1] + d[cuts[b] - 1]))
            if total < tolerance:
                found.append((total, a, b))
    if not found:
        return cuts
    gone: set[int] = set()
    for _, a, b in sorted(found):
        if a in gone or b in gone or any(k not in gone for k in range(a + 1, b)):
            continue
        gone.update((a, b))
    return np.array([c for k, c in enumerate(cuts) if k not in gone], dtype=np.intp)


def _raw_steps(cuts: IntArray, d: FloatArray, step_bytes: float) -> FloatArray:
    """Each cut's jump, less the typical change between neighbouring samples."""
    steps = np.empty(len(cuts))
    for k, c in enumerate(cuts):
        near = np.concatenate([d[max(0, c - 6) : c - 1], d[c : c + 5]])
        near = near[np.abs(near) <= step_bytes]
        steps[k] = d[c - 1] - (_median(near) if len(near) else 0.0)
    return steps


_FLOOR_STEPS = True


def _floor_steps(
    cuts: IntArray, x: FloatArray, idx: IntArray, seg: IntArray, raw: FloatArray, tolerance: float
) -> FloatArray:
    """Each cut's step, corrected where the step also restarted an allocator cycle.

    When a cycle restarts at a step, the sample just after the cut is the new floor, and
    the raw jump misses whatever the old cycle had built up since its last release. That
    sample then lies no higher than the first trough after the cut (within ``tolerance``);
    in that case the step is taken from the last trough before the cut to that sample,
    when this is the larger of the two. Elsewhere the raw jump stands.
    """
    chosen = raw.copy()
    for k, c in enumerate(cuts):
        before = np.flatnonzero(seg <= k)
        after = idx[seg == k + 1]
        if not len(before) or not len(after) or x[c] > x[after[0]] + tolerance:
            continue
        last = before[-1]
        floor = float(x[c]) - float(x[idx[last]]) - float(chosen[seg[last] : k].sum())
        chosen[k] = max(float(raw[k]), floor)
    return chosen


def _theil_sen(t: FloatArray, y: FloatArray, min_gap: float) -> tuple[float, float] | None:
    i, j = _pairs(len(t))
    gaps = t[j] - t[i]
    keep = gaps >= min_gap
    if not keep.any():
        keep = gaps > 0
        if not keep.any():
            return None
    slopes = (y[j] - y[i])[keep] / gaps[keep]
    slope = _median(slopes)
    if slope > 0:
        agreement = float(np.count_nonzero(slopes > 0)) / len(slopes)
    elif slope < 0:
        agreement = float(np.count_nonzero(slopes < 0)) / len(slopes)
    else:
        agreement = 1.0
    return slope, agreement


def _thin(t: FloatArray, x: FloatArray, idx: IntArray, span: float) -> IntArray:
    """At most :data:`MAX_POINTS` of ``idx``: the lowest in each equal slice of the window."""
    if len(idx) <= MAX_POINTS:
        return idx
    slices = ((t[idx] - t[0]) * (MAX_POINTS / span)).astype(np.intp)
    order = np.lexsort((x[idx], slices))
    ordered = slices[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = ordered[1:] != ordered[:-1]
    return np.sort(idx[order[first]])


def fit_growth(
    t: FloatArray, x: FloatArray, *, step_bytes: float, radius_s: float
) -> Fit | None:
    """Fit the growth of one window of samples (``t`` seconds ascending, ``x`` bytes).

    Returns None when the window has fewer than :data:`MIN_SAMPLES` samples, spans no
    time, or has releases but too few troughs to fit (see the module docstring).
    """
    n = len(t)
    if n < MIN_SAMPLES:
        return None
    span = float(t[-1] - t[0])
    if span <= 0:
        return None
    step = span / (n - 1)
    h = max(1, round(radius_s / step))
    d = np.diff(x)
    cuts = np.flatnonzero(np.abs(d) > step_bytes) + 1
    cuts = _merge_spikes(cuts, d, h, step_bytes / 8)

    valid = x <= _sliding_min(x, h)
    valid[:h] = False
    valid[n - h :] = False
    for c in cuts:
        valid[max(0, c - h) : c + h] = False
    idx = np.flatnonzero(valid)

    if len(idx) < 2 or t[idx[-1]] - t[idx[0]] < span / 4:
        return _fit_smooth(t, x, d, cuts, step_bytes, span)

    idx = _thin(t, x, idx, span)
    tp, xp = t[idx], x[idx]
    seg = np.searchsorted(cuts, idx, side="right")
    i, j = _pairs(len(idx))
    gaps = tp[j] - tp[i]
    same = seg[i] == seg[j]
    inside = same & (gaps >= span / 4)
    confirmed = bool(inside.any())
    if confirmed:
        within = _median((xp[j] - xp[i])[inside] / gaps[inside])
        jumps = np.zeros(len(idx))
        crossing = np.flatnonzero(seg[1:] != seg[:-1]) + 1
        jumps[crossing] = (xp[crossing] - xp[crossing - 1]) - within * (
            tp[crossing] - tp[crossing - 1]
        )
        yp = xp - np.cumsum(jumps)
    else:
        steps = _raw_steps(cuts, d, step_bytes)
        if _FLOOR_STEPS:
            steps = _floor_steps(cuts, x, idx, seg, steps, step_bytes / 32)
        levels = np.concatenate([[0.0], np.cumsum(steps)])
        yp = xp - levels[seg]
    result = _theil_sen(tp, yp, span / 6)
    if result is None:
        return None
    slope, agreement = result
    bridged = tuple(float(t[c]) for c in cuts if idx[0] < c <= idx[-1])
    if not confirmed and len(idx) >= 3 and bridged:
        residual = yp - slope * tp
        residual -= _median(residual)
        confirmed = bool(np.max(np.abs(residual)) <= step_bytes / 16)
    if not bridged:
        confirmed = True
    return Fit(slope, confirmed, agreement, len(idx), bridged)


def _fit_smooth(
    t: FloatArray,
    x: FloatArray,
    d: FloatArray,
    cuts: IntArray,
    step_bytes: float,
    span: float,
) -> Fit | None:
    """Fit a series without troughs over its samples, unless it has releases."""
    moves = d.copy()
    moves[cuts - 1] = 0.0
    typical = _median(np.abs(moves))
    if typical > 0 and bool(np.any(moves < -6 * typical)):
        return None
    n = len(t)
    idx = np.unique(np.linspace(0, n - 1, min(n, MAX_POINTS)).round().astype(np.intp))
    levels = np.concatenate([[0.0], np.cumsum(_raw_steps(cuts, d, step_bytes))])
    seg = np.searchsorted(cuts, idx, side="right")
    tp = t[idx]
    result = _theil_sen(tp, x[idx] - levels[seg], span / 6)
    if result is None:
        return None
    slope, agreement = result
    return Fit(slope, len(cuts) == 0, agreement, len(idx), tuple(float(t[c]) for c in cuts), False)
