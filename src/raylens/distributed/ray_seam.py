"""The one place where raylens' worker groups and virtual clusters reach Ray.

Two things need care when talking to Ray from a library. First, most of Ray's entry
points (``.remote()``, ``ray.get``, ``ray.kill``...) silently start a new local cluster
when the process is not connected, so every call that could run late (a shutdown at
exit, a restart after ``ray.shutdown()``) first asks :meth:`RaySeam.connected_ray`.
Second, decorating a function with ``@ray.remote`` registers a new definition with the
GCS each time, so remote definitions are built once and kept in the seam's cache.

:class:`~raylens.distributed.virtual_cluster.RayVirtualCluster` and
:class:`~raylens.distributed.worker_groups.RayWorkerGroup` take a ``ray_seam``
argument; by default they share :data:`DEFAULT_RAY_SEAM`. A test hands them a seam
whose ``connected_ray()`` returns a stand-in module. Ray is imported only when a
connected process asks for it, so this module imports where Ray is not installed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from raylens.cluster import default_cluster_view, ray_call_errors

if TYPE_CHECKING:
    from raylens.cluster import ClusterView

__all__ = ["DEFAULT_RAY_SEAM", "RaySeam", "connected_ray"]


class RaySeam:
    """How raylens reaches Ray: the connection check and the remote definitions it built.

    ``cluster_view`` answers "is this process connected?" (the default cluster view
    when None). :meth:`remote` builds a remote definition on first use and returns
    the same one afterwards; :meth:`reset` forgets them all, for a new Ray session.
    """

    def __init__(self, cluster_view: ClusterView | None = None) -> None:
        self._cluster_view = cluster_view
        self._lock = threading.Lock()
        self._remote: dict[str, Any] = {}

    def connected_ray(self) -> Any:
        """The ``ray`` module when this process is connected to a cluster, else None."""
        view = self._cluster_view or default_cluster_view()
        if not view.is_initialized():
            return None
        import ray

        return ray

    def ray(self) -> Any:
        """The ``ray`` module, for type checks on Ray objects that need no connection."""
        connected = self.connected_ray()
        if connected is not None:
            return connected
        import ray

        return ray

    def remote(self, key: str, build: Callable[[Any], Any]) -> Any:
        """The remote definition cached under ``key``; ``build(ray)`` makes it the first time."""
        with self._lock:
            definition = self._remote.get(key)
        if definition is None:
            definition = build(self.ray())
            with self._lock:
                definition = self._remote.setdefault(key, definition)
        return definition

    def reset(self) -> None:
        """Forget every remote definition; each is rebuilt on its next use."""
        with self._lock:
            self._remote.clear()


#: The seam every cluster and group uses unless given another.
DEFAULT_RAY_SEAM = RaySeam()


def connected_ray() -> Any:
    """The ``ray`` module when this process is connected to a cluster, else None."""
    return DEFAULT_RAY_SEAM.connected_ray()


# ---- small helpers over a connected ray module -------------------------------------------


def _submit_call(ray: Any, worker: Any, method_name: str) -> Any:
    """Submit ``worker.method_name()``; the submission error itself if that fails."""
    try:
        return getattr(worker, method_name).remote()
    except ray_call_errors(ray, AttributeError) as error:  # no such method, or Ray refused
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
            except ray_call_errors(ray):  # the method's own exception arrives as a RayTaskError
                outcomes.append("failed")
    return outcomes


def _wait_until_dead(ray: Any, worker: Any, timeout_s: float) -> bool:
    """Poll a killed actor until Ray reports it dead; False if still alive at the deadline."""
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
