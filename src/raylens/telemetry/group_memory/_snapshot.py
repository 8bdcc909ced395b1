"""The driver's latest group readings and the gauges that export them.

:class:`GroupMemorySnapshot` holds one cycle's readings per node; the gauges read it
without I/O. Group names and hosts are made encodable when a snapshot is published; a node
with no reading in the latest cycle has no point, and a reading older than ``max_age`` is
not exported.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import zip_longest

from opentelemetry.metrics import CallbackOptions, Observation

from raylens.lens import OBSERVABLE_GAUGE, RecordedMetric, register_observable_gauge
from raylens.safe_text import encodable
from raylens.telemetry.group_memory._reading import (
    NodeGroupMemory,
    PublishedReading,
    check_positive_seconds,
)
from raylens.telemetry.group_memory._registry import DEFAULT_WORKER_REGISTRY

__all__ = [
    "DEFAULT_MAX_AGE_SECONDS",
    "DEFAULT_SNAPSHOT",
    "GROUP_MEMORY_RECORDED_METRICS",
    "GROUP_MEMORY_USAGE_METRIC",
    "GROUP_PROCESSES_METRIC",
    "GROUP_PSS_AGE_METRIC",
    "MEMORY_TYPE_ATTR",
    "WORKER_GROUP_ATTR",
    "GroupMemorySnapshot",
    "Reading",
    "register_group_memory_gauges",
    "reset_group_memory_state",
]

GROUP_MEMORY_USAGE_METRIC = "rl.worker_group.memory.usage"
GROUP_PROCESSES_METRIC = "rl.worker_group.processes"
GROUP_PSS_AGE_METRIC = "rl.worker_group.memory.pss_age"
WORKER_GROUP_ATTR = "rl.worker_group"
MEMORY_TYPE_ATTR = "memory.type"
_NODE_ID_ATTR = "ray.node.id"
_HOST_NAME_ATTR = "host.name"
_RSS = "rss"
_PSS = "pss"

DEFAULT_MAX_AGE_SECONDS = 25.0
"""How long a published reading stays exported by default: two 10 s cycles plus a 5 s
deadline, as for host memory. Callers that know their interval pass their own."""

GROUP_MEMORY_RECORDED_METRICS: tuple[RecordedMetric, ...] = (
    RecordedMetric(
        GROUP_MEMORY_USAGE_METRIC,
        OBSERVABLE_GAUGE,
        "By",
        "Memory of a worker group's processes on a Ray node (its workers' process trees), "
        "by memory.type; the object store, the raylet and other processes are not in it.",
    ),
    RecordedMetric(
        GROUP_PROCESSES_METRIC,
        OBSERVABLE_GAUGE,
        "{process}",
        "Processes in a worker group's process trees on a Ray node at the latest reading.",
    ),
    RecordedMetric(
        GROUP_PSS_AGE_METRIC,
        OBSERVABLE_GAUGE,
        "s",
        "How old the pss point of rl.worker_group.memory.usage was when its reading was "
        "taken: PSS is read less often than RSS, so a sum of PSS lags by up to this much.",
    ),
)


Reading = NodeGroupMemory | PublishedReading
"""What a snapshot holds per node: a reading, or a sampler's published figures."""


def _group_names(reading: Reading) -> Iterator[str]:
    if isinstance(reading, PublishedReading):
        return reading.group_names()
    return (group.group for group in reading.groups)


def _group_points(reading: Reading) -> Iterable[tuple[int, int | None, int]]:
    """``(rss, pss or None, processes)`` per group of ``reading``, in its order."""
    if isinstance(reading, PublishedReading):
        return reading.points()
    return ((g.rss_bytes, g.pss_bytes, g.process_count) for g in reading.groups)


def _pss_ages(reading: Reading) -> Iterable[float | None]:
    """How old each group's PSS of ``reading`` is (None: no PSS), in its order."""
    if isinstance(reading, PublishedReading):
        return reading.pss_ages()
    return (None if g.pss_bytes is None else g.pss_age_seconds for g in reading.groups)


def _as_reading(reading: Reading) -> NodeGroupMemory:
    return reading.reading() if isinstance(reading, PublishedReading) else reading


@dataclass(frozen=True, slots=True)
class _NodeEntry:
    reading: Reading
    # Per group of the reading, in its order: the point's attributes without memory.type.
    # Shared with the entry of the node's next reading while its groups and host stay,
    # so a new reading costs one entry; never changed once built.
    attributes: tuple[dict[str, str], ...]

    def same_labels(self, reading: Reading) -> bool:
        """Whether ``reading`` has this entry's host and groups, in the same order."""
        if self.reading.host_name != reading.host_name:
            return False
        mine, theirs = _group_names(self.reading), _group_names(reading)
        return all(old == new for old, new in zip_longest(mine, theirs))


