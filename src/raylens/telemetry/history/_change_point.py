"""The rate since a change point: when in the window memory started to grow.

A window holding a leak's start is read as a hinge (flat, then rising), and its slope since
the change is taken only where the hinge explains the points much better than one line
(:data:`BETTER`) and rises faster than it. Invariants: the points are those the growth fit
already chose, each step taken out; the search runs only for the rows whose slope reaches
the fit's ``recent_from``, so a window that shows no growth costs nothing here.

The hinge, its search over :data:`CANDIDATES` and why: ``docs/architecture.md``, *Memory
over time*, *The rate since a change point*.
"""

from __future__ import annotations

import warnings

import numpy as np

from raylens.telemetry.history._arrays import BoolArray, FloatArray

__all__ = ["BETTER", "CANDIDATES", "slope_since_change"]


#: Times tried as the change point, the first being the window's first point (one line).
CANDIDATES = 12
#: Times tried again between the best candidate's neighbours.
_REFINE = 9
#: A hinge is kept when its summed absolute residual is at most this share of one line's.
BETTER = 0.5
#: The change must leave this share of the window after it.
_AFTER_SHARE = 0.25
#: Points needed on each side of the change: a hinge has three parameters, so with fewer
#: than four points it always fits exactly and proves nothing.
_MIN_POINTS_EACH_SIDE = 2


def _nan_median(values: FloatArray, axis: int = -1) -> FloatArray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.asarray(np.nanmedian(values, axis=axis), dtype=np.float64)


def _hinges(
    t: FloatArray, y: FloatArray, ok: BoolArray, b: FloatArray
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """For each row and each of its candidate times ``b`` (``(rows, candidates)``): the
    hinge's slope, its summed absolute residual, and the points after and at or before ``b``."""
    m = t.shape[1]
    u = np.maximum(0.0, t[:, None, :] - b[:, :, None])  # (rows, candidates, points)
    i, j = np.triu_indices(m, 1)
    du = u[:, :, j] - u[:, :, i]
    dy = (y[:, j] - y[:, i])[:, None, :]
    pairs = (ok[:, i] & ok[:, j])[:, None, :] & (du > 0)
    s = _nan_median(np.where(pairs, dy / np.where(pairs, du, 1.0), np.nan))
    residual = y[:, None, :] - np.nan_to_num(s)[:, :, None] * u
    level = _nan_median(np.where(ok[:, None, :], residual, np.nan))
    misfit = np.where(ok[:, None, :], np.abs(residual - np.nan_to_num(level)[:, :, None]), 0.0)
    after = (ok[:, None, :] & (t[:, None, :] > b[:, :, None])).sum(axis=2)
    before = (ok[:, None, :] & (t[:, None, :] <= b[:, :, None])).sum(axis=2)
    return s, misfit.sum(axis=2), after, before


def slope_since_change(
    t: FloatArray,
    y: FloatArray,
    ok: BoolArray,
    span: FloatArray,
    known: FloatArray | None = None,
) -> tuple[FloatArray, FloatArray]:
    """Per row: (slope since the change point, the change point's time); NaN where none.

    ``t``, ``y`` and ``ok`` are ``(rows, points)``: the points' times, levels (bytes, steps
    taken out) and which points exist; ``span`` is each row's window length in seconds. A
    row gets NaN when it has too few points, when no change leaves a quarter of the window
    after it, or when no hinge explains its points much better than one line.

    ``known`` gives, per row, a change point an earlier window found (NaN for none). Where
    this window finds none of its own but still holds that time, with a point on each side
    of it, the slope is the hinge's at that time: a window with too few points to find a
    change can still be read from one already found. Its time is then not returned: the
    change point returned is one this window found itself.
    """
    t = np.asarray(t, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    ok = np.asarray(ok, dtype=np.bool_)
    rows, m = t.shape
    slope = np.full(rows, np.nan)
    onset = np.full(rows, np.nan)
    if rows == 0 or m < 2:
        return slope, onset
    first = np.where(ok, t, np.inf).min(axis=1)
    last = np.where(ok, t, -np.inf).max(axis=1)
    reach = last - np.asarray(span, dtype=np.float64) * _AFTER_SHARE - first
    usable = np.isfinite(reach) & (reach > 0)
    if usable.any():
        picked = np.flatnonzero(usable)
        grid = np.linspace(0.0, 1.0, CANDIDATES)
        b = first[picked, None] + grid[None, :] * reach[picked, None]  # (rows, candidates)
        tp, yp, okp = t[picked], y[picked], ok[picked]
        s, l1, after, before = _hinges(tp, yp, okp, b)
        allowed = (
            np.isfinite(s) & (after >= _MIN_POINTS_EACH_SIDE) & (before >= _MIN_POINTS_EACH_SIDE)
        )
        allowed[:, 0] = False
        hinge_l1 = np.where(allowed, l1, np.inf)
        best = np.argmin(hinge_l1, axis=1)
        at = np.arange(len(picked))
        # Then finer, between the best candidate's neighbours.
        low = b[at, np.maximum(best - 1, 1)]
        high = b[at, np.minimum(best + 1, CANDIDATES - 1)]
        fine = low[:, None] + np.linspace(0.0, 1.0, _REFINE)[None, :] * (high - low)[:, None]
        s2, l2, after2, before2 = _hinges(tp, yp, okp, fine)
        allowed2 = (
            np.isfinite(s2) & (after2 >= _MIN_POINTS_EACH_SIDE) & (before2 >= _MIN_POINTS_EACH_SIDE)
        )
        b = np.concatenate([b, fine], axis=1)
        s = np.concatenate([s, s2], axis=1)
        hinge_l1 = np.concatenate([hinge_l1, np.where(allowed2, l2, np.inf)], axis=1)
        best = np.argmin(hinge_l1, axis=1)
        chosen_l1 = hinge_l1[at, best]
        chosen_s = s[at, best]
        line_l1, line_s = l1[:, 0], s[:, 0]
        kept = (
            np.isfinite(chosen_l1)
            & (chosen_l1 <= BETTER * line_l1)
            & (chosen_s > np.where(np.isfinite(line_s), line_s, -np.inf))
        )
        slope[picked[kept]] = chosen_s[kept]
        onset[picked[kept]] = b[at, best][kept]
    if known is not None:
        given = np.asarray(known, dtype=np.float64)
        inside = np.flatnonzero(
            np.isnan(slope) & np.isfinite(given) & (given > first) & (given < last)
        )
        if len(inside):
            b = given[inside, None]
            s, _, after, before = _hinges(t[inside], y[inside], ok[inside], b)
            found = np.isfinite(s[:, 0]) & (after[:, 0] >= 1) & (before[:, 0] >= 1)
            slope[inside[found]] = s[found, 0]
    return slope, onset
