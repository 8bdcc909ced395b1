"""The one place raylens checks the durations a caller passes in.

Intervals, deadlines and ages arrive from constructors, environment variables and flags.
Each is a number of seconds that must be finite, and usually positive; a value too large
for the platform's timers (``threading.TIMEOUT_MAX``) would make a later wait raise far
from the mistake, so a caller that waits on it can ask for that bound as well. Every error
names the argument and the value, and says what is allowed.
"""

from __future__ import annotations

import math

__all__ = ["non_negative_seconds", "positive_seconds"]


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def positive_seconds(name: str, value: object, *, maximum: float | None = None) -> float:
    """``value`` as float seconds: a finite number above 0 (and at most ``maximum``).

    Raises:
        ValueError: naming ``name`` and ``value``, for a bool, a non-number, NaN, an
            infinity, zero, a negative number, or a number above ``maximum``.
    """
    number = _number(value)
    if number is None or number <= 0 or (maximum is not None and number > maximum):
        bound = "" if maximum is None else f" of at most {maximum:g}"
        raise ValueError(
            f"{name} must be a positive, finite number of seconds{bound}, got {value!r:.80}"
        )
    return number


def non_negative_seconds(name: str, value: object) -> float:
    """``value`` as float seconds: a finite number of at least 0.

    Raises:
        ValueError: naming ``name`` and ``value`` for anything else.
    """
    number = _number(value)
    if number is None or number < 0:
        raise ValueError(
            f"{name} must be a non-negative, finite number of seconds, got {value!r:.80}"
        )
    return number
