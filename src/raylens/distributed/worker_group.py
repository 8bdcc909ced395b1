"""A group of Ray worker actors on a virtual cluster's bundles, started, repaired and
stopped as one.

:class:`RayWorkerGroup` plans its workers (:mod:`raylens.distributed.worker_planning`),
has them created by a :class:`~raylens.distributed.worker_builder.RayWorkerBuilder`,
gives each the environment a distributed job expects, and dispatches calls to them
(:mod:`raylens.distributed._worker_dispatch`). It can rebuild one worker in place, probe
the GPU a worker's bundle holds, and shut everything down within a bound. Once its
workers are ready it tells :mod:`raylens.telemetry.host_memory` which bundles it holds,
and the group-worker registry which processes its workers are; shutdown withdraws both. Every Ray call goes through the group's
:class:`~raylens.distributed.ray_seam.RaySeam`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from raylens.cluster import ray_call_errors
from raylens.distributed import gpu_state
from raylens.distributed._worker_dispatch import _WorkerDispatch
from raylens.distributed.group_memory_cycle import WorkerProcesses
from raylens.distributed.named_sharding import NamedSharding
from raylens.distributed.ray_seam import (
    DEFAULT_RAY_SEAM,
    RaySeam,
    _await_calls,
    _submit_call,
    _wait_until_dead,
)
from raylens.distributed.worker_builder import RayWorkerBuilder, _CreationRecord
from raylens.distributed.worker_planning import (
    _DEFAULT_NAMES,
    _bundle_indices_from_workers_per_node,
    _check_dp_leader_worker_indices,
    _check_sharding_covers_workers,
    _checked_env_vars,
    _dp_shard_of_workers,
    _driver_env,
    _get_initializer_env_vars,
    _normalized_bundle_indices_list,
    _plan_workers,
    _tied_groups,
    _worker_env_vars,
)
from raylens.lens import warn_once
from raylens.telemetry.host_memory import NO_WORKER_GROUPS

if TYPE_CHECKING:
    from raylens.distributed.virtual_cluster import RayVirtualCluster

__all__ = ["RayWorkerGroup"]

_LOGGER = logging.getLogger("raylens.distributed")

# A worker that was told to die is expected to be reported dead by Ray within this.
_DEATH_WAIT_S = 30.0
# Graceful exit after a successful cleanup, when no shutdown timeout bounds it.
_GRACEFUL_EXIT_S = 30.0


def _kill_or_warn_once(ray: Any, actor: Any, warning_key: str, warning: str) -> None:
    """``ray.kill(actor, no_restart=True)``; a failure is logged once under ``warning_key``."""
    try:
        ray.kill(actor, no_restart=True)
    except ray_call_errors(ray):
        warn_once(warning_key, warning, logger=_LOGGER)


class RayWorkerGroup(_WorkerDispatch):
    """A group of worker actors on a virtual cluster's bundles, dispatched to as one.

    ``workers_per_node`` (ignored when ``bundle_indices_list`` is given) asks for one
    worker per bundle (None), that many per node (int), or a count per node (list);
    each such worker is a tied group of its own. ``bundle_indices_list`` lists tied
    groups explicitly as ``(node_idx, [local bundle indices])``: all workers of a
    group serve the same data, and the first is the group's leader. A local index past
    the end of its node continues on the following nodes.

    Each worker gets ``RANK`` (its index in the group), ``WORLD_SIZE``, ``NODE_RANK``
    and ``LOCAL_RANK`` (its node and its bundle's index there, as
    :meth:`RayVirtualCluster.node_and_local_index` reports them), ``MASTER_ADDR`` and
    ``MASTER_PORT`` (from the cluster, also kept as :attr:`master_address` and
    :attr:`master_port`). Environment precedence,
    highest first: the worker class's ``configure_worker``, then those distributed
    variables, then ``env_vars``, then the driver's environment (less driver-only
    entries such as ``CUDA_VISIBLE_DEVICES``). ``env_vars`` is copied, never modified.

    ``sharding_annotations`` maps named axes to worker ranks for
    :meth:`run_all_workers_sharded_data` and the ``run_rank_0_only_axes`` filters; it
    must cover exactly the group's workers. ``dp_leader_worker_indices`` names the
    worker that owns each data-parallel shard; by default the leader of every tied
    group. It must be an ascending subset of the tied-group leaders.

    Every worker also gets ``RAYLENS_WORKER_GROUP`` and ``NRL_WORKER_GROUP`` (the
    group's name, which raylens' telemetry reports as the ``rl.worker_group`` resource
    attribute), and ``AVAILABLE_ADDR_LIST`` / ``AVAILABLE_PORT_LIST``: the string form
    of the list of every worker's node IP, and of one port free on that node for each.

    ``name_prefix`` names the workers' Ray actors and labels the group in host-memory
    telemetry. When empty, the group is named after its worker class (``EnvWorker``
    for ``pkg.mod.EnvWorker``), followed by ``-2``, ``-3``... while another group of
    this process already holds that name.
    """

    # How the group reaches Ray; set per instance from ``ray_seam`` or the cluster's.
    _seam: RaySeam = DEFAULT_RAY_SEAM
    # Whether name_prefix was handed out by _DEFAULT_NAMES and must be given back.
    _default_name = False
    _processes: WorkerProcesses | None = None  # for per-group memory, made when first needed

    def __init__(
        self,
        cluster: RayVirtualCluster,
        remote_worker_builder: RayWorkerBuilder,
        workers_per_node: int | list[int] | None = None,
        name_prefix: str = "",
        bundle_indices_list: list[tuple[int, list[int]]] | None = None,
        sharding_annotations: NamedSharding | None = None,
        env_vars: Mapping[str, str] | None = None,
        dp_leader_worker_indices: list[int] | None = None,
        *,
        ray_seam: RaySeam | None = None,
    ) -> None:
        if not isinstance(name_prefix, str) or "," in name_prefix:
            raise ValueError(
                f"name_prefix={name_prefix!r} must be a string without commas: it names the "
                "workers and labels the group in host-memory telemetry, which joins group "
                "names with commas"
            )
        if name_prefix == NO_WORKER_GROUPS:
            raise ValueError(
                f"name_prefix={name_prefix!r} is the host-memory label of a node with no worker "
                "group; choose another name"
            )
        self.cluster = cluster
        self._seam = ray_seam or getattr(cluster, "ray_seam", None) or DEFAULT_RAY_SEAM
        self._group_env = _checked_env_vars(env_vars)
        if bundle_indices_list is None:
            indices = _bundle_indices_from_workers_per_node(
                workers_per_node, cluster.bundle_ct_per_node_list
            )
        else:
            indices = _normalized_bundle_indices_list(bundle_indices_list)
        self._plans = _plan_workers(indices, cluster.node_and_local_index, name_prefix or "w")
        _check_sharding_covers_workers(sharding_annotations, len(self._plans))
        self.sharding_annotations = sharding_annotations
        self.tied_workers_groups, self.worker_to_tied_group_index = _tied_groups(self._plans)
        leaders = [group[0] for group in self.tied_workers_groups]
        if dp_leader_worker_indices is None:
            self._dp_leaders = leaders
        else:
            _check_dp_leader_worker_indices(dp_leader_worker_indices, leaders)
            self._dp_leaders = list(dp_leader_worker_indices)
        self._builder = remote_worker_builder
        self._workers: list[Any] = []
        self._worker_metadata: list[dict[str, Any]] = []
        self._records: list[_CreationRecord] = []
        # One initializer per logical node, shared by every tied group placed there.
        self._initializer_pool: dict[int, Any] = {}
        self._initializer_sites: dict[int, tuple[Any, int, dict[str, str]]] = {}
        self._placement_registered = False
        self._default_name = not name_prefix
        self.name_prefix = name_prefix or _DEFAULT_NAMES.take(remote_worker_builder)
        self.master_address: str | None = None
        self.master_port: int | None = None
        created = False
        try:
            self._create_workers_from_bundle_indices(
                remote_worker_builder, indices, self._group_env
            )
            created = True
        finally:
            if not created:
                self._release_default_name()

    def _release_default_name(self) -> None:
        if self._default_name:
            _DEFAULT_NAMES.release(self.name_prefix)
            self._default_name = False

    # ---- creation -------------------------------------------------------------------

    def _create_workers_from_bundle_indices(
        self,
        remote_worker_builder: RayWorkerBuilder,
        bundle_indices_list: list[tuple[int, list[int]]],
        env_vars: Mapping[str, str] | None = None,
    ) -> None:
        """Create the workers of ``bundle_indices_list``, one tied group per entry.

        Each entry is ``(node_idx, [local bundle indices])``; a tied group whose local
        indices run past its node's bundles continues on the following nodes, and
        ``node_idx`` is then the first of them. Returns once every worker's constructor
        has finished; on any failure the workers and initializers created so far are
        killed before the error propagates. ``env_vars`` is not modified.
        """
        normalized = _normalized_bundle_indices_list(bundle_indices_list)
        group_env = _checked_env_vars(env_vars)
        # Reserves the cluster's bundles, and fails clearly when Ray is not connected.
        master_address, master_port = self.cluster.get_master_address_and_port()
        # Planned once the bundles are placed: a unified group's node ranks come from
        # the Ray nodes its bundles landed on.
        plans = _plan_workers(normalized, self.cluster.node_and_local_index, self.name_prefix)
        ray = self._seam.ray()

        driver_env = _driver_env()
        num_gpus: float | int = (
            1 / self.cluster.max_colocated_worker_groups if self.cluster.use_gpus else 0
        )
        world_size = str(len(plans))
        locations = [
            self.cluster.get_bundle_location(plan.node_idx, plan.local_bundle_idx) for plan in plans
        ]
        available = self.cluster._addresses_and_ports(locations)
        shared = {
            "MASTER_ADDR": master_address,
            "MASTER_PORT": str(master_port),
            "RAYLENS_WORKER_GROUP": self.name_prefix,
            "NRL_WORKER_GROUP": self.name_prefix,
            "AVAILABLE_ADDR_LIST": str([address for address, _ in available]),
            "AVAILABLE_PORT_LIST": str([port for _, port in available]),
        }
        records: list[_CreationRecord] = []
        futures = []
        ready = False
        try:
            for plan, (group, bundle_index) in zip(plans, locations):
                env = _worker_env_vars(
                    driver_env,
                    group_env,
                    {
                        "RANK": str(plan.global_rank),
                        "WORLD_SIZE": world_size,
                        "LOCAL_RANK": str(plan.local_rank),
                        "NODE_RANK": str(plan.node_rank),
                        **shared,
                    },
                )
                key = self._initializer_for(
                    remote_worker_builder,
                    plan.node_idx,
                    group,
                    bundle_index,
                    _get_initializer_env_vars(env),
                )
                record = _CreationRecord(
                    placement_group=group,
                    bundle_index=bundle_index,
                    num_gpus=num_gpus,
                    bundle_indices=plan.bundle_indices,
                    extra_options={
                        "runtime_env": {"env_vars": env},
                        "name": plan.name,
                        "num_cpus": 1,
                    },
                    initializer_key=key,
                )
                records.append(record)
                futures.append(self._submit(remote_worker_builder, record))
            workers = ray.get(futures)
            ray.get([worker.__ray_ready__.remote() for worker in workers])
            ready = True
        finally:
            if not ready:
                self._kill_initializers()
        shards = _dp_shard_of_workers(len(plans), self._dp_leaders)
        self._builder = remote_worker_builder
        self._plans = plans
        self._records = records
        self._workers = list(workers)
        self.master_address = master_address
        self.master_port = int(master_port)
        self._worker_metadata = [
            {
                "name": plan.name,
                "global_rank": plan.global_rank,
                "node_idx": plan.node_idx,
                "node_rank": plan.node_rank,
                "local_rank": plan.member_idx,
                "node_local_rank": plan.local_rank,
                "bundle_indices": plan.bundle_indices,
                "tied_group_idx": plan.tied_group_idx,
                "member_idx": plan.member_idx,
                "dp_shard_idx": shards[plan.global_rank],
                "placement_group_bundle_index": record.bundle_index,
            }
            for plan, record in zip(plans, records)
        ]
        self._register_placement()

    def _initializer_for(
        self,
        builder: RayWorkerBuilder,
        node_idx: int,
        group: Any,
        bundle_index: int,
        env: dict[str, str],
    ) -> int:
        """Key of this group's initializer on logical node ``node_idx``, made at first need.

        Every tied group on that node shares it, so a group starts as many initializer
        actors as it has nodes, not workers; it runs beside the node's first bundle.
        """
        key = node_idx
        if key not in self._initializer_pool:
            self._initializer_pool[key] = builder._create_initializer(
                group, bundle_index, env, self._seam
            )
            self._initializer_sites[key] = (group, bundle_index, env)
        return key

    def _submit(self, builder: RayWorkerBuilder, record: _CreationRecord) -> Any:
        return builder._submit_worker(
            self._initializer_pool[record.initializer_key],
            record.placement_group,
            record.bundle_index,
            record.num_gpus,
            record.bundle_indices,
            self.cluster.num_gpus_per_node,
            record.extra_options,
        )

    def _register_placement(self, changed: list[int] | None = None) -> None:
        self._processes = self._processes or WorkerProcesses()
        self._processes.learn(self.name_prefix, self._seam.connected_ray(), self._workers, changed)
        bundles = [(record.placement_group, record.bundle_index) for record in self._records]
        try:
            from raylens.telemetry.host_memory import register_worker_group_placement

            register_worker_group_placement(self.name_prefix, bundles)
            self._placement_registered = True
        except (ImportError, ValueError, TypeError):  # what the never-raising facade may refuse
            warn_once(
                f"worker_groups.register.{self.name_prefix}",
                f"worker group {self.name_prefix!r}: could not register its placement for "
                "host-memory labels",
                logger=_LOGGER,
            )

    def _forget_placement(self) -> None:
        if self._processes is not None:
            self._processes.forget(self.name_prefix)
        try:
            from raylens.telemetry.host_memory import forget_worker_group_nodes

            forget_worker_group_nodes(self.name_prefix)
        except (ImportError, ValueError, TypeError):  # what the never-raising facade may refuse
            warn_once(
                f"worker_groups.forget.{self.name_prefix}",
                f"worker group {self.name_prefix!r}: could not withdraw its host-memory labels",
                logger=_LOGGER,
            )
        self._placement_registered = False

    # ---- description ----------------------------------------------------------------

    @property
    def workers(self) -> list[Any]:
        """The workers' actor handles, by rank: the group's own list, so assigning
        ``workers[i] = handle`` replaces a worker, as NeMo-RL allows."""
        return self._workers

    @property
    def worker_metadata(self) -> list[dict[str, Any]]:
        """Per worker: name, global_rank, node_idx, node_rank, local_rank (the index in
        its tied group), node_local_rank (its ``LOCAL_RANK``: the bundle's index on its
        node), bundle_indices, tied_group_idx, member_idx, dp_shard_idx and
        placement_group_bundle_index."""
        return [dict(metadata) for metadata in self._worker_metadata]

    @property
    def dp_size(self) -> int:
        """Number of data-parallel shards (one per DP leader)."""
        return len(self._dp_leaders)

    @property
    def dp_leader_worker_indices(self) -> list[int]:
        """The worker that owns each data-parallel shard, in shard order."""
        return list(self._dp_leaders)

    def log_worker_gpu_state(self, worker_idx: int, *, label: str, timeout_s: float = 30.0) -> None:
        """Print the state of the GPU held by worker ``worker_idx``'s bundle, from its node.

        Meant for the moment before a restart: whether the device is still occupied
        decides whether a replacement can start at all. The reading runs as a short
        task pinned to the worker's bundle (asking for no GPU, so it is not queued
        behind whatever holds it), because reading NVML here would describe the
        driver's node. The task prints on that node; Ray forwards the line to the
        driver's output. A node without GPUs is reported as such.

        Never raises and never waits more than ``timeout_s``: a probe that cannot be
        scheduled, times out or fails is itself printed as the finding.
        """
        prefix = f"[{label}] worker {worker_idx}"
        ray: Any = None
        try:
            self._check_worker_idx(worker_idx)
            record = self._records[worker_idx]
            metadata = self._worker_metadata[worker_idx]
            prefix = f"[{label}] worker {worker_idx} ({metadata['name']})"
            # Submitting to Ray from a disconnected process would start a new local cluster.
            ray = self._seam.connected_ray()
            if ray is None:
                print(
                    f"{prefix}: the GPU probe could not run: this process is not connected to Ray",
                    flush=True,
                )
                return
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            strategy = PlacementGroupSchedulingStrategy(
                placement_group=record.placement_group,
                placement_group_bundle_index=record.bundle_index,
            )
            ref = (
                gpu_state._remote_log_gpu_state(self._seam)
                .options(scheduling_strategy=strategy)
                .remote(label, metadata["node_local_rank"])
            )
            ready, _ = ray.wait([ref], timeout=max(0.0, float(timeout_s)))
            if not ready:
                with contextlib.suppress(*ray_call_errors(ray)):
                    ray.cancel(ref, force=True)
                print(
                    f"{prefix}: the GPU probe on its bundle (index {record.bundle_index}) did "
                    f"not finish within {timeout_s:g}s; the bundle could not be scheduled or "
                    "its node did not answer",
                    flush=True,
                )
                return
            ray.get(ref, timeout=max(1.0, float(timeout_s)))
        except ray_call_errors(ray, LookupError, ImportError) as error:
            print(f"{prefix}: the GPU probe could not run: {error}", flush=True)

    def recreate_worker(self, worker_idx: int) -> Any:
        """Rebuild worker ``worker_idx`` on its bundle by replaying the call that made it.

        Brings a dead or unresponsive worker back without touching the others. The old
        actor is killed first (without restart) and awaited until Ray reports it dead:
        its bundle stays reserved, so the replacement lands on the same resources once
        they are free, with the same environment, name and constructor arguments.
        Returns the new handle, also installed at ``workers[worker_idx]``, once its
        constructor has finished; the group's host-memory placement is registered
        again. Raises RuntimeError when this process is no longer connected to Ray.
        """
        self._check_worker_idx(worker_idx)
        # Ray's calls would otherwise start a new, empty local cluster to recreate into.
        ray = self._seam.connected_ray()
        if ray is None:
            raise RuntimeError(
                f"worker group {self.name_prefix!r}: cannot recreate worker {worker_idx}, this "
                "process is not connected to Ray (ray.init() was not called, or "
                "ray.shutdown() was)"
            )
        old = self._workers[worker_idx]
        _kill_or_warn_once(
            ray,
            old,
            f"worker_groups.recreate.kill.{self.name_prefix}",
            f"worker group {self.name_prefix!r}: could not kill worker {worker_idx} "
            "before recreating it",
        )
        if not _wait_until_dead(ray, old, _DEATH_WAIT_S):
            raise TimeoutError(
                f"worker group {self.name_prefix!r}: worker {worker_idx} was killed but Ray "
                f"did not report it dead within {_DEATH_WAIT_S:g}s; not recreating it"
            )
        record = self._records[worker_idx]
        initializer = self._initializer_pool.get(record.initializer_key)
        if initializer is not None:
            try:
                new = ray.get(self._submit(self._builder, record))
            except ray.exceptions.RayActorError:
                new = None  # the initializer itself is gone: start a fresh one below
        else:
            new = None
        if new is None:
            group, bundle_index, env = self._initializer_sites[record.initializer_key]
            self._initializer_pool[record.initializer_key] = self._builder._create_initializer(
                group, bundle_index, env, self._seam
            )
            new = ray.get(self._submit(self._builder, record))
        ray.get(new.__ray_ready__.remote())
        self._workers[worker_idx] = new
        self._register_placement([worker_idx])
        return new

    # ---- shutdown -------------------------------------------------------------------

    def shutdown(
        self,
        cleanup_method: str | None = None,
        timeout: float | None = 30.0,
        force: bool = False,
    ) -> bool:
        """Stop every worker; True when each one is gone and none failed its cleanup.

        With ``force``, or without ``cleanup_method``, every worker is killed at once
        (``cleanup_method`` is not called when ``force`` is set) and the result is True
        once every kill went through. Otherwise ``cleanup_method`` is called on every
        worker and awaited for at most ``timeout`` seconds (None: as long as it
        takes); workers whose cleanup succeeded are then asked to exit gracefully, and
        a worker that failed its cleanup or did not finish it in time makes the result
        False. A worker that was already dead counts as shut down. Whatever happened,
        every worker is killed in the end, then the initializers that owned them, and
        the group's host-memory placement is withdrawn. Calling it again returns True.
        """
        if not self._workers and not self._initializer_pool:
            if self._placement_registered:
                self._forget_placement()
            return True
        ok = True
        ray: Any = None
        try:
            ray = self._seam.connected_ray()
            if ray is None:
                _LOGGER.warning(
                    "worker group %r: Ray is no longer connected; its workers ended with the "
                    "Ray job",
                    self.name_prefix,
                )
                ok = False
            else:
                ok = self._stop_workers(ray, cleanup_method, timeout, force)
        except ray_call_errors(ray, ImportError):
            _LOGGER.exception("worker group %r: shutdown failed", self.name_prefix)
            ok = False
        finally:
            self._workers = []
            self._worker_metadata = []
            self._records = []
            self._initializer_pool = {}
            self._initializer_sites = {}
            self._forget_placement()
            self._release_default_name()
        return ok

    def _stop_workers(
        self, ray: Any, cleanup_method: str | None, timeout: float | None, force: bool
    ) -> bool:
        ok = True
        workers = list(self._workers)
        deadline = None if timeout is None else time.monotonic() + float(timeout)
        try:
            if cleanup_method is not None and not force:
                ok = self._clean_up_workers(ray, workers, cleanup_method, timeout, deadline)
        finally:
            for worker_idx, worker in enumerate(workers):
                try:
                    ray.kill(worker, no_restart=True)
                except ray_call_errors(ray):
                    ok = False
                    _LOGGER.warning(
                        "worker group %r: could not kill worker %d",
                        self.name_prefix,
                        worker_idx,
                        exc_info=True,
                    )
            self._kill_initializers(ray)
        return ok

    def _clean_up_workers(
        self,
        ray: Any,
        workers: list[Any],
        cleanup_method: str,
        timeout: float | None,
        deadline: float | None,
    ) -> bool:
        """Call ``cleanup_method`` everywhere, then let the workers that ran it exit."""
        ok = True
        finished_cleanly: list[Any] = []
        outcomes = _await_calls(
            ray, [_submit_call(ray, w, cleanup_method) for w in workers], timeout
        )
        for worker_idx, (worker, outcome) in enumerate(zip(workers, outcomes)):
            if outcome == "ok":
                finished_cleanly.append(worker)
            elif outcome == "died":
                _LOGGER.info(
                    "worker group %r: worker %d was already gone at %s()",
                    self.name_prefix,
                    worker_idx,
                    cleanup_method,
                )
            else:
                ok = False
                _LOGGER.warning(
                    "worker group %r: worker %d %s during %s()",
                    self.name_prefix,
                    worker_idx,
                    outcome,
                    cleanup_method,
                )
        if finished_cleanly:
            remaining = (
                _GRACEFUL_EXIT_S if deadline is None else max(0.0, deadline - time.monotonic())
            )
            _await_calls(
                ray,
                [_submit_call(ray, w, "__ray_terminate__") for w in finished_cleanly],
                remaining,
            )
        return ok

    def _kill_initializers(self, ray: Any = None) -> None:
        if ray is None:
            ray = self._seam.connected_ray()
        initializers = list(self._initializer_pool.values())
        self._initializer_pool = {}
        if ray is None:
            return
        for initializer in initializers:
            _kill_or_warn_once(
                ray,
                initializer,
                f"worker_groups.kill_initializer.{self.name_prefix}",
                f"worker group {self.name_prefix!r}: could not kill an initializer actor",
            )

    def __repr__(self) -> str:
        return (
            f"RayWorkerGroup(name_prefix={self.name_prefix!r}, workers={len(self._workers)}, "
            f"tied_groups={len(self.tied_workers_groups)}, dp_size={self.dp_size})"
        )