class GroupMemorySnapshot:
    """The latest per-node group readings the driver received, as the gauges export them.

    :meth:`publish` replaces the whole content with one cycle's results, keyed by node
    id: a node whose result is neither a :class:`NodeGroupMemory` nor a
    :class:`PublishedReading` (an error, a timeout)
    or that is missing has no point from then on. A reading is exported until
    ``max_age`` seconds of ``clock`` (default :func:`time.monotonic`) after it was
    published, even if no later cycle replaces it.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] | None = None,
        max_age: float = DEFAULT_MAX_AGE_SECONDS,
    ) -> None:
        self._clock = clock or time.monotonic
        self.max_age = check_positive_seconds("max_age", max_age)
        self._lock = threading.Lock()
        self._entries: dict[str, _NodeEntry] = {}
        # Every entry was received in the one publish that made the content: when, and
        # until when it is exported. Kept once, so that a reading published again costs
        # no new entry.
        self._received_at = float("-inf")
        self._expires_at = float("-inf")

    def publish(self, results: Mapping[str, object], *, max_age: float | None = None) -> None:
        """Make ``results`` (``{node id: reading or error}``) the snapshot's whole content.

        ``max_age`` overrides the snapshot's own for these readings.
        """
        limit = self.max_age if max_age is None else check_positive_seconds("max_age", max_age)
        now = self._clock()
        with self._lock:
            previous = self._entries
        entries: dict[str, _NodeEntry] = {}
        for node_id, reading in results.items():
            if not isinstance(reading, (NodeGroupMemory, PublishedReading)):
                continue
            before = previous.get(node_id)
            if before is None:
                node = encodable(str(node_id))
                before = previous.get(node)
            else:
                node = node_id  # found as a key: made encodable when that entry was built
            if before is not None and before.reading is reading:
                # The same reading again (its sampler published nothing new): its entry stands.
                entries[node] = before
                continue
            if before is not None and before.same_labels(reading):
                entries[node] = _NodeEntry(reading, before.attributes)
                continue
            host = encodable(reading.host_name)
            attributes = tuple(
                {WORKER_GROUP_ATTR: encodable(name), _NODE_ID_ATTR: node, _HOST_NAME_ATTR: host}
                for name in _group_names(reading)
            )
            entries[node] = _NodeEntry(reading, attributes)
        with self._lock:
            self._entries = entries
            self._received_at, self._expires_at = now, now + limit

    def _fresh(self) -> list[_NodeEntry]:
        now = self._clock()
        with self._lock:
            entries, expires_at = self._entries, self._expires_at
        return list(entries.values()) if now <= expires_at else []

    def observe_usage(self, _options: CallbackOptions | None = None) -> list[Observation]:
        """Points of ``rl.worker_group.memory.usage`` for every fresh reading."""
        points = []
        for entry in self._fresh():
            for attributes, (rss, pss, _processes) in zip(
                entry.attributes, _group_points(entry.reading)
            ):
                points.append(Observation(rss, {**attributes, MEMORY_TYPE_ATTR: _RSS}))
                if pss is not None:
                    points.append(Observation(pss, {**attributes, MEMORY_TYPE_ATTR: _PSS}))
        return points

    def observe_processes(self, _options: CallbackOptions | None = None) -> list[Observation]:
        """Points of ``rl.worker_group.processes`` for every fresh reading."""
        return [
            Observation(processes, dict(attributes))
            for entry in self._fresh()
            for attributes, (_rss, _pss, processes) in zip(
                entry.attributes, _group_points(entry.reading)
            )
        ]

    def observe_pss_age(self, _options: CallbackOptions | None = None) -> list[Observation]:
        """Points of ``rl.worker_group.memory.pss_age`` for every fresh reading with PSS."""
        return [
            Observation(age, dict(attributes))
            for entry in self._fresh()
            for attributes, age in zip(entry.attributes, _pss_ages(entry.reading))
            if age is not None
        ]

    def latest(self) -> dict[str, tuple[NodeGroupMemory, float]]:
        """``{node id: (reading, seconds since published)}`` for every fresh reading, for tables."""
        now = self._clock()
        with self._lock:
            entries, received_at, expires_at = self._entries, self._received_at, self._expires_at
        if now > expires_at:
            return {}
        age = max(0.0, now - received_at)
        return {node: (_as_reading(entry.reading), age) for node, entry in entries.items()}

    def clear(self) -> None:
        """Forget every reading."""
        with self._lock:
            self._entries = {}
            self._received_at = self._expires_at = float("-inf")


DEFAULT_SNAPSHOT = GroupMemorySnapshot()
"""The snapshot the driver's sampler cycle publishes into and the default gauges read."""


def register_group_memory_gauges(snapshot: GroupMemorySnapshot | None = None) -> None:
    """Export the group-memory gauges from ``snapshot`` (default :data:`DEFAULT_SNAPSHOT`).

    Idempotent; a later call with another snapshot points the gauges at it.
    """
    source = snapshot if snapshot is not None else DEFAULT_SNAPSHOT
    usage, processes, pss_age = GROUP_MEMORY_RECORDED_METRICS
    # publish() made every name and host encodable: lens need not check them again.
    register_observable_gauge(usage, source.observe_usage, attributes_encodable=True)
    register_observable_gauge(processes, source.observe_processes, attributes_encodable=True)
    register_observable_gauge(pss_age, source.observe_pss_age, attributes_encodable=True)


def reset_group_memory_state() -> None:
    """Forget the default registry's workers and the default snapshot's readings (tests)."""
    DEFAULT_WORKER_REGISTRY.clear()
    DEFAULT_SNAPSHOT.clear()
