"""What a monitor publishes: per-node samples, and the snapshot the gauges read.

Each :class:`~._monitor.HostMemoryMonitor` owns a :class:`Snapshot`; the gauges
read the unexpired samples of every monitor registered here
(:func:`fresh_samples`). A sample's expiry is a reading of its monitor's clock,
so ageing follows whatever clock the monitor was given.
"""

from __future__ import annotations

import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

__all__ = ["NodeSample", "Snapshot", "forget_all_monitors", "fresh_samples", "register_publisher"]

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


@dataclass
class Snapshot:
    """Latest good sample of every node and when each stops being exported.

    ``samples`` is ``{(node id, host): {registry key: bytes}}``; ``expiry`` holds
    clock readings. Written whole by a finished cycle, read by the gauges.
    """

    samples: dict[NodeKey, dict[str, float]] = field(default_factory=dict)
    expiry: dict[NodeKey, float] = field(default_factory=dict)
    sampled_at: dict[NodeKey, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def publish(
        self,
        samples: dict[NodeKey, dict[str, float]],
        expiry: dict[NodeKey, float],
        sampled_at: dict[NodeKey, float],
    ) -> None:
        with self.lock:
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

    def clear(self) -> None:
        self.publish({}, {}, {})


#: Monitors whose snapshot the gauges read.
_PUBLISHERS: weakref.WeakSet[Any] = weakref.WeakSet()
_PUBLISHERS_LOCK = threading.Lock()


def register_publisher(monitor: Any) -> None:
    """Have the gauges read ``monitor``'s snapshot (it needs ``snapshot`` and ``clock``)."""
    with _PUBLISHERS_LOCK:
        _PUBLISHERS.add(monitor)


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


def forget_all_monitors() -> None:
    """Stop every monitor and clear every snapshot the gauges read (for resets)."""
    with _PUBLISHERS_LOCK:
        monitors = list(_PUBLISHERS)
    for monitor in monitors:
        monitor.stop()
        monitor.snapshot.clear()
