"""Which worker processes each group has on each node, as the driver's groups report them.

:class:`GroupWorkerRegistry` holds ``(node id, pid, start_ticks)`` per worker of each
group; :data:`DEFAULT_WORKER_REGISTRY` is the one the driver's worker groups write, through
:func:`register_group_workers` and :func:`forget_group_workers`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable

from raylens.telemetry.group_memory._reading import as_group_worker
from raylens.telemetry.procfs import ProcFS

__all__ = [
    "DEFAULT_WORKER_REGISTRY",
    "GroupWorkerRegistry",
    "forget_group_workers",
    "own_process_identity",
    "register_group_workers",
]


def own_process_identity(procfs: ProcFS | None = None) -> tuple[int, int | None]:
    """``(pid, start_ticks)`` of the calling process, for a worker to report about itself."""
    pid = os.getpid()
    return pid, (procfs or ProcFS()).start_ticks(pid)


class GroupWorkerRegistry:
    """Which worker processes each group has on each node, as the driver's groups report them.

    A group registers all its workers at once, as ``(node id, pid, start_ticks)``, when
    they are ready and again after a worker is recreated (the new list replaces the
    old), and is forgotten at shutdown. :meth:`workers_by_node` is what the sampler
    manager takes each cycle. Thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._groups: dict[str, tuple[tuple[str, int, int | None], ...]] = {}
        self._version = 0

    @property
    def version(self) -> int:
        """A number that changes whenever the registration does, so a reader can cache."""
        return self._version

    def register(self, group: str, workers: Iterable[tuple[str, int, int | None]]) -> None:
        """Make ``workers`` the whole of ``group``'s worker processes.

        Raises ValueError, naming the fault, for an empty group name or a malformed
        worker; nothing is changed then.
        """
        if not isinstance(group, str) or not group:
            raise ValueError(f"worker group must be a non-empty str, got {group!r:.80}")
        entries = tuple(_check_registered(group, worker) for worker in workers)
        with self._lock:
            self._groups[group] = entries
            self._version += 1

    def forget(self, group: str) -> None:
        """Drop ``group``'s workers (nothing happens for an unknown group)."""
        with self._lock:
            if self._groups.pop(group, None) is not None:
                self._version += 1

    def groups(self) -> set[str]:
        """The registered group names."""
        with self._lock:
            return set(self._groups)

    def workers_by_node(self) -> dict[str, list[tuple[str, int, int | None]]]:
        """``{node id: [(group, pid, start_ticks), ...]}``, groups in name order."""
        with self._lock:
            groups = sorted(self._groups.items())
        by_node: dict[str, list[tuple[str, int, int | None]]] = {}
        for group, workers in groups:
            for node_id, pid, ticks in workers:
                by_node.setdefault(node_id, []).append((group, pid, ticks))
        return by_node

    def clear(self) -> None:
        """Forget every group."""
        with self._lock:
            self._groups.clear()
            self._version += 1


def _check_registered(group: str, worker: object) -> tuple[str, int, int | None]:
    if not isinstance(worker, (tuple, list)) or len(worker) != 3:
        raise ValueError(
            f"each worker of group {group!r:.80} must be a (node_id, pid, start_ticks) tuple, "
            f"got {worker!r:.120}"
        )
    node_id, pid, ticks = worker
    if not isinstance(node_id, str) or not node_id:
        raise ValueError(
            f"node id of a {group!r:.80} worker must be a non-empty str, got {node_id!r:.80}"
        )
    checked = as_group_worker((group, pid, ticks))
    return node_id, checked.pid, checked.start_ticks


DEFAULT_WORKER_REGISTRY = GroupWorkerRegistry()
"""The registry :func:`register_group_workers` and :func:`forget_group_workers` write."""


def register_group_workers(group: str, workers: Iterable[tuple[str, int, int | None]]) -> None:
    """:meth:`GroupWorkerRegistry.register` on :data:`DEFAULT_WORKER_REGISTRY`."""
    DEFAULT_WORKER_REGISTRY.register(group, workers)


def forget_group_workers(group: str) -> None:
    """:meth:`GroupWorkerRegistry.forget` on :data:`DEFAULT_WORKER_REGISTRY`."""
    DEFAULT_WORKER_REGISTRY.forget(group)
