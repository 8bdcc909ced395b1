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

The history is kept where the monitor parses its scrapes: in its scrape helper process
when it has one (the default), so recording and fitting cost the driver (or ``raylens
watch``) nothing but naming the figures the helper sends when they change; in the
monitor's own process otherwise. Nothing is asked of the nodes beyond the scrape already
made. Gauges are declared by :func:`register_growth_gauges`, never at import.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from opentelemetry.metrics import CallbackOptions, Observation

from raylens.lens import OBSERVABLE_GAUGE, RecordedMetric, register_observable_gauge
from raylens.telemetry.history import (
    NO_FIGURES,
    GrowthConfig,
    GrowthFigures,
    GrowthKeeper,
    GrowthSettings,
    KillLineConfig,
    MemoryHistory,
    RecentHistory,
    recent_history,
    resolve_kill_line_config,
    without_limit,
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
    "GrowthElsewhere",
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


@runtime_checkable
class GrowthElsewhere(Protocol):
    """A monitor that can have its growth kept where it scrapes (its scrape helper).

    :meth:`keep_growth` hands it the keeper's settings (None: stop); :meth:`kept_growth`
    is every node's figures as last received, by ``(node id, host)`` (a cycle behind its
    samples: the helper records a batch after answering it), or None while the growth is
    not kept there (this process must then keep it); :meth:`recent_history` reads a
    node's history where it is kept.
    """

    def keep_growth(self, config: GrowthConfig | None) -> None: ...

    def kept_growth(self) -> Mapping[Hashable, GrowthFigures] | None: ...

    def recent_history(self, node_id: str, at: float) -> RecentHistory | None: ...


class GrowthCycle:
    """A monitor cycle hook: every node's growth figures, published as outlooks.

    ``settings`` default to the environment (``RAYLENS_GROWTH_WINDOW``); ``kill_line``
    to :func:`~raylens.telemetry.history.resolve_kill_line_config` over the environment.
    A node's figures are recorded once per new sample, at the time it was read (the
    monitor's clock); a node that left the cluster is forgotten. Where the monitor scrapes
    in a helper process (:class:`GrowthElsewhere`), the helper keeps the history and this
    only names its figures; otherwise :attr:`keeper` keeps it here.
    """

    def __init__(
        self,
        *,
        settings: GrowthSettings | None = None,
        kill_line: KillLineConfig | None = None,
        snapshot: GrowthSnapshot | None = None,
    ) -> None:
        self.keeper = GrowthKeeper(
            GrowthConfig(
                settings or GrowthSettings.from_env(), kill_line or resolve_kill_line_config()
            )
        )
        self.snapshot = snapshot if snapshot is not None else GrowthSnapshot()
        #: Per node: the outlook last published, and the figures and names it was made of.
        self._named: dict[str, _Named] = {}
        #: The monitor keeping the history, while one does.
        self._elsewhere: GrowthElsewhere | None = None
        self._lock = threading.Lock()

    @property
    def history(self) -> MemoryHistory:
        """The history this process keeps (empty while the monitor's helper keeps it)."""
        return self.keeper.history

    @property
    def kill_line(self) -> KillLineConfig:
        return self.keeper.kill_line

    def attach_to(self, monitor: object) -> None:
        """Have ``monitor`` keep the growth where it scrapes, if it can (and is read through
        its records, the only way this cycle names figures kept elsewhere)."""
        if isinstance(monitor, GrowthElsewhere) and isinstance(monitor, RecordSource):
            monitor.keep_growth(self.keeper.config)

    def __call__(self, monitor: FigureSource) -> None:
        with self._lock:
            outlooks: dict[str, NodeOutlook] = {}
            # Only a monitor read through its records can name figures kept elsewhere.
            elsewhere = (
                monitor
                if isinstance(monitor, GrowthElsewhere) and isinstance(monitor, RecordSource)
                else None
            )
            kept = None if elsewhere is None else elsewhere.kept_growth()
            self._elsewhere = elsewhere if kept is not None else None
            if kept is not None:
                self.keeper.forget_all()  # the helper keeps it; nothing is recorded here
            if kept is not None and elsewhere is not None:
                elsewhere.declare_consumer()
                _version, labels = DEFAULT_REGISTRY.labels_by_node()
                for key, record in elsewhere.records().items():
                    node = record.node
                    figures = kept.get(key, NO_FIGURES)
                    if record.sampled_at is None:
                        figures = without_limit(figures)
                    outlooks[node.node_id] = self._named_outlook(
                        node.node_id, node.host, labels.get(node.node_id, NO_WORKER_GROUPS), figures
                    )
            elif isinstance(monitor, RecordSource):
                # The records themselves: what latest() and group_figures() would copy out.
                monitor.declare_consumer()
                _version, labels = DEFAULT_REGISTRY.labels_by_node()
                observe = self.keeper.observe
                for record in monitor.records().values():
                    node, values, at = record.node, record.values, record.sampled_at
                    node_id = node.node_id
                    figures = observe(
                        node_id,
                        values.get(USED_KEY) if values else None,
                        values.get(TOTAL_KEY) if values else None,
                        at,
                        record.groups if at is not None else None,
                    )
                    outlooks[node_id] = self._named_outlook(
                        node_id, node.host, labels.get(node_id, NO_WORKER_GROUPS), figures
                    )
            else:
                carried_by_node = monitor.group_figures()
                for sample in monitor.latest():
                    carried = carried_by_node.get(sample.node_id)
                    figures = self.keeper.observe(
                        sample.node_id,
                        sample.used,
                        sample.total,
                        sample.sampled_at,
                        None if carried is None else carried[1],
                    )
                    outlooks[sample.node_id] = self._named_outlook(
                        sample.node_id, sample.host, sample.worker_groups, figures
                    )
            if len(self._named) != len(outlooks):  # every node published is named
                self._named = {node: self._named[node] for node in outlooks if node in self._named}
                self.keeper.retain(outlooks)
            self.snapshot._publish_by_node(outlooks)

    def _named_outlook(
        self, node_id: str, host: str, worker_groups: str, figures: GrowthFigures
    ) -> NodeOutlook:
        """``figures`` as ``node_id``'s outlook; the one last published while nothing changed."""
        named = self._named.get(node_id)
        if named is None:
            named = self._named[node_id] = _Named()
        elif (
            named.outlook is not None
            and named.figures is figures
            and named.host == host
            and named.worker_groups == worker_groups
        ):
            return named.outlook
        outlook = NodeOutlook(
            node_id,
            host,
            worker_groups,
            figures.used,
            figures.growth,
            figures.growing,
            figures.limit,
            figures.time_to_limit,
            figures.fastest_group,
            dict(figures.group_growth),
        )
        named.figures, named.host, named.worker_groups = figures, host, worker_groups
        named.outlook = outlook
        return outlook

    def recent_history(self, node_id: str, at: float) -> RecentHistory | None:
        """``node_id``'s memory up to ``at``, read where its history is kept."""
        elsewhere = self._elsewhere
        if elsewhere is not None:
            return elsewhere.recent_history(node_id, at)
        with self._lock:
            return recent_history(self.keeper.history, node_id, at)

    def close(self) -> None:
        """Forget every node's history (the monitor stopped)."""
        with self._lock:
            self.keeper.forget_all()
            self._named.clear()
            self._elsewhere = None
            self.snapshot.clear()


class _Named:
    """A node's outlook as last published, and what it was made of; changed in place, so a
    new outlook leaves no other object behind."""

    __slots__ = ("figures", "host", "outlook", "worker_groups")

    def __init__(self) -> None:
        self.figures: GrowthFigures | None = None
        self.host = self.worker_groups = ""
        self.outlook: NodeOutlook | None = None


def attach_growth(monitor: GrowthMonitor, cycle: GrowthCycle | None = None) -> GrowthCycle:
    """Declare the growth gauges and run ``cycle`` (default a new one) after every cycle."""
    cycle = cycle if cycle is not None else GrowthCycle()
    register_growth_gauges(cycle.snapshot)
    cycle.attach_to(monitor)
    monitor.add_cycle_hook(cycle, on_stop=cycle.close)
    return cycle
