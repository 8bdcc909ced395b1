"""What a monitor publishes: one record per node per cycle, and the registry the gauges read.

Each :class:`~._monitor.HostMemoryMonitor` owns a :class:`Snapshot` and publishes into it,
once per cycle, one mapping of :class:`NodeRecord`: everything the cycle learnt about each
live node. The gauges read the records of every monitor registered here. A record's times
are readings of its monitor's clock, so ageing follows whatever clock the monitor was given.
A published mapping and its records are never changed afterwards.
"""

from __future__ import annotations

import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import FrozenInstanceError, dataclass, field
from typing import Any, NamedTuple, Protocol, TypeVar, runtime_checkable

from raylens import forking
from raylens.telemetry.host_memory._nodes import RayNode
from raylens.telemetry.names import HOST_NAME_ATTR, RAY_NODE_ID_ATTR, RL_WORKER_GROUPS_ATTR
from raylens.telemetry.raylet_payload import NodeGroupFigures, NodeOomCounts

__all__ = [
    "NodeRecord",
    "NodeSample",
    "RecordSource",
    "ScrapeHealth",
    "Snapshot",
    "forget_all_monitors",
    "fresh_health_records",
    "fresh_value_records",
    "hold_publisher",
    "node_attributes",
    "register_publisher",
    "release_publisher",
]

NodeKey = tuple[str, str]
_Item = TypeVar("_Item")


@dataclass(frozen=True)
class NodeSample:
    """What the monitor last learnt about one node, for tables and tools.

    ``used``, ``total`` and ``sampled_at`` (seconds on the monitor's clock)
    describe the node's last successful scrape, or are None if it never had one.
    ``error`` says why the latest cycle got no sample from it (None when it did);
    a node with an error is not exported, whatever its older figures say.
    ``worker_groups`` is the ``rl.worker_groups`` value when the sample was read out.
    """

    node_id: str
    host: str
    ip: str
    used: float | None
    total: float | None
    worker_groups: str
    sampled_at: float | None
    error: str | None = None
    metrics_url: str = ""

    def age(self, now: float | None = None) -> float | None:
        """Seconds since the last successful scrape, or None if there never was one.

        ``now`` defaults to ``time.monotonic()``; pass the monitor's clock reading
        when it was built with another clock.
        """
        if self.sampled_at is None:
            return None
        return (time.monotonic() if now is None else now) - self.sampled_at


class ScrapeHealth(NamedTuple):
    """How a node's latest scrape went, for the ``rl.host.scrape.*`` series.

    ``up`` is 1 or 0; ``error_type`` is one of ``SCRAPE_ERROR_TYPES`` when ``up``
    is 0, else None; ``duration`` is the request's seconds, None when no request
    was sent; ``observed_at`` and ``expires_at`` are readings of the monitor's clock.
    """

    up: int
    error_type: str | None
    duration: float | None
    observed_at: float
    expires_at: float


def node_attributes(node: RayNode, worker_groups: str) -> dict[str, str]:
    """The attributes every host-memory point of ``node`` carries (all already encodable)."""
    return {
        HOST_NAME_ATTR: node.host,
        RL_WORKER_GROUPS_ATTR: worker_groups,
        RAY_NODE_ID_ATTR: node.node_id,
    }


#: Where a record's fields sit in the tuple it is (see :class:`NodeRecord`).
_NODE, _VALUES, _SAMPLED_AT, _ERROR, _WORKER_GROUPS, _LABELS_VERSION, _ATTRIBUTES = range(7)
_GROUPS, _OOM, _EXPIRES_AT, _UP, _ERROR_TYPE, _DURATION, _OBSERVED_AT, _HEALTH_EXPIRES_AT = range(
    7, 15
)
#: A :class:`ScrapeHealth`'s fields, in its order: what a record holds of it.
HealthFields = tuple[int, str | None, float | None, float, float]
#: A record's health fields when it has no health entry.
_NO_HEALTH = (None, None, None, None, None)


