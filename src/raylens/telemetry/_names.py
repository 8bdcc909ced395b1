"""The names host memory is exported under, and the two raylet series it reads.

Kept apart from the facade so that the private host-memory modules can share them
without importing :mod:`raylens.telemetry.host_memory`, which imports them.
"""

from __future__ import annotations

from raylens.lens import registry_key

RL_HOST_MEMORY_USED_METRIC = "rl.host.memory.used"
RL_HOST_MEMORY_TOTAL_METRIC = "rl.host.memory.total"

HOST_NAME_ATTR = "host.name"
#: Worker groups with at least one worker on the node: their names, sorted and joined
#: with commas, or :data:`NO_WORKER_GROUPS`. It tells which groups a node's memory
#: figure is shared by; it is not a per-group figure, and summing the memory of the
#: points that carry one group's name counts every shared node once per group.
RL_WORKER_GROUPS_ATTR = "rl.worker_groups"
RAY_NODE_ID_ATTR = "ray.node.id"
NO_WORKER_GROUPS = "none"

RAY_NODE_MEM_USED = "ray_node_mem_used"
RAY_NODE_MEM_TOTAL = "ray_node_mem_total"

USED_KEY = registry_key(RL_HOST_MEMORY_USED_METRIC)
TOTAL_KEY = registry_key(RL_HOST_MEMORY_TOTAL_METRIC)

#: The raylet series read from each payload, and the registry key each is filed under.
SERIES_BY_RAY_NAME: dict[str, str] = {
    RAY_NODE_MEM_USED: USED_KEY,
    RAY_NODE_MEM_TOTAL: TOTAL_KEY,
}

#: Name of the logger every host-memory module writes to, so that one logger
#: configuration (and one ``caplog`` filter) covers them all.
LOGGER_NAME = "raylens.telemetry.host_memory"
