"""Growth of one memory series, judged on its ratchet at several time scales.

The *ratchet* of a series at a moment is the lowest level memory comes back to from that
moment on. Whatever memory takes and gives back (an allocator's sawtooth, a spike, a
checkpoint's host copy, a phase's working set, the object store filled and freed) leaves the
ratchet flat once it is given back; a step that stays makes it jump once; memory filling
towards a plateau makes it climb ever slower; a leak makes it climb along a straight line.

The estimator keeps, for each of ``levels`` scales (the window, then each twice the one
before), the floor (lowest sample) of each of the last :data:`FLOORS` slices of the scale.
When a slice closes, the scale is read: it *rises* when its ratchet, up to its newest
quarter, climbs at ``grow_slow`` or faster, strays from the straight line between its ends by
at most :data:`STRAIGHT` of the climb (on the longer scales, only where its segments end, so
that stairs count: :data:`STAIRS_FROM_S`), does not climb clearly less over its second half
than its first (:data:`STEADY`), and goes on climbing in the newest quarter. A series starts
*growing* when a scale rises and the longer scales bear it out (``_confirmed``), or at once
when the rise would reach the node's kill line within :data:`URGENT_S`. It stops when no
scale longer than the one that started the spell rises and that scale and the next
:data:`HOLDING` have all stalled over their newer half, up to the newest segment (climbed at
under ``calm``), so a leak that pauses between training phases keeps its spell; or at once
when memory gives back a fast rise read on the spell's scale or a longer one (``_Climb``):
it falls back to about where memory was before the rise and no lower for a minute, which a
leak never does. A series that gave back such a climb within the longest scale (a sawtooth
whose teeth last 10 or 40 minutes, the object store filled and freed phase after phase) needs
the confirmation of scales longer than the one that gave it back; the shortest scale, which
bears out none, is not taken at its word on a fast rise within the next scale's span after it
gave one back (the next tooth of a sawtooth whose teeth vary in height can climb straight for
longer). Its rate is the longest rising scale's no longer than the growth is known to span (the
longest scale rising when the spell started, plus the spell's age), or a longer scale's lying
within the spell where that climbs slower (``_spell_rate``).

Invariants a maintainer must keep: no clock is read (times are the caller's); memory per
series is fixed (``levels`` x :data:`FLOORS` pairs of floats and a climb per scale), and a
node's phase marks are bounded (:data:`MAX_PHASE_MARKS`); feeding samples one at a time or in
arrays gives the same figures, with each phase mark placed between the same samples.
"""

from __future__ import annotations

import math
from collections import deque
from typing import NamedTuple

import numpy as np

from raylens.telemetry.growth._arrays import FloatArray
from raylens.telemetry.growth._settings import SLICES_PER_WINDOW, GrowthSettings

__all__ = [
    "FLOORS",
    "SEGMENTS",
    "STAIRS_FROM_S",
    "STRAIGHT",
    "GrowthEstimator",
    "PhaseMarks",
    "ScaleReading",
]

#: Floors kept per scale: the scale is cut into this many slices.
FLOORS = SLICES_PER_WINDOW
#: Parts a scale is cut into; the newest part must go on climbing, the others make the line.
SEGMENTS = 4
#: Farthest a rising scale's ratchet may stray from the straight line between its ends, as
#: a share of its climb: a climb made of one or two steps strays farther.
STRAIGHT = 0.2
#: Scales of at least this many seconds, but not the longest, are held to the line only where
#: their segments end (20, 40 and 80 minutes with the default window). Under a sawtooth or a
#: leak that runs only while training, memory comes back down only now and then (once a
#: tooth, once a phase), so the ratchet climbs in stairs a tooth or a phase long: minutes,
#: whatever the window. A scale holding several of them reads the stairs as a line at its
#: segments' ends, while one or two steps still stray from it. Shorter scales' slices hold too
#: few samples for two points to stand clear of jitter, and the longest has none longer to
#: bear out a reading that loose.
STAIRS_FROM_S = 1200.0
#: The ratchet's climb over a scale's second half, as a share of its first half, below which
#: the rise is slowing down (memory filling towards a plateau), not a leak.
STEADY = 0.9
#: Fewest slices with samples, of :data:`FLOORS`, for a scale to be read at all (its first
#: slice must have samples: a scale is read once it spans its whole length).
MIN_FILLED = 16

