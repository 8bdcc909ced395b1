"""Growing needs confirmed evidence, fast or slow, and stops with hysteresis."""

from __future__ import annotations

from raylens.telemetry.history import Fit, GrowthSettings, GrowthTracker

MIB_MIN = (1 << 20) / 60.0
SETTINGS = GrowthSettings()  # 600 s window, fast 10, slow 3.5, calm 1 MiB/min


def fit(
    rate: float, *, confirmed: bool = True, cuts: tuple[float, ...] = (), troughs: bool = True
) -> Fit:
    return Fit(rate * MIB_MIN, confirmed, 1.0, 12, cuts, troughs)


def feed(tracker: GrowthTracker, fits: list[Fit | None], start: float = 0.0) -> float:
    now = start
    for item in fits:
        now += SETTINGS.fit_interval_s
        tracker.update(now, item)
    return now


def test_two_steady_confirmed_fast_fits_start_growing() -> None:
    tracker = GrowthTracker(SETTINGS)
    feed(tracker, [fit(50)])
    assert not tracker.growing
    now = feed(tracker, [fit(55)], start=60.0)
    assert tracker.growing and tracker.growing_since == now and tracker.spells == 1
    assert tracker.growth == 55 * MIB_MIN and tracker.confirmed


def test_a_climbing_rate_waits_until_it_settles() -> None:
    tracker = GrowthTracker(SETTINGS)
    feed(tracker, [fit(20), fit(30), fit(42)])
    assert not tracker.growing
    feed(tracker, [fit(48)], start=180.0)
    assert tracker.growing


def test_unconfirmed_fits_never_start_growing_on_their_own() -> None:
    tracker = GrowthTracker(SETTINGS)
    feed(tracker, [fit(80, confirmed=False, cuts=(1.0,))] * 40)
    assert not tracker.growing
    assert tracker.growth == 80 * MIB_MIN and not tracker.confirmed


def test_fits_over_different_cuts_that_agree_confirm_each_other() -> None:
    tracker = GrowthTracker(SETTINGS)
    feed(tracker, [fit(50, confirmed=False, cuts=(100.0,))])
    assert not tracker.confirmed
    feed(tracker, [fit(52, confirmed=False, cuts=(300.0,))], start=60.0)
    assert tracker.confirmed


def test_fits_sharing_a_cut_or_without_troughs_do_not_confirm_each_other() -> None:
    tracker = GrowthTracker(SETTINGS)
    feed(
        tracker,
        [fit(50, confirmed=False, cuts=(100.0,)), fit(50, confirmed=False, cuts=(100.0, 300.0))],
    )
    assert not tracker.confirmed
    smooth = GrowthTracker(SETTINGS)
    feed(
        smooth,
        [
            fit(50, confirmed=False, cuts=(1.0,), troughs=False),
            fit(50, confirmed=False, cuts=(2.0,), troughs=False),
        ],
    )
    assert not smooth.confirmed


def test_a_slow_rate_starts_growing_after_enough_confirmed_evidence() -> None:
    tracker = GrowthTracker(SETTINGS)
    now = feed(tracker, [fit(5)] * 14)
    assert not tracker.growing
    feed(tracker, [fit(5)], start=now)
    assert tracker.growing


def test_a_slow_rate_that_has_flattened_lately_does_not() -> None:
    tracker = GrowthTracker(SETTINGS)
    feed(tracker, [fit(8)] * 9 + [fit(0.5)] * 11)
    assert not tracker.growing and tracker.spells == 0


def test_a_slow_rate_below_the_threshold_or_of_mixed_sign_does_not() -> None:
    low = GrowthTracker(SETTINGS)
    feed(low, [fit(3)] * 40)
    assert not low.growing
    mixed = GrowthTracker(SETTINGS)
    feed(mixed, [fit(8), fit(8), fit(-1)] * 12)
    assert not mixed.growing


def test_growing_stops_when_the_recent_median_calms_and_not_before() -> None:
    tracker = GrowthTracker(SETTINGS)
    now = feed(tracker, [fit(50), fit(50)])
    assert tracker.growing
    now = feed(tracker, [fit(0.5)] * 4, start=now)
    assert tracker.growing  # fewer than half a window of rates since it began: not yet
    now = feed(tracker, [fit(0.5)], start=now)
    assert not tracker.growing and tracker.growing_since is None
    feed(tracker, [fit(5)] * 20, start=now)
    assert tracker.spells == 2  # a new spell needs new evidence, then starts again


