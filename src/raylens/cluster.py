"""What raylens asks a Ray cluster, behind one small interface: :class:`ClusterView`.

Invariants a maintainer must keep:

- Ray is imported lazily, inside the calls that need it: ``import raylens`` works
  without Ray, and :meth:`RayClusterView.is_initialized` never imports it.
- :class:`RayClusterView` never starts Ray: unconnected, its calls raise instead.
- :func:`use_cluster_view` swaps the default for every thread of the process.
- The key-value methods (:data:`KEY_VALUE_METHODS`) are optional: callers check
  :func:`supports_key_value` and do without them.

The view, its optional methods and who uses them: ``docs/architecture.md``,
*``raylens.cluster``: the cluster seam*.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from typing import Protocol, TypeGuard, runtime_checkable

from raylens import forking

__all__ = [
    "KEY_VALUE_METHODS",
    "KV_NAMESPACE",
    "ClusterView",
    "KeyValueClusterView",
    "RayClusterView",
    "default_cluster_view",
    "ray_call_errors",
    "supports_key_value",
    "use_cluster_view",
]

#: Namespace of every key raylens writes to Ray's internal key-value store.
KV_NAMESPACE = "raylens"

#: The optional methods of a view with a shared key-value store:
#: ``kv_put(key: str, value: bytes)``, ``kv_get(key) -> bytes | None``,
#: ``kv_delete(key)``, ``kv_keys(prefix) -> list[str]``, ``job_id() -> str | None``
#: (this process's job, hex) and ``live_job_ids() -> set[str]`` (jobs whose driver is
#: alive). Keys are plain strings, all in raylens' own namespace. Ray stores keys as bytes: a
#: key that is not UTF-8 is listed with each undecodable byte as a lone surrogate
#: (``surrogateescape``), and passing that string back reaches the same key, so it can be deleted.
KEY_VALUE_METHODS = ("kv_put", "kv_get", "kv_delete", "kv_keys", "job_id", "live_job_ids")


#: What a call into Ray raises besides its own ``RayError`` family: ``RuntimeError`` (not
#: connected; raylens' own view says so too), ``ValueError`` and ``TypeError`` (arguments
#: Ray refuses, values it cannot serialize) and ``OSError`` (its GCS and client connections:
#: ``ConnectionError``, ``TimeoutError``).
_OTHER_RAY_CALL_ERRORS: tuple[type[Exception], ...] = (
    RuntimeError,
    ValueError,
    TypeError,
    OSError,
)


def ray_call_errors(
    ray: object | None = None, *also: type[Exception]
) -> tuple[type[Exception], ...]:
    """The exceptions a call into ``ray`` (default: the imported ``ray`` module) can raise,
    and ``also`` those the caller's own code around it may.

    Ray's ``RayError`` covers what goes wrong in a task, an actor or an object, a timeout
    (``GetTimeoutError``) and a remote call's own exception (wrapped in ``RayTaskError``);
    the others are named beside it. Read when an exception is being handled,
    so a module stand-in (a test's fake Ray) brings its own ``RayError``.
    """
    module = ray if ray is not None else sys.modules.get("ray")
    base = getattr(getattr(module, "exceptions", None), "RayError", None)
    if isinstance(base, type) and issubclass(base, Exception):
        return (base, *_OTHER_RAY_CALL_ERRORS, *also)
    return (*_OTHER_RAY_CALL_ERRORS, *also)


def supports_key_value(view: object) -> TypeGuard[KeyValueClusterView]:
    """True when ``view`` has every method of :data:`KEY_VALUE_METHODS`."""
    return all(callable(getattr(view, name, None)) for name in KEY_VALUE_METHODS)


@runtime_checkable
class ClusterView(Protocol):
    """The cluster as raylens sees it.

    ``nodes()`` returns one dict per node with Ray's keys, among them ``"NodeID"``
    (hex), ``"Alive"``, ``"NodeManagerAddress"``, ``"NodeManagerHostname"`` and
    ``"MetricsExportPort"``. ``placement_group_table(pg)`` returns Ray's record of
    one placement group, among them ``"state"`` (``"PENDING"``, ``"CREATED"``,
    ``"RESCHEDULING"``, ``"REMOVED"``...) and ``"bundles_to_node_id"``, which maps
    each bundle index to the hex id of the node it was placed on (``""`` when it
    has not been placed).
    """

    def is_initialized(self) -> bool:
        """True when this process is connected to a cluster."""
        ...

    def nodes(self) -> list[dict[str, object]]:
        """Every node the cluster knows of, dead ones included."""
        ...

    def placement_group_table(self, placement_group: object) -> dict[str, object]:
        """Ray's record of ``placement_group``."""
        ...


class KeyValueClusterView(ClusterView, Protocol):
    """A :class:`ClusterView` that also has the methods of :data:`KEY_VALUE_METHODS`.

    Code holding a plain view asks :func:`supports_key_value` before it uses them.
    """

    def kv_put(self, key: str, value: bytes) -> None:
        """Store ``value`` under ``key``, replacing what was there."""
        ...

    def kv_get(self, key: str) -> bytes | None:
        """The value under ``key``, or None when there is none."""
        ...

    def kv_delete(self, key: str) -> None:
        """Remove ``key``; nothing happens when it is absent."""
        ...

    def kv_keys(self, prefix: str) -> list[str]:
        """Every key that starts with ``prefix``."""
        ...

    def job_id(self) -> str | None:
        """This process's job id (hex), or None when it has none."""
        ...

    def live_job_ids(self) -> set[str]:
        """Ids (hex) of the jobs whose driver is alive."""
        ...


class RayClusterView:
    """:class:`ClusterView` over the Ray this process is connected to.

    Stateless: every call goes to Ray. ``is_initialized`` answers False without
    importing Ray when nothing else has imported it yet, since a process that has
    never imported Ray cannot have called ``ray.init``.

    raylens never starts Ray: while this process is not connected, every call but
    ``is_initialized`` raises RuntimeError instead of reaching Ray, whose calls would
    start a local instance. A test that forgot to point raylens at its fake cluster
    fails at once, saying so, instead of starting Ray.
    """

    def is_initialized(self) -> bool:
        ray = sys.modules.get("ray")
        if ray is None:
            return False
        try:
            return bool(ray.is_initialized())
        except AttributeError:  # a partially imported or stub module
            return False

    def _connected(self, call: str) -> None:
        if not self.is_initialized():
            raise RuntimeError(
                f"cannot {call}: this process is not connected to Ray, and raylens never "
                "starts it; call ray.init first, or pass a cluster view (cluster=...), or "
                "make one the default with raylens.cluster.use_cluster_view(view)"
            )

    def nodes(self) -> list[dict[str, object]]:
        self._connected("list the cluster's nodes")
        import ray

        return list(ray.nodes())

    def placement_group_table(self, placement_group: object) -> dict[str, object]:
        self._connected("read a placement group")
        from ray.util import placement_group_table

        return dict(placement_group_table(placement_group))

    # The shared key-value store: Ray's internal KV, namespace KV_NAMESPACE.

    def kv_put(self, key: str, value: bytes) -> None:
        self._connected("write to the cluster's key-value store")
        from ray.experimental import internal_kv

        internal_kv._internal_kv_put(_key_bytes(key), value, True, namespace=KV_NAMESPACE)

    def kv_get(self, key: str) -> bytes | None:
        self._connected("read the cluster's key-value store")
        from ray.experimental import internal_kv

        return internal_kv._internal_kv_get(_key_bytes(key), namespace=KV_NAMESPACE)

    def kv_delete(self, key: str) -> None:
        self._connected("delete from the cluster's key-value store")
        from ray.experimental import internal_kv

        internal_kv._internal_kv_del(_key_bytes(key), namespace=KV_NAMESPACE)

    def kv_keys(self, prefix: str) -> list[str]:
        self._connected("list the cluster's key-value store")
        from ray.experimental import internal_kv

        keys = internal_kv._internal_kv_list(_key_bytes(prefix), namespace=KV_NAMESPACE)
        return [key.decode("utf-8", "surrogateescape") for key in keys]

    def job_id(self) -> str | None:
        """This process's job id (hex), or None when it has none."""
        self._connected("read this process's job id")
        import ray

        job = ray.get_runtime_context().get_job_id()
        return str(job) if job else None

    def live_job_ids(self) -> set[str]:
        """Ids of the jobs the GCS lists whose driver has not exited."""
        self._connected("list the cluster's jobs")
        from ray._private import state

        return {
            str(job["JobID"])
            for job in state.jobs()
            if isinstance(job, dict) and job.get("JobID") and job.get("IsDead") is False
        }

    def __repr__(self) -> str:
        return "RayClusterView()"


def _key_bytes(key: str) -> bytes:
    """``key`` as Ray stores it: the inverse of how :meth:`RayClusterView.kv_keys` decodes."""
    return key.encode("utf-8", "surrogateescape")


_DEFAULT_VIEW = RayClusterView()
# Views installed by use_cluster_view, innermost last.
_OVERRIDES: list[ClusterView] = []
_OVERRIDES_LOCK = threading.Lock()
forking.renew_lock_in_child(sys.modules[__name__], "_OVERRIDES_LOCK")


def connected_system_config() -> dict[str, object]:
    """The system-config overrides of the Ray cluster this process is connected to.

    Only what the cluster's ``_system_config`` set; empty when not connected, or when
    this Ray cannot say (the call is Ray-internal, so any failure reads as empty).
    """
    if not RayClusterView().is_initialized():
        return {}
    try:
        from ray._private.state import state

        config = state.get_system_config()
    except ray_call_errors(None, ImportError, AttributeError):  # an internal API that moves
        return {}
    return {str(key): value for key, value in config.items()} if isinstance(config, dict) else {}


def default_cluster_view() -> ClusterView:
    """The view raylens uses when none is passed.

    The innermost :func:`use_cluster_view` in effect, otherwise the Ray this
    process is connected to.
    """
    try:
        return _OVERRIDES[-1]
    except IndexError:
        return _DEFAULT_VIEW


@contextlib.contextmanager
def use_cluster_view(view: ClusterView) -> Iterator[ClusterView]:
    """Make ``view`` the default cluster view of the whole process until the block ends.

    Blocks nest; leaving one restores the view that was in effect before it, even
    when the block raises. Raises TypeError when ``view`` lacks one of the
    :class:`ClusterView` methods.
    """
    if not isinstance(view, ClusterView):
        missing = [
            name
            for name in ("is_initialized", "nodes", "placement_group_table")
            if not callable(getattr(view, name, None))
        ]
        raise TypeError(
            f"{type(view).__name__} is not a ClusterView; it lacks {', '.join(missing)}"
        )
    with _OVERRIDES_LOCK:
        _OVERRIDES.append(view)
    try:
        yield view
    finally:
        with _OVERRIDES_LOCK:
            # Remove this block's entry even if an inner block was left unbalanced.
            for index in range(len(_OVERRIDES) - 1, -1, -1):
                if _OVERRIDES[index] is view:
                    del _OVERRIDES[index]
                    break
