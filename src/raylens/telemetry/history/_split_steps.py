"""Spikes and phase steps the one-sample cuts do not see.

The growth fit (:mod:`._estimator`) takes a change between two consecutive samples larger
than ``step_bytes`` as a cut: a phase step, or a spike's edge. A spike under that size is
no cut, yet it hides the samples under it (:func:`spike_spans` finds spikes of any size).
A spike that overlaps a step hides part of the step from that rule, and the fit would read
the hidden part as growth:

* a step that begins as a spike ends leaves its first part in the spike's falling edge,
  and the spike's two edges still cancel within the tolerance (:func:`fold_spike_residues`);
* a spike that starts a few samples before a step up and ends on it splits the step in
  two jumps of one sign, neither over the threshold (:func:`joined_jumps`).
"""

from __future__ import annotations

import numpy as np

from raylens.telemetry.history._arrays import FloatArray

__all__ = ["fold_spike_residues", "joined_jumps", "spike_spans"]


def spike_spans(
    d: FloatArray, within: int, step_bytes: float, tolerance: float
) -> dict[int, list[tuple[int, int]]]:
    """Spikes of any height over a quarter of ``step_bytes``: per row, each pair of opposite
    jumps at most ``within`` samples apart that cancel within ``tolerance``, as ``(a, b)``
    covering samples ``a`` to ``b - 1`` (other jumps may lie between, a release among them).
    """
    rows, cols = np.nonzero(np.abs(d) > step_bytes / 4)
    jumps = d[rows, cols]
    found: dict[int, list[tuple[int, int]]] = {}
    offset = 1
    while offset < len(rows):
        same_row = rows[offset:] == rows[:-offset]
        close = same_row & (cols[offset:] - cols[:-offset] <= within)
        if not close.any():
            break
        opposite = jumps[offset:] * jumps[:-offset] < 0
        cancel = np.abs(jumps[offset:] + jumps[:-offset]) < tolerance
        for n in np.flatnonzero(close & opposite & cancel).tolist():
            found.setdefault(int(rows[n]), []).append((int(cols[n]) + 1, int(cols[n + offset]) + 1))
        offset += 1
    return found


def joined_jumps(
    x: FloatArray,
    d: FloatArray,
    within: int,
    step_bytes: float,
    spikes: dict[int, list[tuple[int, int]]],
) -> dict[int, tuple[list[int], list[int]]]:
    """Steps made of two jumps of one sign, each below ``step_bytes``, at most ``within``
    samples apart: per row, the cut each makes (at its second jump) and where it began.

    A spike that starts a few samples before a phase step and ends on it splits the step in
    two: the spike's rise, then the rest of the step less the spike. Neither crosses the
    threshold alone, yet the level has moved by the whole step, which the fit would read
    as growth. Each jump must be above a quarter of ``step_bytes`` (an allocator release
    is not), and the level after the pair must stand more than ``step_bytes`` from the one
    before it, where a pair with a jump that is the edge of one of ``spikes`` (from
    :func:`spike_spans`) spans that spike too: a spike's falling edge and a release after
    it are two drops of one sign, but the level after the release stands from the one
    before the spike by the release alone.
    """
    big = np.abs(d) > step_bytes / 4
    big &= np.abs(d) <= step_bytes
    rows, cols = np.nonzero(big)
    found: dict[int, tuple[list[int], list[int]]] = {}
    if len(rows) < 2:
        return found
    same_row = rows[1:] == rows[:-1]
    near = cols[1:] - cols[:-1] <= within
    one_sign = np.sign(d[rows[1:], cols[1:]]) == np.sign(d[rows[:-1], cols[:-1]])
    for n in np.flatnonzero(same_row & near & one_sign).tolist():
        r, first, second = int(rows[n]), int(cols[n]), int(cols[n + 1])
        before, after = first, second + 1
        for a, b in spikes.get(r, ()):
            if {a, b} & {first + 1, second + 1}:
                before, after = min(before, a - 1), max(after, b)
        if abs(float(x[r, after] - x[r, before])) > step_bytes:
            ends, starts = found.setdefault(r, ([], []))
            if starts and ends[-1] >= first + 1:
                continue  # this jump already ended the previous pair
            ends.append(second + 1)
            starts.append(first + 1)
    return found


def fold_spike_residues(
    x: FloatArray,
    d: FloatArray,
    spikes: list[tuple[int, int]],
    cuts: list[int],
    raw: list[float],
    within: int,
) -> None:
    """Give a step what a spike next to it took of it (updates ``raw`` in place).

    A step that begins as a spike ends (or ends as one begins) puts its first part in the
    spike's edge, which still cancels the other edge within the tolerance; the level then
    moves by that part across the spike, and the troughs either side read it as growth.
    So the level change across each spike, less the typical change over its samples, is
    added to the step of the nearest cut at most ``within`` samples from it.
    """
    for a, b in spikes:
        near = [k for k, c in enumerate(cuts) if a - within <= c <= b + within]
        if not near:
            continue
        k = min(near, key=lambda n: min(abs(cuts[n] - a), abs(cuts[n] - b)))
        typical = float(d[cuts[k] - 1]) - raw[k]
        raw[k] += float(x[b] - x[a - 1]) - typical * (b - a + 1)
