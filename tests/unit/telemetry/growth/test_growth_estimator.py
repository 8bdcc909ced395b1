"""One series judged on its ratchet: leaks grow, what memory gives back or plateaus at does not."""

from __future__ import annotations

import numpy as np
import pytest

from raylens.simulation.trace_families import TUNE_FAMILIES, make_trace
from raylens.simulation.trace_families import sawtooth as trace_sawtooth
from raylens.telemetry.growth import GrowthEstimator, GrowthSettings

MIB = float(1 << 20)
GIB = float(1 << 30)
MIB_MIN = MIB / 60

SETTINGS = GrowthSettings()
HOURS = 3600.0


def run(values: np.ndarray, times: np.ndarray | None = None) -> GrowthEstimator:
    estimator = GrowthEstimator(SETTINGS)
    t = np.arange(float(len(values))) if times is None else times
    estimator.add_many(t, values)
    return estimator


def jitter(n: int, sigma: float = 8 * MIB, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0.0, sigma, n)


def sawtooth(t: np.ndarray, amount: float, period: float) -> np.ndarray:
    return amount * (t % period) / period


def test_a_steady_leak_is_growing_at_its_rate() -> None:
    t = np.arange(0.0, 2 * HOURS)
    rate = 50 * MIB_MIN
    estimator = run(8 * GIB + rate * t + jitter(len(t)))
    assert estimator.growing and estimator.spells == 1
    assert estimator.rate == pytest.approx(rate, rel=0.1)
    assert estimator.growth == estimator.rate


def test_a_leak_under_a_large_heap_sawtooth_is_found_from_the_floor_it_returns_to() -> None:
    t = np.arange(0.0, 4 * HOURS)
    rate = 20 * MIB_MIN
    values = 8 * GIB + sawtooth(t, 6 * GIB, 170.0) + np.where(t > HOURS, (t - HOURS) * rate, 0)
    estimator = run(values + jitter(len(t)))
    assert estimator.growing
    assert estimator.growing_since is not None and estimator.growing_since > HOURS
    assert estimator.rate == pytest.approx(rate, rel=0.25)


@pytest.mark.parametrize("period", [25.0, 90.0, 290.0])
def test_an_allocator_sawtooth_alone_never_grows(period: float) -> None:
    t = np.arange(0.0, 6 * HOURS)
    estimator = run(8 * GIB + sawtooth(t, 4 * GIB, period) + jitter(len(t)))
    assert estimator.spells == 0 and not estimator.growing
    assert estimator.growth is not None and estimator.growth < 1 * MIB_MIN


def test_memory_filling_towards_a_plateau_is_not_a_leak() -> None:
    """Arenas, caches and replay buffers fill fast, then slower and slower."""
    t = np.arange(0.0, 4 * HOURS)
    warm = 6 * GIB * (1 - np.exp(-t / 1200.0))
    estimator = run(4 * GIB + warm + jitter(len(t)))
    assert estimator.spells == 0


