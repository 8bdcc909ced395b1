"""The knobs of memory history and growth, and the one environment variable that sets the window.

Every figure here is in seconds or bytes. The window is the span the growth rate is fitted
over; everything else scales with it unless given, so a 30 s window (for a test) behaves like
a 10 min one, only faster.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "DEFAULT_GROWTH_WINDOW_S",
    "DEFAULT_HORIZON_S",
    "DEFAULT_STEP_BYTES",
    "GROWTH_WINDOW_ENV",
    "MAX_GROWTH_WINDOW_S",
    "MIN_GROWTH_WINDOW_S",
    "GrowthSettings",
    "growth_window_from_env",
]

#: Environment variable with the growth window in seconds.
GROWTH_WINDOW_ENV = "RAYLENS_GROWTH_WINDOW"
DEFAULT_GROWTH_WINDOW_S = 600.0
MIN_GROWTH_WINDOW_S = 10.0
MAX_GROWTH_WINDOW_S = 86_400.0
DEFAULT_HORIZON_S = 3_600.0
#: A change between two samples larger than this is a phase step, not growth.
DEFAULT_STEP_BYTES = float(1 << 30)

_MIB_PER_MIN = (1 << 20) / 60.0


def _finite(name: str, value: object, *, low: float, high: float, unit: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(
            f"{name} must be a number of {unit} from {low:g} to {high:g}, got {value!r:.80}"
        )
    number = float(value)
    if not math.isfinite(number) or not low <= number <= high:
        raise ValueError(
            f"{name} must be a number of {unit} from {low:g} to {high:g}, got {value!r:.80}"
        )
    return number


def growth_window_from_env(
    env: Mapping[str, str] | None = None, default: float = DEFAULT_GROWTH_WINDOW_S
) -> float:
    """The growth window from ``RAYLENS_GROWTH_WINDOW`` (seconds), or ``default`` when unset or blank.

    Raises:
        ValueError: naming the variable, its value and the allowed range, for anything that is
            not a finite number of seconds from 10 to 86400.
    """
    raw = (os.environ if env is None else env).get(GROWTH_WINDOW_ENV, "")
    if not raw.strip():
        return default
    allowed = (
        f"allowed: a number of seconds from {MIN_GROWTH_WINDOW_S:g} to {MAX_GROWTH_WINDOW_S:g}"
        f" (default {DEFAULT_GROWTH_WINDOW_S:g})"
    )
    try:
        number = float(raw.strip())
    except ValueError:
        raise ValueError(f"{GROWTH_WINDOW_ENV}={raw!r:.80} is not a number; {allowed}") from None
    if not math.isfinite(number) or not MIN_GROWTH_WINDOW_S <= number <= MAX_GROWTH_WINDOW_S:
        raise ValueError(f"{GROWTH_WINDOW_ENV}={raw!r:.80} is out of range; {allowed}")
    return number


@dataclass(frozen=True)
class GrowthSettings:
    """How history is kept and how growth is fitted and judged.

    ``window_s``
        Span of the growth fit; full-resolution samples are kept this long.
    ``horizon_s``
        How far back downsampled history reaches (at least the window); it is kept in
        ``buckets`` buckets of ``horizon_s / buckets`` seconds with min, max and mean.
    ``step_bytes``
        A change between consecutive samples larger than this is a phase step (or a
        spike's edge) and is not counted as growth. Allocator releases must stay below it.
    ``refit_every_s``
        Seconds of a series' own time between two fits; default a tenth of the window.
        Fitting is what costs CPU; the figures move little between fits.
    ``grow_fast``, ``grow_slow``, ``calm``
        Bytes per second. A series starts *growing* when a confirmed rate of at least
        ``grow_fast`` is seen twice in a row, or when the median of the confirmed rates
        over the last three windows reaches ``grow_slow``; it stops when the median of the
        confirmed rates over the last window falls below ``calm``.

    Raises ValueError naming the field and what is allowed when a value is out of range.
    """

    window_s: float = DEFAULT_GROWTH_WINDOW_S
    horizon_s: float = DEFAULT_HORIZON_S
    buckets: int = 60
    step_bytes: float = DEFAULT_STEP_BYTES
    refit_every_s: float | None = None
    grow_fast: float = 20 * _MIB_PER_MIN
    grow_slow: float = 3.5 * _MIB_PER_MIN
    calm: float = 1.0 * _MIB_PER_MIN

    def __post_init__(self) -> None:
        window = _finite(
            "window_s",
            self.window_s,
            low=MIN_GROWTH_WINDOW_S,
            high=MAX_GROWTH_WINDOW_S,
            unit="seconds",
        )
        object.__setattr__(self, "window_s", window)
        horizon = _finite(
            "horizon_s", self.horizon_s, low=window, high=30 * MAX_GROWTH_WINDOW_S, unit="seconds"
        )
        object.__setattr__(self, "horizon_s", horizon)
        if (
            isinstance(self.buckets, bool)
            or not isinstance(self.buckets, int)
            or not 1 <= self.buckets <= 10_000
        ):
            raise ValueError(f"buckets must be an int from 1 to 10000, got {self.buckets!r:.80}")
        if self.refit_every_s is None:
            object.__setattr__(self, "refit_every_s", window / 10.0)
        else:
            object.__setattr__(
                self,
                "refit_every_s",
                _finite(
                    "refit_every_s",
                    self.refit_every_s,
                    low=window / 100,
                    high=horizon,
                    unit="seconds",
                ),
            )
        for name in ("step_bytes", "grow_fast", "grow_slow", "calm"):
            object.__setattr__(
                self, name, _finite(name, getattr(self, name), low=0.0, high=1e18, unit="bytes")
            )
        if self.step_bytes <= 0:
            raise ValueError(f"step_bytes must be above 0, got {self.step_bytes!r}")
        if not self.calm <= self.grow_slow <= self.grow_fast:
            raise ValueError(
                "thresholds must satisfy calm <= grow_slow <= grow_fast, got "
                f"calm={self.calm!r}, grow_slow={self.grow_slow!r}, grow_fast={self.grow_fast!r}"
            )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: float) -> GrowthSettings:
        """Settings with the window from ``RAYLENS_GROWTH_WINDOW`` unless ``window_s`` is given."""
        if "window_s" not in overrides:
            overrides["window_s"] = growth_window_from_env(env)
        if "horizon_s" not in overrides:
            overrides["horizon_s"] = max(DEFAULT_HORIZON_S, float(overrides["window_s"]))
        return cls(**overrides)  # type: ignore[arg-type]

    @property
    def fit_interval_s(self) -> float:
        """``refit_every_s`` as resolved (never None once constructed)."""
        return float(self.refit_every_s or self.window_s / 10.0)

    @property
    def trough_radius_s(self) -> float:
        """Half-width of the neighbourhood a trough must be the lowest point of."""
        return self.window_s / 60.0

    @property
    def bucket_s(self) -> float:
        """Width of one downsampled bucket."""
        return self.horizon_s / self.buckets
