"""Where memory is going: growth per node and per worker group, the kill line, the time to it.

:class:`GrowthCycle` is a host-memory monitor cycle hook. After every cycle it records
each node's used memory and each worker group's RSS there (the figures the node's
sampler published, read back from the same scrape) into a bounded
:class:`~raylens.telemetry.history.MemoryHistory`, and publishes what the history makes
of them into a :class:`GrowthSnapshot` that the gauges and the tables read:

- ``rl.host.memory.growth`` and ``rl.worker_group.memory.growth`` (``By/s``): a robust
  slope over the growth window, absent until the window holds enough samples;
- ``rl.host.memory.limit`` (``By``): the node's kill line, its total (Ray's
  container-aware figure) times Ray's memory-monitor threshold;
- ``rl.host.memory.time_to_limit`` (``s``): only while the node is growing.

The history lives in the process that runs the monitor (the driver, or ``raylens
watch``); nothing is asked of the nodes beyond the scrape already made. Gauges are
declared by :func:`register_growth_gauges`, never at import.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from opentelemetry.metrics import CallbackOptions, Observation

from raylens.lens import OBSERVABLE_GAUGE, RecordedMetric, register_observable_gauge
from raylens.telemetry.history import (
    GrowthSettings,
    KillLineConfig,
    MemoryHistory,
    NodeGrowth,
    resolve_kill_line_config,
)
from raylens.telemetry.host_memory import (
    DEFAULT_REGISTRY,
    NO_WORKER_GROUPS,
    TOTAL_KEY,
    USED_KEY,
    NodeSample,
    RecordSource,
)
from raylens.telemetry.names import HOST_NAME_ATTR, RAY_NODE_ID_ATTR, RL_WORKER_GROUPS_ATTR
from raylens.telemetry.raylet_payload import NodeGroupFigures

__all__ = [
    "RL_HOST_MEMORY_GROWTH_METRIC",
    "RL_HOST_MEMORY_LIMIT_METRIC",
    "RL_HOST_MEMORY_TIME_TO_LIMIT_METRIC",
    "RL_WORKER_GROUP_MEMORY_GROWTH_METRIC",
    "FigureSource",
    "GrowthCycle",
    "GrowthMonitor",
    "GrowthSnapshot",
    "NodeOutlook",
    "attach_growth",
    "register_growth_gauges",
]

RL_HOST_MEMORY_GROWTH_METRIC = "rl.host.memory.growth"
RL_WORKER_GROUP_MEMORY_GROWTH_METRIC = "rl.worker_group.memory.growth"
RL_HOST_MEMORY_LIMIT_METRIC = "rl.host.memory.limit"
RL_HOST_MEMORY_TIME_TO_LIMIT_METRIC = "rl.host.memory.time_to_limit"
RL_WORKER_GROUP_ATTR = "rl.worker_group"

_METRICS = (
    RecordedMetric(
        RL_HOST_MEMORY_GROWTH_METRIC,
        OBSERVABLE_GAUGE,
        "By/s",
        "Growth of the node's used memory: a robust slope over the growth window",
    ),
    RecordedMetric(
        RL_WORKER_GROUP_MEMORY_GROWTH_METRIC,
        OBSERVABLE_GAUGE,
        "By/s",
        "Growth of a worker group's RSS on the node: a robust slope over the growth window",
    ),
    RecordedMetric(
        RL_HOST_MEMORY_LIMIT_METRIC,
        OBSERVABLE_GAUGE,
        "By",
        "The node's kill line: its total memory times Ray's memory-monitor threshold",
    ),
    RecordedMetric(
        RL_HOST_MEMORY_TIME_TO_LIMIT_METRIC,
        OBSERVABLE_GAUGE,
        "s",
        "Seconds until the node reaches its kill line at the current growth, while growing",
    ),
)


@dataclass(frozen=True)
class NodeOutlook:
    """One node's growth, its groups' growth, its kill line and the time left to it."""

    node_id: str
    host: str
    worker_groups: str
    used: float | None
    growth: float | None
    growing: bool
    limit: float | None
    time_to_limit: float | None
    fastest_group: str | None
    group_growth: dict[str, float] = field(default_factory=dict)


class GrowthSnapshot:
    """The latest outlook of every live node; what the gauges and the tables read."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nodes: dict[str, NodeOutlook] = {}

    def publish(self, outlooks: Iterable[NodeOutlook]) -> None:
        self._publish_by_node({outlook.node_id: outlook for outlook in outlooks})

    def _publish_by_node(self, nodes: dict[str, NodeOutlook]) -> None:
        """Publish ``{node id: outlook}`` as it is; the caller hands it over and keeps no hold."""
        with self._lock:
            self._nodes = nodes

    def latest(self) -> dict[str, NodeOutlook]:
        with self._lock:
            return dict(self._nodes)

    def clear(self) -> None:
        self.publish(())

    def _node_attributes(self, outlook: NodeOutlook) -> dict[str, str]:
        return {
            HOST_NAME_ATTR: outlook.host,
            RL_WORKER_GROUPS_ATTR: outlook.worker_groups,
            RAY_NODE_ID_ATTR: outlook.node_id,
        }

    def _node_points(self, figure: Callable[[NodeOutlook], float | None]) -> list[Observation]:
        """One point per node whose ``figure`` is known, with the node's attributes."""
        points = []
        for outlook in self.latest().values():
            value = figure(outlook)
            if value is not None:
                points.append(Observation(value, self._node_attributes(outlook)))
        return points

    def observe_growth(self, _options: CallbackOptions | None = None) -> list[Observation]:
        return self._node_points(lambda o: o.growth)

    def observe_group_growth(self, _options: CallbackOptions | None = None) -> list[Observation]:
        return [
            Observation(
                rate,
                {RL_WORKER_GROUP_ATTR: group, RAY_NODE_ID_ATTR: o.node_id, HOST_NAME_ATTR: o.host},
            )
            for o in self.latest().values()
            for group, rate in sorted(o.group_growth.items())
        ]

    def observe_limit(self, _options: CallbackOptions | None = None) -> list[Observation]:
        return self._node_points(lambda o: o.limit)

    def observe_time_to_limit(self, _options: CallbackOptions | None = None) -> list[Observation]:
        return self._node_points(lambda o: o.time_to_limit)


