"""Whether one series is growing: the fits of successive windows, judged with hysteresis.

Invariants a maintainer must keep:

- a series is called *growing* only on confirmed evidence (a fast streak of two, or the slow
  rule over three windows); the decision rests on the fits' slopes, never on ``Fit.recent``;
- a growing series' *rate* is the median of its last three confirmed figures of the spell
  within a window, else of its last three figures of the spell; fits that may read a
  restarted cycle (``Fit.restart``) never count towards it, nor confirm one another;
- memory per series is fixed from the start: the confirmed rates live in a preallocated ring.

The rules and their thresholds: ``docs/architecture.md``, *Memory over time*, *The decision*.
"""

from __future__ import annotations

import math

import numpy as np

from raylens.telemetry.history._estimator import Fit
from raylens.telemetry.history._settings import GrowthSettings

__all__ = ["GrowthTracker"]

_FAST_STREAK = 2
_FAST_AGREEMENT = 0.75
_FAST_STEADY = 0.25
_SLOW_WINDOWS = 3
_RATES_PER_WINDOW = 10
_SLOW_MIN_RATES = 15
_SLOW_POSITIVE = 0.9
_CALM_MIN_RATES = 5
_TWIN_TOLERANCE = 0.3
_RING = _SLOW_WINDOWS * _RATES_PER_WINDOW
#: Latest figures a growing series' rate is the median of.
_RATE_FIGURES = 3


