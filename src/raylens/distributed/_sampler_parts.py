"""The pieces the driver's sampler manager is made of: its per-node state, its checks, and
the post-mortem's one question to a sampler.

Kept apart from :mod:`raylens.distributed.group_memory_sampler` so that module holds the
manager's policy alone; everything here is re-exported there where it is public.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, cast

from raylens.cluster import ray_call_errors
from raylens.lens import warn_once
from raylens.safe_text import printable
from raylens.telemetry.group_memory import (
    DEFAULT_SNAPSHOT,
    DEFAULT_WORKER_REGISTRY,
    GroupMemorySnapshot,
    GroupWorkerRegistry,
    NodeGroupMemory,
    own_process_identity,
)
from raylens.telemetry.growth import (
    RecentHistory,
    check_growth_window,
    growth_window_for_sampling,
)
from raylens.validation import positive_seconds

__all__ = [
    "STUCK_INTERVALS",
    "STUCK_MIN_S",
    "SamplerError",
    "Sampling",
    "ask_recent_history",
    "collect_group_memory",
    "learn_worker",
    "monitor_identity",
    "stuck_for",
    "worker_identity",
]

STUCK_INTERVALS = 30
"""Sampling intervals without a new reading, while the sampler answers its pings, after
which its publishing loop counts as stuck and it is replaced (never under a minute)."""
STUCK_MIN_S = 60.0

_LOGGER = logging.getLogger("raylens.distributed")
#: Most group names one warning quotes.
_NAMES_QUOTED = 5


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
    # Readings published, as its latest ping answered, and since when (manager's clock)
    # that count has stood still; None until it is told to publish.
    passes: object = None
    advanced_at: float | None = None
    # Its ``worker_id`` call, until its answer is read; then that id ("": not known).
    asked_worker: Any = None
    worker_id: str = ""


def learn_worker(ray: Any, sampler: _Sampler) -> None:
    """Read the Ray worker id a sampler answered, once that answer is there. Never raises."""
    ref = sampler.asked_worker
    if ref is None:
        return
    with contextlib.suppress(*ray_call_errors(ray)):
        ready, _ = ray.wait([ref], num_returns=1, timeout=0)
        if not ready:
            return
        answer = ray.get(ref, timeout=0)
        if isinstance(answer, str):
            sampler.worker_id = answer[:80]
    sampler.asked_worker = None


def stuck_for(sampler: _Sampler, passes: object, now: float, interval_s: float) -> float | None:
    """Seconds a publishing sampler's reading count (``passes``, its ping's answer) has
    stood still at ``now``, once that is more than its loop may take (see
    :data:`STUCK_INTERVALS`, of ``interval_s``); else None."""
    if sampler.advanced_at is None:
        return None
    if passes != sampler.passes:
        sampler.passes, sampler.advanced_at = passes, now
        return None
    still = now - sampler.advanced_at
    limit = max(STUCK_INTERVALS * interval_s, STUCK_MIN_S)
    return still if still >= limit else None


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
    except ray_call_errors(ray) as error:
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


class Sampling(Protocol):
    """What :func:`collect_group_memory` asks of a sampler manager."""

    @property
    def max_processes(self) -> int: ...

    def sample(
        self, workers_by_node: Mapping[str, Iterable[tuple[str, int, int | None]]]
    ) -> dict[str, NodeGroupMemory | SamplerError]: ...


def collect_group_memory(
    samplers: Sampling,
    *,
    registry: GroupWorkerRegistry | None = None,
    snapshot: GroupMemorySnapshot | None = None,
    max_age: float | None = None,
) -> dict[str, NodeGroupMemory | SamplerError]:
    """One cycle: sample every registered worker's node and publish what came back.

    ``registry`` and ``snapshot`` default to the module-wide ones of
    :mod:`raylens.telemetry.group_memory`; ``max_age`` is passed to
    :meth:`GroupMemorySnapshot.publish`. Returns the cycle's results, for a table.
    """
    source = registry if registry is not None else DEFAULT_WORKER_REGISTRY
    target = snapshot if snapshot is not None else DEFAULT_SNAPSHOT
    results = samplers.sample(source.workers_by_node())
    target.publish(results, max_age=max_age)
    _warn_about_skipped_groups(results, samplers.max_processes)
    return results


def _warn_about_skipped_groups(
    results: Mapping[str, NodeGroupMemory | SamplerError], max_processes: int
) -> None:
    """Say once which groups a reading left out to stay within its process cap."""
    for node_id, reading in results.items():
        if not isinstance(reading, NodeGroupMemory) or not reading.skipped_groups:
            continue
        names = reading.skipped_groups
        quoted = ", ".join(f"'{printable(name[:80])}'" for name in names[:_NAMES_QUOTED])
        more = f" and {len(names) - _NAMES_QUOTED} more" if len(names) > _NAMES_QUOTED else ""
        warn_once(
            "group_memory.process_cap",
            f"node {printable(node_id[:80])}: worker group(s) {quoted}{more} have no "
            f"group-memory figures: measuring them would pass the cap of {max_processes} "
            "processes per node, which goes to the smallest groups first (raise it with "
            "GroupMemorySamplers(max_processes=...); warned once)",
            logger=_LOGGER,
        )
        return
