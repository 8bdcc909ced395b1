"""The host-memory gauges: what they are, and the callbacks that read every monitor's records.

A callback reads only published records and the placement registry, never the network,
so an export never waits on a node. The worker-group label is the one of the moment: a
record carries the label of its cycle, and when the placement registry changed since, the
label comes from the registry's table for its current version, worked out once per change
and shared by all six gauges. Every attribute was made encodable where it entered raylens
(node records in ``_nodes``, group names in the placement registry), so the gauges are
declared with lens as already encodable and nothing cleans them again.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry.metrics import CallbackOptions, Observation

from raylens.lens import (
    OBSERVABLE_GAUGE,
    RecordedMetric,
    register_observable_gauge,
    register_recorded_metrics,
)
from raylens.telemetry import names
from raylens.telemetry.host_memory._placement import DEFAULT_REGISTRY
from raylens.telemetry.host_memory._snapshot import (
    NodeRecord,
    fresh_health_records,
    fresh_value_records,
    node_attributes,
)
from raylens.telemetry.raylet_payload import (
    MACHINE_TOTAL_KEY,
    MACHINE_USED_KEY,
    TOTAL_KEY,
    USED_KEY,
)

__all__ = [
    "HOST_MEMORY_RECORDED_METRICS",
    "SCRAPE_HEALTH_RECORDED_METRICS",
    "declare_gauges",
    "list_gauges",
]

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


def _attributes(record: NodeRecord, version: int, labels: Mapping[str, str]) -> Mapping[str, str]:
    """``record``'s attributes, relabelled when the placement changed since its cycle."""
    if record.labels_version == version:
        return record.attributes
    return node_attributes(record.node, labels.get(record.node.node_id, names.NO_WORKER_GROUPS))


def _observations(key: str) -> list[Observation]:
    """One observation per node with a fresh sample of ``key`` (a registry key).

    Reads only the monitors' published records and the placement registry: no I/O, so
    an export never waits on a node. Samples past their expiry are left out.
    """
    fresh = fresh_value_records(key)
    if not fresh:
        return []
    version, labels = DEFAULT_REGISTRY.labels_by_node()
    return [Observation(value, _attributes(record, version, labels)) for record, value in fresh]


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
    fresh = fresh_health_records()
    if not fresh:
        return []
    version, labels = DEFAULT_REGISTRY.labels_by_node()
    found = []
    for record, health in fresh:
        attributes = _attributes(record, version, labels)
        if health.error_type is not None:
            attributes = {**attributes, names.ERROR_TYPE_ATTR: health.error_type}
        found.append(Observation(health.up, attributes))
    return found


def _observe_scrape_duration(options: CallbackOptions) -> list[Observation]:
    """``rl.host.scrape.duration`` of every node a request was sent to."""
    fresh = fresh_health_records()
    if not fresh:
        return []
    version, labels = DEFAULT_REGISTRY.labels_by_node()
    return [
        Observation(health.duration, _attributes(record, version, labels))
        for record, health in fresh
        if health.duration is not None
    ]


def list_gauges() -> None:
    """List every host-memory gauge in lens' catalogue (``recorded_metrics()``).

    Listing describes a gauge and nothing more: no callback, no instrument. The facade
    lists them at import and at a reset, as upstream's module does, so that code reading
    the catalogue finds them before any monitor exists.
    """
    register_recorded_metrics((*HOST_MEMORY_RECORDED_METRICS, *SCRAPE_HEALTH_RECORDED_METRICS))


def declare_gauges() -> None:
    """Declare every host-memory gauge with lens (idempotent: a second call replaces the callbacks).

    A monitor calls this when it is built, as it registers itself for the gauges to read;
    nothing calls it at import or at a reset.
    """
    used, total, machine_used, machine_total = HOST_MEMORY_RECORDED_METRICS
    for metric, callback in (
        (used, _observe_used),
        (total, _observe_total),
        (machine_used, _observe_machine_used),
        (machine_total, _observe_machine_total),
        *zip(SCRAPE_HEALTH_RECORDED_METRICS, (_observe_scrape_up, _observe_scrape_duration)),
    ):
        register_observable_gauge(metric, callback, attributes_encodable=True)