def test_a_figure_is_kept_for_one_window_when_fits_fail() -> None:
    tracker = GrowthTracker(SETTINGS)
    now = feed(tracker, [fit(5)])
    assert tracker.trusted == 5 * MIB_MIN
    now = feed(tracker, [None] * 10, start=now)
    assert tracker.growth == 5 * MIB_MIN
    feed(tracker, [None], start=now)
    assert tracker.growth is None and tracker.trusted is None


def since(rate: float, recent: float, *, confirmed: bool = True) -> Fit:
    """A fit whose window holds the start of growth: ``rate`` over it, ``recent`` since."""
    return Fit(rate * MIB_MIN, confirmed, 1.0, 12, (), True, False, recent * MIB_MIN)


def test_the_figure_is_the_rate_since_the_change_the_window_shows() -> None:
    tracker = GrowthTracker(SETTINGS)
    feed(tracker, [since(24, 50)])
    assert tracker.growth == 50 * MIB_MIN
    assert tracker.trusted == 24 * MIB_MIN  # the decision's evidence stays the window's slope


def test_a_growing_series_rate_is_the_median_of_its_last_three_figures() -> None:
    tracker = GrowthTracker(SETTINGS)
    now = feed(tracker, [fit(5)] * 3)
    assert tracker.rate is None  # not growing
    now = feed(tracker, [since(24, 48), since(28, 52)], start=now)
    assert tracker.growing and tracker.rate == 50 * MIB_MIN  # not the 5 from before the streak
    # Confirmed figures win: an unconfirmed one may rest on a misread step.
    now = feed(tracker, [fit(200, confirmed=False, cuts=(1.0,))], start=now)
    assert tracker.rate == 50 * MIB_MIN
    now = feed(tracker, [since(30, 56)], start=now)
    assert tracker.rate == 52 * MIB_MIN  # 48, 52, 56
    # A window later with only unconfirmed figures: their median, one misread among three.
    now += SETTINGS.window_s
    for cut, rate in ((3.0, 60), (3.0, 200), (3.0, 62)):  # one cut: none confirms another
        now += SETTINGS.fit_interval_s
        tracker.update(now, fit(rate, confirmed=False, cuts=(cut,)))
    assert tracker.growing and tracker.rate == 62 * MIB_MIN
    # A fit that may read a restarted cycle does not count; older figures of the spell do.
    now += SETTINGS.window_s
    tracker.update(now, Fit(1 * MIB_MIN, False, 1.0, 2, (9.0,), True, True))
    assert tracker.growing and tracker.growth == 1 * MIB_MIN and tracker.rate == 62 * MIB_MIN
    # Fits that fail for a window drop the figure, not the growing series' rate.
    feed(tracker, [None] * 11, start=now)
    assert tracker.growing and tracker.growth is None and tracker.rate == 62 * MIB_MIN


def test_the_latest_change_point_found_is_kept_for_the_next_windows() -> None:
    tracker = GrowthTracker(SETTINGS)
    assert tracker.onset is None
    feed(tracker, [Fit(24 * MIB_MIN, True, 1.0, 12, (), True, False, 50 * MIB_MIN, 330.0)])
    assert tracker.onset == 330.0
    feed(tracker, [fit(50), None], start=60.0)
    assert tracker.onset == 330.0


def test_a_change_point_is_looked_for_only_while_the_window_can_hold_the_spells_start() -> None:
    tracker = GrowthTracker(SETTINGS)
    assert tracker.change_point_from(0.0) == SETTINGS.grow_slow
    now = feed(tracker, [fit(50), fit(50)])
    assert tracker.growing
    assert tracker.change_point_from(now + SETTINGS.window_s) == SETTINGS.grow_slow
    assert tracker.change_point_from(now + SETTINGS.window_s + 1) == float("inf")


def test_slow_evidence_with_no_confirmed_rate_in_the_last_window_is_not_enough() -> None:
    """Fifteen confirmed rates over the last three windows with a median above the slow
    threshold, none in the last window: its median cannot be taken, and the series is not
    flagged (nor does the judgement fail)."""
    tracker = GrowthTracker(SETTINGS)
    now = feed(tracker, [fit(8)] * 9 + [fit(1)] * 6)  # the last window's median is low
    assert not tracker.growing
    feed(tracker, [fit(80, confirmed=False, cuts=(1.0,))] * 10, start=now)
    assert not tracker.growing