def register_growth_gauges(snapshot: GrowthSnapshot) -> None:
    """Declare the four growth gauges, read from ``snapshot``."""
    callbacks = (
        snapshot.observe_growth,
        snapshot.observe_group_growth,
        snapshot.observe_limit,
        snapshot.observe_time_to_limit,
    )
    for metric, callback in zip(_METRICS, callbacks):
        register_observable_gauge(metric, callback)


class FigureSource(Protocol):
    """What a growth cycle reads of a monitor: its latest samples and the group figures."""

    def latest(self) -> list[NodeSample]: ...

    def group_figures(self) -> dict[str, tuple[str, NodeGroupFigures, float]]: ...


class GrowthMonitor(FigureSource, Protocol):
    """A monitor a growth cycle can be attached to."""

    def add_cycle_hook(
        self, hook: Callable[[Any], None], *, on_stop: Callable[[], None] | None = None
    ) -> None: ...


class _Watched:
    """What a growth cycle keeps of one node between cycles: one object per node, changed in place.

    ``recorded_at`` is the sample time last recorded, ``stamp`` the sampler's reading it
    carried (None without groups); ``built`` the outlook last built from the history, at
    sample time ``built_at``; ``merged`` what merging the outlook ``merged_from`` with the
    figures ``merged_figures`` gave, and ``published`` the growth those figures added to it.
    Besides floats and a dict of them (which the garbage collector does not track), it
    refers only to what exists anyway (the monitor's figures, the published outlooks), and
    is changed in place: a cycle leaves no new tracked object per node.
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
        self.built: NodeOutlook | None = None
        self.built_at = -math.inf
        self.merged_from: NodeOutlook | None = None
        self.merged_figures: NodeGroupFigures | None = None
        self.merged: NodeOutlook | None = None
        self.published: dict[str, float] = {}


class GrowthCycle:
    """A monitor cycle hook: record the cycle's figures, then publish every node's outlook.

    ``settings`` default to the environment (``RAYLENS_GROWTH_WINDOW``); ``kill_line``
    to :func:`~raylens.telemetry.history.resolve_kill_line_config` over the environment.
    A node's figures are recorded once per new sample, at the time it was read (the
    monitor's clock); a node that left the cluster is forgotten.
    """

    def __init__(
        self,
        *,
        settings: GrowthSettings | None = None,
        kill_line: KillLineConfig | None = None,
        snapshot: GrowthSnapshot | None = None,
    ) -> None:
        self.history = MemoryHistory(settings or GrowthSettings.from_env())
        self.kill_line = kill_line or resolve_kill_line_config()
        self.snapshot = snapshot if snapshot is not None else GrowthSnapshot()
        #: Per node seen in the last cycle: what is kept of it between cycles.
        self._watched: dict[str, _Watched] = {}
        self._lock = threading.Lock()

    def __call__(self, monitor: FigureSource) -> None:
        with self._lock:
            outlooks: dict[str, NodeOutlook] = {}
            every = self.history.settings.fit_interval_s
            if isinstance(monitor, RecordSource):
                # The records themselves: what latest() and group_figures() would copy out.
                monitor.declare_consumer()
                _version, labels = DEFAULT_REGISTRY.labels_by_node()
                for record in monitor.records().values():
                    node, values, at = record.node, record.values, record.sampled_at
                    node_id = node.node_id
                    outlooks[node_id] = self._observe(
                        node_id,
                        node.host,
                        labels.get(node_id, NO_WORKER_GROUPS),
                        values.get(USED_KEY) if values else None,
                        values.get(TOTAL_KEY) if values else None,
                        at,
                        record.groups if at is not None else None,
                        every,
                    )
            else:
                figures = monitor.group_figures()
                for sample in monitor.latest():
                    carried = figures.get(sample.node_id)
                    outlooks[sample.node_id] = self._observe(
                        sample.node_id,
                        sample.host,
                        sample.worker_groups,
                        sample.used,
                        sample.total,
                        sample.sampled_at,
                        None if carried is None else carried[1],
                        every,
                    )
            watched = self._watched
            if len(watched) != len(outlooks):  # every node observed is watched
                for gone in [node for node in watched if node not in outlooks]:
                    del watched[gone]
                    self.history.forget(gone)
            self.snapshot._publish_by_node(outlooks)

    def _observe(
        self,
        node: str,
        host: str,
        worker_groups: str,
        used: float | None,
        total: float | None,
        at: float | None,
        carried: NodeGroupFigures | None,
        every: float,
    ) -> NodeOutlook:
        """Record one node's sample if it is new, and return the node's outlook.

        A node whose groups a sampler reports is recorded once per reading of the
        sampler, not once per scrape: the same reading scraped again is no new sample,
        and counting it again would weigh stale figures as fresh ones in the fit.

        Fits run every ``every`` seconds of a series' own time (a tenth of a window), so
        between two of them the figures cannot change: the outlook is built again at most
        that often, and merged with the sampler's figures once per reading, which keeps a
        cycle's cost per node to recording its samples.
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
                watched.stamp = carried.sampled_at
                # Rows hold (group, rss, pss, processes, growth).
                groups = {row[0]: row[1] for row in carried.rows}
                self.history.record_node(node, at, used, groups=groups)
                watched.recorded_at = at
        outlook = watched.built
        if (
            outlook is None
            or at is None
            or not at - watched.built_at < every
            or outlook.worker_groups != worker_groups
        ):
            limit = self.kill_line.limit(total)
            outlook = _outlook(node, host, worker_groups, self.history.node(node), limit)
            if at is not None:
                watched.built, watched.built_at = outlook, at
        if carried is None:
            return outlook
        merged = watched.merged
        if (
            merged is not None
            and watched.merged_figures is carried
            and watched.merged_from is outlook
        ):
            return merged
        return self._merged_with(watched, outlook, carried)

    @staticmethod
    def _merged_with(
        watched: _Watched, outlook: NodeOutlook, figures: NodeGroupFigures
    ) -> NodeOutlook:
        """``outlook`` with the growth ``figures`` published; the last merge again when it
        adds the same growth to the same outlook (so a new reading builds no new outlook)."""
        published = _published_growth(outlook, figures)
        previous = watched.merged
        if (
            previous is not None
            and watched.merged_from is outlook
            and published == watched.published
        ):
            merged = previous
        else:
            merged = _with_published_growth(outlook, published)
        watched.merged_from, watched.merged_figures, watched.merged = outlook, figures, merged
        watched.published = published
        return merged

    def close(self) -> None:
        """Forget every node's history (the monitor stopped)."""
        with self._lock:
            for node in list(self._watched):
                self.history.forget(node)
            self._watched.clear()
            self.snapshot.clear()


