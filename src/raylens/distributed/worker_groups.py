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

This module holds what talks to Ray: the builder, the initializer actor, the group and
its futures, the options a worker actor is created with, and a few small Ray helpers.
The decisions that need no Ray (environment precedence, worker plans, tied groups,
data-parallel leaders, sharded routing, result selection) live in
:mod:`raylens.distributed.worker_planning`; the NVML probe that runs on a bundle lives
in :mod:`raylens.distributed.gpu_state`. Ray is imported only inside the functions that
talk to it, so this module imports where Ray is not installed.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from raylens.distributed import gpu_state
from raylens.distributed.gpu_state import _log_gpu_state_on_bundle as _log_gpu_state_on_bundle
from raylens.distributed.gpu_state import _remote_log_gpu_state
from raylens.distributed.named_sharding import NamedSharding
from raylens.distributed.worker_planning import (
    _DEFAULT_NAMES,
    DISTRIBUTED_ENV_VARS,
    DispatchLengthError,
    WorkerIndexError,
    _bundle_indices_from_workers_per_node,
    _check_dp_leader_worker_indices,
    _check_multiple_data_lengths,
    _check_no_kwarg_clash,
    _check_sharding_covers_workers,
    _checked_env_vars,
    _dp_shard_of_workers,
    _driver_env,
    _get_initializer_env_vars,
    _normalized_bundle_indices_list,
    _plan_sharded_calls,
    _plan_workers,
    _rank0_only_workers,
    _select_results,
    _slice_sharded,
    _tied_groups,
    _worker_env_vars,
)
from raylens.lens import warn_once
from raylens.telemetry.host_memory import NO_WORKER_GROUPS

if TYPE_CHECKING:
    from raylens.distributed.virtual_cluster import RayVirtualCluster

__all__ = [
    "DISTRIBUTED_ENV_VARS",
    "DispatchLengthError",
    "MultiWorkerFuture",
    "RayWorkerBuilder",
    "RayWorkerGroup",
    "WorkerIndexError",
    "reset_remote_function_cache",
]

_LOGGER = logging.getLogger("raylens.distributed")

# A worker that was told to die is expected to be reported dead by Ray within this.
_DEATH_WAIT_S = 30.0
# Graceful exit after a successful cleanup, when no shutdown timeout bounds it.
_GRACEFUL_EXIT_S = 30.0

# Ray remote definitions (the initializer's actor class), built once on first use:
# decorating inside a method would register a new remote definition with the GCS on
# every call.
_REMOTE: dict[str, Any] = {}


def reset_remote_function_cache() -> None:
    """Forget the Ray remote definitions built for worker groups; they are rebuilt on next use.

    Covers the initializer actor class kept here and the GPU probe kept by
    :mod:`raylens.distributed.gpu_state`.
    """
    _REMOTE.clear()
    gpu_state.reset_remote_function_cache()


# =========================================================================================
# Worker construction options (run inside the initializer actor)
# =========================================================================================


_MAIN_MODULE_HELP = (
    "{fqn!r}: the worker class is defined in the driver's __main__ script, which the Ray "
    "workers cannot import (their __main__ is Ray's own). Make the class importable by "
    "the workers: move it into a module and pass 'module.ClassName' (with that module "
    "on their path, for example runtime_env={{'working_dir': '.'}} in ray.init), or pass "
    "the class object itself to RayWorkerBuilder instead of its name"
)


def _class_label(target: Any) -> str:
    """The dotted name of a worker class given by path or as a class object."""
    if isinstance(target, str):
        return target
    metadata = getattr(target, "__ray_metadata__", None)
    cls = getattr(metadata, "modified_class", None) or target
    module = getattr(cls, "__module__", None) or "?"
    name = getattr(metadata, "class_name", None) or getattr(cls, "__qualname__", repr(cls))
    return f"{module}.{name}"


def _import_by_fqn(fqn: str) -> Any:
    """The object a dotted path names: ``package.module.Class`` or ``module.Outer.Inner``."""
    if not isinstance(fqn, str) or "." not in fqn:
        raise ValueError(
            f"expected a fully qualified name such as 'package.module.WorkerClass', got {fqn!r}"
        )
    parts = fqn.split(".")
    for split in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:split])
        try:
            target = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            missing = error.name or ""
            if not (module_name == missing or module_name.startswith(missing + ".")):
                raise  # the module exists but one of its own imports is missing
            continue
        for attribute in parts[split:]:
            try:
                target = getattr(target, attribute)
            except AttributeError:
                if module_name == "__main__":
                    raise ImportError(_MAIN_MODULE_HELP.format(fqn=fqn)) from None
                raise ImportError(
                    f"{fqn!r}: module {module_name!r} has no attribute path "
                    f"{'.'.join(parts[split:])!r}"
                ) from None
        return target
    raise ImportError(f"{fqn!r}: no importable module found in this path")