#: Longer scales that must rise too before a spell starts (fewer above the longest).
CONFIRMING = 2
#: Longer scales whose newer half must have stalled too before a spell ends: a leak that
#: pauses for less than about half of the longest of them (a generation phase between two
#: training phases; some 20 min with the default window for a spell started on the shortest
#: scale) keeps its spell.
HOLDING = 3
#: Growth that would reach the node's kill line within this many seconds is flagged as soon
#: as one scale reads it (see ``GrowthEstimator.room``).
URGENT_S = 3600.0
#: Growth at least this many times ``grow_slow`` needs less confirmation (see ``_confirmed``).
FAST = 5.0
#: A fast climb is given back when memory falls to within this share of the climb of where it
#: was before the climb, and no lower for :data:`GIVE_BACK_SLICES`: what a tooth, a fill or
#: creep took and returned. Falling farther is something else (an engine
#: putting its weights to sleep, a restart).
GIVE_BACK = 0.25
#: Slices of the shortest scale (a minute with the default window) memory must stay no lower
#: than that for a fall to be a give-back: a drop of weights or a working set passing through
#: on its way down, over up to a minute, is not one.
GIVE_BACK_SLICES = 4
#: A slice whose floor is below this share of the one before starts the series afresh.
FRESH_SHARE = 0.5
#: The scale whose highest sample is the series' recurring peak (or the longest one below).
PEAK_LEVEL = 2

#: Phase boundaries a node keeps at most (those within the longest scale are kept; past
#: this many, the oldest go): phases of a second or more over 160 minutes.
MAX_PHASE_MARKS = 10_000
#: Marks closer than this to the one before are one boundary (a phase's end and the next
#: one's beginning arrive together).
SAME_BOUNDARY_S = 1.0

_SEGMENT = FLOORS // SEGMENTS
_INF = math.inf


class ScaleReading(NamedTuple):
    """One scale as last read.

    ``rate`` is bytes/s (at least 0); ``rises`` whether the scale rises; ``slowing`` whether
    its ratchet climbed clearly less over its second half than over its first (memory
    filling towards a plateau); ``peak`` its highest sample; ``recent`` the ratchet's climb
    over its newer half up to the newest segment, bytes/s; ``base`` and ``top`` the ratchet
    where the scale begins and where its newest segment begins; ``straight`` whether the
    ratchet keeps to the line at every slice, not only in stairs (see :data:`STAIRS_FROM_S`);
    ``stair_rate`` the ratchet's climb from the end of its first segment up to the newest,
    bytes/s: the rate of stairs that began part-way along the first segment.
    """

    scale_s: float
    rate: float
    rises: bool
    slowing: bool
    peak: float
    recent: float
    base: float
    top: float
    straight: bool
    stair_rate: float


def _read(
    floors: deque[float],
    highs: deque[float],
    width: float,
    settings: GrowthSettings,
    *,
    stairs: bool = False,
) -> ScaleReading | None:
    """The reading of one scale's floors, or None when too few slices hold samples; with
    ``stairs``, a ratchet climbing in stairs that keep to the line where the segments end
    rises too."""
    filled = 0
    ratchet = [0.0] * FLOORS
    low = _INF
    for i in range(FLOORS - 1, -1, -1):
        value = floors[i]
        if value == value:  # not NaN
            filled += 1
            if value < low:
                low = value
        ratchet[i] = low
    if filled < MIN_FILLED or floors[0] != floors[0]:
        return None  # too many gaps, or the scale's span not yet covered
    # The last segment ends on the newest slice alone, whose floor is the ratchet there:
    # it is read up to the end of the segment before.
    whole = FLOORS - _SEGMENT
    start = ratchet[0]
    climb = ratchet[whole] - start
    rate = max(0.0, climb / (whole * width))
    half = whole // 2
    first, second = ratchet[half] - start, ratchet[whole] - ratchet[half]
    slowing = second < STEADY * first
    bent = stair_bent = 0.0
    for i in range(1, whole):
        off = abs(ratchet[i] - start - climb * i / whole)
        bent = max(bent, off)
        if i % _SEGMENT == 0:
            stair_bent = max(stair_bent, off)
    straight = bent <= STRAIGHT * climb
    in_line = straight or (stairs and stair_bent <= STRAIGHT * climb)
    # The newest segment must go on climbing: a rise that has stopped is not growing now.
    newest = ratchet[-1] - ratchet[whole]
    going_on = newest >= STEADY * rate * (FLOORS - 1 - whole) * width
    rises = rate >= settings.grow_slow and in_line and not slowing and going_on
    peak = max((h for h in highs if h == h), default=math.nan)
    # What the ratchet climbed over its newer half, up to the newest segment: the ratchet
    # there is a minimum over fewer slices and rises on noise alone.
    recent = second / ((whole - half) * width)
    stair_rate = (ratchet[whole] - ratchet[_SEGMENT]) / ((whole - _SEGMENT) * width)
    return ScaleReading(
        width * FLOORS,
        rate,
        rises,
        slowing,
        peak,
        recent,
        start,
        ratchet[whole],
        straight,
        max(0.0, stair_rate),
    )