def _published_growth(outlook: NodeOutlook, figures: NodeGroupFigures) -> dict[str, float]:
    """The growth ``figures`` publish for groups ``outlook`` has no figure for."""
    known = outlook.group_growth
    # Rows hold (group, rss, pss, processes, growth).
    return {row[0]: row[4] for row in figures.rows if row[4] is not None and row[0] not in known}


def _with_published_growth(outlook: NodeOutlook, published: dict[str, float]) -> NodeOutlook:
    """Fill in, for groups this history has no figure for yet, the growth their sampler published.

    A sampler keeps its node's history from the moment it starts, so a process that
    has just begun watching (``raylens watch --once``) still shows each group's growth.
    ``published`` is :func:`_published_growth` of the sampler's figures.
    """
    if not published:
        return outlook
    merged = {**outlook.group_growth, **published}
    fastest = outlook.fastest_group or max(merged, key=lambda group: merged[group])
    return dataclasses.replace(outlook, group_growth=merged, fastest_group=fastest)


def _outlook(
    node_id: str, host: str, worker_groups: str, growth: NodeGrowth | None, limit: float | None
) -> NodeOutlook:
    if growth is None:
        return NodeOutlook(node_id, host, worker_groups, None, None, False, limit, None, None)
    return NodeOutlook(
        node_id=node_id,
        host=host,
        worker_groups=worker_groups,
        used=growth.used,
        growth=growth.growth,
        growing=growth.growing,
        limit=limit,
        time_to_limit=growth.time_to_limit(limit),
        fastest_group=growth.fastest_group,
        group_growth={
            name: part.growth for name, part in growth.groups.items() if part.growth is not None
        },
    )


def attach_growth(monitor: GrowthMonitor, cycle: GrowthCycle | None = None) -> GrowthCycle:
    """Declare the growth gauges and run ``cycle`` (default a new one) after every cycle."""
    cycle = cycle if cycle is not None else GrowthCycle()
    register_growth_gauges(cycle.snapshot)
    monitor.add_cycle_hook(cycle, on_stop=cycle.close)
    return cycle