_Configured = tuple[dict[str, Any], dict[str, str], dict[str, Any], dict[str, Any]]


def _call_configure_worker(
    worker_class: Any,
    num_gpus: float | int,
    bundle_indices: tuple[int, list[int]] | None,
    num_gpus_per_node: int | None,
) -> _Configured | None:
    """Ask the worker class for its settings; None when it defines no ``configure_worker``.

    ``configure_worker`` is a static method of the worker class::

        @staticmethod
        def configure_worker(num_gpus, bundle_indices=None, num_gpus_per_node=None):
            return resources, env_vars, init_kwargs, runtime_env_overrides

    ``resources`` holds Ray actor options (``num_gpus``, ``num_cpus``, ``memory``,
    ``resources``...), ``env_vars`` extra environment for the worker, ``init_kwargs``
    extra constructor keyword arguments and ``runtime_env_overrides`` entries merged
    into the actor's ``runtime_env``; any of them may be None, and the fourth may be
    left out (a three-item tuple). ``num_gpus_per_node`` is passed only to a method
    whose signature accepts it.
    """
    configure = getattr(worker_class, "configure_worker", None)
    if configure is None:
        return None
    kwargs: dict[str, Any] = {"num_gpus": num_gpus, "bundle_indices": bundle_indices}
    try:
        parameters = inspect.signature(configure).parameters
    except (TypeError, ValueError):
        parameters = {}
    if "num_gpus_per_node" in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
    ):
        kwargs["num_gpus_per_node"] = num_gpus_per_node
    returned = configure(**kwargs)
    if not (isinstance(returned, tuple) and len(returned) in (3, 4)):
        raise TypeError(
            f"{getattr(worker_class, '__name__', worker_class)}.configure_worker must return "
            f"(resources, env_vars, init_kwargs, runtime_env_overrides) or its first three "
            f"items, got {returned!r}"
        )
    labels = ("resources", "env_vars", "init_kwargs", "runtime_env_overrides")
    parts = [*returned, None][:4]
    for label, part in zip(labels, parts):
        if part is not None and not isinstance(part, Mapping):
            raise TypeError(f"configure_worker returned {label}={part!r}; expected a dict or None")
    resources, env_vars, init_kwargs, overrides = (dict(part or {}) for part in parts)
    return resources, env_vars, init_kwargs, overrides


def _merged_runtime_env(
    default_options: Mapping[str, Any] | None, extra_options: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, str]]:
    """``(runtime_env, env_vars)`` of the decorator's options overlaid by the caller's.

    Ray's ``.options()`` replaces a ``runtime_env`` given in ``@ray.remote(...)`` as a
    whole; merging here keeps the decorator's entries (and its environment variables)
    that the caller does not set.
    """
    decorated = dict((default_options or {}).get("runtime_env") or {})
    given = dict(extra_options.get("runtime_env") or {})
    env_vars = {**dict(decorated.get("env_vars") or {}), **dict(given.get("env_vars") or {})}
    runtime_env = {**decorated, **given}
    runtime_env.pop("env_vars", None)
    return runtime_env, env_vars