class PhaseMarks:
    """The phase boundaries of one node, times on its samples' clock in order, newest last;
    shared by the estimators of the node's series. Only those within twice the longest scale
    of the newest are kept (the longest scale is as far back as a judgement looks)."""

    __slots__ = ("_horizon_s", "_times")

    def __init__(self, settings: GrowthSettings) -> None:
        self._horizon_s = 2 * settings.longest_scale_s
        self._times: deque[float] = deque(maxlen=MAX_PHASE_MARKS)

    def mark(self, t: float) -> None:
        """A phase began or ended at ``t``; within :data:`SAME_BOUNDARY_S` of the newest mark
        it is the same boundary.

        Raises:
            ValueError: for a ``t`` that is not a finite time or is before the newest mark
                (nothing is marked then).
        """
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
            raise ValueError(f"a phase boundary must be a finite time in seconds, got {t!r:.80}")
        times = self._times
        if times and t < times[-1]:
            raise ValueError(
                f"phase boundaries must come in time order: {t!r} is before the newest, "
                f"{times[-1]!r}"
            )
        if times and t - times[-1] < SAME_BOUNDARY_S:
            return
        times.append(t)
        while times[0] < t - self._horizon_s:
            times.popleft()

    @property
    def times(self) -> tuple[float, ...]:
        return tuple(self._times)

    def marked_between(self, start: float, end: float) -> bool:
        """Whether a boundary lies in ``[start, end]``."""
        for at in reversed(self._times):
            if at < start:
                return False
            if at <= end:
                return True
        return False


class _Climb:
    """A fast rise one scale read, followed until memory gives it back or leaves it.

    ``base`` and ``top`` are where the reading's ratchet began and where its newest segment
    begins; ``before`` the lowest floor of the next longer scale (the scale's own for the
    longest) up to the rise, where memory was before it, a step up included; ``settling`` how
    many slices have closed, none of them lower than the band, since memory first fell into
    the band around ``before``.

    Given back means memory back where it was before the rise, not merely a drop the size of
    the climb: whatever a leak took stays, so after any fall memory is still above that level
    by at least the climb, whatever else let go (a training phase's working set, weights put
    to sleep).
    """

    __slots__ = ("base", "before", "settling", "top")

    def __init__(self, base: float, top: float, before: float) -> None:
        self.base, self.top, self.before = base, top, min(before, base)
        self.settling = 0

    def follow(self, floor: float) -> bool | None:
        """The next floor of the shortest scale: True once the climb is given back, False once
        memory fell well below where it was before (the climb is no longer followed), else None.

        A fall passes through the band around ``before`` on its way down, so memory must go no
        lower for :data:`GIVE_BACK_SLICES` slices from the first floor in it."""
        reach = GIVE_BACK * (self.top - self.base)
        if floor < self.before - reach:
            return False
        if self.settling == 0 and floor >= self.before + reach:
            return None
        self.settling += 1
        return True if self.settling >= GIVE_BACK_SLICES else None


class _Scale:
    """One scale's open slice and its last :data:`FLOORS` closed ones; ``stairs`` whether it
    reads a ratchet climbing in stairs (see :data:`STAIRS_FROM_S`)."""

    __slots__ = ("floors", "high", "highs", "index", "low", "stairs", "width")

    def __init__(self, width: float, *, stairs: bool) -> None:
        self.width = width
        self.stairs = stairs
        self.index: int | None = None
        self.low = _INF
        self.high = -_INF
        self.floors: deque[float] = deque([math.nan] * FLOORS, maxlen=FLOORS)
        self.highs: deque[float] = deque([math.nan] * FLOORS, maxlen=FLOORS)


