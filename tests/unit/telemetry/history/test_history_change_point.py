"""The rate since a change point: a window holding a leak's start reads the leak's rate."""

from __future__ import annotations

import numpy as np
import pytest

from raylens.telemetry.history._change_point import slope_since_change

MIB = float(1 << 20)
RATE = 50 * MIB / 60  # 50 MiB/min in bytes/s
WINDOW = 600.0


def troughs(onset: float, *, rate: float = RATE, points: int = 20, seed: int = 0):
    """Trough points over a window: flat until ``onset``, rising at ``rate`` after it."""
    rng = np.random.default_rng(seed)
    t = np.linspace(10.0, WINDOW - 10.0, points)
    y = 6e9 + rate * np.maximum(0.0, t - onset) + rng.uniform(-4, 4, points) * MIB
    return t[None, :], y[None, :], np.ones((1, points), dtype=bool), np.array([WINDOW])


def test_a_window_holding_the_start_of_a_leak_reads_the_rate_after_it() -> None:
    t, y, ok, span = troughs(onset=330.0)
    slope, onset = slope_since_change(t, y, ok, span)
    assert slope[0] == pytest.approx(RATE, rel=0.1)
    assert onset[0] == pytest.approx(330.0, abs=60.0)
    line = np.median(
        [(y[0, j] - y[0, i]) / (t[0, j] - t[0, i]) for i in range(20) for j in range(i + 1, 20)]
    )
    assert line < 0.75 * RATE  # what one line through the window reads


def test_a_steady_rise_or_a_flat_series_has_no_change_point() -> None:
    for onset in (-100.0, 10_000.0):
        for seed in range(20):
            slope, when = slope_since_change(*troughs(onset=onset, seed=seed))
            assert np.isnan(slope[0]) and np.isnan(when[0])


def test_too_few_points_after_any_candidate_or_missing_points_give_none() -> None:
    t, y, ok, span = troughs(onset=330.0, points=3)
    assert np.isnan(slope_since_change(t, y, ok, span)[0][0])
    t, y, ok, span = troughs(onset=330.0)
    ok[0, 8:] = False  # nothing after the change
    assert np.isnan(slope_since_change(t, y, ok, span)[0][0])


def test_rows_are_independent() -> None:
    rows = [troughs(onset=330.0), troughs(onset=10_000.0), troughs(onset=200.0, seed=3)]
    t, y, ok, span = (np.concatenate([r[k] for r in rows]) for k in range(4))
    slope, _ = slope_since_change(t, y, ok, span)
    for k, row in enumerate(rows):
        alone = slope_since_change(*row)[0][0]
        assert (np.isnan(alone) and np.isnan(slope[k])) or slope[k] == alone


def test_a_change_found_earlier_reads_a_window_too_sparse_to_find_it() -> None:
    t, y, ok, span = troughs(onset=330.0, points=3)  # one point before, two after
    assert np.isnan(slope_since_change(t, y, ok, span)[0][0])
    slope, onset = slope_since_change(t, y, ok, span, known=np.array([330.0]))
    assert slope[0] == pytest.approx(RATE, rel=0.1)
    assert np.isnan(onset[0])  # used, not found again
    # A change the window no longer holds (or holds no point after) is not used.
    for gone in (5.0, 595.0, np.nan):
        assert np.isnan(slope_since_change(t, y, ok, span, known=np.array([gone]))[0][0])


def test_a_change_the_window_finds_itself_wins_over_a_known_one() -> None:
    t, y, ok, span = troughs(onset=330.0)
    slope, onset = slope_since_change(t, y, ok, span, known=np.array([100.0]))
    assert onset[0] == pytest.approx(330.0, abs=60.0)
    assert slope[0] == pytest.approx(RATE, rel=0.1)
