"""One node's memory over time, kept where the node is read: readings in, the node's figures out.

A :class:`NodeGrowthKeeper` is what a node's sampler (and each node of the simulated cluster)
holds: one :class:`MemoryHistory` of that node alone, and the node's kill line. Each reading
(the node's used memory, its totals, each group's bytes) is recorded and turned into a
:class:`NodeReading`: the figures the sampler publishes. The keeper reads no clock and does
no I/O: times and figures are the caller's, so the same readings give the same figures in a
sampler, a simulation or a replay.

Invariants: memory is bounded by the history's settings whatever the run's length. A group
that leaves keeps its history (a post-mortem shows the group a kill took), up to
:data:`MAX_DEPARTED_GROUPS` of them; past that the node's history starts afresh, so what a
keeper holds stays bounded however many groups come and go; the phase boundaries marked
(:meth:`NodeGrowthKeeper.mark_phase`) stay through such a fresh start.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from raylens.telemetry.growth._limit import KillLineConfig
from raylens.telemetry.growth._recent import RecentHistory, recent_history
from raylens.telemetry.growth._settings import GrowthSettings
from raylens.telemetry.growth._store import MemoryHistory, NodeGrowth

__all__ = ["MAX_DEPARTED_GROUPS", "NODE_KEY", "NodeGrowthKeeper", "NodeReading"]

#: The key a keeper files its node under in its history (it holds one node only).
NODE_KEY = "node"
#: Groups that left whose history a keeper holds before it starts the node's afresh.
MAX_DEPARTED_GROUPS = 32


class NodeReading(NamedTuple):
    """A node's figures after one reading, as its sampler publishes them.

    ``growth`` (the node's), ``outside_growth`` (the memory outside every group) and each
    entry of ``group_growth`` are bytes per second, None until the window holds enough
    readings. ``limit`` is the kill line for the totals read; ``time_to_limit`` is set only
    while the node is ``growing``.
    """

    used: float
    growth: float | None
    outside_growth: float | None
    growing: bool
    limit: float | None
    time_to_limit: float | None
    group_growth: dict[str, float | None]


class NodeGrowthKeeper:
    """A node's bounded history and kill line; :meth:`record` one reading at a time.

    ``settings`` are the history's (the window above all); ``kill_line`` says how the
    node's line is drawn from its totals. Thread-safe as its history is: a reader may ask
    for :meth:`recent` while another thread records.
    """

    def __init__(self, settings: GrowthSettings, kill_line: KillLineConfig) -> None:
        self.settings = settings
        self.kill_line = kill_line
        self.history = MemoryHistory(settings)
        self._groups: frozenset[str] = frozenset()
        self._departed: set[str] = set()

    @property
    def window_s(self) -> float:
        return self.settings.window_s

    def record(
        self,
        t: float,
        used: float,
        groups: Mapping[str, float],
        *,
        host_total: float | None,
        cgroup_total: float | None = None,
    ) -> NodeReading:
        """Record the node at ``t`` (seconds on any monotonic clock) and return its figures.

        ``used`` is the node's used bytes, ``groups`` each group's bytes on it (empty when
        it hosts none: everything is then outside the groups). A group that was in the last
        reading and is not in this one leaves the node's figures; its history stays (see
        the module docstring).
        """
        self.history.set_limit(NODE_KEY, self.kill_line.limit(host_total, cgroup_total))
        self.add(t, used, groups)
        return self._reading(used, self.history.node(NODE_KEY), host_total, cgroup_total)

    def add(self, t: float, used: float, groups: Mapping[str, float]) -> None:
        """Record the node at ``t`` as :meth:`record` does, without working out its figures
        (readings made up for the past, as a simulation catching up does)."""
        names = frozenset(groups)
        if names != self._groups:
            self._regrouped(names)
        self.history.record_node(NODE_KEY, t, used, groups=groups)

    def mark_phase(self, t: float) -> None:
        """A phase of the job began or ended at ``t`` (the clock :meth:`record` is given)."""
        self.history.mark_phase(NODE_KEY, t)

    def _regrouped(self, names: frozenset[str]) -> None:
        self._departed |= self._groups - names
        self._departed -= names
        self._groups = names
        if len(self._departed) > MAX_DEPARTED_GROUPS:
            self.history.forget(NODE_KEY, keep_phase_marks=True)
            self._departed.clear()

    def recent(self, at: float) -> RecentHistory:
        """The node's recent memory up to ``at`` (the clock :meth:`record` was given)."""
        return recent_history(self.history, NODE_KEY, at)

    def _reading(
        self,
        used: float,
        growth: NodeGrowth | None,
        host_total: float | None,
        cgroup_total: float | None,
    ) -> NodeReading:
        limit = self.kill_line.limit(host_total, cgroup_total)
        if growth is None:
            return NodeReading(used, None, None, False, limit, None, {})
        return NodeReading(
            used,
            growth.growth,
            None if growth.other is None else growth.other.growth,
            growth.growing,
            limit,
            growth.time_to_limit(limit),
            {name: part.growth for name, part in growth.groups.items()},
        )
