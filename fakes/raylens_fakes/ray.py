"""An in-process stand-in for the ``ray`` module, for unit tests of raylens' Ray-facing code.

:class:`FakeRay` is an object shaped like the parts of ``ray`` that raylens' distributed
layer calls: ``remote`` (actor classes and functions, with ``.options(...).remote(...)``),
``get``, ``wait``, ``put``, ``kill``, ``cancel``, ``is_initialized``, ``exceptions``,
``get_runtime_context``, ``nodes`` (with ``node_resources`` and ``node_labels``),
``cluster_resources`` and ``util`` (placement groups, their table,
scheduling strategies). Nothing runs in another process: an actor is an instance of the
decorated class on a named node, and a method call runs when its result is first asked
for. Every effect is recorded (``actors``, ``killed``, ``submitted``, ``wait_timeouts``,
``get_timeouts``, ``cancelled``, ``placement_groups``) so tests can assert on it.

Tests script what Ray would do to them:

- ``actor.script("method", "hangs" | "died" | "raises" | "ok" | callable | exception)``
  decides how later calls of one method end; ``actor.hung = True`` makes every later call
  hang, ``actor.dead = True`` makes every later call fail as Ray's ``RayActorError`` does,
  ``actor.kill_error = True`` makes ``kill`` of it raise.
- ``hang_actors_on(node_id)`` makes actors started on that node hang from the start;
  ``actor_setup`` may adjust an actor's constructor arguments per node
  (:meth:`FakeRay.read_procfs` sets it so that each actor reads its own node's fake ``/proc``);
  ``on_submit`` and ``on_kill`` run for every method call and every kill.
- ``pending_placement = True`` leaves new placement groups unplaced (``ready()`` hangs).

Hand it to raylens through :meth:`FakeRay.seam` (a ``RaySeam`` whose connected module is
this fake) or pass it as ``ray=`` where a constructor takes one; :meth:`FakeRay.install`
also puts it in ``sys.modules`` for code that imports ``ray`` by name.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Protocol

__all__ = [
    "DEFAULT_NODE_IDS",
    "FakeActor",
    "FakeObjectRef",
    "FakeRay",
    "FakeRayPlacementGroup",
    "GetTimeoutError",
    "NodeAffinitySchedulingStrategy",
    "PlacementGroupSchedulingStrategy",
    "RayActorError",
    "RayError",
    "TaskCancelledError",
    "WouldBlockForever",
]

#: Two node ids in Ray's format (56 hex digits), used when a FakeRay is given none.
DEFAULT_NODE_IDS = ("a" * 56, "b" * 56)

_OUTCOMES = ("ok", "hangs", "died", "raises")
_UNSET = object()


class RayError(Exception):
    """Stands for ``ray.exceptions.RayError``, the base of the errors below, as in Ray."""


class RayActorError(RayError):
    """Stands for ``ray.exceptions.RayActorError``: the actor is gone."""


class GetTimeoutError(RayError, TimeoutError):
    """Stands for ``ray.exceptions.GetTimeoutError``: a ``get`` ran out of time."""


class TaskCancelledError(RayError):
    """Stands for ``ray.exceptions.TaskCancelledError``."""


class WouldBlockForever(AssertionError):
    """``get`` without a timeout on a call that never ends: the test would hang, so it fails."""


@dataclass(frozen=True)
class NodeAffinitySchedulingStrategy:
    """Stands for Ray's strategy that pins a task or actor to one node."""

    node_id: str
    soft: bool = False


@dataclass(frozen=True)
class PlacementGroupSchedulingStrategy:
    """Stands for Ray's strategy that places a task or actor in a placement-group bundle."""

    placement_group: Any
    placement_group_bundle_index: int = -1
    placement_group_capture_child_tasks: bool | None = None


