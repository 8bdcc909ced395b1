"""Creating worker actors: the builder, the initializer actor, and the options they use.

A :class:`RayWorkerBuilder` names a worker class and its constructor arguments. Workers
are not created by the driver but by a small intermediate actor,
:class:`RayWorkerBuilder.IsolatedWorkerInitializer`, which imports the worker class in
the worker's own environment and owns the workers it creates (they live exactly as long
as it does).

The options a worker actor is created with are merged here, lowest precedence first:
the class's ``@ray.remote(...)`` options, the caller's options, what the class's
``configure_worker`` asks for, and the scheduling strategy that pins the worker to its
bundle. Ray is imported only inside the functions that talk to it.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from raylens.distributed.ray_seam import DEFAULT_RAY_SEAM, RaySeam
from raylens.distributed.worker_planning import _get_initializer_env_vars

__all__ = ["RayWorkerBuilder"]

_LOGGER = logging.getLogger("raylens.distributed")


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
    parameters: Mapping[str, inspect.Parameter]
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


def _override(
    target: dict[str, Any],
    updates: Mapping[str, Any],
    messages: list[str],
    describe: Callable[[str], str],
) -> None:
    """Write ``updates`` into ``target``, noting each value that replaces a different one."""
    for key, value in updates.items():
        if key in target and target[key] != value:
            messages.append(f"configure_worker sets {describe(key)}={value!r} over {target[key]!r}")
        target[key] = value


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
        _override(options, resources, messages, lambda key: f"actor option {key}")
        overridden_env = dict(overrides.get("env_vars") or {})
        _override(
            env_vars,
            {**configured_env, **overridden_env},
            messages,
            lambda key: f"environment variable {key}",
        )
        _override(
            runtime_env,
            {key: value for key, value in overrides.items() if key != "env_vars"},
            messages,
            lambda key: f"runtime_env[{key!r}]",
        )
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
    def _initializer_class(seam: RaySeam | None = None) -> Any:
        """The initializer's Ray actor class, built once per seam."""
        return (seam or DEFAULT_RAY_SEAM).remote(
            "initializer",
            lambda ray: ray.remote(num_cpus=0, num_gpus=0)(
                RayWorkerBuilder.IsolatedWorkerInitializer
            ),
        )

    def _create_initializer(
        self,
        placement_group: Any,
        placement_group_bundle_index: int,
        env_vars: dict[str, str],
        seam: RaySeam | None = None,
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
            self._initializer_class(seam)
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
    initializer_key: int
