"""Where memory is going: growth per node and per worker group, the kill line, the time to it.

Each node's sampler computes these figures on its node, from its own history, and
publishes them through Ray's metrics (see :mod:`raylens.telemetry.raylet_payload`); the
host-memory scrape reads them back with the node's memory. :class:`GrowthCycle`, a monitor
cycle hook, only names what the nodes published, per node, into a :class:`GrowthSnapshot`
that the gauges and the tables read:

- ``rl.host.memory.growth`` and ``rl.worker_group.memory.growth`` (``By/s``): the
  sampler's growth over its window, absent until the window holds enough readings;
- ``rl.host.memory.limit`` (``By``): the node's kill line, min(host, container) total
  times Ray's memory-monitor threshold, as the sampler draws it (from the scraped total
  and this process's kill-line settings on a node without a sampler);
- ``rl.host.memory.time_to_limit`` (``s``): only while the node is growing.

No history is kept here, so every process that scrapes the nodes (the driver, ``raylens
watch`` anywhere, a Prometheus) sees the same figures at once. A node without them has a
one-line reason (:attr:`NodeOutlook.unavailable`). Gauges are declared by
:func:`register_growth_gauges`, never at import.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from opentelemetry.metrics import CallbackOptions, Observation

from raylens.lens import OBSERVABLE_GAUGE, RecordedMetric, register_observable_gauge
from raylens.telemetry.growth import (
    GrowthSettings,
    KillLineConfig,
    RecentHistory,
    resolve_kill_line_config,
)
from raylens.telemetry.host_memory import (
    DEFAULT_REGISTRY,
    NO_WORKER_GROUPS,
    NodeSample,
    RecordSource,
)
from raylens.telemetry.names import HOST_NAME_ATTR, RAY_NODE_ID_ATTR, RL_WORKER_GROUPS_ATTR
from raylens.telemetry.raylet_payload import TOTAL_KEY, USED_KEY, NodeFigures, NodeGroupFigures

__all__ = [
    "NO_SAMPLER",
    "NO_SCRAPE",
    "OLD_SAMPLER",
    "OUT_OF_BOUNDS",
    "RL_HOST_MEMORY_GROWTH_METRIC",
    "RL_HOST_MEMORY_LIMIT_METRIC",
    "RL_HOST_MEMORY_TIME_TO_LIMIT_METRIC",
    "RL_WORKER_GROUP_MEMORY_GROWTH_METRIC",
    "STALE_SAMPLER",
    "FigureSource",
    "GrowthCycle",
    "GrowthMonitor",
    "GrowthSnapshot",
    "NodeHistorySource",
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
    #: Why the node has no growth figures, in one line; None when it has them.
    unavailable: str | None = None


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

    def unavailable(self) -> dict[str, str]:
        """``{node id: why}`` of every node without growth figures."""
        return {
            node: outlook.unavailable
            for node, outlook in self.latest().items()
            if outlook.unavailable is not None
        }

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


#: Why a node shows no growth: no sampler publishes on it (none was started: only a
#: monitor with per-group memory on, in a driver, starts them).
NO_SAMPLER = (
    "no raylens sampler publishes there (a driver monitoring with init_telemetry_driver "
    "starts one on every node)"
)
#: ... its sampler is from a raylens that computes no growth on the node.
OLD_SAMPLER = "its sampler publishes no node growth (a raylens older than this one)"
#: ... its latest scrape failed, so nothing it published is fresh.
NO_SCRAPE = "no fresh scrape of this node"
#: ... what its sampler published cannot be this node's (more used than the node has).
OUT_OF_BOUNDS = "its sampler's figures are out of the node's physical bounds, so they are ignored"
#: ... its sampler's stamp has stood still (its publishing is stuck, or it is gone): the
#: figures it last published are not believed; formatted with their age in seconds.
STALE_SAMPLER = "its sampler has published nothing for {age:.0f} s, so its figures are stale"
#: How far above the node's scraped total a sampler's figures may read (the two are read at
#: different moments, and the sampler's total is the machine's where Ray's is a container's).
_BOUNDS_SLACK = 1.05


def _window_not_full(window_s: float) -> str:
    return f"its sampler's {window_s:g} s growth window is not full yet"


class FigureSource(Protocol):
    """What a growth cycle reads of a monitor: its latest samples and the group figures."""

    def latest(self) -> list[NodeSample]: ...

    def group_figures(self) -> dict[str, tuple[str, NodeGroupFigures, float]]: ...


class GrowthMonitor(FigureSource, Protocol):
    """A monitor a growth cycle can be attached to."""

    def add_cycle_hook(
        self, hook: Callable[[Any], None], *, on_stop: Callable[[], None] | None = None
    ) -> None: ...


#: ``(node id, Unix time) -> recent history`` read from the node's sampler, or None.
NodeHistorySource = Callable[[str, float], "RecentHistory | None"]


class GrowthCycle:
    """A monitor cycle hook: every node's growth figures, as its sampler published them.

    ``kill_line`` (default :func:`~raylens.telemetry.growth.resolve_kill_line_config`
    over the environment) draws the line of a node without a sampler, and a post-mortem's;
    ``settings`` are accepted for the window a driver asked its samplers for.
    ``node_history`` reads a node's recent memory from its sampler, for post-mortems
    (the driver wires it to its samplers; without it there is none); ``wall_of`` places a
    moment of the monitor's clock on the wall clock the samplers are asked in (default:
    by the distance between :func:`time.time` and :func:`time.monotonic` now).
    """

    def __init__(
        self,
        *,
        settings: GrowthSettings | None = None,
        kill_line: KillLineConfig | None = None,
        snapshot: GrowthSnapshot | None = None,
        node_history: NodeHistorySource | None = None,
        wall_of: Callable[[float], float] | None = None,
    ) -> None:
        self.settings = settings
        self.wall_of = wall_of or _wall_of
        self.kill_line = kill_line or resolve_kill_line_config()
        self.snapshot = snapshot if snapshot is not None else GrowthSnapshot()
        self.node_history = node_history
        #: Per node: the outlook last published, and what it was made of.
        self._named: dict[str, _Named] = {}
        self._lock = threading.Lock()

    def __call__(self, monitor: FigureSource) -> None:
        with self._lock:
            outlooks: dict[str, NodeOutlook] = {}
            if isinstance(monitor, RecordSource):
                # The records themselves: what latest() and group_figures() would copy out.
                monitor.declare_consumer()
                _version, labels = DEFAULT_REGISTRY.labels_by_node()
                for record in monitor.records().values():
                    node, values = record.node, record.values
                    fresh = record.sampled_at is not None
                    outlooks[node.node_id] = self._outlook(
                        node.node_id,
                        node.host,
                        labels.get(node.node_id, NO_WORKER_GROUPS),
                        record.groups if fresh else None,
                        values.get(USED_KEY) if values and fresh else None,
                        values.get(TOTAL_KEY) if values and fresh else None,
                        fresh,
                    )
            else:
                carried_by_node = monitor.group_figures()
                for sample in monitor.latest():
                    carried = carried_by_node.get(sample.node_id)
                    fresh = sample.sampled_at is not None
                    outlooks[sample.node_id] = self._outlook(
                        sample.node_id,
                        sample.host,
                        sample.worker_groups,
                        None if carried is None or not fresh else carried[1],
                        sample.used,
                        sample.total,
                        fresh,
                    )
            if len(self._named) != len(outlooks):  # only nodes published are kept
                self._named = {node: self._named[node] for node in outlooks if node in self._named}
            self.snapshot._publish_by_node(outlooks)

    def _outlook(
        self,
        node_id: str,
        host: str,
        worker_groups: str,
        figures: NodeGroupFigures | None,
        used: float | None,
        total: float | None,
        fresh: bool,
    ) -> NodeOutlook:
        """The node's outlook; the one last published while nothing it is made of changed."""
        named = self._named.get(node_id)
        if named is None:
            named = self._named[node_id] = _Named()
        elif (
            named.outlook is not None
            and named.figures is figures
            and named.host == host
            and named.worker_groups == worker_groups
            and (figures is not None or (named.used == used and named.total == total))
        ):
            return named.outlook
        outlook = _outlook_of(
            node_id, host, worker_groups, figures, used, total, fresh, self.kill_line
        )
        named.figures, named.host, named.worker_groups = figures, host, worker_groups
        named.used, named.total, named.outlook = used, total, outlook
        return outlook

    def recent_history(self, node_id: str, at: float) -> RecentHistory | None:
        """``node_id``'s memory up to ``at`` (this process's monotonic clock), from its sampler."""
        source = self.node_history
        if source is None:
            return None
        return source(node_id, self.wall_of(at))

    def close(self) -> None:
        """Forget every node's outlook (the monitor stopped)."""
        with self._lock:
            self._named.clear()
            self.snapshot.clear()