class FakeObjectRef:
    """The result of a call: computed once, when first asked for, unless it hangs.

    ``hung`` refs are never ready; set ``hung = False`` (or call :meth:`release`) to let
    one finish.
    """

    _ids = itertools.count()

    def __init__(self, compute: Callable[[], Any], *, hung: bool = False) -> None:
        self.id = next(self._ids)
        self.hung = hung
        self.cancelled = False
        self._compute = compute
        self._done = False
        self._value: Any = None
        self._error: BaseException | None = None

    def release(self) -> None:
        """Let a hanging call finish; its result is computed when next asked for."""
        self.hung = False

    def result(self) -> Any:
        """The call's value, or raise what it raised."""
        if self.cancelled:
            raise TaskCancelledError(f"object ref {self.id} was cancelled")
        if not self._done:
            try:
                self._value = self._compute()
            except BaseException as error:
                self._error = error
            self._done = True
        if self._error is not None:
            raise self._error
        return self._value

    def __hash__(self) -> int:
        return hash(("FakeObjectRef", self.id))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FakeObjectRef) and other.id == self.id

    def __repr__(self) -> str:
        return f"FakeObjectRef({self.id}{', hung' if self.hung else ''})"


def _raising(error: BaseException) -> Callable[[], Any]:
    def fail() -> Any:
        raise error

    return fail


class _Method:
    """``actor.method``: its ``remote(...)`` submits a call and returns a ref."""

    def __init__(self, actor: FakeActor, name: str) -> None:
        self._actor = actor
        self._name = name

    def remote(self, *args: Any, **kwargs: Any) -> FakeObjectRef:
        return self._actor._submit(self._name, args, kwargs)

    def options(self, **_options: Any) -> _Method:
        return self


class _FakeActorId:
    """An actor id as a Ray handle holds it (``.hex()``); numbered in start order."""

    def __init__(self, number: int) -> None:
        self.number = number

    def hex(self) -> str:
        return f"{self.number:032x}"


