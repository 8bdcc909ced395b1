"""One series keeps its last window at full resolution and older samples in bounded buckets."""

from __future__ import annotations

import gc
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from raylens.telemetry.growth._series import SeriesBuffer

GIB = float(1 << 30)


def test_the_window_holds_the_last_window_of_samples() -> None:
    buffer = SeriesBuffer(window_s=60.0, bucket_s=60.0, buckets=10)
    for k in range(300):
        buffer.append(float(k), 1000.0 + k)
    t, x = buffer.window()
    assert t[0] == 239.0 and t[-1] == 299.0
    assert np.array_equal(x, 1000.0 + t)
    assert buffer.last_time == 299.0 and buffer.last_value == 1299.0


def test_a_window_ending_before_the_newest_sample_is_kept_while_held() -> None:
    buffer = SeriesBuffer(window_s=60.0, bucket_s=60.0, buckets=10)
    buffer.hold_from = 80.0
    buffer.extend(np.arange(100.0), np.arange(100.0))
    t, _ = buffer.window(80.0)
    assert (t[0], t[-1]) == (20.0, 80.0)
    buffer.hold_from = None
    buffer.extend(np.arange(100.0, 200.0), np.arange(100.0, 200.0))
    t, _ = buffer.window()
    assert t[0] == 139.0


def test_older_samples_fold_into_min_max_mean_buckets() -> None:
    buffer = SeriesBuffer(window_s=60.0, bucket_s=60.0, buckets=10)
    t = np.arange(0.0, 600.0)
    buffer.extend(t, t % 60)
    buffer.extend(np.arange(600.0, 1200.0), np.zeros(600))
    buckets = buffer.buckets()
    assert 1 <= len(buckets) <= 10
    full = [b for b in buckets if b.start < 600 and b.samples == 60]
    assert full, buckets
    for bucket in full:
        assert (bucket.minimum, bucket.maximum, bucket.mean) == (0.0, 59.0, pytest.approx(29.5))
        assert bucket.width == 60.0


def test_memory_stays_bounded_over_a_long_run() -> None:
    buffer = SeriesBuffer(window_s=600.0, bucket_s=60.0, buckets=60)
    chunk = np.arange(0.0, 3600.0)
    buffer.extend(chunk, chunk)
    size = buffer.nbytes()
    for hour in range(1, 24):
        buffer.extend(chunk + hour * 3600.0, chunk)
    assert buffer.nbytes() <= size
    assert len(buffer.buckets()) <= 60
    assert len(buffer) <= 1.3 * 601


def test_late_repeated_and_non_finite_samples_are_skipped() -> None:
    buffer = SeriesBuffer(window_s=60.0, bucket_s=60.0, buckets=10)
    buffer.append(10.0, 1.0)
    buffer.append(10.0, 2.0)
    buffer.append(5.0, 3.0)
    buffer.append(11.0, math.nan)
    buffer.append(math.inf, 4.0)
    buffer.extend(np.array([12.0, 11.5, 13.0, 13.0]), np.array([5.0, 6.0, 7.0, 8.0]))
    t, x = buffer.window()
    assert list(t) == [10.0, 12.0, 13.0]
    assert list(x) == [1.0, 5.0, 7.0]


@given(
    start=st.floats(0.0, 1e9),
    base=st.floats(0.0, 4e12),
    swings=st.lists(st.floats(-2e11, 2e11), min_size=1, max_size=20),
)
def test_values_keep_their_precision_far_from_where_they_began(
    start: float, base: float, swings: list[float]
) -> None:
    buffer = SeriesBuffer(window_s=600.0, bucket_s=60.0, buckets=60)
    level = base
    for k, swing in enumerate(swings):
        level = max(0.0, level + swing)
        t = start + 3 * 86400.0 * k + np.arange(0.0, 120.0, 10.0)
        buffer.extend(t, level + np.arange(len(t)) * 1024.0)
    times, values = buffer.window()
    expected = level + np.arange(len(times)) * 1024.0
    # float32 offsets from a moving anchor: within 2**-24 of 16 GiB, plus the step's own size.
    assert np.allclose(values, expected, rtol=0, atol=2048.0)
    assert np.allclose(np.diff(times), 10.0, atol=0.01)


def _walked_by_the_collector(root: object) -> int:
    """References a full collection follows from ``root``'s fields and from what they hold."""
    walked = 0
    for child in gc.get_referents(root):
        if isinstance(child, type):
            continue
        walked += 1
        if gc.is_tracked(child):
            walked += sum(not isinstance(o, type) for o in gc.get_referents(child))
    return walked


def test_samples_waiting_to_be_stored_give_the_garbage_collector_nothing_to_walk() -> None:
    # A driver holds thousands of series; a full collection walks all of them, so a sample
    # must not become an object the collector visits while it waits to be stored.
    buffer = SeriesBuffer(window_s=600.0, bucket_s=60.0, buckets=10)
    buffer.append(0.0, GIB)
    before = _walked_by_the_collector(buffer)
    for k in range(1, 40):
        buffer.append(float(k), GIB + k)
    assert len(buffer) == 40
    assert _walked_by_the_collector(buffer) == before


@given(
    steps=st.lists(st.floats(min_value=0.001, max_value=5_000.0), min_size=0, max_size=80),
    start=st.floats(min_value=-1e6, max_value=1e9),
    ends=st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=1, max_size=5),
)
def test_no_window_spans_more_than_the_samples_held(
    steps: list[float], start: float, ends: list[float]
) -> None:
    buffer = SeriesBuffer(window_s=600.0, bucket_s=60.0, buckets=10)
    times = start + np.cumsum([0.0, *steps])
    for t in times:
        buffer.append(float(t), 1e9)
    for share in ends:
        t, _x, _t0, _v0 = buffer.window_parts(float(times[0] + share * (times[-1] - times[0])))
        span = float(t[-1]) - float(t[0]) if len(t) >= 2 else 0.0
        assert span <= buffer.held_span()
    if len(times) < 2:
        assert buffer.held_span() == 0.0
