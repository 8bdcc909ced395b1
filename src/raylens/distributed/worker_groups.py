"""Groups of Ray actors placed on the bundles of a :class:`RayVirtualCluster`.

A :class:`RayWorkerGroup` starts one actor per requested bundle, gives each the
environment a distributed job expects (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``NODE_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), and dispatches method calls to them:
to one worker, to all with the same data, to all with per-worker data, or sharded over
the named axes of a :class:`NamedSharding`. It can rebuild one worker in place
(:meth:`RayWorkerGroup.recreate_worker`), probe the GPU a worker's bundle holds
(:meth:`RayWorkerGroup.log_worker_gpu_state`) and shut everything down within a bound
(:meth:`RayWorkerGroup.shutdown`).

Workers are not created by the driver but by a small intermediate actor,
:class:`RayWorkerBuilder.IsolatedWorkerInitializer`, which imports the worker class in
the worker's own environment and owns the workers it creates (they live exactly as long
as it does). A group uses one initializer per placement group.

Once its workers are ready, a group tells :mod:`raylens.telemetry.host_memory` which
bundles it holds, so host-memory points carry the group's name; shutdown withdraws it.

This module is the public face of that machinery; the code lives in focused modules:
:mod:`~raylens.distributed.worker_builder` (the builder, the initializer actor and the
options a worker is created with), :mod:`~raylens.distributed.worker_group` (the
group's life: creation, repair, shutdown), ``_worker_dispatch`` (calls and their
futures), :mod:`~raylens.distributed.worker_planning` (every decision that needs no
Ray), :mod:`~raylens.distributed.gpu_state` (the NVML probe run on a bundle) and
:mod:`~raylens.distributed.ray_seam` (the one way in to Ray, which a group or cluster
takes as ``ray_seam``). Ray is imported only inside the functions that talk to it, so
this module imports where Ray is not installed.
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
