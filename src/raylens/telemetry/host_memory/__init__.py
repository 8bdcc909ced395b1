"""Host memory of every Ray node, scraped from the raylets and exported through lens.

The public face of the host-memory package: the metric and attribute names,
:class:`HostMemoryMonitor`, this process's monitor (:func:`start_host_memory_monitoring`,
:func:`stop_host_memory_monitoring`) and the worker-group placement functions, bound to the
default :class:`PlacementRegistry`. What each series means is in the README's metric
reference; the private modules and one scrape's path are in ``docs/architecture.md``.

Invariants: starting and stopping the process's monitor and
:func:`register_worker_group_placement` never raise (a failure is logged once);
:func:`register_worker_group_nodes` raises for a bad argument. ``_MONITOR`` is read and
replaced only under ``_MONITOR_LOCK``, which a forked child renews. The gauges are listed in
lens' catalogue at import and at a reset, and declared (given their callbacks) only when a
monitor is built, as it registers for them to read it.
:func:`reset_host_memory_state` (for tests) stops every monitor and clears
:data:`DEFAULT_SNAPSHOT` and the default placement registry :data:`DEFAULT_REGISTRY`.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Iterable

from raylens import forking
from raylens.cluster import ClusterView
from raylens.lens import warn_once
from raylens.telemetry.host_memory._cycle_hooks import CycleHooks
from raylens.telemetry.host_memory._gauges import (
    HOST_MEMORY_RECORDED_METRICS,
    SCRAPE_HEALTH_RECORDED_METRICS,
    list_gauges,
)
from raylens.telemetry.host_memory._helper_engine import GroupFiguresMemo
from raylens.telemetry.host_memory._monitor import (
    SCRAPE_MODE_ENV,
    SCRAPE_TIMEOUT_S,
    SHUTDOWN_GRACE_S,
    HostMemoryMonitor,
    ScrapeMode,
)
from raylens.telemetry.host_memory._nodes import RayNode, ray_nodes
from raylens.telemetry.host_memory._placement import (
    DEFAULT_REGISTRY,
    PlacementRegistry,
    format_worker_groups,
)
from raylens.telemetry.host_memory._snapshot import (
    NodeRecord,
    NodeSample,
    RecordSource,
    ScrapeHealth,
    Snapshot,
    forget_all_monitors,
)
from raylens.telemetry.names import (
    ERROR_TYPE_ATTR,
    HOST_NAME_ATTR,
    LOGGER_NAME,
    NO_WORKER_GROUPS,
    RAY_NODE_ID_ATTR,
    RL_HOST_MACHINE_MEMORY_TOTAL_METRIC,
    RL_HOST_MACHINE_MEMORY_USED_METRIC,
    RL_HOST_MEMORY_TOTAL_METRIC,
    RL_HOST_MEMORY_USED_METRIC,
    RL_HOST_SCRAPE_DURATION_METRIC,
    RL_HOST_SCRAPE_UP_METRIC,
    RL_WORKER_GROUPS_ATTR,
)
from raylens.telemetry.raylet_payload import (
    RAY_NODE_MEM_TOTAL,
    RAY_NODE_MEM_TOTAL_HOST,
    RAY_NODE_MEM_USED,
    RAY_NODE_MEM_USED_HOST,
    SCRAPE_ERROR_TYPES,
    SERIES_BY_RAY_NAME,
    TOTAL_KEY,
    USED_KEY,
    parse_memory_samples,
)
from raylens.validation import positive_seconds

__all__ = [
    "DEFAULT_REGISTRY",
    "DEFAULT_SNAPSHOT",
    "ERROR_TYPE_ATTR",
    "FALLBACK_COLLECTION_INTERVAL",
    "HOST_MEMORY_RECORDED_METRICS",
    "HOST_NAME_ATTR",
    "NO_WORKER_GROUPS",
    "RAY_NODE_ID_ATTR",
    "RAY_NODE_MEM_TOTAL",
    "RAY_NODE_MEM_TOTAL_HOST",
    "RAY_NODE_MEM_USED",
    "RAY_NODE_MEM_USED_HOST",
    "RL_HOST_MACHINE_MEMORY_TOTAL_METRIC",
    "RL_HOST_MACHINE_MEMORY_USED_METRIC",
    "RL_HOST_MEMORY_TOTAL_METRIC",
    "RL_HOST_MEMORY_USED_METRIC",
    "RL_HOST_SCRAPE_DURATION_METRIC",
    "RL_HOST_SCRAPE_UP_METRIC",
    "RL_WORKER_GROUPS_ATTR",
    "SCRAPE_ERROR_TYPES",
    "SCRAPE_HEALTH_RECORDED_METRICS",
    "SCRAPE_MODE_ENV",
    "SCRAPE_TIMEOUT_S",
    "SHUTDOWN_GRACE_S",
    "CycleHooks",
    "GroupFiguresMemo",
    "HostMemoryMonitor",
    "NodeRecord",
    "NodeSample",
    "PlacementRegistry",
    "RayNode",
    "RecordSource",
    "ScrapeHealth",
    "ScrapeMode",
    "Snapshot",
    "forget_worker_group_nodes",
    "format_worker_groups",
    "parse_memory_samples",
    "ray_nodes",
    "register_worker_group_nodes",
    "register_worker_group_placement",
    "reset_host_memory_state",
    "start_host_memory_monitoring",
    "stop_host_memory_monitoring",
    "worker_group_names_on_node",
    "worker_groups_on_node",
]

logger = logging.getLogger(LOGGER_NAME)

_USED_KEY = USED_KEY
_TOTAL_KEY = TOTAL_KEY
_SERIES_BY_RAY_NAME = SERIES_BY_RAY_NAME

FALLBACK_COLLECTION_INTERVAL = 10.0
_SCRAPE_TIMEOUT_S = SCRAPE_TIMEOUT_S
#: How long past its scrape timeout :meth:`HostMemoryMonitor.stop` may take.
_SHUTDOWN_GRACE_S = SHUTDOWN_GRACE_S

#: Where the process's monitor publishes its records (``{(node id, host): NodeRecord}``).
DEFAULT_SNAPSHOT = Snapshot()
#: The same records as upstream's names read them: ``{(node id, host): {registry key:
#: bytes}}`` of the nodes that answered the latest cycle, and the lock it is refilled under.
_SNAPSHOT: dict[tuple[str, str], dict[str, float]] = DEFAULT_SNAPSHOT.samples
_SNAPSHOT_LOCK = DEFAULT_SNAPSHOT.lock

#: ``{worker group name: node ids}``: the default placement registry's contents.
_WORKER_GROUP_NODES: dict[str, frozenset[str]] = DEFAULT_REGISTRY.nodes
_WORKER_GROUP_LOCK = DEFAULT_REGISTRY.lock

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
            :data:`NO_WORKER_GROUPS`.
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
    """The :data:`RL_WORKER_GROUPS_ATTR` value of ``node_id`` right now."""
    return format_worker_groups(worker_group_names_on_node(node_id))


# The process's monitor -----------------------------------------------------------------

_MONITOR: HostMemoryMonitor | None = None
_MONITOR_LOCK = threading.Lock()
forking.renew_lock_in_child(sys.modules[__name__], "_MONITOR_LOCK")


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
    global _MONITOR
    try:
        interval = _usable_interval(collection_interval)
        # Started under the lock (start() only launches a thread): a stop that comes
        # in meanwhile then finds the monitor running and stops it, rather than
        # taking it away before it starts and leaving it running unowned.
        with _MONITOR_LOCK:
            if _MONITOR is None:
                _MONITOR = HostMemoryMonitor(interval, cluster=cluster, snapshot=DEFAULT_SNAPSHOT)
            _MONITOR.start()
            return _MONITOR
    except Exception:
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
    global _MONITOR
    with _MONITOR_LOCK:
        monitor, _MONITOR = _MONITOR, None
    if monitor is None:
        return
    try:
        monitor.stop()
    except Exception:
        warn_once("host_memory.stop", "stopping host-memory monitoring failed", logger=logger)


def reset_host_memory_state() -> None:
    """Return this module to its state at import: no monitor, records or placements.

    Stops the process's monitor and every other monitor, and forgets every published
    record and worker-group placement. Lists the gauges in lens' catalogue again and
    declares none: the next monitor built declares them. Meant for tests.
    """
    stop_host_memory_monitoring()
    forget_all_monitors()
    DEFAULT_SNAPSHOT.clear()
    DEFAULT_REGISTRY.clear()
    list_gauges()


list_gauges()