class NodeRecord(tuple[Any, ...]):
    """Everything one cycle learnt about one live node.

    ``error`` is None when the node answered this cycle; then ``values`` (``{registry key:
    bytes}``), ``groups`` and ``oom`` are what that answer carried, read at ``sampled_at``,
    and the values are exported until ``expires_at``. A node that did not answer keeps its
    last good ``values`` and ``sampled_at`` for tables (never exported), and has no groups
    or counters. ``health`` is the ``rl.host.scrape.*`` entry (None for a node whose request
    was cut short by a stop). ``worker_groups`` is the node's label when the cycle published,
    from the placement registry at ``labels_version``, and ``attributes`` the attribute set
    built from it. Text in a record was cleaned where it entered raylens.

    Immutable (assigning a field raises :class:`dataclasses.FrozenInstanceError`). A monitor
    builds one per node per cycle, so a record is one flat tuple: built in one step, and the
    health entry, held as plain fields, is no object of its own for the garbage collector to
    walk while the record lives; :attr:`health` builds the :class:`ScrapeHealth` when asked.
    ``health`` is given as a :class:`ScrapeHealth` or as its five fields in a plain tuple.
    """

    __slots__ = ()

    @property
    def node(self) -> RayNode:
        value: RayNode = self[_NODE]
        return value

    @property
    def values(self) -> Mapping[str, float] | None:
        value: Mapping[str, float] | None = self[_VALUES]
        return value

    @property
    def sampled_at(self) -> float | None:
        value: float | None = self[_SAMPLED_AT]
        return value

    @property
    def error(self) -> str | None:
        value: str | None = self[_ERROR]
        return value

    @property
    def worker_groups(self) -> str:
        value: str = self[_WORKER_GROUPS]
        return value

    @property
    def labels_version(self) -> int:
        value: int = self[_LABELS_VERSION]
        return value

    @property
    def attributes(self) -> Mapping[str, str]:
        value: Mapping[str, str] = self[_ATTRIBUTES]
        return value

    @property
    def groups(self) -> NodeGroupFigures | None:
        value: NodeGroupFigures | None = self[_GROUPS]
        return value

    @property
    def oom(self) -> NodeOomCounts | None:
        value: NodeOomCounts | None = self[_OOM]
        return value

    @property
    def expires_at(self) -> float:
        value: float = self[_EXPIRES_AT]
        return value

    def __new__(
        cls,
        node: RayNode,
        values: Mapping[str, float] | None,
        sampled_at: float | None,
        error: str | None,
        health: HealthFields | None,
        worker_groups: str,
        labels_version: int,
        attributes: Mapping[str, str],
        groups: NodeGroupFigures | None = None,
        oom: NodeOomCounts | None = None,
        expires_at: float = float("-inf"),
    ) -> NodeRecord:
        return tuple.__new__(
            cls,
            (
                node,
                values,
                sampled_at,
                error,
                worker_groups,
                labels_version,
                attributes,
                groups,
                oom,
                expires_at,
                *(_NO_HEALTH if health is None else health),
            ),
        )

    @property
    def health(self) -> ScrapeHealth | None:
        """The node's ``rl.host.scrape.*`` entry, or None (a request cut short by a stop)."""
        if self[_UP] is None:
            return None
        return tuple.__new__(ScrapeHealth, self[_UP:])

    def __setattr__(self, name: str, value: object) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def __getnewargs__(self) -> tuple[Any, ...]:  # copy and pickle go through __new__
        return (*self[:_WORKER_GROUPS], self.health, *self[_WORKER_GROUPS:_UP])

    def __repr__(self) -> str:
        fields = ", ".join(
            f"{name}={getattr(self, name)!r}"
            for name in (
                "node",
                "values",
                "sampled_at",
                "error",
                "health",
                "worker_groups",
                "labels_version",
                "attributes",
                "groups",
                "oom",
                "expires_at",
            )
        )
        return f"NodeRecord({fields})"


@dataclass
class Snapshot:
    """The records of a monitor's latest cycle, ``{(node id, host): NodeRecord}``.

    ``records`` is replaced whole by :meth:`publish` and read by the gauges; never changed
    in place.
    """

    records: Mapping[NodeKey, NodeRecord] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def publish(self, records: Mapping[NodeKey, NodeRecord]) -> None:
        """Make ``records`` (not to be changed afterwards) the snapshot's whole content."""
        with self.lock:
            self.records = records

    def fresh_values(self, key: str, now: float) -> list[tuple[NodeRecord, float]]:
        """``(record, value)`` of every record with an unexpired sample of ``key``."""
        found = []
        for record in self.records.values():
            values = record.values
            if record.error is None and values and key in values and now <= record.expires_at:
                found.append((record, values[key]))
        return found

    def fresh_health(self, now: float) -> list[tuple[NodeRecord, ScrapeHealth]]:
        """Every record whose scrape health has not expired at ``now``, with that health."""
        return [
            (record, tuple.__new__(ScrapeHealth, record[_UP:]))
            for record in self.records.values()
            if record[_UP] is not None and now <= record[_HEALTH_EXPIRES_AT]
        ]

    def retain(self, live: set[NodeKey]) -> None:
        """Drop the records of nodes not in ``live`` (nodes that left)."""
        with self.lock:
            records = self.records
            if not live.issuperset(records):
                self.records = {key: r for key, r in records.items() if key in live}

    def clear(self) -> None:
        self.publish({})