def _apply_worker_configuration(
    extra_options: Mapping[str, Any],
    num_gpus: float | int,
    init_kwargs: Mapping[str, Any],
    configured: _Configured | tuple[Any, ...] | None,
    scheduling_strategy: Any,
    default_options: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """Merge actor options, lowest precedence first, and say what was overridden.

    0. the options of the worker class's ``@ray.remote(...)`` decorator
       (``default_options``): Ray applies them itself, except ``runtime_env``, which
       is merged here entry by entry;
    1. the caller's ``extra_options`` (and ``num_gpus``);
    2. what the worker class's ``configure_worker`` returned, which may override the
       caller, with a message for every value it changes;
    3. the scheduling strategy that pins the worker to its bundle, which always wins.

    Returns ``(actor options, constructor kwargs, override messages)``; the inputs are
    not modified.
    """
    options = dict(extra_options)
    runtime_env, env_vars = _merged_runtime_env(default_options, extra_options)
    kwargs = dict(init_kwargs)
    options["num_gpus"] = num_gpus
    messages: list[str] = []
    if configured is not None:
        resources, configured_env, configured_kwargs, overrides = (*configured, {})[:4]
        for key, value in resources.items():
            if key in options and options[key] != value:
                messages.append(
                    f"configure_worker sets actor option {key}={value!r} over {options[key]!r}"
                )
            options[key] = value
        overridden_env = dict(overrides.get("env_vars") or {})
        for key, value in {**configured_env, **overridden_env}.items():
            if key in env_vars and env_vars[key] != value:
                messages.append(
                    f"configure_worker sets environment variable {key}={value!r} over "
                    f"{env_vars[key]!r}"
                )
            env_vars[key] = value
        for key, value in overrides.items():
            if key == "env_vars":
                continue
            if key in runtime_env and runtime_env[key] != value:
                messages.append(
                    f"configure_worker sets runtime_env[{key!r}]={value!r} over "
                    f"{runtime_env[key]!r}"
                )
            runtime_env[key] = value
        for key, value in configured_kwargs.items():
            if key in kwargs:
                messages.append(f"configure_worker sets constructor argument {key!r}")
            kwargs[key] = value
    if env_vars or runtime_env or "runtime_env" in options:
        runtime_env["env_vars"] = env_vars
        options["runtime_env"] = runtime_env
    if (
        "scheduling_strategy" in options
        and options["scheduling_strategy"] is not scheduling_strategy
    ):
        messages.append(
            "the worker is pinned to its bundle; the given scheduling_strategy is ignored"
        )
    options["scheduling_strategy"] = scheduling_strategy
    return options, kwargs, messages


# =========================================================================================
# Ray-facing classes
# =========================================================================================


@dataclass
class MultiWorkerFuture:
    """The futures of one dispatch, and which workers they came from.

    ``futures[i]`` is the result of the call on worker ``called_workers[i]``.
    ``return_from_workers`` lists the workers whose results the caller wants (None:
    all). Either list may be None when unknown.
    """

    futures: list[Any]
    return_from_workers: list[int] | None = None
    called_workers: list[int] | None = None

    def get_results(
        self, worker_group: RayWorkerGroup, return_generators_as_proxies: bool = False
    ) -> list[Any]:
        """Wait for every future and return the wanted results, one per tied group.

        Results are those of ``return_from_workers`` (in that order), keeping only the
        first worker of each tied group according to
        ``worker_group.worker_to_tied_group_index``. Every future is waited on,
        including those whose result is dropped, so errors anywhere surface here.

        Futures that are ``ObjectRefGenerator`` objects (a streaming method) are returned
        as they are with ``return_generators_as_proxies``, and selected like any
        result. Without it, the call returns one flat list of every item every called
        worker yielded, worker by worker in call order, as NeMo-RL's streaming mode
        does; no selection applies then.
        """
        ray = _ray()
        if not return_generators_as_proxies and any(
            isinstance(future, ray.ObjectRefGenerator) for future in self.futures
        ):
            flat: list[Any] = []
            for future in self.futures:
                if isinstance(future, ray.ObjectRefGenerator):
                    flat.extend(ray.get(item) for item in future)
                else:
                    flat.append(ray.get(future))
            return flat

        values: list[Any] = [None] * len(self.futures)
        plain: list[int] = []
        for position, future in enumerate(self.futures):
            if isinstance(future, ray.ObjectRefGenerator):
                values[position] = future  # only reached with return_generators_as_proxies
            else:
                plain.append(position)
        if plain:
            fetched = ray.get([self.futures[position] for position in plain])
            for position, value in zip(plain, fetched):
                values[position] = value
        mapping = getattr(worker_group, "worker_to_tied_group_index", None) or {}
        return _select_results(values, self.called_workers, self.return_from_workers, mapping)


class RayWorkerBuilder:
    """Creates worker actors of one class, with fixed constructor arguments.

    ``ray_actor_class_fqn`` names the worker class by import path (a ``@ray.remote``
    class or a plain one, which is made remote). ``args`` and ``kwargs`` are passed to
    its constructor. Workers are created by an :class:`IsolatedWorkerInitializer`
    actor, which imports the class in the worker's environment and owns the worker.
    """

    class IsolatedWorkerInitializer:
        """Imports a worker class in the worker's environment and creates workers of it.

        Runs as a Ray actor (made remote on first use). It owns every worker it
        creates, so those workers live exactly as long as it does: keep its handle
        for as long as the workers are needed, and kill it after them.
        """

        def __init__(
            self, ray_actor_class_fqn: str | type | Any, *init_args: Any, **init_kwargs: Any
        ) -> None:
            self._target = ray_actor_class_fqn
            self.ray_actor_class_fqn = _class_label(ray_actor_class_fqn)
            self.init_args = init_args
            self.init_kwargs = init_kwargs
            self._workers: list[Any] = []

        def _worker_class(self) -> Any:
            """The worker class: imported by path here, or the class object given."""
            if isinstance(self._target, str):
                return _import_by_fqn(self._target)
            return self._target

        def create_worker(
            self,
            placement_group: Any,
            placement_group_bundle_index: int,
            num_gpus: float | int,
            bundle_indices: tuple[int, list[int]] | None = None,
            num_gpus_per_node: int | None = None,
            **extra_options: Any,
        ) -> Any:
            """Create one worker on a bundle and return its actor handle.

            Actor options, lowest precedence first: ``extra_options`` from the caller;
            what the worker class's ``configure_worker`` returns (each value it
            changes is logged as a warning); the scheduling strategy that pins the
            worker to ``placement_group_bundle_index``. ``num_gpus_per_node`` is handed
            to ``configure_worker`` so it can map a bundle to a node-local index.
            """
            import ray
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            worker_class = self._worker_class()
            default_options: dict[str, Any] = {}
            if hasattr(worker_class, "options"):
                default_options = dict(getattr(worker_class, "_default_options", None) or {})
            else:
                worker_class = ray.remote(worker_class)
            configured = _call_configure_worker(
                worker_class, num_gpus, bundle_indices, num_gpus_per_node
            )
            strategy = PlacementGroupSchedulingStrategy(
                placement_group=placement_group,
                placement_group_bundle_index=placement_group_bundle_index,
                placement_group_capture_child_tasks=True,
            )
            options, kwargs, messages = _apply_worker_configuration(
                extra_options, num_gpus, self.init_kwargs, configured, strategy, default_options
            )
            for message in messages:
                _LOGGER.warning("%s: %s", self.ray_actor_class_fqn, message)
            worker = worker_class.options(**options).remote(*self.init_args, **kwargs)
            self._workers.append(worker)
            return worker

    def __init__(self, ray_actor_class_fqn: str | type | Any, *args: Any, **kwargs: Any) -> None:
        is_class = isinstance(ray_actor_class_fqn, type) or hasattr(
            ray_actor_class_fqn, "__ray_metadata__"
        )
        if not is_class and (
            not isinstance(ray_actor_class_fqn, str) or "." not in ray_actor_class_fqn
        ):
            raise ValueError(
                "ray_actor_class_fqn must be the import path of the worker class, such as "
                f"'package.module.Worker', or the class itself, got {ray_actor_class_fqn!r}"
            )
        self._target = ray_actor_class_fqn
        self.ray_actor_class_fqn = _class_label(ray_actor_class_fqn)
        self.args = args
        self.kwargs = kwargs
        # Initializers of workers created through __call__, kept so those workers live.
        self._call_initializers: list[Any] = []

    @staticmethod
    def _initializer_class() -> Any:
        remote = _REMOTE.get("initializer")
        if remote is None:
            import ray

            remote = ray.remote(num_cpus=0, num_gpus=0)(RayWorkerBuilder.IsolatedWorkerInitializer)
            _REMOTE["initializer"] = remote
        return remote

    def _create_initializer(
        self, placement_group: Any, placement_group_bundle_index: int, env_vars: dict[str, str]
    ) -> Any:
        """Start an initializer beside ``placement_group``'s bundle with ``env_vars``."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        options: dict[str, Any] = {
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=placement_group,
                placement_group_bundle_index=placement_group_bundle_index,
            )
        }
        if env_vars:
            options["runtime_env"] = {"env_vars": dict(env_vars)}
        return (
            self._initializer_class()
            .options(**options)
            .remote(self._target, *self.args, **self.kwargs)
        )

    @staticmethod
    def _submit_worker(
        initializer: Any,
        placement_group: Any,
        placement_group_bundle_index: int,
        num_gpus: float | int,
        bundle_indices: tuple[int, list[int]] | None,
        num_gpus_per_node: int | None,
        extra_options: Mapping[str, Any],
    ) -> Any:
        return initializer.create_worker.remote(
            placement_group,
            placement_group_bundle_index,
            num_gpus,
            bundle_indices,
            num_gpus_per_node,
            **extra_options,
        )

    def create_worker_async(
        self,
        placement_group: Any,
        placement_group_bundle_index: int,
        num_gpus: float | int,
        bundle_indices: tuple[int, list[int]] | None = None,
        **extra_options: Any,
    ) -> tuple[Any, Any]:
        """Start creating a worker; return ``(worker_future, initializer_actor)`` at once.

        ``ray.get(worker_future)`` gives the worker's handle. The initializer owns the
        worker: keep its handle as long as the worker is needed. ``extra_options`` are
        Ray actor options; a ``num_gpus_per_node`` entry among them is not an actor
        option but is passed on to the worker class's ``configure_worker``.
        """
        num_gpus_per_node = extra_options.pop("num_gpus_per_node", None)
        env_vars = dict((extra_options.get("runtime_env") or {}).get("env_vars") or {})
        initializer = self._create_initializer(
            placement_group, placement_group_bundle_index, _get_initializer_env_vars(env_vars)
        )
        future = self._submit_worker(
            initializer,
            placement_group,
            placement_group_bundle_index,
            num_gpus,
            bundle_indices,
            num_gpus_per_node,
            extra_options,
        )
        return future, initializer

    def __call__(
        self,
        placement_group: Any,
        placement_group_bundle_index: int,
        num_gpus: float | int,
        bundle_indices: tuple[int, list[int]] | None = None,
        **extra_options: Any,
    ) -> Any:
        """Create a worker and return its handle once Ray has accepted it.

        Same options and precedence as :meth:`IsolatedWorkerInitializer.create_worker`.
        The builder keeps the worker's initializer alive for as long as the builder
        exists.
        """
        import ray

        future, initializer = self.create_worker_async(
            placement_group, placement_group_bundle_index, num_gpus, bundle_indices, **extra_options
        )
        worker = ray.get(future)
        self._call_initializers.append(initializer)
        return worker


@dataclass
class _CreationRecord:
    """Everything needed to replay the creation of one worker."""

    placement_group: Any
    bundle_index: int
    num_gpus: float | int
    bundle_indices: tuple[int, list[int]] | None
    extra_options: dict[str, Any]
    initializer_key: str


class RayWorkerGroup:
    """A group of worker actors on a virtual cluster's bundles, dispatched to as one.

    ``workers_per_node`` (ignored when ``bundle_indices_list`` is given) asks for one
    worker per bundle (None), that many per node (int), or a count per node (list);
    each such worker is a tied group of its own. ``bundle_indices_list`` lists tied
    groups explicitly as ``(node_idx, [local bundle indices])``: all workers of a
    group serve the same data, and the first is the group's leader. A local index past
    the end of its node continues on the following nodes.

    Each worker gets ``RANK`` (its index in the group), ``WORLD_SIZE``, ``LOCAL_RANK``
    (its bundle's index on its logical node), ``NODE_RANK`` (that node's index),
    ``MASTER_ADDR`` and ``MASTER_PORT`` (from the cluster). Environment precedence,
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
        self._initializers: dict[str, Any] = {}
        self._initializer_sites: dict[str, tuple[Any, int, dict[str, str]]] = {}
        self._placement_registered = False
        self._default_name = not name_prefix
        self.name_prefix = name_prefix or _DEFAULT_NAMES.take(remote_worker_builder)
        self.master_address: str | None = None
        self.master_port: int | None = None
        try:
            self._create_workers_from_bundle_indices(
                remote_worker_builder, indices, self._group_env
            )
        except BaseException:
            self._release_default_name()
            raise

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
        ray = _ray()

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
                    remote_worker_builder, group, bundle_index, _get_initializer_env_vars(env)
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
        except BaseException:
            self._kill_initializers()
            raise
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
        self, builder: RayWorkerBuilder, group: Any, bundle_index: int, env: dict[str, str]
    ) -> str:
        """Key of this group's initializer for ``group``, created at first need."""
        key = group.id.hex()
        if key not in self._initializers:
            self._initializers[key] = builder._create_initializer(group, bundle_index, env)
            self._initializer_sites[key] = (group, bundle_index, env)
        return key

    def _submit(self, builder: RayWorkerBuilder, record: _CreationRecord) -> Any:
        return builder._submit_worker(
            self._initializers[record.initializer_key],
            record.placement_group,
            record.bundle_index,
            record.num_gpus,
            record.bundle_indices,
            self.cluster.num_gpus_per_node,
            record.extra_options,
        )

    def _register_placement(self) -> None:
        bundles = [(record.placement_group, record.bundle_index) for record in self._records]
        try:
            from raylens.telemetry.host_memory import register_worker_group_placement

            register_worker_group_placement(self.name_prefix, bundles)
            self._placement_registered = True
        except Exception:
            warn_once(
                f"worker_groups.register.{self.name_prefix}",
                f"worker group {self.name_prefix!r}: could not register its placement for "
                "host-memory labels",
                logger=_LOGGER,
            )

    def _forget_placement(self) -> None:
        try:
            from raylens.telemetry.host_memory import forget_worker_group_nodes

            forget_worker_group_nodes(self.name_prefix)
        except Exception:
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

    def get_dp_leader_worker_idx(self, dp_shard_idx: int) -> int:
        """The worker that owns data-parallel shard ``dp_shard_idx``."""
        if (
            isinstance(dp_shard_idx, bool)
            or not isinstance(dp_shard_idx, int)
            or not (0 <= dp_shard_idx < len(self._dp_leaders))
        ):
            raise WorkerIndexError(
                f"dp_shard_idx={dp_shard_idx!r} is out of range; this group has "
                f"{len(self._dp_leaders)} DP shards (0..{len(self._dp_leaders) - 1})"
            )
        return self._dp_leaders[dp_shard_idx]

    def _check_worker_idx(self, worker_idx: int) -> None:
        if (
            isinstance(worker_idx, bool)
            or not isinstance(worker_idx, int)
            or not (0 <= worker_idx < len(self._workers))
        ):
            raise WorkerIndexError(
                f"worker_idx={worker_idx!r} is out of range; this group has "
                f"{len(self._workers)} workers"
            )

    # ---- dispatch -------------------------------------------------------------------

    def run_single_worker_single_data(
        self, method_name: str, worker_idx: int, *args: Any, **kwargs: Any
    ) -> Any:
        """Call ``method_name(*args, **kwargs)`` on worker ``worker_idx``; return its future."""
        self._check_worker_idx(worker_idx)
        return getattr(self._workers[worker_idx], method_name).remote(*args, **kwargs)

    def run_all_workers_single_data(
        self,
        method_name: str,
        *args: Any,
        run_rank_0_only_axes: list[str] | None = None,
        **kwargs: Any,
    ) -> list[Any]:
        """Call ``method_name`` with the same arguments on every worker; return the futures.

        With ``run_rank_0_only_axes``, only workers at index 0 of each of those axes are
        called. Arguments are stored in the object store once and shared.
        """
        selected = _rank0_only_workers(
            self.sharding_annotations, len(self._workers), run_rank_0_only_axes
        )
        if len(selected) > 1:
            args, kwargs = _put_once(args, kwargs)
        return [getattr(self._workers[i], method_name).remote(*args, **kwargs) for i in selected]

    def run_all_workers_multiple_data(
        self,
        method_name: str,
        *args: Any,
        run_rank_0_only_axes: list[str] | None = None,
        common_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> list[Any]:
        """Call ``method_name`` on every worker with that worker's entry of each argument.

        Every positional and keyword argument is a list with one entry per *called*
        worker, in the order the workers are called: every worker by rank, or with
        ``run_rank_0_only_axes`` only those at index 0 of each of those axes (so
        NeMo-RL's one entry per data-parallel shard). A list of another length raises
        :class:`DispatchLengthError` (an ``AssertionError``). ``common_kwargs`` go to
        every called worker, stored once.
        """
        common_kwargs = dict(common_kwargs or {})
        _check_no_kwarg_clash(common_kwargs, kwargs)
        selected = _rank0_only_workers(
            self.sharding_annotations, len(self._workers), run_rank_0_only_axes
        )
        _check_multiple_data_lengths(args, kwargs, len(selected))
        if len(selected) > 1:
            _, common_kwargs = _put_once((), common_kwargs)
        futures = []
        for position, worker_idx in enumerate(selected):
            worker_args = [arg[position] for arg in args]
            worker_kwargs = {key: value[position] for key, value in kwargs.items()}
            futures.append(
                getattr(self._workers[worker_idx], method_name).remote(
                    *worker_args, **worker_kwargs, **common_kwargs
                )
            )
        return futures

    def run_all_workers_sharded_data(
        self,
        method_name: str,
        *args: Any,
        in_sharded_axes: list[str] | None = None,
        replicate_on_axes: list[str] | None = None,
        output_is_replicated: list[str] | None = None,
        make_dummy_calls_to_free_axes: bool = False,
        common_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> MultiWorkerFuture:
        """Call ``method_name`` on the workers, each with its slice of sharded data.

        Positional and keyword arguments are nested lists indexed by the worker's
        coordinate along each axis of ``in_sharded_axes``, in that order. Along
        ``replicate_on_axes`` every index gets the same slice. On the remaining (free)
        axes only index 0 is called, unless ``make_dummy_calls_to_free_axes``, in
        which case the others are called with None for every argument. Results come
        back only from index 0 of free axes and of ``output_is_replicated`` axes.
        ``common_kwargs`` go to every call. A slice that several workers receive is
        stored in the object store once.
        """
        sharding = self.sharding_annotations
        if sharding is None:
            raise ValueError(
                f"worker group {self.name_prefix!r} has no sharding_annotations; sharded "
                "dispatch needs them"
            )
        common_kwargs = dict(common_kwargs or {})
        _check_no_kwarg_clash(common_kwargs, kwargs)
        calls, returned = _plan_sharded_calls(
            sharding,
            in_sharded_axes,
            replicate_on_axes,
            output_is_replicated,
            make_dummy_calls_to_free_axes,
        )
        axes = list(in_sharded_axes or [])
        receivers: dict[tuple[int, ...], int] = {}
        for call in calls:
            if call.data_coords is not None:
                receivers[call.data_coords] = receivers.get(call.data_coords, 0) + 1
        slices: dict[tuple[int, ...], tuple[tuple[Any, ...], dict[str, Any]]] = {}
        for coords, count in receivers.items():
            sliced_args = tuple(
                _slice_sharded(arg, axes, coords, sharding, f"argument {i}")
                for i, arg in enumerate(args)
            )
            sliced_kwargs = {
                key: _slice_sharded(value, axes, coords, sharding, f"keyword argument {key!r}")
                for key, value in kwargs.items()
            }
            if count > 1:
                sliced_args, sliced_kwargs = _put_once(sliced_args, sliced_kwargs)
            slices[coords] = (sliced_args, sliced_kwargs)
        if len(calls) > 1:
            _, common_kwargs = _put_once((), common_kwargs)
        futures = []
        for call in calls:
            if call.data_coords is None:
                call_args: tuple[Any, ...] = (None,) * len(args)
                call_kwargs: dict[str, Any] = dict.fromkeys(kwargs)
            else:
                call_args, call_kwargs = slices[call.data_coords]
            futures.append(
                getattr(self._workers[call.worker_idx], method_name).remote(
                    *call_args, **call_kwargs, **common_kwargs
                )
            )
        return MultiWorkerFuture(
            futures=futures,
            return_from_workers=returned,
            called_workers=[call.worker_idx for call in calls],
        )

    def get_all_worker_results(
        self, future_bundle: MultiWorkerFuture, return_generators_as_proxies: bool = False
    ) -> list[Any]:
        """The results of ``future_bundle``, selected as :meth:`MultiWorkerFuture.get_results`."""
        return future_bundle.get_results(self, return_generators_as_proxies)

    # ---- diagnostics and repair -----------------------------------------------------

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
        try:
            self._check_worker_idx(worker_idx)
            record = self._records[worker_idx]
            metadata = self._worker_metadata[worker_idx]
            prefix = f"[{label}] worker {worker_idx} ({metadata['name']})"
            # Submitting to Ray from a disconnected process would start a new local cluster.
            ray = _connected_ray()
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
                _remote_log_gpu_state()
                .options(scheduling_strategy=strategy)
                .remote(label, metadata["node_local_rank"])
            )
            ready, _ = ray.wait([ref], timeout=max(0.0, float(timeout_s)))
            if not ready:
                with contextlib.suppress(Exception):
                    ray.cancel(ref, force=True)
                print(
                    f"{prefix}: the GPU probe on its bundle (index {record.bundle_index}) did "
                    f"not finish within {timeout_s:g}s; the bundle could not be scheduled or "
                    "its node did not answer",
                    flush=True,
                )
                return
            ray.get(ref, timeout=max(1.0, float(timeout_s)))
        except Exception as error:
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
        ray = _connected_ray()
        if ray is None:
            raise RuntimeError(
                f"worker group {self.name_prefix!r}: cannot recreate worker {worker_idx}, this "
                "process is not connected to Ray (ray.init() was not called, or "
                "ray.shutdown() was)"
            )
        old = self._workers[worker_idx]
        try:
            ray.kill(old, no_restart=True)
        except Exception:
            warn_once(
                f"worker_groups.recreate.kill.{self.name_prefix}",
                f"worker group {self.name_prefix!r}: could not kill worker {worker_idx} "
                "before recreating it",
                logger=_LOGGER,
            )
        if not _wait_until_dead(old, _DEATH_WAIT_S):
            raise TimeoutError(
                f"worker group {self.name_prefix!r}: worker {worker_idx} was killed but Ray "
                f"did not report it dead within {_DEATH_WAIT_S:g}s; not recreating it"
            )
        record = self._records[worker_idx]
        initializer = self._initializers.get(record.initializer_key)
        if initializer is not None:
            try:
                new = ray.get(self._submit(self._builder, record))
            except ray.exceptions.RayActorError:
                new = None  # the initializer itself is gone: start a fresh one below
        else:
            new = None
        if new is None:
            group, bundle_index, env = self._initializer_sites[record.initializer_key]
            self._initializers[record.initializer_key] = self._builder._create_initializer(
                group, bundle_index, env
            )
            new = ray.get(self._submit(self._builder, record))
        ray.get(new.__ray_ready__.remote())
        self._workers[worker_idx] = new
        self._register_placement()
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
        if not self._workers and not self._initializers:
            if self._placement_registered:
                self._forget_placement()
            return True
        ok = True
        try:
            ray = _connected_ray()
            if ray is None:
                _LOGGER.warning(
                    "worker group %r: Ray is no longer connected; its workers ended with the "
                    "Ray job",
                    self.name_prefix,
                )
                ok = False
            else:
                ok = self._stop_workers(ray, cleanup_method, timeout, force)
        except Exception:
            _LOGGER.exception("worker group %r: shutdown failed", self.name_prefix)
            ok = False
        finally:
            self._workers = []
            self._worker_metadata = []
            self._records = []
            self._initializers = {}
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
                except Exception:
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
        outcomes = _await_calls(ray, [_submit_call(w, cleanup_method) for w in workers], timeout)
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
                ray, [_submit_call(w, "__ray_terminate__") for w in finished_cleanly], remaining
            )
        return ok

    def _kill_initializers(self, ray: Any = None) -> None:
        if ray is None:
            ray = _connected_ray()
        initializers = list(self._initializers.values())
        self._initializers = {}
        if ray is None:
            return
        for initializer in initializers:
            try:
                ray.kill(initializer, no_restart=True)
            except Exception:
                warn_once(
                    f"worker_groups.kill_initializer.{self.name_prefix}",
                    f"worker group {self.name_prefix!r}: could not kill an initializer actor",
                    logger=_LOGGER,
                )

    def __repr__(self) -> str:
        return (
            f"RayWorkerGroup(name_prefix={self.name_prefix!r}, workers={len(self._workers)}, "
            f"tied_groups={len(self.tied_workers_groups)}, dp_size={self.dp_size})"
        )


