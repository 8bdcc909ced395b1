"""Ray worker groups, their placement, the sharding of work across them, and per-group memory.

:class:`RayVirtualCluster` reserves placement-group bundles, :class:`RayWorkerGroup` starts
actors on them and dispatches calls, and :class:`NamedSharding` names the axes along which
data is split between workers; the group-memory modules keep a sampler on each node that
holds a worker. Each module's job is listed in ``docs/architecture.md``. Nothing here
imports Ray until a cluster or group actually talks to it.
"""

from raylens.distributed.named_sharding import REPLICATED_AXES, NamedSharding, ShardingIndexError
from raylens.distributed.virtual_cluster import (
    PLACEMENT_STRATEGIES,
    ClusterResourceError,
    PlacementTimeoutError,
    RayVirtualCluster,
)
from raylens.distributed.worker_groups import (
    DISTRIBUTED_ENV_VARS,
    DispatchLengthError,
    MultiWorkerFuture,
    RayWorkerBuilder,
    RayWorkerGroup,
    WorkerIndexError,
)

__all__ = [
    "DISTRIBUTED_ENV_VARS",
    "PLACEMENT_STRATEGIES",
    "REPLICATED_AXES",
    "ClusterResourceError",
    "DispatchLengthError",
    "MultiWorkerFuture",
    "NamedSharding",
    "PlacementTimeoutError",
    "RayVirtualCluster",
    "RayWorkerBuilder",
    "RayWorkerGroup",
    "ShardingIndexError",
    "WorkerIndexError",
]
