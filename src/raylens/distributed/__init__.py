"""Ray worker groups, their placement, and the sharding of work across them.

:class:`RayVirtualCluster` reserves placement-group bundles, :class:`RayWorkerGroup`
starts actors on them and dispatches calls, and :class:`NamedSharding` names the axes
along which data is split between workers. Nothing here imports Ray until a cluster
or group actually talks to it.

Modules: ``virtual_cluster`` (bundles and their placement), ``worker_groups`` (the
public face of the group: ``worker_group`` for its life, ``worker_builder`` for how
its actors are created, ``_worker_dispatch`` for calls and futures),
``worker_planning`` (ranks, environments, data-parallel leaders and call routing,
decided without Ray), ``ray_seam`` (the one way in to Ray), ``gpu_state`` (the GPU
reading taken on a worker's node) and ``named_sharding`` (named axes over ranks).
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
