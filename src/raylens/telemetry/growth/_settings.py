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
    "DEFAULT_LEVELS",
    "GROWTH_WINDOW_ENV",
    "MAX_GROWTH_WINDOW_S",
    "MIN_GROWTH_WINDOW_S",
    "SLICES_PER_WINDOW",
    "GrowthSettings",
    "growth_window_from_env",
]

#: Environment variable with the growth window in seconds.
GROWTH_WINDOW_ENV = "RAYLENS_GROWTH_WINDOW"
DEFAULT_GROWTH_WINDOW_S = 300.0
MIN_GROWTH_WINDOW_S = 10.0
MAX_GROWTH_WINDOW_S = 86_400.0
DEFAULT_HORIZON_S = 3_600.0
#: Scales judged by default: 5, 10, 20, 40, 80 and 160 minutes with the default window.
DEFAULT_LEVELS = 6
#: Slices each scale is cut into; the shortest scale's slice is how often figures move.
SLICES_PER_WINDOW = 20

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
    """How history is kept and how growth is judged.

    ``window_s``
        The shortest time scale growth is judged on, cut into :data:`SLICES_PER_WINDOW`
        slices; a figure can change once per slice. Full-resolution samples are kept this
        long (what a post-mortem shows).
    ``levels``
        How many scales are judged: the window, then each twice the one before (the default
        six from 5 minutes reach 160 minutes), so slow growth is found on the long ones.
    ``horizon_s``
        How far back downsampled history reaches (at least the window); it is kept in
        ``buckets`` buckets of ``horizon_s / buckets`` seconds with min, max and mean.
    ``grow_slow``
        Bytes per second: the slowest rate a series is called growing at.
    ``calm``
        Bytes per second: a growing series stops growing when the scale that started its
        spell and the next few climb slower than this over their newer half.

    Raises ValueError naming the field and what is allowed when a value is out of range.
    """

    window_s: float = DEFAULT_GROWTH_WINDOW_S
    levels: int = DEFAULT_LEVELS
    horizon_s: float = DEFAULT_HORIZON_S
    buckets: int = 60
    grow_slow: float = 2.0 * _MIB_PER_MIN
    calm: float = 0.5 * _MIB_PER_MIN

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
        for name, high in (("buckets", 10_000), ("levels", 12)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
                raise ValueError(f"{name} must be an int from 1 to {high}, got {value!r:.80}")
        for name in ("grow_slow", "calm"):
            object.__setattr__(
                self, name, _finite(name, getattr(self, name), low=0.0, high=1e18, unit="bytes")
            )
        if not 0 < self.calm <= self.grow_slow:
            raise ValueError(
                "thresholds must satisfy 0 < calm <= grow_slow, got "
                f"calm={self.calm!r}, grow_slow={self.grow_slow!r}"
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
        """Seconds between two readings of the shortest scale: figures change at most this often."""
        return self.window_s / SLICES_PER_WINDOW

    @property
    def longest_scale_s(self) -> float:
        """The longest time scale growth is judged on."""
        return self.window_s * (1 << (self.levels - 1))

    @property
    def bucket_s(self) -> float:
        """Width of one downsampled bucket."""
        return self.horizon_s / self.buckets