def test_phase_steps_and_a_step_that_stays_are_not_growth() -> None:
    t = np.arange(0.0, 6 * HOURS)
    phases = np.where((t // 420) % 2 == 1, 3 * GIB, 0.0)
    stays = np.where(t > 2 * HOURS, 5 * GIB, 0.0)
    estimator = run(8 * GIB + phases + stays + jitter(len(t)))
    assert estimator.spells == 0


def test_a_checkpoint_copy_held_for_minutes_is_not_growth() -> None:
    t = np.arange(0.0, 4 * HOURS)
    copies = np.where((t % 1800) < 120, 30 * GIB * np.clip((t % 1800) / 20, 0, 1), 0.0)
    estimator = run(8 * GIB + copies + jitter(len(t)))
    assert estimator.spells == 0


def test_growth_is_absent_until_the_shortest_scale_has_been_seen_and_never_negative() -> None:
    t = np.arange(0.0, SETTINGS.window_s / 2)
    assert run(8 * GIB - t * MIB + jitter(len(t))).growth is None
    t = np.arange(0.0, 2 * HOURS)
    freeing = run(16 * GIB - t * 0.5 * MIB + jitter(len(t)))
    assert freeing.growth == 0.0 and not freeing.growing


def test_a_spell_ends_when_memory_stops_growing() -> None:
    t = np.arange(0.0, 6 * HOURS)
    rate = 100 * MIB_MIN
    leak = np.clip(t - 600, 0, 2 * HOURS) * rate
    estimator = GrowthEstimator(SETTINGS)
    values = 8 * GIB + leak + jitter(len(t))
    half = int(2 * HOURS)
    estimator.add_many(t[:half], values[:half])
    assert estimator.growing
    estimator.add_many(t[half:], values[half:])
    assert not estimator.growing and estimator.rate is None and estimator.spells == 1


def growing_share(values: np.ndarray, after: float = 0.0) -> tuple[GrowthEstimator, float]:
    """``values`` at 1 s fed a minute at a time, and the share of minutes from ``after`` on
    that ended with the series growing."""
    estimator = GrowthEstimator(SETTINGS)
    t = np.arange(float(len(values)))
    growing = []
    for start in range(0, len(t), 60):
        estimator.add_many(t[start : start + 60], values[start : start + 60])
        if t[start] >= after:
            growing.append(estimator.growing)
    return estimator, sum(growing) / len(growing)


def growing_after_first_flag(values: np.ndarray) -> tuple[GrowthEstimator, list[bool]]:
    """``values`` at 1 s fed a minute at a time, and whether the series was growing at the end
    of each minute from the first flag on."""
    estimator = GrowthEstimator(SETTINGS)
    t = np.arange(float(len(values)))
    growing = []
    for start in range(0, len(t), 60):
        estimator.add_many(t[start : start + 60], values[start : start + 60])
        if estimator.spells:
            growing.append(estimator.growing)
    return estimator, growing


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("tooth", [(300, 900), (540, 660)])
def test_teeth_that_climb_for_ten_minutes_and_are_freed_are_not_growth(
    seed: int, tooth: tuple[int, int]
) -> None:
    # What a training step takes and frees at its end, step after step: each tooth climbs
    # straight for as long as a fast leak is flagged on, and is given back.
    t = np.arange(0.0, 8 * HOURS)
    values = 8 * GIB + sawtooth_with_drifting_period(t, 1 * GIB, *tooth, seed) + jitter(len(t))
    estimator, share = growing_share(values)
    assert estimator.spells <= 1  # at most the first tooth, before one was seen given back
    assert share < 0.02


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    ("shortest_s", "longest_s", "most_spells"),
    [(900, 1800, 3), (1800, 2700, 2)],
    ids=["15-30 min", "30-45 min"],
)
def test_teeth_of_a_quarter_to_three_quarters_of_an_hour_are_flagged_only_until_seen_given_back(
    seed: int, shortest_s: int, longest_s: int, most_spells: int
) -> None:
    # Such teeth climb straight for as long as the full confirmation takes: the first ones are
    # flagged until they are freed; once the confirming scales have seen teeth given back, the
    # rest are not. A 30-45-minute tooth freed is a climb given back on the 20- and 40-minute
    # scales; the 10-minute scale that bears out the next tooth's start saw no climb of its
    # own given back (memory fell far below where its climb began) but is part of that tooth.
    t = np.arange(0.0, 8 * HOURS)
    teeth = sawtooth_with_drifting_period(t, 1 * GIB, shortest_s, longest_s, seed)
    estimator, share = growing_share(8 * GIB + teeth + jitter(len(t)))
    assert estimator.spells <= most_spells and share < 0.1


def test_teeth_of_three_to_ten_minutes_and_varying_height_are_not_growth_once_one_is_freed() -> (
    None
):
    # A collector's heap: each tooth climbs 0.2-2 GiB over 3-10 minutes and is freed. A tall
    # tooth after a short one reads, on the 5-minute scale, as a fast climb the 10-minute scale
    # bears out, though the 5-minute scale saw the tooth before it given back. Only the first
    # teeth, before one has been seen freed, may be flagged.
    t = np.arange(0.0, 3 * HOURS)
    late_spells = []
    for seed in range(12):
        teeth = teeth_of_varying_height(t, 0.2 * GIB, 2 * GIB, 180, 600, seed)
        estimator = GrowthEstimator(SETTINGS)
        values = 8 * GIB + teeth + jitter(len(t), seed=seed)
        spells = 0
        for start in range(0, len(t), 60):
            estimator.add_many(t[start : start + 60], values[start : start + 60])
            if estimator.spells != spells:
                spells = estimator.spells
                assert estimator.growing_since is not None
                if estimator.growing_since > 1800:
                    late_spells.append((seed, estimator.growing_since))
    assert late_spells == []


def test_a_leak_under_teeth_of_ten_to_thirty_minutes_is_not_held_back_by_longer_scales_own_give_backs() -> (
    None
):
    # Only the shortest scale waits after giving a climb back: the longer ones' give-backs
    # already hold back the scales below them, and holding them back too kept a 50 MiB/min
    # leak under such teeth waiting for the 80- and 160-minute scales (a median of 53 minutes).
    t = np.arange(0.0, 5 * HOURS)
    leak_from = 2 * HOURS
    delays = []
    for seed in range(10):
        teeth = teeth_of_varying_height(t, 0.2 * GIB, 2 * GIB, 600, 1800, seed)
        leak = np.clip(t - leak_from, 0.0, None) * 50 * MIB_MIN
        values = 8 * GIB + teeth + leak + jitter(len(t), seed=seed)
        estimator = GrowthEstimator(SETTINGS)
        for start in range(0, len(t), 60):
            estimator.add_many(t[start : start + 60], values[start : start + 60])
            since = estimator.growing_since
            if since is not None and since >= leak_from:
                delays.append(t[start + 59] - leak_from)
                break
    assert len(delays) == 10 and float(np.median(delays)) <= 40 * 60


def test_a_spell_ends_as_soon_as_the_climb_it_stood_on_is_given_back() -> None:
    # A climb of 200 MiB/min for half an hour, held for ten minutes, then freed: it is a leak
    # until it is freed, and not growth once memory has stayed back for a minute (four slices
    # of the shortest scale; the first closes with the first sample after it).
    t = np.arange(0.0, 3 * HOURS)
    freed_at = HOURS + 2400.0
    climb = np.clip(t - HOURS, 0.0, 1800.0) * 200 * MIB_MIN
    values = 8 * GIB + np.where(t < freed_at, climb, 0.0) + jitter(len(t))
    estimator = GrowthEstimator(SETTINGS)
    cut = int(freed_at)
    estimator.add_many(t[:cut], values[:cut])
    assert estimator.spells == 1 and estimator.growing
    estimator.add_many(t[cut : cut + 45], values[cut : cut + 45])
    assert estimator.growing  # not yet: the fall could be passing through on its way down
    estimator.add_many(t[cut + 45 : cut + 90], values[cut + 45 : cut + 90])
    assert not estimator.growing and estimator.rate is None


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("rate_mib_min", [5.0, 50.0])
def test_a_leak_under_ten_minute_teeth_is_found_on_the_longer_scales_and_keeps_its_spell(
    seed: int, rate_mib_min: float
) -> None:
    # Each tooth given back is a climb on the 10-minute scale: it holds back that scale's
    # path, and leaves alone a spell started on a longer one.
    t = np.arange(0.0, 8 * HOURS)
    rate = rate_mib_min * MIB_MIN
    teeth = sawtooth_with_drifting_period(t, 1 * GIB, 540, 660, seed)
    leak = np.clip(t - HOURS, 0.0, None) * rate
    estimator, share = growing_share(8 * GIB + teeth + leak + jitter(len(t), seed=seed), HOURS)
    assert estimator.spells == 1 and estimator.growing
    assert estimator.growing_since is not None and estimator.growing_since > HOURS
    assert estimator.rate == pytest.approx(rate, rel=0.25)
    assert share > 0.5


@pytest.mark.parametrize("rate_mib_min", [20.0, 50.0])
def test_a_leak_under_ten_minute_teeth_is_found_within_the_hour_in_the_stairs_it_leaves(
    rate_mib_min: float,
) -> None:
    # Memory comes back down only once a tooth, so the floor it returns to climbs in stairs
    # ten minutes long: the 20- and 40-minute scales hold a few of them. Read as a line only
    # slice by slice, the stairs waited for the 80- and 160-minute scales (about two hours).
    t = np.arange(0.0, 4 * HOURS)
    delays = []
    for seed in range(4):
        teeth = sawtooth_with_drifting_period(t, 1 * GIB, 540, 660, seed)
        leak = np.clip(t - HOURS, 0.0, None) * rate_mib_min * MIB_MIN
        estimator = GrowthEstimator(SETTINGS)
        values = 8 * GIB + teeth + leak + jitter(len(t), seed=seed)
        for start in range(0, len(t), 60):
            estimator.add_many(t[start : start + 60], values[start : start + 60])
            if estimator.growing:
                assert estimator.growing_since is not None and estimator.growing_since > HOURS
                delays.append(t[start + 59] - HOURS)
                break
    # Three of the four within 45 minutes (the other within 80).
    assert len(delays) == 4 and sorted(delays)[2] <= 45 * 60 and max(delays) <= 80 * 60


@pytest.mark.parametrize(
    ("window_s", "levels", "seeds"),
    [(60.0, 6, 8), (300.0, 3, 4)],
    ids=["one-minute window", "three scales"],
)
def test_flat_memory_under_heavy_jitter_is_not_read_as_stairs_with_a_short_window_or_few_scales(
    window_s: float, levels: int, seeds: int
) -> None:
    # Stairs are checked at two points only. On scales of a few minutes (a one-minute window
    # makes its third scale four minutes long) jitter of 64 MiB puts floors there that line up
    # with a climb of a few MiB/min; and the longest scale (the 20-minute one of three) needs
    # no other to bear it out.
    t = np.arange(0.0, 8 * HOURS)
    spells = 0
    for seed in range(seeds):
        estimator = GrowthEstimator(GrowthSettings(window_s=window_s, levels=levels))
        values = 8 * GIB + jitter(len(t), 64 * MIB, seed)
        for start in range(0, len(t), 60):
            estimator.add_many(t[start : start + 60], values[start : start + 60])
        spells += estimator.spells
    assert spells == 0


def test_a_leak_soon_after_a_long_tooth_was_freed_waits_for_the_scales_longer_than_the_tooth() -> (
    None
):
    # A 1 GiB climb over 40 minutes, freed: the 20- and 40-minute scales gave it back, so
    # neither they nor the shorter ones bear out a rise for 160 minutes (the next tooth would
    # climb the same way). Five minutes later a 200 MiB/min leak starts: the 80- and
    # 160-minute scales find it, about 75 minutes on, and not before.
    t = np.arange(0.0, 5 * HOURS)
    tooth = np.where((t >= 3300) & (t < 5700), (t - 3300) / 2400 * GIB, 0.0)
    leak = np.clip(t - 6000, 0.0, None) * 200 * MIB_MIN
    estimator = GrowthEstimator(SETTINGS)
    values = 8 * GIB + tooth + leak + jitter(len(t))
    flagged_at = None
    for start in range(0, len(t), 60):
        estimator.add_many(t[start : start + 60], values[start : start + 60])
        since = estimator.growing_since
        if flagged_at is None and since is not None and since > 6000:
            flagged_at = since
    assert estimator.growing
    assert flagged_at is not None and 6000 + 30 * 60 <= flagged_at <= 6000 + 90 * 60


@pytest.mark.parametrize("seed", [3, 5, 12])
def test_fragmentation_creeping_and_given_back_is_not_read_as_stairs_on_the_ten_minute_scale(
    seed: int,
) -> None:
    # Tune-side traces of creep (slowing, then freed) under a small sawtooth, which a
    # 10-minute scale read as stairs would flag: stairs are read from the 20-minute scale up.
    family = next(f for f in TUNE_FAMILIES if f.name == "fragmenting")
    trace = make_trace(family, seed)
    for values in [*trace.groups.values(), trace.other]:
        estimator = GrowthEstimator(SETTINGS)
        for start in range(0, len(trace.times), 60):
            chunk = slice(start, start + 60)
            estimator.add_many(trace.times[chunk], values[chunk])
        assert estimator.spells == 0


@pytest.mark.parametrize("steps", [2, 3])
@pytest.mark.parametrize("apart_s", [300, 600, 1200])
def test_a_few_steps_up_that_stay_are_not_growth_though_stairs_are_read(
    steps: int, apart_s: int
) -> None:
    # Weights loaded in two or three pieces, minutes apart: the floor climbs in stairs that
    # stop, which no scale holds as a line that goes on climbing.
    t = np.arange(0.0, 6 * HOURS)
    values = 8 * GIB + jitter(len(t))
    for k in range(steps):
        values += np.where(t >= HOURS + k * apart_s, 2 * GIB, 0.0)
    estimator, share = growing_share(values)
    assert estimator.spells == 0 and share == 0.0


@pytest.mark.parametrize("keep", [0.2, 0.4])
def test_teeth_that_keep_a_share_of_each_tooth_grow_at_what_they_keep(keep: float) -> None:
    rng = np.random.default_rng(0)
    t = np.arange(0.0, 8 * HOURS)
    teeth = np.zeros(len(t))
    at, kept = 0, 0.0
    while at < len(t):
        length = int(rng.uniform(540, 660))
        span = min(length, len(t) - at)
        teeth[at : at + span] = kept + np.arange(span) / length * GIB
        at, kept = at + length, kept + keep * GIB
    estimator, _ = growing_share(8 * GIB + teeth + jitter(len(t)))
    # Found on the scales that hold several teeth, and held from then on.
    assert estimator.growing and estimator.spells == 1
    assert estimator.growing_since is not None and estimator.growing_since < 3 * HOURS
    assert estimator.rate == pytest.approx(keep * GIB / 600, rel=0.25)


@pytest.mark.parametrize(
    ("working_set_gib", "rate_mib_min"), [(0.5, 50.0), (1.0, 100.0), (2.0, 200.0)]
)
def test_a_leak_while_training_keeps_its_spell_when_each_phase_frees_about_its_climb(
    working_set_gib: float, rate_mib_min: float
) -> None:
    # Twelve-minute phases: training takes a working set and leaks, generation frees the
    # working set, about what the leak climbed within one phase. The fall is not the climb
    # given back: memory stays above where it was before the phase by what leaked.
    t = np.arange(0.0, 6 * HOURS)
    training = (t // 720) % 2 == 1
    leak = np.cumsum(training & (t >= HOURS)) * rate_mib_min * MIB_MIN
    values = 8 * GIB + np.where(training, working_set_gib * GIB, 0.0) + leak + jitter(len(t))
    estimator, growing = growing_after_first_flag(values)
    assert estimator.spells == 1
    assert estimator.growing_since is not None and estimator.growing_since < HOURS + 1800
    assert all(growing)


@pytest.mark.parametrize("offset_s", [0, 4, 8, 12])
def test_a_leak_keeps_its_spell_while_its_engine_puts_weights_to_sleep_over_a_minute(
    offset_s: int,
) -> None:
    # A 100 MiB/min leak in an engine that, an hour in, lets 8 GiB of weights go over a
    # minute and takes them back ten minutes later. On its way down, memory passes where the
    # leak's climb began; it does not stay there, and what leaked is still held.
    t = np.arange(0.0, 3 * HOURS)
    asleep_from = 2 * HOURS + offset_s
    letting_go = np.clip((t - asleep_from) / 60.0, 0.0, 1.0)
    taking_back = np.clip((t - asleep_from - 600.0) / 60.0, 0.0, 1.0)
    weights = 8 * GIB * (1.0 - letting_go + taking_back)
    leak = np.clip(t - HOURS, 0.0, None) * 100 * MIB_MIN
    estimator, growing = growing_after_first_flag(8 * GIB + weights + leak + jitter(len(t)))
    assert estimator.spells == 1 and all(growing)


@pytest.mark.parametrize("hold_s", [600.0, 1200.0])
def test_fills_held_while_memory_creeps_and_then_freed_are_not_growth(hold_s: float) -> None:
    # A 12-minute fill at 256 MiB/min, held while memory creeps at 4 MiB/min, then freed with
    # the creep, every cycle: the slow creep is not taken for the climb to watch being freed.
    t = np.arange(0.0, 8 * HOURS)
    into_cycle = t % (720.0 + hold_s + 600.0)
    fill = np.clip(into_cycle, 0.0, 720.0) * 256 * MIB_MIN
    creep = np.clip(into_cycle - 720.0, 0.0, hold_s) * 4 * MIB_MIN
    held = np.where(into_cycle < 720.0 + hold_s, fill + creep, 0.0)
    estimator, share = growing_share(8 * GIB + held + jitter(len(t)))
    assert estimator.spells == 0 and share == 0.0


@pytest.mark.parametrize("dip_s", [1, 60])
def test_a_leak_keeps_its_spell_through_readings_of_almost_nothing(dip_s: int) -> None:
    # Every half hour the readings say 64 MiB for a moment or a minute (a process restarting
    # with what it leaked kept elsewhere, or readings that missed it): neither gives the
    # leak's climb back, and where memory fell to then is not where a later climb began.
    t = np.arange(0.0, 6 * HOURS)
    values = 8 * GIB + np.clip(t - HOURS, 0.0, None) * 50 * MIB_MIN + jitter(len(t))
    for at in range(int(HOURS) + 1800, len(t), 1800):
        values[at : at + dip_s] = 64 * MIB
    estimator, share = growing_share(values, 1.5 * HOURS)
    assert estimator.spells == 1 and share == 1.0


@pytest.mark.parametrize("tooth_s", [900.0, 1500.0])
def test_a_slow_leak_keeps_its_spell_when_a_long_tooth_on_top_of_it_is_freed(
    tooth_s: float,
) -> None:
    # A 5 MiB/min leak, flagged on the long scales; three hours in, 2 GiB climb on top of it
    # for 15-25 minutes and are freed. The tooth given back is not the leak's: the scales
    # longer than the tooth's still rise.
    t = np.arange(0.0, 6 * HOURS)
    leak = np.clip(t - HOURS, 0.0, None) * 5 * MIB_MIN
    tooth_at = 4 * HOURS
    inside = (t >= tooth_at) & (t < tooth_at + tooth_s)
    tooth = np.where(inside, (t - tooth_at) / tooth_s * 2 * GIB, 0.0)
    estimator, share = growing_share(8 * GIB + leak + tooth + jitter(len(t)), tooth_at - 600.0)
    assert estimator.spells == 1 and share == 1.0


def leak_while_training(rate: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Six hours of a leak running at ``rate`` only while training, generation and training
    alternating every 2-15 minutes: the times and the series."""
    rng = np.random.default_rng(seed)
    t = np.arange(0.0, 6 * HOURS)
    in_training = np.zeros(len(t), dtype=bool)
    at, training = 0, False
    while at < len(t):
        length = int(rng.uniform(120, 900))
        in_training[at : at + length] = training
        at, training = at + length, not training
    leak = np.cumsum(np.where(in_training, rate, 0.0))
    return t, 8 * GIB + leak + rng.normal(0.0, 8 * MIB, len(t))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_leak_that_pauses_between_training_phases_keeps_one_spell(seed: int) -> None:
    _, values = leak_while_training(20 * MIB_MIN, seed)
    estimator, growing = growing_after_first_flag(values)
    assert estimator.spells == 1
    assert len(growing) > 60 and all(growing)


def test_a_leak_an_hour_after_a_slow_warm_up_is_given_its_own_rate_not_the_longest_scales() -> None:
    # Arenas warming up by 1 GiB over the first hour or two, a 20-200 s heap sawtooth, and a
    # 50 MiB/min leak from the 70th-85th minute. Some 10-15 minutes after the flag the 80-minute
    # scale rises too, mostly on the warm-up, at about a fifth of the leak's rate: taken as the
    # rate it held for four minutes in every seed. A minute here and there still reads it.
    rate = 50 * MIB_MIN
    t = np.arange(0.0, 4 * HOURS)
    under_half = minutes = 0
    for seed in range(4):
        leak_from = 4200.0 + 300.0 * seed
        warm_up = 1 * GIB * (1.0 - np.exp(-t / 2400.0))
        heap = sawtooth_with_drifting_period(t, 0.5 * GIB, 20, 200, seed)
        leak = np.clip(t - leak_from, 0.0, None) * rate
        values = 8 * GIB + warm_up + heap + leak + jitter(len(t), seed=seed)
        estimator = GrowthEstimator(SETTINGS)
        flagged_at = None
        for start in range(0, len(t), 60):
            estimator.add_many(t[start : start + 60], values[start : start + 60])
            now = float(t[start + 59])
            since = estimator.growing_since
            if flagged_at is None and since is not None and since >= leak_from:
                flagged_at = now
            if flagged_at is not None and now - flagged_at <= 1200:
                assert estimator.growing and estimator.rate is not None
                minutes += 1
                under_half += estimator.rate < 0.5 * rate
        assert flagged_at is not None
    # 20 of 84 minutes when the longest rising scale gave the rate.
    assert minutes == 84 and under_half <= 5


def test_a_spell_knows_the_longer_scales_that_rose_with_the_sample_that_started_it() -> None:
    # A 100 MiB/min leak under two heap sawtooths (20-600 s, 3-10 min): the spell starts on
    # the 10-minute scale, and the 20- and 40-minute scales rise when their slices close with
    # the same sample. Counted in what the spell is known to span, they give the rate; left
    # out, the 5- and 10-minute scales read one tooth, at twice the leak's rate.
    rng = np.random.default_rng(8 * 1000 + 9)
    rate = float(rng.choice([5, 10, 20, 50, 100, 200])) * MIB_MIN
    leak_from = rng.uniform(1800, 7200)
    t = np.arange(0.0, leak_from + 150 * 60 + 3600)
    values = 8 * GIB + trace_sawtooth(t, rng, 0.05 * GIB, 0.5 * GIB, (20, 600))
    values = values + rng.normal(0.0, rng.uniform(8, 128) * MIB, len(t))
    values = values + trace_sawtooth(t, rng, 0.5 * GIB, 2 * GIB, (180, 600))
    values = values + np.clip(t - leak_from, 0.0, None) * rate
    estimator = GrowthEstimator(SETTINGS)
    rates = []
    for start in range(0, len(t), 60):
        estimator.add_many(t[start : start + 60], values[start : start + 60])
        if estimator.growing_since is not None:
            rates.append(estimator.rate)
            if len(rates) == 3:
                break
    assert rate == 100 * MIB_MIN and len(rates) == 3
    assert all(r is not None and r == pytest.approx(rate, rel=0.25) for r in rates)


def test_a_leak_climbing_in_stairs_is_given_its_rate_over_the_stairs_not_within_one() -> None:
    # A tune-side trace whose leak runs only while training: ten minutes after the flag, the
    # shortest rising scale lies inside one training phase and climbs at about twice the
    # leak's average; a longer scale within the spell holds several phases.
    family = next(f for f in TUNE_FAMILIES if f.name == "leak_training_sleepy")
    trace = make_trace(family, 1003, leak_rate_mib_min=20)
    assert trace.leak_group is not None
    values = trace.groups[trace.leak_group]
    estimator = GrowthEstimator(SETTINGS)
    first_flag = rate_ten_minutes_on = None
    for start in range(0, len(trace.times), 60):
        estimator.add_many(trace.times[start : start + 60], values[start : start + 60])
        now = float(trace.times[min(start + 59, len(trace.times) - 1)])
        if estimator.spells and first_flag is None:
            first_flag = now
        if first_flag is not None and now - first_flag >= 600:
            rate_ten_minutes_on = estimator.rate
            break
    assert rate_ten_minutes_on == pytest.approx(trace.leak_rate, rel=0.25)


def sawtooth_with_drifting_period(
    t: np.ndarray, amount: float, shortest: float, longest: float, seed: int
) -> np.ndarray:
    """A heap climbing by ``amount`` and released, each tooth ``shortest``-``longest`` s."""
    return teeth_of_varying_height(t, amount, amount, shortest, longest, seed)


def teeth_of_varying_height(
    t: np.ndarray, lowest: float, highest: float, shortest: float, longest: float, seed: int
) -> np.ndarray:
    """A heap climbing by ``lowest``-``highest`` bytes and released, each tooth
    ``shortest``-``longest`` s (a height is drawn for each tooth only when they differ, so a
    fixed height leaves the periods drawn as they were)."""
    rng = np.random.default_rng(seed)
    out = np.empty(len(t))
    at = 0
    while at < len(t):
        period = int(rng.uniform(shortest, longest))
        height = rng.uniform(lowest, highest) if highest > lowest else lowest
        span = min(period, len(t) - at)
        out[at : at + span] = np.arange(span) / period * height
        at += span
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("heap", ["jitter of 32 MiB", "2 GiB sawtooth"])
def test_a_spell_ends_within_three_hours_after_a_leak_stops_in_noise_or_under_a_heap(
    seed: int, heap: str
) -> None:
    t = np.arange(0.0, 8 * HOURS)
    stop = 3 * HOURS
    leak = np.clip(np.minimum(t, stop) - HOURS, 0, None) * 20 * MIB_MIN
    if heap == "jitter of 32 MiB":
        noise = jitter(len(t), 32 * MIB, seed)
    else:
        noise = sawtooth_with_drifting_period(t, 2 * GIB, 240, 360, seed) + jitter(
            len(t), seed=seed
        )
    values = 8 * GIB + leak + noise
    estimator = GrowthEstimator(SETTINGS)
    growing_after_stop = []
    for start in range(0, len(t), 60):
        estimator.add_many(t[start : start + 60], values[start : start + 60])
        if t[start] >= stop:
            growing_after_stop.append(estimator.growing)
    # The leak's spell holds a while (as through a pause between phases), then ends.
    assert all(growing_after_stop[:5])
    assert not all(growing_after_stop[:180])


def test_samples_one_by_one_and_in_arrays_give_the_same_figures() -> None:
    t = np.arange(0.0, 3 * HOURS)
    values = 8 * GIB + sawtooth(t, 1 * GIB, 75.0) + t * 30 * MIB_MIN + jitter(len(t))
    values[5000:5300] = np.nan  # a gap
    one, many = GrowthEstimator(SETTINGS), GrowthEstimator(SETTINGS)
    for k in range(len(t)):
        one.add(float(t[k]), float(values[k]))
    for start in range(0, len(t), 997):
        many.add_many(t[start : start + 997], values[start : start + 997])
    assert (one.growth, one.rate, one.growing_since, one.spells, one.peak) == (
        many.growth,
        many.rate,
        many.growing_since,
        many.spells,
        many.peak,
    )


def test_late_and_repeated_samples_are_ignored() -> None:
    estimator = GrowthEstimator(SETTINGS)
    estimator.add(10.0, 5 * GIB)
    estimator.add(10.0, 9 * GIB)
    estimator.add(5.0, 9 * GIB)
    estimator.add(11.0, float("inf"))
    assert (estimator.last_time, estimator.last_value) == (10.0, 5 * GIB)


def test_a_fast_leak_in_a_long_running_series_needs_one_longer_scale_less() -> None:
    """Fast growth in a series running for longer than the scales that judge it: the next
    scale rising and the one after not levelling off is enough."""
    t = np.arange(0.0, 4 * HOURS)
    start = 2 * HOURS
    rate = 50 * MIB_MIN
    values = 8 * GIB + np.clip(t - start, 0, None) * rate + jitter(len(t))
    estimator = run(values)
    assert estimator.growing and estimator.growing_since is not None
    # Two longer scales (the window's four times) would take 20 minutes and more.
    assert estimator.growing_since - start < 15 * 60
    assert estimator.rate == pytest.approx(rate, rel=0.1)


def test_growth_that_would_reach_the_kill_line_within_the_hour_is_flagged_on_the_shortest_scale() -> (
    None
):
    t = np.arange(0.0, 20 * 60.0)
    rate = 600 * MIB_MIN  # 10 MiB/s from the process's first reading: a warm-up or a leak
    values = 8 * GIB + t * rate + jitter(len(t))
    unknown, near = GrowthEstimator(SETTINGS), GrowthEstimator(SETTINGS)
    near.room = 20 * GIB  # about half an hour at this rate
    for estimator in (unknown, near):
        estimator.add_many(t, values)
    assert near.growing and near.growing_since is not None
    assert near.growing_since <= 1.5 * SETTINGS.window_s
    assert not unknown.growing  # a fresh series needs two longer scales without a line


def alternating_phases(length_s: float, phase_s: float) -> np.ndarray:
    """Phase boundaries every ``phase_s`` seconds (generation first, then training, ...)."""
    return np.arange(phase_s, length_s, phase_s)


def object_store_fills(t: np.ndarray, phase_s: float, fill_s: float) -> np.ndarray:
    """Rollouts filling the object store for the last ``fill_s`` seconds of every generation
    phase at 512 MiB/min, held for the first half of the training phase after it, then freed."""
    into_cycle = t % (2 * phase_s)
    filling = np.clip(into_cycle - (phase_s - fill_s), 0.0, fill_s)
    held = (into_cycle >= phase_s) & (into_cycle < 1.5 * phase_s)
    return np.where((into_cycle < phase_s) | held, filling, 0.0) * 512 * MIB_MIN


def run_with_phases(values: np.ndarray, boundaries: np.ndarray | None) -> GrowthEstimator:
    """``values`` at 1 s, fed a minute at a time, each phase boundary marked as it passes."""
    estimator = GrowthEstimator(SETTINGS)
    t = np.arange(float(len(values)))
    for start in range(0, len(t), 60):
        if boundaries is not None:
            for at in boundaries[(boundaries >= start) & (boundaries < start + 60)]:
                estimator.mark_phase(float(at))
        estimator.add_many(t[start : start + 60], values[start : start + 60])
    return estimator


def lone_fill(t: np.ndarray, start: float, fill_s: float = 660.0) -> np.ndarray:
    """The object store filled at 512 MiB/min for ``fill_s`` seconds from ``start`` (the last
    minutes of a generation phase), held through the training phase after it, then freed."""
    filling = np.clip(t - start, 0.0, fill_s) * 512 * MIB_MIN
    return np.where(t < start + fill_s + 720.0, filling, 0.0)


def test_a_fill_inside_one_phase_is_not_growth_once_phase_boundaries_are_marked() -> None:
    # Twelve-minute phases; an hour in, the object store fills for the last eleven minutes of
    # a generation phase: a straight climb as long as the one a fast leak is flagged on, in a
    # series that has given nothing back before (so the give-back guard does not hold it).
    t = np.arange(0.0, 3 * HOURS)
    fill_from = 5 * 720.0 + 60.0
    values = 8 * GIB + lone_fill(t, fill_from) + jitter(len(t))
    unmarked = run_with_phases(values, None)
    assert unmarked.spells == 1  # on its shape alone, the fill reads as a leak
    assert not unmarked.growing  # and once freed it is given back
    marked = run_with_phases(values, alternating_phases(3 * HOURS, 720.0))
    assert marked.spells == 0


def test_phases_marked_long_ago_leave_the_judgement_as_without_marks() -> None:
    # One boundary, then none for longer than the longest scale (160 minutes): from then on
    # phases are not being marked, and a fill reads as it does without marks.
    longest = SETTINGS.longest_scale_s
    fill_from = 30.0 + longest + 1800.0
    t = np.arange(0.0, fill_from + 3600.0)
    values = 8 * GIB + lone_fill(t, fill_from) + jitter(len(t))
    unmarked = run_with_phases(values, None)
    marked_once = run_with_phases(values, np.array([30.0]))
    assert marked_once.spells == unmarked.spells == 1


def test_fills_given_back_phase_after_phase_are_not_growth_even_unmarked() -> None:
    # Twelve-minute phases; the object store fills for the last eleven minutes of every
    # generation phase and is freed during the training phase after it. Each fill's climb
    # is given back, so from the first one on none is taken for a leak.
    t = np.arange(0.0, 6 * HOURS)
    values = 8 * GIB + object_store_fills(t, 720.0, 660.0) + jitter(len(t))
    assert run_with_phases(values, None).spells == 0


@pytest.mark.parametrize("step_gib", [2.0, 6.0])
def test_fills_given_back_after_memory_stepped_up_for_good_are_not_growth(step_gib: float) -> None:
    # Three hours in, the series steps up for good (a larger working set); the fills go on
    # from the new level and are given back to it, not to where memory was before the step.
    t = np.arange(0.0, 8 * HOURS)
    step = np.where(t >= 3 * HOURS + 600.0, step_gib * GIB, 0.0)
    values = 8 * GIB + object_store_fills(t, 720.0, 660.0) + step + jitter(len(t))
    assert run_with_phases(values, None).spells == 0


def test_phase_marks_out_of_order_or_not_finite_are_refused_and_one_boundary_marked_once() -> None:
    estimator = GrowthEstimator(SETTINGS)
    estimator.mark_phase(100.0)
    estimator.mark_phase(100.4)  # a phase's end and the next one's beginning
    for bad in (float("nan"), float("inf"), 99.0):
        with pytest.raises(ValueError, match="phase boundar"):
            estimator.mark_phase(bad)
    assert estimator.phases is not None and estimator.phases.times == (100.0,)


def test_a_leak_that_crosses_phase_boundaries_is_flagged_with_phases_marked() -> None:
    t = np.arange(0.0, 4 * HOURS)
    rate = 50 * MIB_MIN
    values = 8 * GIB + np.clip(t - HOURS, 0, None) * rate + jitter(len(t))
    unmarked = run_with_phases(values, None)
    marked = run_with_phases(values, alternating_phases(4 * HOURS, 480.0))
    assert marked.growing and marked.spells == 1
    assert marked.rate == pytest.approx(rate, rel=0.1)
    assert unmarked.growing_since is not None and marked.growing_since is not None
    # A boundary must pass the middle of the confirming scale: at most one phase later.
    assert marked.growing_since - unmarked.growing_since <= 480.0
