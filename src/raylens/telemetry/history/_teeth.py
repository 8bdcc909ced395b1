"""Checking a step reading against the allocator tooth the step fell in.

A fit whose troughs lie either side of a phase step rests on that step's jump, which is
wrong by a whole release when a release lands on the step's sample. The tooth around the
step gives a rate of its own, ``s - D / (t_b - t_a)``, in which no step size enters.
Invariants: the ramp slope ``s`` is read only from differences that cross no cut; a tooth
rising more than :data:`MAX_RISE_PER_RELEASE` releases (a release hidden in the step) never
confirms.

The tooth's terms and why the bound: ``docs/architecture.md``, *Memory over time*, *The
tooth check*.
"""

from __future__ import annotations

import numpy as np

from raylens.telemetry.history._arrays import BoolArray, FloatArray

__all__ = ["AGREEMENT", "MAX_RISE_PER_RELEASE", "tooth_confirms", "tooth_rate"]


#: A tooth rising more than this many times its release is taken to hide a release.
MAX_RISE_PER_RELEASE = 1.5
#: A tooth's rate confirms a slope within this share of the larger of the two.
AGREEMENT = 0.3
#: Samples before a trough searched for the top of the release that made it.
_RELEASE_SAMPLES = 3
#: Differences a tooth's slope must be read from.
_MIN_DIFFERENCES = 8


def tooth_rate(
    t: FloatArray, x: FloatArray, troughs: BoolArray, cut_marks: FloatArray, cut: int, lag: int
) -> tuple[float, float] | None:
    """(rate, rise per release) of the tooth cut ``cut`` lies in; None where none is seen.

    ``troughs`` marks the fit's troughs (sample indices), ``cut_marks`` is the cumulative
    count of cuts at each sample (a cut at ``c`` separates samples ``c - 1`` and ``c``),
    ``lag`` the spacing in samples of the differences the ramp's slope is read from. The
    tooth is seen when a trough lies on each side of the cut, at least ``2 * lag`` samples
    apart, and the trough after it ends a release.
    """
    positions = np.flatnonzero(troughs)
    k = int(np.searchsorted(positions, cut))
    if k == 0 or k == len(positions):
        return None
    a, b = int(positions[k - 1]), int(positions[k])
    last = b - _RELEASE_SAMPLES  # the ramp ends before the release
    if last - a < 2 * lag:
        return None
    starts = np.arange(a, last - lag + 1)
    ends = starts + lag
    clean = cut_marks[ends] == cut_marks[starts]
    if np.count_nonzero(clean) < _MIN_DIFFERENCES:
        return None
    slope = float(np.median((x[ends[clean]] - x[starts[clean]]) / (t[ends] - t[starts])[clean]))
    # The drop from the top of the ramp, plus the rise the ramp would have made meanwhile.
    top = b - _RELEASE_SAMPLES + int(np.argmax(x[b - _RELEASE_SAMPLES : b]))
    release = float(x[top] - x[b]) + slope * float(t[b] - t[top])
    if release <= 0 or slope <= 0:
        return None
    length = float(t[b] - t[a])
    return slope - release / length, slope * length / release


def tooth_confirms(
    t: FloatArray,
    x: FloatArray,
    troughs: BoolArray,
    cuts: list[int],
    bridged: list[int],
    slope: float,
    lag: int,
) -> bool:
    """Whether the tooth of every cut in ``bridged`` confirms the window's ``slope`` (> 0).

    See the module docstring. ``cuts`` are every cut of the window (sample indices).
    """
    if slope <= 0 or not bridged:
        return False
    marks = np.zeros(len(x), dtype=np.float64)
    marks[cuts] = 1.0
    cut_marks = np.cumsum(marks)
    for cut in bridged:
        found = tooth_rate(t, x, troughs, cut_marks, cut, lag)
        if found is None:
            return False
        rate, rise = found
        if rise > MAX_RISE_PER_RELEASE or abs(rate - slope) > AGREEMENT * max(rate, slope):
            return False
    return True
