"""What a kill is, and how one is found in a counter: the pure part of OOM post-mortems.

A node's kill counters (Ray's memory monitor's eviction counter, the kernel's
``oom_kill`` count) are cumulative.

- :class:`CounterWatch` (the kernel's count, which a sampler publishes from its start):
  the first reading of a node only sets its baseline, an increase of ``k`` is ``k``
  kills, a decrease (a machine rebooted) a new baseline without a kill.
- :class:`EvictionWatch` (Ray's counter, which the raylet exports only once the node
  has had a kill): a node scraped without the counter has had none, so a counter that
  appears later counts from 0 and the first kill on a node is a kill. Only a counter met
  already non-zero at the first scrape of a node is a baseline (kills before raylens
  looked). The node's count is held as a high-water mark: a counter that goes down and
  up again adds no kill until it passes its highest value. The counter's per-victim
  series name the victims of each increase.

Both hold a few numbers per node and forget the nodes they are told have left.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

__all__ = [
    "MAX_KILLS_PER_READING",
    "MAX_NAMES_PER_NODE",
    "SAMPLER_ACTOR_CLASS",
    "CounterWatch",
    "EvictionWatch",
    "Killer",
    "Victim",
    "victim_from_ray_name",
]

#: Most kills one increase of the kernel's count adds: a count that jumps further (a
#: bogus value) still costs a bounded number of post-mortems.
MAX_KILLS_PER_READING = 16
#: Most kills one increase of Ray's counter adds (the raylet's own figure, but bounded
#: all the same).
MAX_EVICTIONS_PER_READING = 10_000
#: Most victim names an :class:`EvictionWatch` remembers per node.
MAX_NAMES_PER_NODE = 256
#: The class of raylens' node sampler actor, as Ray's counter names it.
SAMPLER_ACTOR_CLASS = "GroupMemorySamplerActor"


class Killer(enum.Enum):
    """Who killed the worker: Ray's memory monitor or the kernel's OOM killer."""

    RAY = "ray"
    KERNEL = "kernel"


@dataclass(frozen=True)
class Victim:
    """The worker a kill took, as far as it is known (each part None when not).

    ``ray_name`` is the victim's name on Ray's eviction counter (``<actor
    name>:<Class>.<method>`` for a named actor, ``<Class>.<method>`` or the task's
    function otherwise).
    """

    group: str | None = None
    worker_rank: int | None = None
    pid: int | None = None
    ray_name: str | None = None

    @property
    def is_sampler(self) -> bool:
        """Whether this was raylens' own node sampler."""
        method = (self.ray_name or "").rpartition(":")[2]
        return method.startswith(SAMPLER_ACTOR_CLASS + ".")


def _group_of_actor(actor: str) -> str | None:
    """The group of a raylens worker named ``<group>-<i>-<j>`` (or ``-grp<i>-<j>``), else None."""
    parts = actor.rsplit("-", 2)
    if len(parts) != 3 or not parts[0] or not parts[2].isdigit():
        return None
    middle = parts[1][3:] if parts[1].startswith("grp") else parts[1]
    return parts[0] if middle.isdigit() else None


def victim_from_ray_name(name: str) -> Victim:
    """What Ray's counter's ``Name`` says of a victim: its group when raylens named the actor."""
    actor, colon, _method = name.partition(":")
    group = _group_of_actor(actor) if colon else None
    return Victim(group=group, ray_name=name)


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


@dataclass
class _NodeEvictions:
    high: float
    names: dict[str, float] = field(default_factory=dict)


def _usable(value: float | None) -> float | None:
    if value is None or not math.isfinite(value) or value < 0:
        return None
    return value


class EvictionWatch:
    """Kills and their victims' names from successive scrapes of Ray's counter; see the module docstring.

    Not thread-safe.
    """

    def __init__(self) -> None:
        self._nodes: dict[str, _NodeEvictions] = {}

    def kills(
        self, node_id: str, total: float | None, names: Sequence[tuple[str, float]] = ()
    ) -> tuple[int, list[str]]:
        """``(kills, victim names)`` this scrape of the node adds; ``total`` None: no counter.

        Call it for every scrape of the node that answered, with or without the
        counter. At most as many names as kills come back, in name order.
        """
        total = _usable(total)
        state = self._nodes.get(node_id)
        if state is None:
            # The first scrape: a counter already there holds kills from before.
            state = self._nodes[node_id] = _NodeEvictions(0.0)
            if total is not None:
                state.high = total
                self._remember(state, names)
            return 0, []
        if total is None or total <= state.high:
            self._remember(state, names)
            return 0, []
        added = min(int(total - state.high + 0.5), MAX_EVICTIONS_PER_READING)
        state.high = total
        found: list[str] = []
        for name, value in names:
            before = state.names.get(name, 0.0)
            if _usable(value) is not None and value > before:
                found.extend([name] * min(int(value - before + 0.5), added))
        self._remember(state, names)
        return added, found[:added]

    def _remember(self, state: _NodeEvictions, names: Sequence[tuple[str, float]]) -> None:
        for name, value in names:
            if _usable(value) is not None and value > state.names.get(name, 0.0):
                state.names[name] = value
        if len(state.names) > MAX_NAMES_PER_NODE:
            current = {name for name, _ in names}
            state.names = {n: v for n, v in state.names.items() if n in current}

    def keep_only(self, live: Iterable[str]) -> None:
        """Forget every node not in ``live``."""
        keep = set(live)
        for node in [node for node in self._nodes if node not in keep]:
            del self._nodes[node]

    def __len__(self) -> int:
        return len(self._nodes)
