"""One zero-CPU sampler actor per Ray node, and the driver's side that keeps them.

Each node the monitor scrapes (under :meth:`~GroupMemorySamplers.maintain`; each node with
a registered worker under :meth:`~GroupMemorySamplers.sample`) gets a
:class:`GroupMemorySamplerActor`, pinned there
with a hard node affinity and reserving no CPU or GPU, which reads the workers' process
trees with :class:`~raylens.telemetry.group_memory.GroupMemoryReader`: procfs can only be
read on the node, and asking the workers would wait behind their long methods.
:class:`GroupMemorySamplers` runs in the driver, called once per host-memory cycle:
:meth:`~GroupMemorySamplers.maintain` only keeps the samplers (they publish on their own
timer, see :mod:`raylens.distributed._group_memory_publishing`, and compute their node's
growth there); :meth:`~GroupMemorySamplers.sample` asks each for a reading under one deadline.

Invariants: a sampler that is slow, wedged or dead costs only its own node's result; it is
not asked again while its last request is open, and it is replaced once found dead, or after
``max_missed`` cycles without an answer once it has answered (before that, only when it gave
no first answer within ``start_timeout_s``). Under ``maintain`` the driver makes Ray calls
only where a node's workers changed, plus a liveness ping every ``ping_every`` cycles. Ray is
imported only when a manager first needs it, and any object with the few ``ray`` functions
used here can stand in for it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping
from typing import Any

from raylens.cluster import RayClusterView, ray_call_errors
from raylens.distributed._group_memory_publishing import (
    DEFAULT_PSS_INTERVAL_SECONDS,
    DEFAULT_TREE_INTERVAL_SECONDS,
    GroupMemorySamplerActor,
)
from raylens.distributed._sampler_parts import (
    STUCK_INTERVALS,
    STUCK_MIN_S,
    SamplerError,
    _check_node_id,
    _describe,
    _growth_window,
    _Sampler,
    ask_recent_history,
    collect_group_memory,
    learn_worker,
    monitor_identity,
    stuck_for,
    worker_identity,
)
from raylens.lens import warn_once
from raylens.safe_text import printable
from raylens.telemetry.group_memory import (
    DEFAULT_MAX_PROCESSES,
    NodeGroupMemory,
    as_group_worker,
)
from raylens.telemetry.growth import (
    DEFAULT_SAMPLE_INTERVAL_S,
    KillLineConfig,
    RecentHistory,
)
from raylens.telemetry.oom import LargestProcess
from raylens.validation import positive_seconds

__all__ = [
    "DEFAULT_MAX_MISSED",
    "DEFAULT_PING_EVERY",
    "DEFAULT_PSS_INTERVAL_SECONDS",
    "DEFAULT_SAMPLE_INTERVAL_S",
    "DEFAULT_START_TIMEOUT_S",
    "DEFAULT_TIMEOUT_S",
    "DEFAULT_TREE_INTERVAL_SECONDS",
    "STOP_GRACE_S",
    "STUCK_INTERVALS",
    "STUCK_MIN_S",
    "GroupMemorySamplerActor",
    "GroupMemorySamplers",
    "SamplerError",
    "collect_group_memory",
    "worker_identity",
]

DEFAULT_TIMEOUT_S = 2.0
"""How long one cycle waits for every sampler's reading."""

DEFAULT_MAX_MISSED = 3
"""Cycles (liveness rounds, under :meth:`GroupMemorySamplers.maintain`) a sampler may leave
unanswered before it is replaced."""

RECENT_HISTORY_TIMEOUT_S = 2.0
"""How long a post-mortem waits for a node's sampler to give its recent history."""

RECENT_HISTORY_PAUSE_S = 30.0
"""After a sampler gave no history, how long later post-mortems go without asking."""

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

LARGEST_PROCESSES_TIMEOUT_S = 2.0
"""How long a post-mortem waits for a node's sampler to list its largest processes."""
#: Most processes taken from one sampler's answer.
LARGEST_PROCESSES_KEPT = 32

_LOGGER = logging.getLogger("raylens.distributed")
#: No version stands: the next :meth:`GroupMemorySamplers.maintain` walks every list.
_UNSETTLED = object()


