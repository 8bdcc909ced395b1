"""Host memory of every Ray node, scraped from the raylets and exported through lens.

The public face of the host-memory package: the metric and attribute names,
:class:`HostMemoryMonitor`, this process's monitor (:func:`start_host_memory_monitoring`,
:func:`stop_host_memory_monitoring`) and the worker-group placement functions, bound to the
default placement registry :data:`DEFAULT_REGISTRY` (all in ``_process_state``). What each
series means is in the README's metric reference; the private modules and one scrape's path
are in ``docs/architecture.md``. Names left off this face (the scrape-health and
machine-memory series, the engine's settings, the record types) come from
:mod:`raylens.telemetry.names`, :mod:`raylens.telemetry.raylet_payload` or the module that
defines them.

Invariants: starting and stopping the process's monitor and
:func:`register_worker_group_placement` never raise (a failure is logged once);
:func:`register_worker_group_nodes` raises for a bad argument. ``_MONITOR``, the process's
monitor, and ``_WORKER_GROUP_NODES``, the default registry's ``{group: node ids}``, stay
here as NeMo-RL's tests read them. The gauges are listed in lens' catalogue at import and at
a reset, and declared (given their callbacks) only when a monitor is built, as it registers
for them to read it. :func:`reset_host_memory_state` (for tests) stops every monitor and
clears the process's records and placements.
"""

from __future__ import annotations

import logging
import sys

from raylens.telemetry.host_memory._cycle_hooks import CycleHooks
from raylens.telemetry.host_memory._gauges import (
    HOST_MEMORY_RECORDED_METRICS,
    SCRAPE_HEALTH_RECORDED_METRICS,
    list_gauges,
)
from raylens.telemetry.host_memory._monitor import SCRAPE_TIMEOUT_S, HostMemoryMonitor
from raylens.telemetry.host_memory._nodes import RayNode, ray_nodes
from raylens.telemetry.host_memory._placement import DEFAULT_REGISTRY, format_worker_groups
from raylens.telemetry.host_memory._process_state import (
    FALLBACK_COLLECTION_INTERVAL,
    forget_worker_group_nodes,
    keep_monitor_on,
    register_worker_group_nodes,
    register_worker_group_placement,
    reset_host_memory_state,
    start_host_memory_monitoring,
    stop_host_memory_monitoring,
    worker_group_names_on_node,
    worker_groups_on_node,
)
from raylens.telemetry.host_memory._snapshot import NodeRecord, NodeSample, RecordSource
from raylens.telemetry.names import (
    HOST_NAME_ATTR,
    LOGGER_NAME,
    NO_WORKER_GROUPS,
    RAY_NODE_ID_ATTR,
    RL_HOST_MEMORY_TOTAL_METRIC,
    RL_HOST_MEMORY_USED_METRIC,
    RL_WORKER_GROUPS_ATTR,
)
from raylens.telemetry.raylet_payload import (
    RAY_NODE_MEM_TOTAL,
    RAY_NODE_MEM_USED,
    parse_memory_samples,
)

__all__ = [
    "DEFAULT_REGISTRY",
    "FALLBACK_COLLECTION_INTERVAL",
    "HOST_MEMORY_RECORDED_METRICS",
    "HOST_NAME_ATTR",
    "NO_WORKER_GROUPS",
    "RAY_NODE_ID_ATTR",
    "RAY_NODE_MEM_TOTAL",
    "RAY_NODE_MEM_USED",
    "RL_HOST_MEMORY_TOTAL_METRIC",
    "RL_HOST_MEMORY_USED_METRIC",
    "RL_WORKER_GROUPS_ATTR",
    "SCRAPE_HEALTH_RECORDED_METRICS",
    "SCRAPE_TIMEOUT_S",
    "CycleHooks",
    "HostMemoryMonitor",
    "NodeRecord",
    "NodeSample",
    "RayNode",
    "RecordSource",
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

#: The process's monitor, or None; read and replaced by the start and stop functions.
_MONITOR: HostMemoryMonitor | None = None
keep_monitor_on(sys.modules[__name__])

#: ``{worker group name: node ids}``: the default placement registry's contents.
_WORKER_GROUP_NODES: dict[str, frozenset[str]] = DEFAULT_REGISTRY.nodes

list_gauges()
