"""The names worker_groups promises stay importable from it, wherever their code lives."""

from __future__ import annotations

from raylens.distributed import gpu_state, worker_groups, worker_planning


def test_worker_groups_exposes_its_documented_names() -> None:
    for name in ("MultiWorkerFuture", "RayWorkerBuilder", "RayWorkerGroup"):
        assert isinstance(getattr(worker_groups, name), type)
    assert worker_groups._log_gpu_state_on_bundle is gpu_state._log_gpu_state_on_bundle
    assert (
        worker_groups._check_dp_leader_worker_indices
        is worker_planning._check_dp_leader_worker_indices
    )
    assert worker_groups._get_initializer_env_vars is worker_planning._get_initializer_env_vars
    assert worker_groups.RayWorkerBuilder.IsolatedWorkerInitializer is not None


def test_worker_groups_keeps_the_names_its_callers_import() -> None:
    for name in worker_groups.__all__:
        assert hasattr(worker_groups, name), name
    for name in ("DispatchLengthError", "WorkerIndexError", "NamedSharding", "RaySeam"):
        assert name in worker_groups.__all__
    assert worker_groups.RayWorkerGroup.__module__ == "raylens.distributed.worker_group"
    assert worker_groups.RayWorkerBuilder.__module__ == "raylens.distributed.worker_builder"