class GrowthEstimator:
    """Growth, the growing state and its rate for one series, fed samples in time order.

    ``growth`` is the rate (bytes/s, never negative: memory given back reads 0): while
    growing, the spell's rate; else the slowest scale's; None until the shortest scale holds
    enough slices. ``rate`` is the growing series' rate, None while not growing.
    ``peak`` is the highest sample of the recent scales (what recurs, so what reaches a kill
    line first). ``spells`` counts the times it started growing. ``room``, set by whoever
    records, is the bytes left before the node's kill line: growth that would use it up within
    :data:`URGENT_S` is flagged on the shortest evidence.
    """

    __slots__ = (
        "_climbs",
        "_fresh_at",
        "_given_back_at",
        "_last_floor",
        "_readings",
        "_scales",
        "_settings",
        "_spell_scale",
        "_spell_span",
        "growing_since",
        "growth",
        "last_time",
        "last_value",
        "peak",
        "phases",
        "rate",
        "room",
        "spells",
    )

    def __init__(self, settings: GrowthSettings) -> None:
        self._settings = settings
        first = settings.window_s / FLOORS
        widths = [first * (1 << k) for k in range(settings.levels)]
        # The longest scale has none longer to bear out a reading as loose as stairs.
        self._scales = [
            _Scale(width, stairs=width * FLOORS >= STAIRS_FROM_S and width < widths[-1])
            for width in widths
        ]
        self._spell_scale: int | None = None
        #: The longest scale that rose when the spell started: how long the growth was known
        #: to have gone on then.
        self._spell_span = 0.0
        self._readings: list[ScaleReading | None] = [None] * settings.levels
        self._fresh_at = -_INF
        self._last_floor = -_INF
        #: Each scale's fast climb being followed, and when one of its climbs was last given back.
        self._climbs: list[_Climb | None] = [None] * settings.levels
        self._given_back_at = [-_INF] * settings.levels
        #: Bytes left before the node's kill line, when whoever records knows it.
        self.room: float | None = None
        #: The node's phase boundaries, when they are marked (see :meth:`mark_phase`).
        self.phases: PhaseMarks | None = None
        self.growth: float | None = None
        self.rate: float | None = None
        self.peak: float | None = None
        self.growing_since: float | None = None
        self.spells = 0
        self.last_time: float | None = None
        self.last_value: float | None = None

    @property
    def growing(self) -> bool:
        """Whether the series is growing now."""
        return self.growing_since is not None

    def mark_phase(self, t: float) -> None:
        """A phase boundary at ``t`` (``raylens.phase`` began or ended one): from then on,
        fast growth needs a rise that went on across a boundary (see ``_crossed_phase``).

        Raises:
            ValueError: for a ``t`` that is not finite or is before the newest mark.
        """
        if self.phases is None:
            self.phases = PhaseMarks(self._settings)
        self.phases.mark(t)

    def add(self, t: float, value: float) -> None:
        """One sample; samples at or before the last one, or not finite, are ignored."""
        if not (math.isfinite(t) and math.isfinite(value)):
            return
        if self.last_time is not None and t <= self.last_time:
            return
        self.last_time, self.last_value = t, value
        self._slice(0, math.floor(t / self._scales[0].width), value, value, t)

    def add_many(self, times: FloatArray, values: FloatArray) -> None:
        """Samples in time order, as :meth:`add` would take them one by one."""
        keep = np.isfinite(times) & np.isfinite(values)
        if self.last_time is not None:
            keep &= times > self.last_time
        times, values = times[keep], values[keep]
        if len(times) and np.any(np.diff(times) <= 0):
            # Out-of-order samples are dropped the way one-by-one adds drop them.
            running = np.maximum.accumulate(times)
            order = np.concatenate(([True], times[1:] > running[:-1]))
            times, values = times[order], values[order]
        if not len(times):
            return
        width = self._scales[0].width
        index = np.floor(times / width).astype(np.int64)
        starts = np.flatnonzero(np.concatenate(([True], index[1:] != index[:-1])))
        lows = np.minimum.reduceat(values, starts)
        highs = np.maximum.reduceat(values, starts)
        # A slice is closed by the first sample after it, whose time the judgement carries.
        for k, at in enumerate(starts.tolist()):
            self._slice(0, int(index[at]), float(lows[k]), float(highs[k]), float(times[at]))
        self.last_time, self.last_value = float(times[-1]), float(values[-1])

    def _slice(self, level: int, index: int, low: float, high: float, t: float) -> None:
        scale = self._scales[level]
        if scale.index is None:
            scale.index, scale.low, scale.high = index, low, high
            if level == 0:
                self._fresh_at = t
            return
        if index == scale.index:
            if low < scale.low:
                scale.low = low
            if high > scale.high:
                scale.high = high
            return
        closed, closed_low, closed_high = scale.index, scale.low, scale.high
        if level == 0:
            if closed_low < FRESH_SHARE * self._last_floor:
                self._fresh_at = t
            self._follow_climbs(closed_low, t)
            self._last_floor = closed_low
        scale.floors.append(closed_low)
        scale.highs.append(closed_high)
        self._judge(level, t)
        for _ in range(min(index - closed - 1, FLOORS)):
            scale.floors.append(math.nan)
            scale.highs.append(math.nan)
        scale.index, scale.low, scale.high = index, low, high
        if level + 1 < len(self._scales):
            self._slice(level + 1, closed // 2, closed_low, closed_high, t)

    def _track_climb(self, level: int, reading: ScaleReading) -> None:
        """Follow the newest fast rise read on a scale, unless memory is settling back from the
        one followed: a slow rise (creep while a fill is held) would replace a fill's climb
        with one too small to see freed."""
        if not reading.rises or reading.rate < FAST * self._settings.grow_slow:
            return
        climb = self._climbs[level]
        if climb is None or not climb.settling:
            # Where memory was before the rise, leaving out a restart's low (a process that
            # held nothing for a while is not a level the rise began from).
            lowest = FRESH_SHARE * reading.base
            around = self._scales[min(level + 1, len(self._scales) - 1)].floors
            before = min((f for f in around if lowest <= f), default=reading.base)
            self._climbs[level] = _Climb(reading.base, reading.top, before)

    def _follow_climbs(self, floor: float, t: float) -> None:
        """A closed slice's floor of the shortest scale, against every followed climb. A climb
        given back on a scale that bears out others ends a spell started on its scale or a
        shorter one, unless a longer scale still rises (a slow leak under long teeth). On the
        shortest scale it only holds that scale's own fast way back (``_confirmed``): a climb of a
        few minutes given back can be a training phase's working set freed while a leak goes
        on."""
        for level, climb in enumerate(self._climbs):
            if climb is None:
                continue
            given_back = climb.follow(floor)
            if given_back is None:
                continue
            self._climbs[level] = None
            if given_back:
                self._given_back_at[level] = t
                spell = self._spell_scale
                if (
                    level > 0
                    and spell is not None
                    and spell <= level
                    and not self._longer_rises(level)
                ):
                    self._end_spell()

    def _longer_rises(self, level: int) -> bool:
        """Whether a scale longer than ``level`` rises."""
        return any(r is not None and r.rises for r in self._readings[level + 1 :])

    def _end_spell(self) -> None:
        self._spell_scale = None
        self.growing_since = None
        self.rate = None

    def _urgent(self, reading: ScaleReading) -> bool:
        """Whether growth at ``reading``'s rate would take what is left of the node's memory
        (:attr:`room`) within :data:`URGENT_S`: worth a flag on one scale's word."""
        room = self.room
        return room is not None and reading.rate > 0 and room < URGENT_S * reading.rate

    def _confirmed(self, level: int, t: float) -> bool:
        """Whether the longer scales bear out a rise the scale ``level`` reads.

        The next two scales must rise too; or, for fast growth in a series that has not started
        afresh (its first sample, or memory falling to under half, as a process restart does)
        within the longer one's span, the next must rise and the one after must not be levelling
        off. Either way, the scales that bear it out must be quiet (``_quiet``): what a scale
        saw climb and be given back (teeth, fills) is likely to come back, so growth there
        needs the longer scales. A rise on the shortest scale, whose give-backs hold back no
        scale below it, also needs that scale to have given back no climb within the next
        one's span to go the fast way: a collector's teeth of a few minutes, each of its own
        height, climb straight on it tooth after tooth, and a tall one after a short one is
        borne out by the next scale. A fast leak under such teeth stops their give-backs; under
        a slower one they go on, and the first way (two longer scales) finds it.
        """
        longer = self._readings[level + 1 : level + 1 + CONFIRMING]
        quiet = [self._quiet(k, t) for k in range(level + 1, level + 1 + len(longer))]
        if all(r is not None and r.rises for r in longer) and all(quiet):
            return True
        if len(longer) < CONFIRMING or longer[0] is None or not longer[0].rises:
            return False
        outer = longer[-1]
        return (
            outer is not None
            and not outer.slowing
            and t - self._fresh_at >= outer.scale_s
            and (self._readings[level] or outer).rate >= FAST * self._settings.grow_slow
            and self._crossed_phase(longer[0].scale_s, t)
            and quiet[0]
            and (level > 0 or t - self._given_back_at[0] >= longer[0].scale_s)
        )

    def _quiet(self, level: int, t: float) -> bool:
        """Whether the scale ``level`` may bear out a rise on a shorter one: neither it nor a
        longer scale gave back a climb within the longest scale.

        A shorter scale's climbs are parts of a longer one's: inside a 40-minute tooth, a
        10-minute climb ends far above where memory falls, so it is dropped, never given back,
        and the longer scale's give-back speaks for it. The price: a leak that starts soon
        after one long climb was freed waits for the scales longer than that climb's.
        """
        return t - max(self._given_back_at[level:]) >= self._settings.longest_scale_s

    def _crossed_phase(self, span: float, t: float) -> bool:
        """Whether a rise read straight over the last ``span`` seconds went on across a phase
        boundary (one lies in the middle half of the span), or phases are not being marked
        (none within the longest scale).

        What a phase takes and the next gives back (rollouts filling the object store during
        generation, freed after training) climbs straight until the phase ends, as a leak
        does; only a leak goes on climbing past the boundary.
        """
        marks = self.phases
        if marks is None or not marks.marked_between(t - self._settings.longest_scale_s, t):
            return True
        return marks.marked_between(t - 0.75 * span, t - 0.25 * span)

    def _spell_rate(self, longest_rising: ScaleReading, t: float) -> float:
        """The growing series' rate: the longest rising scale's, or less where the longest scale
        lying within the spell (no longer than its age plus the scale that started it) and
        climbing without slowing down climbs slower. A leak that climbs only in some phases
        rises on a short scale at its rate inside one phase; the longer scale reads it over
        several."""
        assert self._spell_scale is not None and self.growing_since is not None
        started = self._readings[self._spell_scale]
        reach = t - self.growing_since + (started.scale_s if started is not None else 0.0)
        longest_within = longest_rising
        for r in self._readings:
            if (
                r is not None
                and longest_rising.scale_s < r.scale_s <= reach
                and not r.slowing
                and r.rate >= self._settings.grow_slow
            ):
                longest_within = r
        return min(longest_rising.rate, longest_within.rate)

    def _judge(self, level: int, t: float) -> None:
        scale = self._scales[level]
        reading = _read(scale.floors, scale.highs, scale.width, self._settings, stairs=scale.stairs)
        if reading is None:
            return
        self._readings[level] = reading
        self._track_climb(level, reading)
        for shown in reversed(self._readings[: PEAK_LEVEL + 1]):
            if shown is not None and shown.peak == shown.peak:
                self.peak = shown.peak
                break
        if (
            self._spell_scale is None
            and reading.rises
            and (self._confirmed(level, t) or self._urgent(reading))
        ):
            self._spell_scale = level
            self.growing_since = t
            self.spells += 1
            self._spell_span = max(r.scale_s for r in self._readings if r is not None and r.rises)
        elif t == self.growing_since and reading.rises:
            # A longer scale read as the spell starts (its slice closed with the same sample).
            self._spell_span = max(self._spell_span, reading.scale_s)
        elif level == self._spell_scale and not reading.rises:
            calm = self._settings.calm
            stalled = all(
                r is None or r.recent < calm for r in self._readings[level : level + 1 + HOLDING]
            )
            if stalled and not self._longer_rises(level):
                self._end_spell()
        rising = [r for r in self._readings if r is not None and r.rises]
        if self._spell_scale is not None and rising:
            assert self.growing_since is not None
            # A scale longer than the growth is known to span reads mostly what came before
            # (a slow climb, a restart's warm-up) and understates the rate; a shorter one
            # may overstate it for a while (one tooth or phase), which errs towards warning.
            known = t - self.growing_since + self._spell_span
            longest = ([r for r in rising if r.scale_s <= known] or rising[:1])[-1]
            if not longest.straight and longest.stair_rate > longest.rate:
                # Stairs keep to the line only roughly: stairs that began part-way along the
                # first segment climb slower over the whole scale than after that segment.
                longest = longest._replace(rate=longest.stair_rate)
            self.rate = self._spell_rate(longest, t)
        elif self._spell_scale is None:
            self.rate = None
        if self.rate is not None:
            self.growth = self.rate
        elif self._readings[0] is not None:
            # Not growing: the slowest scale's rate, so that what one scale misreads (a
            # sawtooth's last tooth, a step) is not shown as growth.
            self.growth = min(r.rate for r in self._readings if r is not None)
