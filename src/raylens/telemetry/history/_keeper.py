"""GrowthKeeper: each node's samples in, its growth figures out, in whichever process scrapes.

A keeper holds the :class:`MemoryHistory` of every node it is shown and turns each node's
newest sample into :class:`GrowthFigures`: plain values, so they cross from the scrape
helper to the driver as they are. The driver's growth cycle runs one in its own process
when it scrapes there, and has the scrape helper run one otherwise, so the recording and
the fits cost the driver nothing.

Invariants a maintainer must keep:

- a node is recorded once per new sample, and, when a sampler reports its groups, once per
  reading of the sampler, however often the same reading is scraped again;
- a node's figures are built again at most once per fit interval of its own time (they
  cannot change between fits), and merged again with a sampler's figures only when a new
  reading brings other growth, so a node with a fresh sample and nothing new returns the
  very same object: whoever forwards figures can tell a change by identity (a node without
  a sample gets new figures each time);
- per node, one state object changed in place; nothing else outlives a call.
"""

from __future__ import annotations

import math
from collections.abc import Container
from typing import NamedTuple

from raylens.telemetry.history._limit import KillLineConfig
from raylens.telemetry.history._settings import GrowthSettings
from raylens.telemetry.history._store import MemoryHistory, NodeGrowth
from raylens.telemetry.raylet_payload import NodeGroupFigures

__all__ = ["NO_FIGURES", "GrowthConfig", "GrowthFigures", "GrowthKeeper", "without_limit"]


class GrowthConfig(NamedTuple):
    """What a keeper is built from; plain, so the driver can hand it to its scrape helper."""

    settings: GrowthSettings
    kill_line: KillLineConfig


class GrowthFigures(NamedTuple):
    """One node's growth as its history reads: the outlook without the node's names.

    ``group_growth`` is ``((group, bytes per second), ...)``; ``fastest_group`` the group
    growing fastest, None when no group has a figure.
    """

    used: float | None
    growth: float | None
    growing: bool
    limit: float | None
    time_to_limit: float | None
    fastest_group: str | None
    group_growth: tuple[tuple[str, float], ...]


#: A node with no figures yet: no sample, no history.
NO_FIGURES = GrowthFigures(None, None, False, None, None, None, ())


def without_limit(figures: GrowthFigures) -> GrowthFigures:
    """``figures`` of a node with no fresh sample: no total, so no kill line and no time to it."""
    return figures._replace(limit=None, time_to_limit=None)


class _Watched:
    """What a keeper holds of one node between samples; changed in place.

    ``recorded_at`` is the sample time last recorded and ``stamp`` the sampler's reading
    it carried (None without groups); ``built`` the figures last built from the history,
    at sample time ``built_at``; ``merged`` what adding the growth of the sampler's
    figures ``merged_figures`` to ``merged_from`` gave, and ``published`` that growth.
    """

    __slots__ = (
        "built",
        "built_at",
        "merged",
        "merged_figures",
        "merged_from",
        "published",
        "recorded_at",
        "stamp",
    )

    def __init__(self) -> None:
        self.recorded_at = -math.inf
        self.stamp: float | None = None
        self.built: GrowthFigures | None = None
        self.built_at = -math.inf
        self.merged_from: GrowthFigures | None = None
        self.merged_figures: NodeGroupFigures | None = None
        self.merged: GrowthFigures | None = None
        self.published: dict[str, float] = {}


class GrowthKeeper:
    """The history of every node shown, and each node's figures. Not thread-safe."""

    def __init__(self, config: GrowthConfig) -> None:
        self.config = config
        self.history = MemoryHistory(config.settings)
        self.kill_line = config.kill_line
        self._watched: dict[str, _Watched] = {}

    def observe(
        self,
        node: str,
        used: float | None,
        total: float | None,
        at: float | None,
        carried: NodeGroupFigures | None,
    ) -> GrowthFigures:
        """Record ``node``'s sample at ``at`` if it is new, and return its figures.

        ``at`` None means the node has no sample (the figures then come from its history,
        without a kill line); ``carried`` is what its sampler published, if anything. The
        growth a sampler published stands in for groups this history has no figure for
        yet: a sampler keeps history from its start, so a process that has just begun
        watching still shows each group's growth.
        """
        watched = self._watched.get(node)
        if watched is None:
            watched = self._watched[node] = _Watched()
        if used is not None and at is not None and at > watched.recorded_at:
            if carried is None:
                watched.stamp = None
                self.history.record_node(node, at, used)
                watched.recorded_at = at
            elif carried.sampled_at != watched.stamp:
                # A reading scraped again is no new sample: counting it twice would weigh
                # stale figures as fresh ones in the fit.
                watched.stamp = carried.sampled_at
                # Rows hold (group, rss, pss, processes, growth).
                groups = {row[0]: row[1] for row in carried.rows}
                self.history.record_node(node, at, used, groups=groups)
                watched.recorded_at = at
        figures = watched.built
        every = self.history.settings.fit_interval_s
        if figures is None or at is None or not at - watched.built_at < every:
            limit = self.kill_line.limit(total) if at is not None else None
            figures = _figures(self.history.node(node), limit)
            if at is not None:
                watched.built, watched.built_at = figures, at
        if carried is None:
            return figures
        if (
            watched.merged is not None
            and watched.merged_figures is carried
            and watched.merged_from is figures
        ):
            return watched.merged
        return _merged_with(watched, figures, carried)

    def retain(self, nodes: Container[str]) -> None:
        """Forget every node not in ``nodes``, history included."""
        for gone in [node for node in self._watched if node not in nodes]:
            del self._watched[gone]
            self.history.forget(gone)

    def forget_all(self) -> None:
        self.retain(())


def _figures(growth: NodeGrowth | None, limit: float | None) -> GrowthFigures:
    if growth is None:
        return NO_FIGURES if limit is None else NO_FIGURES._replace(limit=limit)
    return GrowthFigures(
        growth.used,
        growth.growth,
        growth.growing,
        limit,
        growth.time_to_limit(limit),
        growth.fastest_group,
        tuple(
            (name, part.growth) for name, part in growth.groups.items() if part.growth is not None
        ),
    )


def _merged_with(
    watched: _Watched, figures: GrowthFigures, carried: NodeGroupFigures
) -> GrowthFigures:
    """``figures`` with the growth ``carried`` publishes for groups it has none for; the last
    merge again when it adds the same growth to the same figures."""
    known = {name for name, _rate in figures.group_growth}
    # Rows hold (group, rss, pss, processes, growth).
    published = {
        row[0]: row[4] for row in carried.rows if row[4] is not None and row[0] not in known
    }
    previous = watched.merged
    if previous is not None and watched.merged_from is figures and published == watched.published:
        merged = previous
    elif not published:
        merged = figures
    else:
        rates = (*figures.group_growth, *published.items())
        fastest = figures.fastest_group or max(rates, key=lambda pair: pair[1])[0]
        merged = figures._replace(group_growth=rates, fastest_group=fastest)
    watched.merged_from, watched.merged_figures, watched.merged = figures, carried, merged
    watched.published = published
    return merged
