"""The names host memory is exported under, and the raylet series it reads.

Kept apart from the facade so that the private host-memory modules can share them
without importing :mod:`raylens.telemetry.host_memory`, which imports them.
"""

from __future__ import annotations

from raylens.lens import registry_key

#: Ray's own figure for the node: in a container, the cgroup's usage and limit (what
#: Ray's memory monitor compares against its kill threshold); elsewhere, the machine's.
RL_HOST_MEMORY_USED_METRIC = "rl.host.memory.used"
RL_HOST_MEMORY_TOTAL_METRIC = "rl.host.memory.total"
#: The physical machine's figure, whatever container the raylet runs in.
RL_HOST_MACHINE_MEMORY_USED_METRIC = "rl.host.machine.memory.used"
RL_HOST_MACHINE_MEMORY_TOTAL_METRIC = "rl.host.machine.memory.total"
#: 1 when the node's latest scrape gave a sample, 0 when it did not.
RL_HOST_SCRAPE_UP_METRIC = "rl.host.scrape.up"
#: Seconds the node's latest scrape request took.
RL_HOST_SCRAPE_DURATION_METRIC = "rl.host.scrape.duration"

HOST_NAME_ATTR = "host.name"
#: Worker groups with at least one worker on the node: their names, sorted and joined
#: with commas, or :data:`NO_WORKER_GROUPS`. It tells which groups a node's memory
#: figure is shared by; it is not a per-group figure, and summing the memory of the
#: points that carry one group's name counts every shared node once per group.
RL_WORKER_GROUPS_ATTR = "rl.worker_groups"
RAY_NODE_ID_ATTR = "ray.node.id"
#: Why a scrape failed, one of :data:`SCRAPE_ERROR_TYPES`; absent on a success.
ERROR_TYPE_ATTR = "error.type"
NO_WORKER_GROUPS = "none"

RAY_NODE_MEM_USED = "ray_node_mem_used"
RAY_NODE_MEM_TOTAL = "ray_node_mem_total"
RAY_NODE_MEM_USED_HOST = "ray_node_mem_used_host"
RAY_NODE_MEM_TOTAL_HOST = "ray_node_mem_total_host"

USED_KEY = registry_key(RL_HOST_MEMORY_USED_METRIC)
TOTAL_KEY = registry_key(RL_HOST_MEMORY_TOTAL_METRIC)
MACHINE_USED_KEY = registry_key(RL_HOST_MACHINE_MEMORY_USED_METRIC)
MACHINE_TOTAL_KEY = registry_key(RL_HOST_MACHINE_MEMORY_TOTAL_METRIC)

#: The raylet series read from each payload, and the registry key each is filed under.
SERIES_BY_RAY_NAME: dict[str, str] = {
    RAY_NODE_MEM_USED: USED_KEY,
    RAY_NODE_MEM_TOTAL: TOTAL_KEY,
    RAY_NODE_MEM_USED_HOST: MACHINE_USED_KEY,
    RAY_NODE_MEM_TOTAL_HOST: MACHINE_TOTAL_KEY,
}

#: Every value ``error.type`` may take: a fixed set, so the label's cardinality is bounded.
ERROR_TIMEOUT = "timeout"
ERROR_CONNECTION = "connection"
ERROR_HTTP_STATUS = "http_status"
ERROR_TOO_LARGE = "too_large"
ERROR_ENCODING = "encoding"
ERROR_PARSE = "parse"
ERROR_NO_METRICS_PORT = "no_metrics_port"
#: The scraper itself failed (the helper process died, a replaced ``_scrape`` raised).
ERROR_INTERNAL = "internal"
SCRAPE_ERROR_TYPES = frozenset(
    {
        ERROR_TIMEOUT,
        ERROR_CONNECTION,
        ERROR_HTTP_STATUS,
        ERROR_TOO_LARGE,
        ERROR_ENCODING,
        ERROR_PARSE,
        ERROR_NO_METRICS_PORT,
        ERROR_INTERNAL,
    }
)

#: Name of the logger every host-memory module writes to, so that one logger
#: configuration (and one ``caplog`` filter) covers them all.
LOGGER_NAME = "raylens.telemetry.host_memory"
