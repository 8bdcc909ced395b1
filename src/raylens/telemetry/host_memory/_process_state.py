"""This process's host-memory state: its monitor, its records and its worker-group placement.

The module-level functions of :mod:`raylens.telemetry.host_memory` live here, bound to the
defaults: :data:`DEFAULT_SNAPSHOT` (the records the process's monitor publishes) and the
placement registry :data:`~._placement.DEFAULT_REGISTRY`.

The process's monitor itself is kept on the package's face, as ``_MONITOR``, where
NeMo-RL's tests read and replace it: the face calls :func:`keep_monitor_on` with itself at
import, and :func:`start_host_memory_monitoring` and :func:`stop_host_memory_monitoring` read
and replace it there, under ``_MONITOR_LOCK`` (renewed in a forked child); a monitor is
built by the face's ``HostMemoryMonitor`` as it is at that moment, so a test may replace
it. No private module imports the face.

Invariants: starting and stopping the monitor and :func:`register_worker_group_placement`
never raise (a failure is logged once); :func:`register_worker_group_nodes` raises for a bad
argument.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Iterable
from types import SimpleNamespace
from typing import Protocol

from raylens import forking
from raylens.cluster import ClusterView
from raylens.lens import warn_once
from raylens.telemetry.host_memory._gauges import list_gauges
from raylens.telemetry.host_memory._monitor import HostMemoryMonitor
from raylens.telemetry.host_memory._placement import DEFAULT_REGISTRY, format_worker_groups
from raylens.telemetry.host_memory._snapshot import Snapshot, forget_all_monitors
from raylens.telemetry.names import LOGGER_NAME
from raylens.validation import positive_seconds

__all__ = [
    "DEFAULT_SNAPSHOT",
    "FALLBACK_COLLECTION_INTERVAL",
    "MonitorHolder",
    "forget_worker_group_nodes",
    "keep_monitor_on",
    "register_worker_group_nodes",
    "register_worker_group_placement",
    "reset_host_memory_state",
    "start_host_memory_monitoring",
    "stop_host_memory_monitoring",
    "worker_group_names_on_node",
    "worker_groups_on_node",
]

logger = logging.getLogger(LOGGER_NAME)

FALLBACK_COLLECTION_INTERVAL = 10.0
"""Seconds :func:`start_host_memory_monitoring` uses for an interval it cannot use."""

#: Where the process's monitor publishes its records (``{(node id, host): NodeRecord}``).
DEFAULT_SNAPSHOT = Snapshot()

# Worker groups -----------------------------------------------------------------------


def register_worker_group_nodes(name_prefix: str, node_ids: Iterable[str]) -> None:
    """Record that worker group ``name_prefix`` has workers on ``node_ids``.

    ``name_prefix`` is the group's name, the value its workers carry as their
    ``rl.worker_group`` resource attribute, so the two can be joined. ``node_ids``
    are Ray node ids (hex); empty ones are ignored. The entry replaces any earlier
    one for the group, so a group rebuilt elsewhere after a restart is not reported
    on its old nodes as well. Unlike :func:`register_worker_group_placement`, this
    function does raise for a bad argument.

    Raises:
        ValueError: ``name_prefix`` is empty, contains a comma, or is
            :data:`~raylens.telemetry.names.NO_WORKER_GROUPS`.
        TypeError: ``name_prefix`` or a node id is not a ``str``, or ``node_ids`` is
            a single string rather than an iterable of them.
    """
    DEFAULT_REGISTRY.register_nodes(name_prefix, node_ids)


def register_worker_group_placement(
    name_prefix: str,
    bundles: Iterable[tuple[object, int]],
    *,
    cluster: ClusterView | None = None,
) -> None:
    """Find the nodes under ``bundles`` and register them for ``name_prefix``. Never raises.

    ``bundles`` are the ``(placement group, bundle index)`` pairs the group's
    workers sit on; a bundle index of -1 stands for every bundle of its group.
    Each placement group is looked up once (``placement_group_table``), however
    many bundles it contributes: Ray's scheduling record, read on the driver
    without asking any worker. Only groups in state ``CREATED`` or ``RESCHEDULING``
    are read, since the node ids of any other state are not, or no longer, where
    the bundles are; unplaced bundles (empty node id) are skipped.

    A bad ``name_prefix`` (empty, with a comma, ``none``, not a ``str``) is logged
    once and ignored; a failed lookup or malformed ``bundles`` is warned about
    once and the group keeps whatever it was registered with before.
    """
    DEFAULT_REGISTRY.register_placement(name_prefix, bundles, cluster)


def forget_worker_group_nodes(name_prefix: str) -> None:
    """Drop ``name_prefix``'s placement, for a group that has shut down. No-op if unknown."""
    DEFAULT_REGISTRY.forget(name_prefix)


