"""The public face of Ray worker groups: the names NeMo-RL code imports.

:class:`RayWorkerGroup` (``worker_group``) starts one actor per requested bundle of a
:class:`RayVirtualCluster`, through a :class:`RayWorkerBuilder` (``worker_builder``) and its
initializer actor, gives each worker the environment a distributed job expects, dispatches
calls to them (``_worker_dispatch``), rebuilds one in place and shuts them all down within a
bound; every decision that needs no Ray is in ``worker_planning``, every Ray call goes
through a :class:`RaySeam`. Each module's job is listed in ``docs/architecture.md``.

Ray is imported only inside the functions that talk to it, so this module imports where Ray
is not installed.
"""

from __future__ import annotations

from raylens.distributed import gpu_state
from raylens.distributed._worker_dispatch import MultiWorkerFuture
from raylens.distributed.gpu_state import _log_gpu_state_on_bundle as _log_gpu_state_on_bundle
from raylens.distributed.named_sharding import NamedSharding
from raylens.distributed.ray_seam import DEFAULT_RAY_SEAM, RaySeam, connected_ray
from raylens.distributed.worker_builder import (
    RayWorkerBuilder,
    _apply_worker_configuration,
    _call_configure_worker,
    _CreationRecord,
    _import_by_fqn,
)
from raylens.distributed.worker_group import RayWorkerGroup
from raylens.distributed.worker_planning import (
    DISTRIBUTED_ENV_VARS,
    DispatchLengthError,
    WorkerIndexError,
    _check_dp_leader_worker_indices,
    _get_initializer_env_vars,
)

__all__ = [
    "DEFAULT_RAY_SEAM",
    "DISTRIBUTED_ENV_VARS",
    "DispatchLengthError",
    "MultiWorkerFuture",
    "NamedSharding",
    "RaySeam",
    "RayWorkerBuilder",
    "RayWorkerGroup",
    "WorkerIndexError",
    "connected_ray",
    "reset_remote_function_cache",
]

# Names the specification documents for this module, kept importable from it.
_SPECIFIED_PRIVATE_NAMES = (
    _log_gpu_state_on_bundle,
    _check_dp_leader_worker_indices,
    _get_initializer_env_vars,
    _apply_worker_configuration,
    _call_configure_worker,
    _import_by_fqn,
    _CreationRecord,
)


def reset_remote_function_cache() -> None:
    """Forget the Ray remote definitions of the default seam; they are rebuilt on next use.

    Covers the initializer actor class, the GPU probe and the virtual cluster's
    address task.
    """
    gpu_state.reset_remote_function_cache()
