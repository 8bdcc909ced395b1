"""The tooth around a step: its own rate, and how many releases it rises."""

from __future__ import annotations

import numpy as np
import pytest

from raylens.telemetry.history._teeth import MAX_RISE_PER_RELEASE, tooth_confirms, tooth_rate

MIB = float(1 << 20)
GIB = float(1 << 30)
LAG = 10


def sawtooth(t: np.ndarray, amplitude: float, period: float, phase: float) -> np.ndarray:
    return amplitude * (2 * (((t + phase) / period) % 1.0) - 1)


def tooth(leak: float, step_at: int, period: float = 200.0) -> tuple[np.ndarray, ...]:
    """Releases at 100 s, 100 s + period, ...; a 2 GiB step at ``step_at``; troughs marked."""
    t = np.arange(0.0, 601.0)
    x = 8 * GIB + sawtooth(t, 300 * MIB, period, period - 100.0) + leak * t
    x[step_at:] += 2 * GIB
    troughs = np.zeros(len(t), dtype=np.bool_)
    troughs[np.arange(100, 601, int(period))] = True
    troughs[step_at] = False
    marks = np.zeros(len(t))
    marks[step_at] = 1.0
    return t, x, troughs, np.cumsum(marks)


@pytest.mark.parametrize("leak", [0.0, 5 * MIB / 60, 50 * MIB / 60])
def test_a_tooth_gives_the_leak_rate_whatever_the_step(leak: float) -> None:
    t, x, troughs, marks = tooth(leak, 250)
    found = tooth_rate(t, x, troughs, marks, 250, LAG)
    assert found is not None
    rate, rise = found
    assert rate == pytest.approx(leak, abs=0.01 * MIB)
    # One release (600 MiB, less the one-sample drop) plus what leaked over 200 s.
    assert rise == pytest.approx(1 + leak * 200 / (600 * MIB), rel=0.02)


def test_a_release_hidden_in_the_step_makes_a_tooth_two_releases_high() -> None:
    t, x, troughs, marks = tooth(0.0, 300)
    found = tooth_rate(t, x, troughs, marks, 300, LAG)
    assert found is not None
    rate, rise = found
    assert rise > MAX_RISE_PER_RELEASE
    assert rate > 0  # the misread the check is there to refuse
    assert not tooth_confirms(t, x, troughs, [300], [300], rate, LAG)


def test_a_tooth_confirms_only_a_slope_it_agrees_with() -> None:
    leak = 50 * MIB / 60
    t, x, troughs, _ = tooth(leak, 250)
    assert tooth_confirms(t, x, troughs, [250], [250], leak, LAG)
    assert tooth_confirms(t, x, troughs, [250], [250], 1.2 * leak, LAG)
    assert not tooth_confirms(t, x, troughs, [250], [250], 2 * leak, LAG)
    assert not tooth_confirms(t, x, troughs, [250], [250], 0.5 * leak, LAG)
    assert not tooth_confirms(t, x, troughs, [250], [250], -leak, LAG)


def test_a_cut_without_a_trough_on_each_side_has_no_tooth() -> None:
    t, x, troughs, marks = tooth(0.0, 250)
    troughs[300:] = False
    assert tooth_rate(t, x, troughs, marks, 250, LAG) is None
    troughs[:] = False
    troughs[[240, 260]] = True  # too close to read a ramp between them
    assert tooth_rate(t, x, troughs, marks, 250, LAG) is None
