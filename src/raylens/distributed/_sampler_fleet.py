"""The set of sampler actors the driver keeps, one per node, and what every path shares.

:class:`_SamplerFleet` owns the manager's state (the samplers by node, the stopping ones,
the liveness-round counters, the ids version) and its lock, and the steps both ways of
using it take: validating the settings, starting a pinned zero-CPU
:class:`~raylens.distributed._group_memory_publishing.GroupMemorySamplerActor`, removing
one, counting a miss against one, killing stopped ones after their grace, the ids of
those running, and closing. :meth:`~raylens.distributed.group_memory_sampler.GroupMemorySamplers.sample`
lives in :mod:`raylens.distributed._sampler_reads`,
:meth:`~raylens.distributed.group_memory_sampler.GroupMemorySamplers.maintain` in
:mod:`raylens.distributed._sampler_upkeep`, and the post-mortem questions in
:mod:`raylens.distributed._sampler_postmortem`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from raylens.cluster import RayClusterView, ray_call_errors
from raylens.distributed._group_memory_publishing import (
    DEFAULT_PSS_INTERVAL_SECONDS,
    DEFAULT_TREE_INTERVAL_SECONDS,
    GroupMemorySamplerActor,
)
from raylens.distributed._sampler_parts import (
    SamplerError,
    _check_node_id,
    _describe,
    _growth_window,
    _Sampler,
    monitor_identity,
)
from raylens.lens import warn_once
from raylens.safe_text import printable
from raylens.telemetry.group_memory import DEFAULT_MAX_PROCESSES
from raylens.telemetry.growth import DEFAULT_SAMPLE_INTERVAL_S, KillLineConfig
from raylens.validation import positive_seconds

__all__ = [
    "DEFAULT_MAX_MISSED",
    "DEFAULT_PING_EVERY",
    "DEFAULT_START_TIMEOUT_S",
    "DEFAULT_TIMEOUT_S",
    "STOP_GRACE_S",
]

DEFAULT_TIMEOUT_S = 2.0
"""How long one cycle waits for every sampler's reading."""

DEFAULT_MAX_MISSED = 3
"""Cycles (liveness rounds, under :meth:`GroupMemorySamplers.maintain`) a sampler may leave
unanswered before it is replaced."""

DEFAULT_PING_EVERY = 6
"""Cycles of :meth:`GroupMemorySamplers.maintain` between two liveness rounds by default."""

STOP_GRACE_S = 25.0
"""How long a stopped sampler is left alive before it is killed: time for Ray to report the
NaN it gave its groups (Ray's default report interval is 10 s). Ray keeps a dead actor's
last values for a while, so one killed at once would leave its numbers there."""

DEFAULT_START_TIMEOUT_S = 300.0
"""How long a new sampler may take to give its first answer before it is replaced.

Generous: a sampler's first answer waits for a worker process to start on its node,
and for the job's runtime environment to be set up there if the node is new to it."""

_LOGGER = logging.getLogger("raylens.distributed")
#: No version stands: the next :meth:`GroupMemorySamplers.maintain` walks every list.
_UNSETTLED = object()


