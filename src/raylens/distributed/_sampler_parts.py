"""The pieces the driver's sampler manager is made of: its per-node state, its checks, and
the post-mortem's one question to a sampler.

Kept apart from :mod:`raylens.distributed.group_memory_sampler` so that module holds the
manager's policy alone; everything here is re-exported there where it is public.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from typing import Any, cast

from raylens.lens import warn_once
from raylens.safe_text import printable
from raylens.telemetry.group_memory import own_process_identity
from raylens.telemetry.history import (
    RecentHistory,
    check_growth_window,
    growth_window_for_sampling,
)
from raylens.validation import positive_seconds

__all__ = [
    "SamplerError",
    "ask_recent_history",
    "monitor_identity",
    "worker_identity",
]

_LOGGER = logging.getLogger("raylens.distributed")


@dataclass(frozen=True)
class SamplerError:
    """Why a node has no reading this cycle."""

    node_id: str
    message: str


@dataclass
class _Sampler:
    actor: Any
    # When it was started, on the manager's clock.
    started_at: float
    pending: Any = None
    missed: int = 0
    # Until its first answer an actor may still be starting (a worker process, imports),
    # which can take many cycles on a busy node: misses count only after that, and
    # before it only the start timeout applies.
    answered: bool = False
    # Publishing samplers (maintain): the worker list it was last told, None if never.
    workers: list[tuple[str, int, int | None]] | None = None
    # Its liveness ping not read yet.
    ping: Any = None


def _check_node_id(node_id: object) -> str:
    if not isinstance(node_id, str) or not node_id:
        raise ValueError(f"node id must be a non-empty str, got {node_id!r:.80}")
    return node_id


def _describe(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return printable(f"{type(error).__name__}: {text[0] if text else ''}"[:300])


def _growth_window(window: float | None, interval: float) -> float | None:
    """The samplers' growth window: the one given (checked against ``interval``), else the
    driver's setting.

    A bad ``RAYLENS_GROWTH_WINDOW`` (out of range, or shorter than the sampling allows) is
    the driver's to report; the samplers then keep the default rather than fail to start.
    """
    if window is not None:
        return check_growth_window(
            positive_seconds("growth_window_s", window), interval, name="growth_window_s"
        )
    try:
        return growth_window_for_sampling(sample_interval_s=interval)
    except ValueError:
        return None


def monitor_identity() -> str:
    """How a sampler names the process that started it: ``host/pid``, printable."""
    return printable(f"{socket.gethostname()}/{os.getpid()}")[:120]


def ask_recent_history(
    ray: Any, actor: Any, node_id: str, at_wall: float, timeout_s: float
) -> RecentHistory | None:
    """Ask ``actor`` (a node's sampler) for its recent history up to ``at_wall``, within
    ``timeout_s``; None for no answer in time or one that is not a history. Never raises."""
    try:
        found = ray.get(actor.recent_history.remote(float(at_wall)), timeout=timeout_s)
    except Exception as error:
        warn_once(
            "group_memory.sampler.recent_history",
            f"could not ask node {printable(node_id[:80])}'s sampler for its recent "
            f"memory: {_describe(error)} (warned once)",
            logger=_LOGGER,
        )
        return None
    if not isinstance(found, dict) or not {"node_used", "worker_groups"} <= found.keys():
        return None
    return cast(RecentHistory, found)


def worker_identity(_actor: object = None) -> tuple[str, int, int | None]:
    """``(node id, pid, start_ticks)`` of the calling Ray worker process.

    Shaped for ``ray.get(worker.__ray_call__.remote(worker_identity))``, which runs it
    inside the worker's own process whatever the worker class is; the result is what
    :func:`~raylens.telemetry.group_memory.register_group_workers` takes per worker.
    """
    import ray

    pid, ticks = own_process_identity()
    return ray.get_runtime_context().get_node_id(), pid, ticks
