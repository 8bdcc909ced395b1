"""The host-memory gauges: what they are, and the callbacks that read every monitor's snapshot.

A callback reads only published snapshots and the placement registry, never the
network, so an export never waits on a node; the worker-group label is worked out at
export time, so a group registered or forgotten since the sample is already reflected.
"""

from __future__ import annotations

from opentelemetry.metrics import CallbackOptions, Observation

from raylens.lens import OBSERVABLE_GAUGE, RecordedMetric, register_observable_gauge
from raylens.telemetry import names
from raylens.telemetry.host_memory._placement import DEFAULT_REGISTRY, format_worker_groups
from raylens.telemetry.host_memory._snapshot import fresh_health, fresh_samples
from raylens.telemetry.raylet_payload import (
    MACHINE_TOTAL_KEY,
    MACHINE_USED_KEY,
    TOTAL_KEY,
    USED_KEY,
)

__all__ = ["HOST_MEMORY_RECORDED_METRICS", "SCRAPE_HEALTH_RECORDED_METRICS", "declare_gauges"]

HOST_MEMORY_RECORDED_METRICS: tuple[RecordedMetric, ...] = (
    RecordedMetric(
        names.RL_HOST_MEMORY_USED_METRIC,
        OBSERVABLE_GAUGE,
        "By",
        "Memory in use on a Ray node as Ray counts it (ray_node_mem_used): in a container, "
        "the cgroup's usage, which Ray's memory monitor acts on; else the machine's. Object "
        "store, raylet, workers and driver are all in it.",
    ),
    RecordedMetric(
        names.RL_HOST_MEMORY_TOTAL_METRIC,
        OBSERVABLE_GAUGE,
        "By",
        "Memory a Ray node may use as Ray counts it (ray_node_mem_total): in a container, "
        "the cgroup's limit; else the machine's total.",
    ),
    RecordedMetric(
        names.RL_HOST_MACHINE_MEMORY_USED_METRIC,
        OBSERVABLE_GAUGE,
        "By",
        "Memory in use on the physical machine a Ray node runs on (ray_node_mem_used_host), "
        "whatever container the raylet is in; only where the raylet publishes it.",
    ),
    RecordedMetric(
        names.RL_HOST_MACHINE_MEMORY_TOTAL_METRIC,
        OBSERVABLE_GAUGE,
        "By",
        "Total memory of the physical machine a Ray node runs on (ray_node_mem_total_host); "
        "only where the raylet publishes it.",
    ),
)

SCRAPE_HEALTH_RECORDED_METRICS: tuple[RecordedMetric, ...] = (
    RecordedMetric(
        names.RL_HOST_SCRAPE_UP_METRIC,
        OBSERVABLE_GAUGE,
        # An annotation only: Prometheus drops it, so the series stays rl_host_scrape_up.
        "{node}",
        "1 when the node's latest metrics scrape gave a memory sample, 0 when it did not; "
        "error.type says why. A node that left the cluster has no point.",
    ),
    RecordedMetric(
        names.RL_HOST_SCRAPE_DURATION_METRIC,
        OBSERVABLE_GAUGE,
        "s",
        "Seconds the node's latest metrics scrape took, failed ones included.",
    ),
)


def _attributes(node_id: str, host: str, groups: dict[str, list[str]]) -> dict[str, str]:
    return {
        names.HOST_NAME_ATTR: host,
        names.RL_WORKER_GROUPS_ATTR: format_worker_groups(groups.get(node_id, ())),
        names.RAY_NODE_ID_ATTR: node_id,
    }


def _observations(key: str) -> list[Observation]:
    """One observation per node with a fresh sample of ``key`` (a registry key).

    Reads only the monitors' published snapshots and the placement registry: no
    I/O, so an export never waits on a node. Samples past their expiry are left
    out, and the worker-group label is worked out now, so a group registered or
    forgotten since the sample was taken is already reflected.
    """
    fresh = fresh_samples(key)
    if not fresh:
        return []
    groups = DEFAULT_REGISTRY.groups_by_node()
    return [
        Observation(value, _attributes(node_id, host, groups))
        for (node_id, host), value in fresh.items()
    ]


def _observe_used(options: CallbackOptions) -> list[Observation]:
    return _observations(USED_KEY)


def _observe_total(options: CallbackOptions) -> list[Observation]:
    return _observations(TOTAL_KEY)


def _observe_machine_used(options: CallbackOptions) -> list[Observation]:
    return _observations(MACHINE_USED_KEY)


def _observe_machine_total(options: CallbackOptions) -> list[Observation]:
    return _observations(MACHINE_TOTAL_KEY)


def _observe_scrape_up(options: CallbackOptions) -> list[Observation]:
    """``rl.host.scrape.up`` of every listed node, with ``error.type`` on a failure."""
    health = fresh_health()
    if not health:
        return []
    groups = DEFAULT_REGISTRY.groups_by_node()
    found = []
    for (node_id, host), entry in health.items():
        attributes = _attributes(node_id, host, groups)
        if entry.error_type is not None:
            attributes[names.ERROR_TYPE_ATTR] = entry.error_type
        found.append(Observation(entry.up, attributes))
    return found


def _observe_scrape_duration(options: CallbackOptions) -> list[Observation]:
    """``rl.host.scrape.duration`` of every node a request was sent to."""
    health = fresh_health()
    if not health:
        return []
    groups = DEFAULT_REGISTRY.groups_by_node()
    return [
        Observation(entry.duration, _attributes(node_id, host, groups))
        for (node_id, host), entry in health.items()
        if entry.duration is not None
    ]


def declare_gauges() -> None:
    """Declare every host-memory gauge with lens (idempotent: a second call replaces the callbacks)."""
    used, total, machine_used, machine_total = HOST_MEMORY_RECORDED_METRICS
    register_observable_gauge(used, _observe_used)
    register_observable_gauge(total, _observe_total)
    register_observable_gauge(machine_used, _observe_machine_used)
    register_observable_gauge(machine_total, _observe_machine_total)
    up, duration = SCRAPE_HEALTH_RECORDED_METRICS
    register_observable_gauge(up, _observe_scrape_up)
    register_observable_gauge(duration, _observe_scrape_duration)