class _SamplerFleet:
    """The samplers kept, their settings and the steps every path shares (see
    :class:`~raylens.distributed.group_memory_sampler.GroupMemorySamplers` for the
    arguments). Every method that reads or changes the samplers holds ``_lock``, or is
    called by one that does."""

    def __init__(
        self,
        *,
        ray: Any = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        pss_interval_seconds: float | None = DEFAULT_PSS_INTERVAL_SECONDS,
        tree_interval_seconds: float | None = DEFAULT_TREE_INTERVAL_SECONDS,
        max_processes: int = DEFAULT_MAX_PROCESSES,
        max_missed: int = DEFAULT_MAX_MISSED,
        procfs_root: str | None = None,
        start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
        clock: Callable[[], float] | None = None,
        sample_interval_s: float = DEFAULT_SAMPLE_INTERVAL_S,
        growth_window_s: float | None = None,
        ping_every: int = DEFAULT_PING_EVERY,
        kill_line: KillLineConfig | None = None,
        started_by: str | None = None,
    ) -> None:
        self._ray = ray
        self.timeout_s = positive_seconds("timeout_s", timeout_s)
        self.start_timeout_s = positive_seconds("start_timeout_s", start_timeout_s)
        self.sample_interval_s = positive_seconds(
            "sample_interval_s", sample_interval_s, maximum=threading.TIMEOUT_MAX
        )
        if isinstance(ping_every, bool) or not isinstance(ping_every, int) or ping_every <= 0:
            raise ValueError(f"ping_every must be a positive int of cycles, got {ping_every!r}")
        self.ping_every = ping_every
        self._clock = clock or time.monotonic
        for name, interval in (
            ("pss_interval_seconds", pss_interval_seconds),
            ("tree_interval_seconds", tree_interval_seconds),
        ):
            if interval is not None:
                positive_seconds(name, interval)
        if isinstance(max_missed, bool) or not isinstance(max_missed, int) or max_missed <= 0:
            raise ValueError(f"max_missed must be a positive int, got {max_missed!r}")
        if isinstance(max_processes, bool) or not isinstance(max_processes, int):
            raise ValueError(f"max_processes must be a positive int, got {max_processes!r}")
        if max_processes <= 0:
            raise ValueError(f"max_processes must be a positive int, got {max_processes!r}")
        self._actor_kwargs = {
            "pss_interval_seconds": pss_interval_seconds,
            "tree_interval_seconds": tree_interval_seconds,
            "max_processes": max_processes,
            "procfs_root": procfs_root,
            "growth_window_s": _growth_window(growth_window_s, self.sample_interval_s),
            "kill_line": kill_line,
            "started_by": monitor_identity() if started_by is None else printable(started_by),
        }
        self.max_missed = max_missed
        self._max_processes = max_processes
        self._lock = threading.Lock()
        self._samplers: dict[str, _Sampler] = {}
        # Bumped whenever sampler_ids() may answer otherwise.
        self._ids_version = 0
        self._remote_class: Any = None
        # maintain(): cycles so far, the cycle of the latest liveness round, whether its
        # pings are still to be read, and stopped samplers with when (killed after the grace).
        self._cycle = 0
        self._round = 0
        self._pings_out = False
        self._stopping: list[tuple[Any, float]] = []
        # Until when (on the manager's clock) post-mortems do not ask for a history.
        self._history_paused_until = -float("inf")
        # The caller's version of the worker lists every node's sampler was last told,
        # while nothing has been removed or failed since; see maintain().
        self._settled: object = _UNSETTLED

    def configure_growth(
        self, *, window_s: float | None = None, kill_line: KillLineConfig | None = None
    ) -> None:
        """Give samplers started from now on this growth window and kill line (None: as is).

        Raises ValueError, in one line, for a window shorter than the sampling allows.
        """
        with self._lock:
            if window_s is not None:
                self._actor_kwargs["growth_window_s"] = _growth_window(
                    window_s, self.sample_interval_s
                )
            if kill_line is not None:
                self._actor_kwargs["kill_line"] = kill_line

    def ray_ready(self) -> bool:
        """Whether samplers can be started without importing Ray here (never starts it)."""
        return self._ray is not None or RayClusterView().is_initialized()

    @property
    def max_processes(self) -> int:
        """Most processes each sampler's reading measures on its node."""
        return self._max_processes

    @property
    def nodes(self) -> set[str]:
        """Node ids that have a sampler now."""
        with self._lock:
            return set(self._samplers)

    def _ray_module(self) -> Any:
        if self._ray is None:
            import ray
            import ray.util.scheduling_strategies  # makes ray.util.scheduling_strategies reachable

            self._ray = ray
        return self._ray

    def _call_errors(self) -> tuple[type[Exception], ...]:
        """What asking Ray here can raise: its own errors, or no Ray to import."""
        return ray_call_errors(self._ray, ImportError)

    def _start(self, node_id: str) -> _Sampler:
        ray = self._ray_module()
        if self._remote_class is None:
            self._remote_class = ray.remote(num_cpus=0, num_gpus=0)(GroupMemorySamplerActor)
        strategy = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(
            node_id=node_id, soft=False
        )
        actor = self._remote_class.options(scheduling_strategy=strategy, max_restarts=0).remote(
            **self._actor_kwargs
        )
        self._ids_version += 1
        return _Sampler(actor, started_at=self._clock())

    def start_early(self, node_ids: Iterable[str]) -> list[str]:
        """Start an idle sampler now on each of ``node_ids`` that has none; the ids started.

        Ray's memory monitor kills the workers of a job that cannot be retried (an actor
        with no restarts, as the samplers and, by default, group workers are) newest
        first: a sampler started before any worker of the node is its last choice. Such a
        sampler waits, publishing nothing, until a group registers workers on its node,
        and is kept while none does. Never raises: a node whose sampler cannot start gets
        one when its workers register.
        """
        started = []
        with self._lock:
            for node_id in node_ids:
                if node_id in self._samplers:
                    continue
                try:
                    self._samplers[_check_node_id(node_id)] = self._start(node_id)
                except self._call_errors() as error:
                    why = _describe(error)
                else:
                    started.append(node_id)
                    continue
                warn_once(
                    "group_memory.sampler.start_early",
                    f"could not start a sampler early on node {printable(str(node_id)[:80])}: "
                    f"{why} (warned once; it starts when a group registers workers there)",
                    logger=_LOGGER,
                )
            self._settled = _UNSETTLED
        return started

    def _remove(self, node_id: str) -> None:
        self._settled = _UNSETTLED  # a node may now lack its sampler: walk the lists again
        sampler = self._samplers.pop(node_id, None)
        if sampler is None:
            return
        self._ids_version += 1
        # An actor that is already gone needs no killing.
        with contextlib.suppress(*self._call_errors()):
            self._ray_module().kill(sampler.actor, no_restart=True)

    def _missed(
        self, node_id: str, sampler: _Sampler, why: str, unit: str = "cycles"
    ) -> SamplerError:
        """A miss: within the start timeout, or counted; the sampler removed once too many."""
        if not sampler.answered:
            waited = self._clock() - sampler.started_at
            if waited < self.start_timeout_s:
                return SamplerError(
                    node_id,
                    f"no group-memory reading from node {node_id}: its sampler has not "
                    "answered yet (it may still be starting)",
                )
            self._remove(node_id)  # started afresh next cycle
            message = (
                f"no group-memory reading from node {node_id}: its sampler gave no first "
                f"answer within the {self.start_timeout_s:g} s start timeout, so it was "
                "replaced"
            )
            warn_once(
                "group_memory.sampler.start_timeout",
                f"{message} (warned once; later replacements on any node are not logged)",
                logger=_LOGGER,
            )
            return SamplerError(node_id, message)
        sampler.missed += 1
        if sampler.missed >= self.max_missed:
            self._remove(node_id)
            why += f"; replaced after {sampler.missed} {unit} without an answer"
        return SamplerError(node_id, f"no group-memory reading from node {node_id}: {why}")

    def _kill_stopping(self, *, all_of_them: bool = False) -> None:
        if not self._stopping:
            return
        ray = self._ray_module()
        now = self._clock()
        kept = []
        for actor, stopped_at in self._stopping:
            if not all_of_them and now - stopped_at < STOP_GRACE_S:
                kept.append((actor, stopped_at))
                continue
            with contextlib.suppress(*ray_call_errors(ray)):  # one already gone needs no killing
                ray.kill(actor, no_restart=True)
        if len(kept) != len(self._stopping):
            self._ids_version += 1
        self._stopping = kept

    @property
    def ids_version(self) -> int:
        """A number that changes whenever :meth:`sampler_ids` may answer otherwise."""
        return self._ids_version

    def sampler_ids(self) -> dict[str, str]:
        """``{actor id: worker id}`` of the samplers running or stopping now: what each
        publishes as its identity, and the Ray worker its series come from (``""`` until it
        answered, which is asked and read with the liveness pings); a handle without an id
        is left out."""
        with self._lock:
            actors = [(s.actor, s.worker_id) for s in self._samplers.values()]
            actors += [(actor, "") for actor, _stopped_at in self._stopping]
        ids = {}
        for actor, worker in actors:
            with contextlib.suppress(AttributeError):  # a handle without Ray's private id
                ids[str(actor._actor_id.hex())] = worker
        return ids

    def sampler_actors(self) -> tuple[Any, dict[str, Any]]:
        """``(ray, {node id: sampler actor})`` of every running sampler, for phase boundaries."""
        with self._lock:
            actors = {node: sampler.actor for node, sampler in self._samplers.items()}
        return (self._ray_module() if actors else self._ray), actors

    def close(self) -> None:
        """Remove every sampler, stopping ones included (idempotent)."""
        with self._lock:
            for node_id in list(self._samplers):
                self._remove(node_id)
            self._kill_stopping(all_of_them=True)