class FakeActor:
    """An actor handle: an ``instance`` of the decorated class (or None) on ``node_id``.

    ``actor.method.remote(...)`` records ``(method, args, kwargs)`` in ``calls`` and in
    the fake's ``submitted``; Ray's built-in ``__ray_ready__``, ``__ray_call__`` (runs
    ``fn(instance, *args)``) and ``__ray_terminate__`` are understood.
    """

    def __init__(
        self,
        ray: FakeRay,
        name: str,
        instance: Any = None,
        *,
        node_id: str,
        options: dict[str, Any] | None = None,
    ) -> None:
        self._ray = ray
        self.name = name
        self.instance = instance
        self.node_id = node_id
        self.options: dict[str, Any] = dict(options or {})
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.scripts: dict[str, Any] = {}
        self.hung = False
        self.dead = False
        self.killed = False
        self.kill_error = False
        # What a Ray handle keeps as ``_actor_id``: 16 bytes, shown as 32 hex characters.
        self._actor_id = _FakeActorId(len(ray.actors) + 1)

    def script(self, method: str, outcome: Any) -> FakeActor:
        """Decide how later calls of ``method`` end.

        ``outcome`` is ``"ok"`` (run normally), ``"hangs"``, ``"died"``, ``"raises"`` (a
        RuntimeError), an exception instance (raised by ``get``) or a callable that
        computes the value from the call's arguments.
        """
        if isinstance(outcome, str) and outcome not in _OUTCOMES:
            raise ValueError(
                f"actor {self.name!r}: unknown outcome {outcome!r} for {method!r}; "
                f"expected one of {', '.join(_OUTCOMES)}, an exception or a callable"
            )
        self.scripts[method] = outcome
        return self

    def __getattr__(self, name: str) -> _Method:
        builtin = name.startswith("__ray_") and name.endswith("__")
        if name.startswith("_") and not builtin:
            raise AttributeError(name)
        # Like Ray's handle: only the class's methods (any name on a hand-made actor).
        known = self.instance is None or name in self.scripts or hasattr(self.instance, name)
        if not (builtin or known):
            raise AttributeError(f"actor {self.name!r} has no method {name!r}")
        return _Method(self, name)

    def __repr__(self) -> str:
        return f"FakeActor({self.name!r} on {self.node_id[:8]})"

    def _submit(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> FakeObjectRef:
        self.calls.append((method, args, kwargs))
        self._ray.submitted.append((self.name, method))
        for hook in list(self._ray.on_submit):
            hook(self, method)
        # A dead actor answers at once, with its death, whatever else was scripted.
        hung = not self.dead and (self.hung or self.scripts.get(method) == "hangs")
        return FakeObjectRef(self._outcome(method, args, kwargs), hung=hung)

    def _outcome(
        self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Callable[[], Any]:
        """What asking for the call's result does, as fixed when the call was made."""
        outcome = self.scripts.get(method, "ok")
        if self.dead or outcome == "died":
            return _raising(RayActorError(f"actor died: {self.name}"))
        if outcome == "raises":
            return _raising(RuntimeError(f"{method} failed on {self.name}"))
        if isinstance(outcome, BaseException):
            return _raising(outcome)
        if callable(outcome):
            return lambda: outcome(*args, **kwargs)
        return lambda: self._run(method, args, kwargs)

    def _run(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if method == "__ray_ready__":
            return True
        if method == "__ray_terminate__":
            self.dead = True
            return None
        if method == "__ray_call__":
            function, *rest = args
            return function(self.instance, *rest, **kwargs)
        if self.instance is None:
            return None
        return getattr(self.instance, method)(*args, **kwargs)


class _ActorClass:
    """What ``ray.remote`` makes of a class: ``.options(...).remote(...)`` starts an actor."""

    def __init__(self, ray: FakeRay, cls: type, options: dict[str, Any]) -> None:
        self._ray = ray
        self._cls = cls
        self._options = options

    def options(self, **options: Any) -> _ActorClass:
        return _ActorClass(self._ray, self._cls, {**self._options, **options})

    def remote(self, *args: Any, **kwargs: Any) -> FakeActor:
        return self._ray._start_actor(self._cls, self._options, args, kwargs)


class _RemoteFunction:
    """What ``ray.remote`` makes of a function: ``.remote(...)`` runs it as a task."""

    def __init__(self, ray: FakeRay, function: Callable[..., Any], options: dict[str, Any]):
        self._ray = ray
        self._function = function
        self._options = options

    def options(self, **options: Any) -> _RemoteFunction:
        return _RemoteFunction(self._ray, self._function, {**self._options, **options})

    def remote(self, *args: Any, **kwargs: Any) -> FakeObjectRef:
        name = getattr(self._function, "__name__", repr(self._function))
        self._ray.tasks.append((name, args, dict(self._options)))
        if name in self._ray.hung_tasks:
            return FakeObjectRef(lambda: None, hung=True)
        return FakeObjectRef(lambda: self._function(*args, **kwargs))


class FakeRayPlacementGroup:
    """A placement group: ``bundle_specs`` placed on ``bundle_nodes`` (one node id each)."""

    def __init__(
        self, ray: FakeRay, bundles: list[dict[str, float]], strategy: str, name: str
    ) -> None:
        self._ray = ray
        self.bundle_specs = [dict(bundle) for bundle in bundles]
        self.strategy = strategy
        self.name = name
        self.hex_id = format(next(ray._pg_ids), "036x")
        self.id = SimpleNamespace(hex=lambda: self.hex_id)
        self.state = "PENDING" if ray.pending_placement else "CREATED"
        self.bundle_nodes = ray._place(len(bundles), strategy)

    @property
    def bundle_count(self) -> int:
        return len(self.bundle_specs)

    def ready(self) -> FakeObjectRef:
        """A ref that resolves once the group is placed (never, while it is pending)."""
        return FakeObjectRef(lambda: self, hung=self.state == "PENDING")

    def table(self) -> dict[str, Any]:
        return {
            "placement_group_id": self.hex_id,
            "name": self.name,
            "strategy": self.strategy,
            "state": self.state,
            "bundles": dict(enumerate(self.bundle_specs)),
            "bundles_to_node_id": (
                dict(enumerate(self.bundle_nodes)) if self.state == "CREATED" else {}
            ),
        }


class _ProcRoot(Protocol):
    """A fake ``/proc`` tree, as :class:`raylens_fakes.procfs.FakeProcFS` is."""

    @property
    def root(self) -> Path: ...


class FakeRay:
    """A module-like stand-in for ``ray`` over ``node_ids`` (see the module docstring)."""

    def __init__(self, node_ids: Iterable[str] = DEFAULT_NODE_IDS) -> None:
        self.node_ids = list(node_ids)
        if not self.node_ids:
            raise ValueError("FakeRay needs at least one node id")
        self.initialized = True
        self.driver_node = self.node_ids[0]
        self.actors: list[FakeActor] = []
        self.killed: list[str] = []
        self.submitted: list[tuple[str, str]] = []
        self.tasks: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.hung_tasks: set[str] = set()
        self.cancelled: list[FakeObjectRef] = []
        self.wait_timeouts: list[float | None] = []
        self.get_timeouts: list[float | None] = []
        self.timed_out_gets: list[FakeObjectRef] = []
        self.wait_error: BaseException | None = None
        self.placement_groups: list[FakeRayPlacementGroup] = []
        self.pending_placement = False
        # What ``nodes()`` and ``cluster_resources()`` report, per node id.
        self.node_resources: dict[str, dict[str, float]] = {
            node: {"CPU": 8.0} for node in self.node_ids
        }
        self.node_labels: dict[str, dict[str, str]] = {node: {} for node in self.node_ids}
        self.actor_setup: Callable[[str, type, dict[str, Any]], None] | None = None
        self.on_submit: list[Callable[[FakeActor, str], None]] = []
        self.on_kill: list[Callable[[FakeActor], None]] = []
        self._hang_on: set[str] = set()
        self._actor_ids = itertools.count()
        self._pg_ids = itertools.count(1)
        self._spread = itertools.count()
        self.exceptions = SimpleNamespace(
            RayError=RayError,
            RayActorError=RayActorError,
            ActorDiedError=RayActorError,
            GetTimeoutError=GetTimeoutError,
            TaskCancelledError=TaskCancelledError,
        )
        strategies = SimpleNamespace(
            NodeAffinitySchedulingStrategy=NodeAffinitySchedulingStrategy,
            PlacementGroupSchedulingStrategy=PlacementGroupSchedulingStrategy,
        )
        self.util = SimpleNamespace(
            scheduling_strategies=strategies,
            placement_group=self._placement_group,
            placement_group_table=self._placement_group_table,
            remove_placement_group=self._remove_placement_group,
            get_node_ip_address=lambda: "127.0.0.1",
        )

    # ---- the ray module's surface ------------------------------------------------------

    def is_initialized(self) -> bool:
        return self.initialized

    def shutdown(self) -> None:
        self.initialized = False

    def remote(self, *target: Any, **options: Any) -> Any:
        """``@ray.remote`` or ``ray.remote(**options)(target)`` for a class or a function."""
        if target:
            (only,) = target
            return self._wrap(only, {})
        return lambda decorated: self._wrap(decorated, options)

    def get(self, refs: Any, *, timeout: float | None = None) -> Any:
        """The value of a ref (or a list of them); GetTimeoutError for one that hangs."""
        self.get_timeouts.append(timeout)
        if isinstance(refs, list):
            return [self._get_one(ref, timeout) for ref in refs]
        return self._get_one(refs, timeout)

    def wait(
        self,
        refs: list[FakeObjectRef],
        *,
        num_returns: int = 1,
        timeout: float | None = None,
        **_options: Any,
    ) -> tuple[list[FakeObjectRef], list[FakeObjectRef]]:
        """Up to ``num_returns`` refs that do not hang, in order, and the rest."""
        self.wait_timeouts.append(timeout)
        if self.wait_error is not None:
            raise self.wait_error
        ready = [ref for ref in refs if not ref.hung][:num_returns]
        # By identity, so waiting on a thousand refs stays linear.
        taken = {id(ref) for ref in ready}
        return ready, [ref for ref in refs if id(ref) not in taken]

    def put(self, value: Any) -> FakeObjectRef:
        return FakeObjectRef(lambda: value)

    def kill(self, actor: FakeActor, *, no_restart: bool = True) -> None:
        """Record the kill and mark the actor dead; raises if ``actor.kill_error`` is set."""
        if not no_restart:
            raise AssertionError(f"kill({actor.name}) asked Ray to restart the actor")
        if actor.kill_error:
            raise RuntimeError(f"cannot kill {actor.name}")
        self.killed.append(actor.name)
        actor.killed = True
        actor.dead = True
        for hook in list(self.on_kill):
            hook(actor)

    def cancel(self, ref: FakeObjectRef, *, force: bool = False, **_options: Any) -> None:
        ref.cancelled = True
        ref.hung = False
        self.cancelled.append(ref)

    def get_runtime_context(self) -> Any:
        return SimpleNamespace(get_node_id=lambda: self.driver_node)

    def nodes(self) -> list[dict[str, Any]]:
        return [
            {
                "NodeID": node,
                "Alive": True,
                "NodeManagerAddress": "127.0.0.1",
                "Resources": dict(self.node_resources.get(node, {})),
                "Labels": dict(self.node_labels.get(node, {})),
            }
            for node in self.node_ids
        ]

    def cluster_resources(self) -> dict[str, float]:
        """The sum of ``node_resources`` over the nodes."""
        totals: dict[str, float] = {}
        for resources in self.node_resources.values():
            for key, amount in resources.items():
                totals[key] = totals.get(key, 0.0) + amount
        return totals

    # ---- helpers for tests ---------------------------------------------------------------

    def actor(self, name: str, instance: Any = None, *, node_id: str | None = None) -> FakeActor:
        """A handle made directly (as if started elsewhere), recorded in ``actors``."""
        handle = FakeActor(self, name, instance, node_id=node_id or self.node_ids[0])
        self.actors.append(handle)
        return handle

    def live_actors(self) -> list[FakeActor]:
        """Actors neither killed nor dead."""
        return [actor for actor in self.actors if not (actor.killed or actor.dead)]

    def hang_actors_on(self, node_id: str) -> None:
        """Actors started on ``node_id`` from now on hang on every call."""
        self._hang_on.add(node_id)

    @classmethod
    def over_procfs(cls, procfs: Mapping[str, _ProcRoot]) -> FakeRay:
        """A fake over ``procfs``' node ids whose every actor reads its own node's fake
        ``/proc`` (see :meth:`read_procfs`)."""
        fake = cls(procfs)
        fake.read_procfs(procfs)
        return fake

    def read_procfs(self, procfs: Mapping[str, _ProcRoot]) -> None:
        """Start every later actor with ``procfs_root`` set to its own node's fake ``/proc``."""
        self.actor_setup = lambda node, _cls, kwargs: kwargs.update(
            procfs_root=str(procfs[node].root)
        )

    def seam(self) -> Any:
        """A ``RaySeam`` whose connected module is this fake (None once ``shutdown()``)."""
        return _seam_class()(self)

    def modules(self) -> dict[str, Any]:
        """``sys.modules`` entries under which code that imports ``ray`` finds this fake."""
        return {
            "ray": self,
            "ray.exceptions": self.exceptions,
            "ray.util": self.util,
            "ray.util.scheduling_strategies": self.util.scheduling_strategies,
            "ray.util.placement_group": SimpleNamespace(
                placement_group=self._placement_group,
                PlacementGroup=FakeRayPlacementGroup,
                remove_placement_group=self._remove_placement_group,
            ),
        }

    def install(self, monkeypatch: Any) -> FakeRay:
        """Put :meth:`modules` in ``sys.modules`` for the test (undone by ``monkeypatch``)."""
        import sys

        for name, module in self.modules().items():
            monkeypatch.setitem(sys.modules, name, module)
        return self

    # ---- internals -----------------------------------------------------------------------

    def _wrap(self, target: Any, options: dict[str, Any]) -> Any:
        if isinstance(target, type):
            return _ActorClass(self, target, options)
        if callable(target):
            return _RemoteFunction(self, target, options)
        raise TypeError(f"ray.remote takes a class or a function, not {type(target).__name__}")

    def _start_actor(
        self, cls: type, options: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> FakeActor:
        node = self._node_for(options.get("scheduling_strategy"))
        kwargs = dict(kwargs)
        if self.actor_setup is not None:
            self.actor_setup(node, cls, kwargs)
        name = options.get("name") or f"{cls.__name__}-{next(self._actor_ids)}"
        handle = FakeActor(self, name, cls(*args, **kwargs), node_id=node, options=options)
        handle.hung = node in self._hang_on
        self.actors.append(handle)
        return handle

    def _node_for(self, strategy: Any) -> str:
        if isinstance(strategy, NodeAffinitySchedulingStrategy):
            if strategy.node_id not in self.node_ids and not strategy.soft:
                raise ValueError(
                    f"no node {strategy.node_id!r} in this FakeRay; nodes: {self.node_ids}"
                )
            return strategy.node_id if strategy.node_id in self.node_ids else self.node_ids[0]
        if isinstance(strategy, PlacementGroupSchedulingStrategy):
            group = strategy.placement_group
            index = max(0, strategy.placement_group_bundle_index)
            return group.bundle_nodes[index]
        return self.node_ids[0]

    def _place(self, count: int, strategy: str) -> list[str]:
        if strategy in ("SPREAD", "STRICT_SPREAD"):
            return [self.node_ids[next(self._spread) % len(self.node_ids)] for _ in range(count)]
        return [self.node_ids[0]] * count

    def _placement_group(
        self,
        bundles: list[dict[str, float]],
        strategy: str = "PACK",
        name: str = "",
        **_options: Any,
    ) -> FakeRayPlacementGroup:
        group = FakeRayPlacementGroup(self, bundles, strategy, name)
        self.placement_groups.append(group)
        return group

    def _placement_group_table(self, group: FakeRayPlacementGroup | None = None) -> Any:
        if group is None:
            return {pg.hex_id: pg.table() for pg in self.placement_groups}
        return group.table()

    def _remove_placement_group(self, group: FakeRayPlacementGroup) -> None:
        group.state = "REMOVED"

    def _get_one(self, ref: Any, timeout: float | None) -> Any:
        if not isinstance(ref, FakeObjectRef):
            raise TypeError(f"ray.get takes object refs, not {type(ref).__name__}")
        if ref.hung:
            if timeout is None:
                raise WouldBlockForever(f"get({ref!r}) without a timeout would never return")
            self.timed_out_gets.append(ref)
            raise GetTimeoutError(f"{ref!r} not ready within {timeout}s")
        return ref.result()


@functools.cache
def _seam_class() -> type:
    """The RaySeam subclass over a FakeRay, defined on first use.

    Importing the distributed layer declares raylens' metrics, so the plugin that
    imports this module must not do it at import.
    """
    from raylens.distributed.ray_seam import RaySeam

    class FakeRaySeam(RaySeam):
        """A RaySeam over a FakeRay: connected while the fake ``is_initialized()``."""

        def __init__(self, fake: FakeRay) -> None:
            super().__init__()
            self.fake = fake

        def connected_ray(self) -> Any:
            return self.fake if self.fake.is_initialized() else None

        def ray(self) -> Any:
            return self.fake

    return FakeRaySeam
