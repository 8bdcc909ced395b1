"""Joining or starting Ray the way a NeMo-RL driver expects, and the names that go with it.

:func:`init_ray` first tries to join a running cluster. A cluster that a previous
:func:`init_ray` started locally carries a ``nrl_tag_<devices>`` resource naming the
``CUDA_VISIBLE_DEVICES`` it was started for (sorted, so ``2,0`` and ``0,2`` are one
set): the driver reuses it only when its own devices match, and otherwise disconnects
and starts a fresh local cluster with its own tag. A cluster without any such tag was
started by someone else (``ray start``, a Slurm script) and is always joined.

Ray is imported when :func:`init_ray` runs, and its functions are looked up on the
``ray`` module at call time.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, TypedDict

__all__ = ["PY_EXECUTABLES", "ClusterConfig", "init_ray"]

_LOGGER = logging.getLogger("raylens.distributed")

#: The prefix of the resource that marks a local cluster started by :func:`init_ray`.
_TAG_PREFIX = "nrl_tag_"
#: Environment of launchers (MPI, PMIx, Slurm) that must not reach Ray's actors.
_LAUNCHER_PREFIXES = ("PMIX_", "PMI_", "MPI_", "OMPI_", "SLURM_")


class _ClusterConfigRequired(TypedDict):
    gpus_per_node: int
    num_nodes: int


class ClusterConfig(_ClusterConfigRequired, total=False):
    """The ``cluster`` section of a NeMo-RL configuration.

    ``master_port_range_low``/``_high`` bound the band master and per-worker ports
    are chosen from, ``[low, high)``; ``segment_size`` is the number of nodes per
    NVLink-domain segment for topology-aware placement (None disables it).
    """

    master_port_range_low: int
    master_port_range_high: int
    segment_size: int | None


class PY_EXECUTABLES:
    """The interpreter to run workers with, per dependency set.

    NeMo-RL builds one virtual environment per set (``uv run --extra vllm`` and so
    on). raylens builds none: every set names the interpreter running the driver, so
    workers run in the environment the cluster already has.
    """

    SYSTEM = sys.executable
    BASE = sys.executable
    VLLM = sys.executable
    FSDP = sys.executable
    AUTOMODEL = sys.executable
    MCORE = sys.executable
    NEMO_GYM = sys.executable
    SGLANG = sys.executable
    TRTLLM = sys.executable


def _devices_tag() -> str:
    devices = os.environ.get("CUDA_VISIBLE_DEVICES", "ALL")
    return _TAG_PREFIX + "_".join(sorted(devices.split(",")))


def _forget_uploaded_packages() -> None:
    """Make the next connection upload ``working_dir`` again (Ray caches it per driver)."""
    try:
        import importlib

        import ray._private.runtime_env.packaging as packaging

        importlib.reload(packaging)
    except ImportError:  # a Ray without that module has nothing cached
        _LOGGER.debug("init_ray: no runtime_env package cache to clear", exc_info=True)


def init_ray(log_dir: str | None = None) -> None:
    """Join the running Ray cluster, or start a local one tagged with this driver's GPUs.

    Launcher variables (``PMIX_``, ``PMI_``, ``MPI_``, ``OMPI_``, ``SLURM_``) are
    removed from this process's environment first, and the rest of the environment
    becomes the job's ``runtime_env`` so every actor sees it. ``log_dir`` becomes
    Ray's temporary directory (logs included).
    """
    import ray

    for key in list(os.environ):
        if key.startswith(_LAUNCHER_PREFIXES):
            os.environ.pop(key, None)
    env_vars = dict(os.environ)
    env_vars.pop("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES", None)
    runtime_env: dict[str, Any] = {"env_vars": env_vars}
    temp_dir = os.path.abspath(log_dir) if log_dir else None
    tag = _devices_tag()
    try:
        ray.init(
            address="auto",
            log_to_driver=True,
            include_dashboard=False,
            runtime_env=runtime_env,
            _temp_dir=temp_dir,
        )
        resources = ray.cluster_resources()
        tags = [key for key in resources if str(key).startswith(_TAG_PREFIX)]
        if not tags:
            _LOGGER.info("init_ray: joined the running Ray cluster")
            return
        if tag in resources:
            _LOGGER.info("init_ray: joined the local cluster started for %s", tag)
            return
        _LOGGER.info(
            "init_ray: the local cluster was started for %s, this driver needs %s; "
            "starting a new one",
            tags[0],
            tag,
        )
        ray.shutdown()
        _forget_uploaded_packages()
    except ConnectionError:
        _LOGGER.debug("init_ray: no running Ray cluster; starting a local one")
        ray.shutdown()
    local_env = dict(runtime_env)
    local_env.pop("working_dir", None)
    ray.init(
        log_to_driver=True,
        include_dashboard=True,
        runtime_env=local_env,
        _temp_dir=temp_dir,
        resources={tag: 1},
    )
    _LOGGER.info("init_ray: started a local Ray cluster tagged %s", tag)
