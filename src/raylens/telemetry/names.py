"""The names host memory is exported under, and the raylet series it reads.

Kept apart from the facade so that the private host-memory modules can share them
without importing :mod:`raylens.telemetry.host_memory`, which imports them.
"""

from __future__ import annotations

# The raylet's series, their keys and the error types live with the payload parser, which
# the helper process imports without lens; they are named here too for the facade's modules.

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

#: Name of the logger every host-memory module writes to, so that one logger
#: configuration (and one ``caplog`` filter) covers them all.
LOGGER_NAME = "raylens.telemetry.host_memory"
