"""Telling raylens which worker Ray's memory monitor killed, from a failed group call.

When Ray's memory monitor kills a worker, the calls waiting on it fail with
``ray.exceptions.OutOfMemoryError`` at ``ray.get``. The worker group knows what the
raylet's counter cannot say: the victim's group, rank, pid and node. A group call
that fails this way reports each victim to :func:`raylens.telemetry.oom.report_worker_oom`
(the post-mortem then names it) and the error goes on to the caller unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from raylens.cluster import ray_call_errors
from raylens.lens import warn_once
from raylens.telemetry.oom import report_worker_oom

__all__ = ["out_of_memory_errors", "report_out_of_memory"]

_LOGGER = logging.getLogger("raylens.distributed")


def out_of_memory_errors(ray: Any) -> tuple[type[Exception], ...]:
    """``(ray.exceptions.OutOfMemoryError,)``, or ``()`` for a Ray (or stand-in) without it."""
    kind = getattr(getattr(ray, "exceptions", None), "OutOfMemoryError", None)
    return (kind,) if isinstance(kind, type) and issubclass(kind, Exception) else ()


def _is_out_of_memory(ray: Any, error: BaseException) -> bool:
    return isinstance(error, out_of_memory_errors(ray))


def _victims(ray: Any, futures: Sequence[Any]) -> list[int]:
    """Positions of the futures that failed with the out-of-memory error (ready ones only)."""
    found = []
    for position, future in enumerate(futures):
        ready, _ = ray.wait([future], num_returns=1, timeout=0)
        if not ready:
            continue
        try:
            ray.get(future, timeout=0)
        except out_of_memory_errors(ray) + ray_call_errors(ray) as error:
            if _is_out_of_memory(ray, error):
                found.append(position)
    return found


def report_out_of_memory(
    ray: Any,
    worker_group: object,
    futures: Sequence[Any],
    called_workers: Sequence[int] | None,
    error: BaseException,
) -> None:
    """If ``error`` is Ray's out-of-memory error, report each victim among ``futures``.

    ``called_workers[i]`` is the rank behind ``futures[i]`` (None: the position is the
    rank). A victim that cannot be told apart is reported with what is known (its
    group). Never raises.
    """
    try:
        if not _is_out_of_memory(ray, error):
            return
        group = getattr(worker_group, "name_prefix", None)
        processes = getattr(worker_group, "_processes", None)
        identities = list(getattr(processes, "identities", None) or [])
        positions = _victims(ray, futures)
        ranks: list[int | None] = [
            called_workers[p] if called_workers is not None and p < len(called_workers) else p
            for p in positions
        ] or [None]
        for rank in ranks:
            identity = identities[rank] if rank is not None and rank < len(identities) else None
            report_worker_oom(
                node_id=identity[0] if identity else None,
                group=group if isinstance(group, str) else None,
                worker_rank=rank,
                pid=identity[1] if identity else None,
            )
    except ray_call_errors(ray, LookupError):  # Ray's wait, or identities of another shape
        warn_once(
            "worker_groups.oom_report",
            "could not report a worker lost to Ray's out-of-memory error to raylens",
            logger=_LOGGER,
        )
