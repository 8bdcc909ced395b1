"""What a monitor publishes: per-node samples, and the snapshot the gauges read.

Each :class:`~._monitor.HostMemoryMonitor` owns a :class:`Snapshot`; the gauges
read the unexpired samples of every monitor registered here
(:func:`fresh_samples`). A sample's expiry is a reading of its monitor's clock,
so ageing follows whatever clock the monitor was given.
"""

from __future__ import annotations

import sys
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from raylens import forking

__all__ = [
    "NodeSample",
    "ScrapeHealth",
    "Snapshot",
    "forget_all_monitors",
    "fresh_health",
    "fresh_samples",
    "hold_publisher",
    "register_publisher",
    "release_publisher",
]

NodeKey = tuple[str, str]


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


@dataclass
class Snapshot:
    """Latest good sample of every node and when each stops being exported.

    ``samples`` is ``{(node id, host): {registry key: bytes}}``; ``expiry`` holds
    clock readings. Written whole by a finished cycle, read by the gauges.
    """

    samples: dict[NodeKey, dict[str, float]] = field(default_factory=dict)
    expiry: dict[NodeKey, float] = field(default_factory=dict)
    sampled_at: dict[NodeKey, float] = field(default_factory=dict)
    #: How each listed node's latest scrape went, failures included.
    health: dict[NodeKey, ScrapeHealth] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def publish(
        self,
        samples: dict[NodeKey, dict[str, float]],
        expiry: dict[NodeKey, float],
        sampled_at: dict[NodeKey, float],
        health: dict[NodeKey, ScrapeHealth] | None = None,
    ) -> None:
        with self.lock:
            self.health.clear()
            self.health.update(health or {})
            self.samples.clear()
            self.samples.update(samples)
            self.expiry.clear()
            self.expiry.update(expiry)
            self.sampled_at.clear()
            self.sampled_at.update(sampled_at)

    def fresh(self, key: str, now: float) -> list[tuple[NodeKey, float, float]]:
        """``(node key, value, sampled at)`` of every unexpired sample of ``key``."""
        with self.lock:
            return [
                (node_key, values[key], self.sampled_at.get(node_key, now))
                for node_key, values in self.samples.items()
                if key in values and now <= self.expiry.get(node_key, float("-inf"))
            ]

    def fresh_health(self, now: float) -> list[tuple[NodeKey, ScrapeHealth]]:
        """Every node's scrape health that has not expired at ``now``."""
        with self.lock:
            return [(key, h) for key, h in self.health.items() if now <= h.expires_at]

    def forget(self, keys: list[NodeKey]) -> None:
        """Drop everything held about ``keys`` (nodes that left)."""
        with self.lock:
            for key in keys:
                self.samples.pop(key, None)
                self.expiry.pop(key, None)
                self.sampled_at.pop(key, None)
                self.health.pop(key, None)

    def clear(self) -> None:
        self.publish({}, {}, {})


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


def fresh_samples(key: str) -> dict[NodeKey, float]:
    """Every monitor's unexpired samples of ``key``; the newest wins for a node two report."""
    with _PUBLISHERS_LOCK:
        monitors = list(_PUBLISHERS)
    newest: dict[NodeKey, tuple[float, float]] = {}
    for monitor in monitors:
        for node_key, value, sampled_at in monitor.snapshot.fresh(key, monitor.clock()):
            if node_key not in newest or sampled_at >= newest[node_key][1]:
                newest[node_key] = (value, sampled_at)
    return {node_key: value for node_key, (value, _) in newest.items()}


def fresh_health() -> dict[NodeKey, ScrapeHealth]:
    """Every monitor's unexpired scrape health; the latest observation wins for a node."""
    with _PUBLISHERS_LOCK:
        monitors = list(_PUBLISHERS)
    newest: dict[NodeKey, ScrapeHealth] = {}
    for monitor in monitors:
        for node_key, health in monitor.snapshot.fresh_health(monitor.clock()):
            if node_key not in newest or health.observed_at >= newest[node_key].observed_at:
                newest[node_key] = health
    return newest


def forget_all_monitors() -> None:
    """Stop every monitor and clear every snapshot the gauges read (for resets)."""
    with _PUBLISHERS_LOCK:
        monitors = list(_PUBLISHERS)
    for monitor in monitors:
        monitor.stop()
        monitor.snapshot.clear()
