"""How often a node is read, and the shortest growth window that reading rate allows.

A window is only worth what the readings inside it are: a fit over too few of them follows
noise, and a window shorter than a handful of readings never fills. The rule is one ratio,
:data:`READINGS_PER_WINDOW` readings per window at the least, so the shortest window scales
with the sampling interval: 40 s at the default 1 s, 400 s for a sampler read every 10 s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from raylens.telemetry.growth._settings import (
    GROWTH_WINDOW_ENV,
    MAX_GROWTH_WINDOW_S,
    MIN_GROWTH_WINDOW_S,
    SLICES_PER_WINDOW,
    growth_window_from_env,
)

__all__ = [
    "DEFAULT_SAMPLE_INTERVAL_S",
    "READINGS_PER_WINDOW",
    "check_growth_window",
    "growth_window_for_sampling",
    "shortest_growth_window",
]

#: How often a node's sampler reads its node by default, in seconds.
DEFAULT_SAMPLE_INTERVAL_S = 1.0
#: Readings a window must hold at the least: two in each of its slices, so that a slice's
#: floor is the lower of two readings and one missed reading leaves no slice empty.
READINGS_PER_WINDOW = 2 * SLICES_PER_WINDOW


def shortest_growth_window(sample_interval_s: float = DEFAULT_SAMPLE_INTERVAL_S) -> float:
    """The shortest window allowed when a node is read every ``sample_interval_s`` seconds."""
    if (
        isinstance(sample_interval_s, bool)
        or not isinstance(sample_interval_s, (int, float))
        or not math.isfinite(sample_interval_s)
        or sample_interval_s <= 0
    ):
        raise ValueError(
            f"sample_interval_s must be a positive number of seconds, got {sample_interval_s!r:.80}"
        )
    return max(MIN_GROWTH_WINDOW_S, READINGS_PER_WINDOW * float(sample_interval_s))


def check_growth_window(
    window_s: float, sample_interval_s: float = DEFAULT_SAMPLE_INTERVAL_S, *, name: str = "window_s"
) -> float:
    """``window_s`` if it is at least :func:`shortest_growth_window`; else ValueError in one line."""
    shortest = shortest_growth_window(sample_interval_s)
    if (
        isinstance(window_s, bool)
        or not isinstance(window_s, (int, float))
        or not math.isfinite(window_s)
        or window_s > MAX_GROWTH_WINDOW_S
    ):
        raise ValueError(
            f"{name} must be a number of seconds from {shortest:g} to {MAX_GROWTH_WINDOW_S:g}, "
            f"got {window_s!r:.80}"
        )
    if window_s < shortest:
        raise ValueError(
            f"{name}={window_s:g} s is shorter than the shortest growth window allowed at "
            f"{sample_interval_s:g} s sampling: {shortest:g} s ({READINGS_PER_WINDOW} readings)"
        )
    return float(window_s)


def growth_window_for_sampling(
    env: Mapping[str, str] | None = None,
    sample_interval_s: float = DEFAULT_SAMPLE_INTERVAL_S,
) -> float:
    """The window from ``RAYLENS_GROWTH_WINDOW`` (else the default), checked against the sampling.

    Raises ValueError, in one line naming the variable and the shortest window allowed, for a
    window shorter than :func:`shortest_growth_window`, and as
    :func:`~raylens.telemetry.growth.growth_window_from_env` does for one out of range.
    """
    return check_growth_window(
        growth_window_from_env(env), sample_interval_s, name=GROWTH_WINDOW_ENV
    )
