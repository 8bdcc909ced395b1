"""Simulated time for code that takes a clock: a clock moved by hand, and a stop event on it.

Code under test that reads ``clock()`` and waits on ``stop.wait(timeout)`` runs on
:class:`ManualClock` and :class:`ClockedStop` without any real time passing: each wait
moves the clock on by its timeout, so a loop's schedule is checked exactly.
"""

from __future__ import annotations

import threading

__all__ = ["ClockedStop", "ManualClock"]


class ManualClock:
    """A monotonic clock that reads ``now`` and moves only when a test moves it."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = float(start)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move the clock on by ``seconds`` (zero or more)."""
        if seconds < 0:
            raise ValueError(f"a monotonic clock cannot move back: advance({seconds!r})")
        self.now += seconds


class ClockedStop(threading.Event):
    """A stop event whose waits pass on ``clock`` instead of in real time.

    Every wait moves the clock on by its timeout and is recorded in :attr:`waits`. With
    ``until``, the event sets itself once the clock reaches that time, so a loop that
    would otherwise never end stops there (and its test can say so).
    """

    def __init__(self, clock: ManualClock, *, until: float | None = None) -> None:
        super().__init__()
        self.clock = clock
        self.until = until
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is None:
            raise ValueError("a clocked stop is waited on with a timeout, got None")
        self.waits.append(timeout)
        self.clock.now += timeout
        if self.until is not None and self.clock.now >= self.until:
            self.set()
        return self.is_set()
