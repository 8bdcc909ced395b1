"""Memory held by each worker group's processes on a node, read from procfs.

The public face of the group-memory package, three parts joined only by plain values:
:class:`GroupWorkerRegistry` (``_registry``; in the driver: each group's workers as
``(node id, pid, start_ticks)``), :class:`GroupMemoryReader` (``_reading``; on the node, in
a sampler: per group, the memory of the union of its workers' process trees, so a process
two trees share counts once) and :class:`GroupMemorySnapshot` (``_snapshot``; in the
driver: one cycle's readings, which the gauges read without I/O). How readings reach the
driver is in ``docs/architecture.md``; what the figures mean, in the README.

Invariants: the gauges are declared by :func:`register_group_memory_gauges`, never at
import; group names and hosts are made encodable when a snapshot is published; a node with
no reading in the latest cycle has no point, and a reading older than ``max_age`` is not
exported. :func:`reset_group_memory_state` clears :data:`DEFAULT_WORKER_REGISTRY` and
:data:`DEFAULT_SNAPSHOT`.
"""

from raylens.telemetry.group_memory._reading import (
    DEFAULT_MAX_PROCESSES,
    GoneWorker,
    GroupMemory,
    GroupMemoryReader,
    GroupWorker,
    NodeGroupMemory,
    PublishedReading,
    WorkerFate,
    as_group_worker,
)
from raylens.telemetry.group_memory._registry import (
    DEFAULT_WORKER_REGISTRY,
    GroupWorkerRegistry,
    forget_group_workers,
    own_process_identity,
    register_group_workers,
)
from raylens.telemetry.group_memory._snapshot import (
    DEFAULT_SNAPSHOT,
    GroupMemorySnapshot,
    register_group_memory_gauges,
    reset_group_memory_state,
)

__all__ = [
    "DEFAULT_MAX_PROCESSES",
    "DEFAULT_SNAPSHOT",
    "DEFAULT_WORKER_REGISTRY",
    "GoneWorker",
    "GroupMemory",
    "GroupMemoryReader",
    "GroupMemorySnapshot",
    "GroupWorker",
    "GroupWorkerRegistry",
    "NodeGroupMemory",
    "PublishedReading",
    "WorkerFate",
    "as_group_worker",
    "forget_group_workers",
    "own_process_identity",
    "register_group_memory_gauges",
    "register_group_workers",
    "reset_group_memory_state",
]