# =========================================================================================
# Small Ray utilities
# =========================================================================================


def _ray() -> Any:
    """The ray module: the connected one when there is one, else imported as is."""
    ray = _connected_ray()
    if ray is None:
        import ray
    return ray


def _connected_ray() -> Any:
    """The ray module when this process is connected to a cluster, else None."""
    from raylens.cluster import default_cluster_view

    if not default_cluster_view().is_initialized():
        return None
    import ray

    return ray


def _put_once(
    args: Sequence[Any], kwargs: Mapping[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Store every argument that is not already a Ray reference in the object store once.

    Top-level references are resolved by Ray before the method runs, so workers see
    the values while the data is serialized a single time.
    """
    if not args and not kwargs:
        return (), {}
    ray = _ray()

    def put(value: Any) -> Any:
        if isinstance(value, (ray.ObjectRef, ray.ObjectRefGenerator)):
            return value
        return ray.put(value)

    return tuple(put(arg) for arg in args), {key: put(value) for key, value in kwargs.items()}


def _submit_call(worker: Any, method_name: str) -> Any:
    """Submit ``worker.method_name()``; the submission error itself if that fails."""
    try:
        return getattr(worker, method_name).remote()
    except Exception as error:
        return error


def _await_calls(ray: Any, refs: list[Any], timeout: float | None) -> list[str]:
    """Wait for ``refs`` up to ``timeout`` seconds; say how each call ended.

    ``"ok"``, ``"died"`` (the actor is gone), ``"failed"`` (the method raised or could
    not be submitted) or ``"timed out"``.
    """
    pending = [ref for ref in refs if not isinstance(ref, Exception)]
    ready: set[Any] = set()
    if pending:
        done, _ = ray.wait(pending, num_returns=len(pending), timeout=timeout)
        ready = set(done)
    outcomes = []
    for ref in refs:
        if isinstance(ref, Exception):
            outcomes.append("failed")
        elif ref not in ready:
            outcomes.append("timed out")
        else:
            try:
                ray.get(ref, timeout=0)
                outcomes.append("ok")
            except ray.exceptions.RayActorError:
                outcomes.append("died")
            except Exception:
                outcomes.append("failed")
    return outcomes


def _wait_until_dead(worker: Any, timeout_s: float) -> bool:
    """Poll a killed actor until Ray reports it dead; False if still alive at the deadline."""
    import ray

    deadline = time.monotonic() + timeout_s
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        try:
            ray.get(worker.__ray_ready__.remote(), timeout=remaining)
        except ray.exceptions.RayActorError:
            return True
        except ray.exceptions.GetTimeoutError:
            return False
        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