def worker_group_names_on_node(node_id: str) -> set[str]:
    """Names of the worker groups with at least one worker on ``node_id``."""
    return DEFAULT_REGISTRY.names_on_node(node_id)


def worker_groups_on_node(node_id: str) -> str:
    """The ``rl.worker_groups`` value of ``node_id`` right now."""
    return format_worker_groups(worker_group_names_on_node(node_id))


# The process's monitor -----------------------------------------------------------------


class MonitorHolder(Protocol):
    """Where the process's monitor is kept (``_MONITOR``), with the class that builds it."""

    _MONITOR: HostMemoryMonitor | None
    HostMemoryMonitor: Callable[..., HostMemoryMonitor]


# The package's face, once it has called keep_monitor_on; until then, a namespace of
# this module's own.
_holder: MonitorHolder = SimpleNamespace(_MONITOR=None, HostMemoryMonitor=HostMemoryMonitor)
_MONITOR_LOCK = threading.Lock()
forking.renew_lock_in_child(sys.modules[__name__], "_MONITOR_LOCK")


def keep_monitor_on(holder: MonitorHolder) -> None:
    """Keep the process's monitor as ``holder._MONITOR`` (read and replaced there at each call)."""
    global _holder
    _holder = holder


def _usable_interval(collection_interval: object) -> float:
    try:
        return positive_seconds("collection_interval", collection_interval)
    except ValueError:
        logger.warning(
            "host-memory collection interval %r is not a positive finite number of seconds; "
            "using %g s",
            collection_interval,
            FALLBACK_COLLECTION_INTERVAL,
        )
        return FALLBACK_COLLECTION_INTERVAL


def start_host_memory_monitoring(
    collection_interval: float, *, cluster: ClusterView | None = None
) -> HostMemoryMonitor | None:
    """Start this process's monitor unless one is running, and return it. Never raises.

    The driver's telemetry entry point calls this, which puts the monitor in the
    driver, next to the worker-group placement registry it labels nodes from. A
    monitor in another process connected to the cluster (``raylens watch``) reads
    the placement that drivers publish in the cluster's key-value store instead.

    An interval that is not a positive finite number is logged and replaced by
    :data:`FALLBACK_COLLECTION_INTERVAL`. ``cluster`` overrides the connected Ray.
    The monitor scrapes only while lens exports (no consumer, no scrape). Returns
    None when it could not start.
    """
    try:
        interval = _usable_interval(collection_interval)
        # Started under the lock (start() only launches a thread): a stop that comes
        # in meanwhile then finds the monitor running and stops it, rather than
        # taking it away before it starts and leaving it running unowned.
        with _MONITOR_LOCK:
            holder = _holder
            monitor = holder._MONITOR
            if monitor is None:
                build = holder.HostMemoryMonitor
                monitor = build(interval, cluster=cluster, snapshot=DEFAULT_SNAPSHOT)
                holder._MONITOR = monitor
            monitor.start()
            return monitor
    except Exception:  # noqa: BLE001 start never raises; the monitor class may be a caller's stand-in
        warn_once(
            "host_memory.start",
            "could not start host-memory monitoring; no host memory will be exported",
            logger=logger,
        )
        return None


def stop_host_memory_monitoring() -> None:
    """Stop this process's monitor. Never raises; does nothing when none runs.

    Telemetry shutdown calls this in every process, most of which never started a
    monitor, hence the quiet no-op.
    """
    with _MONITOR_LOCK:
        holder = _holder
        monitor = holder._MONITOR
        holder._MONITOR = None
    if monitor is None:
        return
    try:
        monitor.stop()
    except Exception:  # noqa: BLE001 stop never raises; the monitor may be a caller's stand-in
        warn_once("host_memory.stop", "stopping host-memory monitoring failed", logger=logger)


def reset_host_memory_state() -> None:
    """Return host memory to its state at import: no monitor, records or placements.

    Stops the process's monitor and every other monitor, and forgets every published
    record and worker-group placement. Lists the gauges in lens' catalogue again and
    declares none: the next monitor built declares them. Meant for tests.
    """
    stop_host_memory_monitoring()
    forget_all_monitors()
    DEFAULT_SNAPSHOT.clear()
    DEFAULT_REGISTRY.clear()
    list_gauges()