def _median(values: np.ndarray) -> float:
    ordered = np.sort(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return float(ordered[middle])
    return float(ordered[middle - 1] + ordered[middle]) / 2


class GrowthTracker:
    """The growth figure and the growing decision of one series, fed one fit at a time.

    ``growth`` (bytes/s) is the latest fit's figure (its rate since the change point its
    window shows, else its slope), kept for one window when a fit cannot be made, None
    before the first fit. ``onset`` is the latest change point a fit found (the next
    windows are read from it while they hold it). ``rate`` is the growing series' rate (module docstring), None
    while it is not growing. ``confirmed`` says whether it is. ``trusted`` is
    the latest confirmed rate of the last window (None when there was none), the figure to
    add up when several series make a whole. ``growing_since`` is when the current growing
    spell began (None while not growing), ``spells`` how many have begun.
    """

    __slots__ = (
        "_calm_at",
        "_evidence_from",
        "_fast",
        "_figures",
        "_last_strong",
        "_rate_t",
        "_rate_v",
        "_rates",
        "_settings",
        "_twins",
        "confirmed",
        "growing_since",
        "growth",
        "growth_at",
        "onset",
        "spells",
    )

    def __init__(self, settings: GrowthSettings) -> None:
        self._settings = settings
        self.growth: float | None = None
        self.growth_at: float | None = None
        self.confirmed = False
        self.growing_since: float | None = None
        self.onset: float | None = None
        self.spells = 0
        self._fast = 0
        # Before a spell: when the current fast streak began; during one: the time from
        # which figures count towards its rate.
        self._evidence_from = -math.inf
        self._calm_at = -math.inf
        self._last_strong = math.nan
        self._rate_t = np.full(_RING, -math.inf)
        self._rate_v = np.zeros(_RING)
        self._rates = 0
        self._twins: list[tuple[float, float, tuple[float, ...]]] | None = None
        # Only while a spell may begin or goes on (a fast streak, or growing): times, then
        # figures, each of the last figures (row 0) and the last confirmed ones (row 1).
        self._figures: np.ndarray | None = None

    @property
    def growing(self) -> bool:
        """Whether the series is growing now."""
        return self.growing_since is not None

    @property
    def rate(self) -> float | None:
        """While growing, the median of its last three figures (module docstring); else None."""
        if self.growing_since is None or self._figures is None:
            return None
        times, values = self._figures
        latest = float(times[0].max())
        counted = times >= self._evidence_from
        counted[1] &= latest - times[1] <= self._settings.window_s
        for row in (1, 0):
            recent = values[row][counted[row]]
            if len(recent):
                return _median(recent)
        return None

    def change_point_from(self, now: float) -> float:
        """The slope from which the window ending at ``now`` is also read for a change point.

        ``grow_slow``, unless the series has been growing for more than a window: its
        window then no longer holds the start of the spell, and a change found there would
        be a misread step rather than the growth the decision is about (infinite: not asked).
        """
        since = self.growing_since
        if since is not None and now - since > self._settings.window_s:
            return math.inf
        return self._settings.grow_slow

    @property
    def trusted(self) -> float | None:
        """The latest confirmed rate, if one was seen within the last window."""
        if not self._rates or self.growth_at is None:
            return None
        k = (self._rates - 1) % _RING
        if self.growth_at - self._rate_t[k] > self._settings.window_s:
            return None
        return float(self._rate_v[k])

    def update(self, now: float, fit: Fit | None) -> None:
        """Take the fit of the window ending at ``now`` (None when none could be made)."""
        settings = self._settings
        if fit is None:
            if self.growth_at is not None and now - self.growth_at > settings.window_s:
                self.growth, self.growth_at, self.confirmed = None, None, False
            self._fast = 0
            self._judge(now)
            return
        confirmed = fit.confirmed or self._twin(now, fit)
        figure = fit.slope if fit.recent is None else fit.recent
        if fit.onset is not None:
            self.onset = fit.onset
        self.growth, self.growth_at, self.confirmed = figure, now, confirmed
        if confirmed:
            self._keep_rate(now, fit.slope)
        strong = confirmed and fit.slope >= settings.grow_fast and fit.agreement >= _FAST_AGREEMENT
        if not strong:
            self._fast = 0
        elif self._fast and abs(fit.slope - self._last_strong) <= _FAST_STEADY * self._last_strong:
            self._fast += 1
        elif self.growing_since is None:
            self._fast = 1
            self._evidence_from = now
        else:
            self._fast = 1
        self._last_strong = fit.slope if strong else math.nan
        self._judge(now)
        self._keep_figure(now, figure, confirmed, fit.restart)

    def _keep_figure(self, now: float, figure: float, confirmed: bool, restart: bool) -> None:
        """Keep the figure for a spell's rate while a spell may begin or goes on."""
        if self.growing_since is None and self._fast == 0:
            self._figures = None
            return
        if restart:
            return
        if self._figures is None:
            self._figures = np.full((2, 2, _RATE_FIGURES), -math.inf)
        times, values = self._figures
        for row in (0, 1) if confirmed else (0,):
            k = int(np.argmin(times[row]))  # the oldest
            times[row, k], values[row, k] = now, figure

    def _twin(self, now: float, fit: Fit) -> bool:
        """Whether a recent unconfirmed fit over other cuts gives nearly the same rate."""
        window = self._settings.window_s
        if self._twins:
            self._twins = [twin for twin in self._twins if now - twin[0] <= window] or None
        if not fit.troughs or fit.restart or not fit.cuts or fit.slope <= 0:
            return False
        mine = set(fit.cuts)
        found = any(
            not mine.intersection(cuts)
            and abs(slope - fit.slope) <= _TWIN_TOLERANCE * max(slope, fit.slope)
            for _, slope, cuts in self._twins or ()
        )
        if self._twins is None:
            self._twins = []
        self._twins.append((now, fit.slope, fit.cuts))
        return found

    def _keep_rate(self, now: float, slope: float) -> None:
        spacing = self._settings.window_s / _RATES_PER_WINDOW
        if self._rates:
            k = (self._rates - 1) % _RING
            if self._rate_t[k] // spacing == now // spacing:
                self._rate_t[k], self._rate_v[k] = now, slope
                return
        k = self._rates % _RING
        self._rate_t[k], self._rate_v[k] = now, slope
        self._rates += 1

    def _recent(self, now: float, span: float) -> np.ndarray:
        return self._rate_v[now - self._rate_t < span]

    def _judge(self, now: float) -> None:
        settings = self._settings
        window = settings.window_s
        if self.growing_since is None:
            if self._fast >= _FAST_STREAK:
                self.growing_since = now
                self.spells += 1
                return
            if self._rates < _SLOW_MIN_RATES:
                return
            span = min(_SLOW_WINDOWS * window, now - self._calm_at)
            recent = self._recent(now, span)
            lately = self._recent(now, min(window, span))
            if (
                len(recent) >= _SLOW_MIN_RATES
                and len(lately)
                and _median(recent) >= settings.grow_slow
                and np.count_nonzero(recent > 0) >= _SLOW_POSITIVE * len(recent)
                and _median(lately) >= settings.grow_slow
            ):
                self.growing_since = now
                self._evidence_from = now - window
                self.spells += 1
            return
        latest = self._recent(now, min(window, now - self.growing_since))
        if len(latest) >= _CALM_MIN_RATES and _median(latest) < settings.calm:
            self.growing_since = None
            self._calm_at = now
