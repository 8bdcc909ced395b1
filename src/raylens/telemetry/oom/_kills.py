"""What a kill is, and how one is found in a counter: the pure part of OOM post-mortems.

A node's kill counters (Ray's memory monitor's eviction counter, the kernel's
``oom_kill`` count) are cumulative. :class:`CounterWatch` turns successive readings of
them into kills: the first reading of a node only sets its baseline, an increase of
``k`` is ``k`` kills, and a decrease (a raylet restarted, a machine rebooted) sets a new
baseline without a kill. It holds one number per node and counter, and forgets the
nodes it is told have left.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["MAX_KILLS_PER_READING", "CounterWatch", "Killer", "Victim"]

#: Most kills one increase counts: a counter that jumps further (a bogus value) still
#: costs a bounded number of post-mortems.
MAX_KILLS_PER_READING = 16


class Killer(enum.Enum):
    """Who killed the worker: Ray's memory monitor or the kernel's OOM killer."""

    RAY = "ray"
    KERNEL = "kernel"


@dataclass(frozen=True)
class Victim:
    """The worker a kill took, as far as it is known (each part None when not)."""

    group: str | None = None
    worker_rank: int | None = None
    pid: int | None = None


class CounterWatch:
    """Kills from successive readings of one cumulative counter per node. Not thread-safe."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}

    def kills(self, node_id: str, value: float | None) -> int:
        """How many kills ``value`` adds to the node's last reading (0 for a first or reset)."""
        if value is None or not math.isfinite(value) or value < 0:
            return 0
        previous = self._last.get(node_id)
        self._last[node_id] = value
        if previous is None or value <= previous:
            return 0
        return min(int(value - previous + 0.5), MAX_KILLS_PER_READING)

    def keep_only(self, live: Iterable[str]) -> None:
        """Forget every node not in ``live``."""
        keep = set(live)
        for node in [node for node in self._last if node not in keep]:
            del self._last[node]

    def __len__(self) -> int:
        return len(self._last)