class GroupMemorySamplers:
    """The driver's side: keeps one sampler per node that hosts workers, and collects readings.

    ``ray`` is the ``ray`` module or a stand-in with ``remote``, ``wait``, ``get``,
    ``kill``, ``util.scheduling_strategies.NodeAffinitySchedulingStrategy`` and
    ``exceptions.RayActorError``; default the real one, imported on first use.
    ``timeout_s`` bounds how long :meth:`sample` waits for all readings together;
    under :meth:`maintain` samplers read every ``sample_interval_s`` and are pinged
    every ``ping_every`` cycles. A sampler that has answered is replaced after ``max_missed`` cycles in a row
    without an answer; one that has not answered yet, after ``start_timeout_s``
    seconds of ``clock`` (default :func:`time.monotonic`) since it was started,
    with one warning for the process.
    ``pss_interval_seconds``, ``tree_interval_seconds``, ``max_processes`` and
    ``procfs_root`` configure each sampler's reader (see :class:`GroupMemoryReader`).
    ``growth_window_s`` (default ``RAYLENS_GROWTH_WINDOW``, else 300 s; at least
    :func:`~raylens.telemetry.growth.shortest_growth_window` of ``sample_interval_s``) and
    ``kill_line`` (default: each sampler resolves it where it runs; see
    :meth:`configure_growth`) are each node's growth settings; ``started_by`` names this
    manager in every sampler's published identity (default :func:`monitor_identity`).
    Thread-safe: concurrent calls run one after the other.
    """

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

    def sample(
        self, workers_by_node: Mapping[str, Iterable[tuple[str, int, int | None]]]
    ) -> dict[str, NodeGroupMemory | SamplerError]:
        """One reading per node that has workers, each or its error, within :attr:`timeout_s`.

        ``workers_by_node`` maps a node id to its ``(group, pid, start_ticks)``
        workers; a node with none, or missing, loses its sampler. Raises ValueError,
        naming it, for a malformed node id or worker, before anything is started.
        """
        wanted: dict[str, list[tuple[str, int, int | None]]] = {}
        for node_id, workers in workers_by_node.items():
            # Plain tuples: they travel to the node's sampler actor as its wire format.
            entries = [
                (checked.group, checked.pid, checked.start_ticks)
                for checked in map(as_group_worker, workers)
            ]
            if entries:
                wanted[_check_node_id(node_id)] = entries
        with self._lock:
            self._settled = _UNSETTLED
            return self._sample(wanted)

    def _sample(
        self, wanted: dict[str, list[tuple[str, int, int | None]]]
    ) -> dict[str, NodeGroupMemory | SamplerError]:
        deadline = time.monotonic() + self.timeout_s
        for node_id in [node for node in self._samplers if node not in wanted]:
            self._remove(node_id)
        if not wanted:
            return {}
        ray = self._ray_module()
        results: dict[str, NodeGroupMemory | SamplerError] = {}
        asked: dict[Any, str] = {}
        for node_id, workers in wanted.items():
            sampler = self._samplers.get(node_id)
            if sampler is None:
                try:
                    sampler = self._samplers[node_id] = self._start(node_id)
                except self._call_errors() as error:
                    results[node_id] = SamplerError(
                        node_id, f"could not start a sampler on node {node_id}: {_describe(error)}"
                    )
                    continue
            if sampler.pending is not None:
                done, _ = ray.wait([sampler.pending], num_returns=1, timeout=0)
                if not done:
                    results[node_id] = self._missed(
                        node_id, sampler, "its previous reading is still running"
                    )
                    continue
                sampler.pending = None  # a late answer describes an older cycle: dropped
            try:
                sampler.pending = sampler.actor.read.remote(workers)
            except ray_call_errors(ray) as error:
                self._remove(node_id)
                results[node_id] = SamplerError(
                    node_id, f"sampler on node {node_id} cannot be asked: {_describe(error)}"
                )
                continue
            asked[sampler.pending] = node_id
        if asked:
            refs = list(asked)
            ready, _ = ray.wait(
                refs, num_returns=len(refs), timeout=max(0.0, deadline - time.monotonic())
            )
            for ref in ready:
                node_id = asked.pop(ref)
                results[node_id] = self._collect(ray, node_id, ref, deadline)
            for node_id in asked.values():
                results[node_id] = self._missed(
                    node_id,
                    self._samplers[node_id],
                    f"no answer within the {self.timeout_s:g} s sampling timeout",
                )
        return {node: results[node] for node in wanted}

    def _collect(
        self, ray: Any, node_id: str, ref: Any, deadline: float
    ) -> NodeGroupMemory | SamplerError:
        sampler = self._samplers[node_id]
        sampler.pending = None
        try:
            plain = ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
        except ray.exceptions.RayActorError as error:
            self._remove(node_id)  # started afresh next cycle
            return SamplerError(node_id, f"sampler on node {node_id} died: {_describe(error)}")
        except ray_call_errors(ray) as error:
            return SamplerError(node_id, f"sampler on node {node_id} failed: {_describe(error)}")
        sampler.missed = 0
        sampler.answered = True
        try:
            return NodeGroupMemory.from_plain(plain)
        except ValueError as error:
            return SamplerError(node_id, f"sampler on node {node_id}: {printable(error)}")

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

    def maintain(
        self,
        workers_by_node: Mapping[str, Iterable[tuple[str, int, int | None]]],
        *,
        version: Hashable | None = None,
        nodes: Collection[str] = (),
    ) -> dict[str, SamplerError]:
        """Keep one publishing sampler per node that has workers or is in ``nodes``, waiting
        on none of them.

        ``nodes`` are the nodes that keep a sampler even with no worker (the nodes the
        monitor scrapes: their sampler reads the node's memory and growth all the same).

        ``workers_by_node`` is as for :meth:`sample`. A node that gained workers gets a
        sampler, told its workers and started on a :attr:`sample_interval_s` timer (it
        then publishes through Ray's metrics pipeline, see
        :class:`GroupMemorySamplerActor`); a node whose list changed is told the new
        one, and only such a node; a node with no worker left has its sampler told to
        mark its groups gone (NaN) and killed at the first liveness round at least
        :data:`STOP_GRACE_S` later, once Ray has reported the NaN. Every :attr:`ping_every` cycles each sampler is pinged and the
        answers are read the cycle after: a dead sampler is replaced at once, one that
        has answered before is replaced after :attr:`max_missed` unanswered rounds, and
        one that never has is left to start for ``start_timeout_s``. Every Ray call made
        here returns at once, and a cycle in which nothing changed and no round falls
        makes none. Use either this or :meth:`sample` on one manager.

        ``version``, when given, names the content of ``workers_by_node`` and ``nodes``
        (the registry's version and the node list's, say): while it is the version of the last call after which
        every node's sampler stood told its list, and no sampler has been removed or
        failed to start since, the lists are not walked again; the liveness rounds
        run all the same, and a sampler they remove is started again the cycle after.

        Returns ``{node id: SamplerError}`` for the nodes with a problem this cycle,
        empty when all is well. Raises ValueError, naming it, for a malformed node id or
        worker, before anything is started or told.
        """
        present: set[str] = set()
        changed: dict[str, list[tuple[str, int, int | None]]] = {}
        with self._lock:
            if version is not None and version == self._settled:
                return self._maintain(None, changed)
            self._settled = _UNSETTLED
            everywhere = nodes if isinstance(nodes, (set, frozenset)) else set(nodes)
            for node_id, workers in workers_by_node.items():
                listed = workers if isinstance(workers, list) else list(workers)
                sampler = self._samplers.get(node_id)
                if sampler is not None and sampler.workers == listed:
                    present.add(node_id)  # the common case: one comparison, no validation
                    continue
                entries = [
                    (checked.group, checked.pid, checked.start_ticks)
                    for checked in map(as_group_worker, listed)
                ]
                if not entries and node_id not in everywhere:
                    continue
                present.add(_check_node_id(node_id))
                if sampler is None or sampler.workers != entries:
                    changed[node_id] = entries
            for node_id in everywhere:
                if node_id in workers_by_node:
                    continue
                sampler = self._samplers.get(node_id)
                present.add(node_id if sampler is not None else _check_node_id(node_id))
                if sampler is None or sampler.workers != []:
                    changed[node_id] = []
            # Settled unless telling a changed node fails or a sampler is removed below.
            self._settled = _UNSETTLED if version is None else version
            return self._maintain(present, changed)

    def _maintain(
        self, present: set[str] | None, changed: dict[str, list[tuple[str, int, int | None]]]
    ) -> dict[str, SamplerError]:
        """One cycle's work; ``present`` None when the worker lists were not walked."""
        self._cycle += 1
        results: dict[str, SamplerError] = {}
        if present is not None:
            # A sampler started early and never told workers is kept for the node's first.
            for node_id in [
                node
                for node, sampler in self._samplers.items()
                if node not in present and sampler.workers is not None
            ]:
                self._stop_sampler(node_id)
        for node_id, entries in changed.items():
            sampler = self._samplers.get(node_id)
            error: SamplerError | None = None
            if sampler is None:
                error = self._start_publishing(node_id, entries)
            elif (why := self._tell(sampler, entries, start=sampler.workers is None)) is not None:
                error = self._replace(
                    node_id,
                    f"sampler on node {node_id} cannot be reached: {why}; replaced",
                    entries,
                )
            if error is not None:
                self._settled = _UNSETTLED
                results[node_id] = error
        if self._pings_out and self._cycle > self._round:
            self._read_pings(results)
        if self._cycle - self._round >= self.ping_every:
            self._kill_stopping()
            self._send_pings(results)
            self._round = self._cycle
        return results

    def _tell(
        self, sampler: _Sampler, entries: list[tuple[str, int, int | None]], *, start: bool
    ) -> str | None:
        """Send a sampler its worker list (and start its timer); why it failed, or None."""
        try:
            sampler.actor.set_workers.remote(entries)
            if start:
                sampler.actor.start.remote(self.sample_interval_s)
        except self._call_errors() as error:
            return _describe(error)
        sampler.workers = entries
        if start:
            sampler.passes, sampler.advanced_at = None, self._clock()
        return None

    def _start_publishing(
        self, node_id: str, entries: list[tuple[str, int, int | None]]
    ) -> SamplerError | None:
        try:
            sampler = self._start(node_id)
        except self._call_errors() as error:
            return SamplerError(
                node_id, f"could not start a sampler on node {node_id}: {_describe(error)}"
            )
        self._samplers[node_id] = sampler
        why = self._tell(sampler, entries, start=True)
        if why is None:
            return None
        self._remove(node_id)  # started afresh next cycle
        return SamplerError(node_id, f"new sampler on node {node_id} cannot be reached: {why}")

    def _replace(
        self,
        node_id: str,
        message: str,
        entries: list[tuple[str, int, int | None]] | None = None,
    ) -> SamplerError:
        """Kill a node's sampler and start another now, told ``entries`` (default: the same)."""
        if entries is None:
            entries = self._samplers[node_id].workers
        self._remove(node_id)
        if entries is not None:
            error = self._start_publishing(node_id, entries)
            if error is not None:
                message = f"{message}; {error.message}"
        return SamplerError(node_id, message)

    def _stop_sampler(self, node_id: str) -> None:
        """Ask a sampler to mark its groups gone; it is killed at a round after the grace."""
        sampler = self._samplers.pop(node_id)
        self._ids_version += 1
        # One that cannot be asked is killed after the grace all the same.
        with contextlib.suppress(*ray_call_errors(self._ray)):
            sampler.actor.stop.remote(forget_groups=True)
        self._stopping.append((sampler.actor, self._clock()))

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

    def _send_pings(self, results: dict[str, SamplerError]) -> None:
        for node_id, sampler in list(self._samplers.items()):
            if sampler.ping is not None:
                self._pings_out = True  # the previous one is still out: read it next cycle
                continue
            try:
                sampler.ping = sampler.actor.ping.remote()
                if not sampler.worker_id and sampler.workers is not None:
                    sampler.asked_worker = sampler.actor.worker_id.remote()
            except self._call_errors() as error:
                results[node_id] = self._replace(
                    node_id,
                    f"sampler on node {node_id} cannot be reached: {_describe(error)}; replaced",
                )
                continue
            self._pings_out = True

    def _read_pings(self, results: dict[str, SamplerError]) -> None:
        self._pings_out = False
        pinged = {s.ping: node for node, s in self._samplers.items() if s.ping is not None}
        if not pinged:
            return
        ray = self._ray_module()
        ready, _ = ray.wait(list(pinged), num_returns=len(pinged), timeout=0)
        answered = set(ready)
        for ref, node_id in pinged.items():
            sampler = self._samplers[node_id]
            if ref not in answered:
                results[node_id] = self._missed(
                    node_id, sampler, "it has not answered its ping", "liveness checks"
                )
                if node_id not in self._samplers and sampler.workers is not None:  # start another
                    error = self._start_publishing(node_id, sampler.workers)
                    if error is not None:
                        message = f"{results[node_id].message}; {error.message}"
                        results[node_id] = SamplerError(node_id, message)
                continue
            sampler.ping = None
            try:
                passes = ray.get(ref, timeout=0)
            except ray.exceptions.RayActorError as error:
                why = _describe(error)
                results[node_id] = self._replace(
                    node_id, f"sampler on node {node_id} died: {why}; replaced"
                )
                _LOGGER.warning(
                    "raylens: the memory sampler on node %s was killed (%s); started again",
                    printable(node_id[:64]),
                    why[:160],
                )
                continue
            except ray_call_errors(ray) as error:  # it answered, so it lives; say what went wrong
                results[node_id] = SamplerError(
                    node_id, f"sampler on node {node_id} failed its ping: {_describe(error)}"
                )
            else:
                if not sampler.worker_id:
                    learn_worker(ray, sampler)
                    self._ids_version += bool(sampler.worker_id)
                stuck = stuck_for(sampler, passes, self._clock(), self.sample_interval_s)
                if stuck is not None:
                    results[node_id] = self._replace(
                        node_id,
                        f"sampler on node {node_id} answers its pings but has published no "
                        f"reading for {stuck:.0f} s; replaced",
                    )
                    continue
            sampler.answered = True
            sampler.missed = 0

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

    def largest_processes(
        self, node_id: str, timeout_s: float = LARGEST_PROCESSES_TIMEOUT_S
    ) -> tuple[list[LargestProcess], float | None] | None:
        """A node's largest processes at its sampler's last reading before a kill, or None.

        One Ray call, made only when a kill is noticed, bounded by ``timeout_s``. None
        when the node has no sampler or it does not answer in time. Never raises.
        """
        with self._lock:
            sampler = self._samplers.get(node_id)
        if sampler is None:
            return None
        try:
            ray = self._ray_module()
            plain = ray.get(sampler.actor.largest_processes.remote(), timeout=timeout_s)
            if not isinstance(plain, dict):
                return None
            processes = [
                LargestProcess(int(pid), printable(str(group))[:200], int(rss))
                for pid, group, rss in list(plain.get("processes", ()))[:LARGEST_PROCESSES_KEPT]
            ]
            stamp = plain.get("sampled_at")
            return processes, float(stamp) if isinstance(stamp, (int, float)) else None
        except self._call_errors() as error:  # a wrong-shaped answer: TypeError, ValueError
            why = _describe(error)
        # Warned outside the except block: a sampler that died needs no traceback in the log.
        warn_once(
            "group_memory.sampler.largest_processes",
            f"could not ask node {printable(node_id[:80])}'s sampler for its largest "
            f"processes: {why} (warned once)",
            logger=_LOGGER,
        )
        return None

    def recent_history(
        self, node_id: str, at_wall: float, timeout_s: float = RECENT_HISTORY_TIMEOUT_S
    ) -> RecentHistory | None:
        """A node's recent memory up to the Unix time ``at_wall``, from its sampler's history.

        One Ray call, made only for a post-mortem, bounded by ``timeout_s``. None when the
        node has no sampler, it does not answer in time, or its answer is not a history.
        After an ask that got nothing, none waits again for :data:`RECENT_HISTORY_PAUSE_S`
        (a burst of kills on the monitor's thread costs one wait, not one each). Never raises.
        """
        with self._lock:
            sampler = self._samplers.get(node_id)
            paused = self._clock() < self._history_paused_until
        if sampler is None or paused:
            return None
        try:
            ray = self._ray_module()
        except ImportError:
            return None
        found = ask_recent_history(ray, sampler.actor, node_id, at_wall, timeout_s)
        if found is None:
            with self._lock:
                self._history_paused_until = self._clock() + RECENT_HISTORY_PAUSE_S
        return found

    def close(self) -> None:
        """Remove every sampler, stopping ones included (idempotent)."""
        with self._lock:
            for node_id in list(self._samplers):
                self._remove(node_id)
            self._kill_stopping(all_of_them=True)