def _wall_of(at: float) -> float:
    return time.time() - (time.monotonic() - at)


def _outlook_of(
    node_id: str,
    host: str,
    worker_groups: str,
    figures: NodeGroupFigures | None,
    used: float | None,
    total: float | None,
    fresh: bool,
    kill_line: KillLineConfig,
) -> NodeOutlook:
    node = None if figures is None else figures.node
    # Rows hold (group, rss, pss, processes, growth, pss age).
    rates = {} if figures is None else {r[0]: r[4] for r in figures.rows if r[4] is not None}
    if node is not None and node.stale_for is None and _within_bounds(node, total):
        return NodeOutlook(
            node_id,
            host,
            worker_groups,
            node.used if node.used is not None else used,
            node.growth,
            node.growing,
            node.limit if node.limit is not None else kill_line.limit(total),
            node.time_to_limit if node.growing else None,
            max(rates, key=rates.__getitem__) if rates else None,
            rates,
            None if node.growth is not None else _window_not_full(node.window_s),
        )
    if not fresh:
        reason = NO_SCRAPE
    elif figures is None:
        reason = NO_SAMPLER
    elif node is None:
        reason = OLD_SAMPLER
    elif node.stale_for is not None:
        reason, rates = STALE_SAMPLER.format(age=node.stale_for), {}
    else:
        reason, rates = OUT_OF_BOUNDS, {}
    fastest = max(rates, key=rates.__getitem__) if rates else None
    limit = kill_line.limit(total) if fresh else None
    return NodeOutlook(
        node_id, host, worker_groups, used, None, False, limit, None, fastest, rates, reason
    )


def _within_bounds(node: NodeFigures, total: float | None) -> bool:
    """Whether a sampler's figures fit the node: nothing used or drawn above its total."""
    if total is None:
        return True
    bound = total * _BOUNDS_SLACK
    return all(value is None or value <= bound for value in (node.used, node.limit))


class _Named:
    """A node's outlook as last published, and what it was made of; changed in place, so a
    new outlook leaves no other object behind."""

    __slots__ = ("figures", "host", "outlook", "total", "used", "worker_groups")

    def __init__(self) -> None:
        self.figures: NodeGroupFigures | None = None
        self.host = self.worker_groups = ""
        self.used: float | None = None
        self.total: float | None = None
        self.outlook: NodeOutlook | None = None


def attach_growth(monitor: GrowthMonitor, cycle: GrowthCycle | None = None) -> GrowthCycle:
    """Declare the growth gauges and run ``cycle`` (default a new one) after every cycle."""
    cycle = cycle if cycle is not None else GrowthCycle()
    register_growth_gauges(cycle.snapshot)
    monitor.add_cycle_hook(cycle, on_stop=cycle.close)
    return cycle