@runtime_checkable
class RecordSource(Protocol):
    """A monitor whose latest cycle can be read as its records (the host-memory one).

    Cycle hooks read it this way when they can: each node then costs a look at its record,
    with no per-node copy built. ``declare_consumer`` marks the monitor as read, as
    ``latest()`` does.
    """

    def records(self) -> Mapping[NodeKey, NodeRecord]: ...

    def declare_consumer(self) -> None: ...


class Publisher(Protocol):
    """What the gauges need of a monitor: its snapshot, its clock, and a way to stop it."""

    snapshot: Snapshot
    clock: Callable[[], float]

    def stop(self) -> None: ...


#: Monitors whose snapshot the gauges read. Held weakly: a monitor nobody uses goes.
_PUBLISHERS: weakref.WeakSet[Publisher] = weakref.WeakSet()
#: Monitors in use (started, or collected once) and not stopped, held strongly, so that
#: ``HostMemoryMonitor(...).collect_once()`` exports although nobody keeps the monitor.
_IN_USE: set[Publisher] = set()
_PUBLISHERS_LOCK = threading.Lock()
forking.renew_lock_in_child(sys.modules[__name__], "_PUBLISHERS_LOCK")


def register_publisher(monitor: Publisher) -> None:
    """Have the gauges read ``monitor``'s snapshot (it needs ``snapshot`` and ``clock``)."""
    with _PUBLISHERS_LOCK:
        _PUBLISHERS.add(monitor)


def hold_publisher(monitor: Publisher) -> None:
    """Keep ``monitor`` alive, and its snapshot read, until :func:`release_publisher`."""
    with _PUBLISHERS_LOCK:
        _PUBLISHERS.add(monitor)
        _IN_USE.add(monitor)


def release_publisher(monitor: Publisher) -> None:
    """Stop keeping ``monitor`` alive; it goes once nobody else holds it."""
    with _PUBLISHERS_LOCK:
        _IN_USE.discard(monitor)


def _monitors() -> list[Publisher]:
    with _PUBLISHERS_LOCK:
        return list(_PUBLISHERS)


def _one_per_node(
    read: Callable[[Publisher], list[tuple[NodeRecord, _Item]]],
    stamp: Callable[[NodeRecord, _Item], float],
) -> list[tuple[NodeRecord, _Item]]:
    """What ``read`` finds in every monitor, one entry per node: the latest ``stamp`` wins."""
    monitors = _monitors()
    if len(monitors) == 1:
        return read(monitors[0])
    newest: dict[NodeKey, tuple[NodeRecord, _Item]] = {}
    for monitor in monitors:
        for record, item in read(monitor):
            held = newest.get(record.node.key)
            if held is None or stamp(record, item) >= stamp(*held):
                newest[record.node.key] = (record, item)
    return list(newest.values())


def _sampled_at(record: NodeRecord, _value: float) -> float:
    return record.sampled_at if record.sampled_at is not None else float("-inf")


def _observed_at(_record: NodeRecord, health: ScrapeHealth) -> float:
    return health.observed_at


def fresh_value_records(key: str) -> list[tuple[NodeRecord, float]]:
    """``(record, value)`` of every monitor's unexpired samples of ``key``, one per node.

    The newest sample wins for a node that two monitors report.
    """
    return _one_per_node(lambda m: m.snapshot.fresh_values(key, m.clock()), _sampled_at)


def fresh_health_records() -> list[tuple[NodeRecord, ScrapeHealth]]:
    """Every monitor's unexpired scrape health, one per node: the latest observation wins."""
    return _one_per_node(lambda m: m.snapshot.fresh_health(m.clock()), _observed_at)


def forget_all_monitors() -> None:
    """Stop every monitor and clear every snapshot the gauges read (for resets)."""
    for monitor in _monitors():
        monitor.stop()
        monitor.snapshot.clear()
