"""One zero-CPU sampler actor per Ray node, reading worker groups' memory there.

A worker group's processes can only be read from procfs on their own node, and
asking the workers themselves would wait behind whatever long method they are
running. So each node that hosts a registered worker gets a small actor of its
own, :class:`GroupMemorySamplerActor`, pinned there with a hard node affinity and
reserving no CPU and no GPU, which reads the workers' process trees from its own
process with :class:`~raylens.telemetry.group_memory.GroupMemoryReader`.

:class:`GroupMemorySamplers` runs in the driver, called once per host-memory
cycle: it starts samplers lazily for nodes that gained a worker, removes the one
of a node whose last worker left, asks every sampler for a reading under one
deadline, and returns ``{node id: NodeGroupMemory | SamplerError}``. A sampler
that is slow, wedged or dead costs only its own node's result: it is not asked
again while its last request is open, and it is replaced as soon as it is found
dead, or after ``max_missed`` cycles without an answer once it has answered at
least once (before that it may still be starting, and is replaced only when it has
given no first answer within ``start_timeout_s``).

Ray is imported only when a manager first needs it, and any object with the few
``ray`` functions used here can stand in for it (the unit tests pass a fake).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from raylens.distributed._group_memory_publishing import (
    STOP_TIMEOUT_S,
    GroupMemoryPublisher,
    PublishingLoop,
    RayMetricsPublisher,
)
from raylens.lens import warn_once
from raylens.safe_text import printable
from raylens.telemetry.group_memory import (
    DEFAULT_MAX_PROCESSES,
    DEFAULT_REGISTRY,
    DEFAULT_SNAPSHOT,
    GroupMemoryReader,
    GroupMemorySnapshot,
    GroupWorkerRegistry,
    NodeGroupMemory,
    as_group_worker,
    own_process_identity,
)
from raylens.telemetry.process_memory import ProcFS
from raylens.validation import positive_seconds

__all__ = [
    "DEFAULT_MAX_MISSED",
    "DEFAULT_PSS_INTERVAL_SECONDS",
    "DEFAULT_START_TIMEOUT_S",
    "DEFAULT_TIMEOUT_S",
    "DEFAULT_TREE_INTERVAL_SECONDS",
    "GroupMemorySamplerActor",
    "GroupMemorySamplers",
    "SamplerError",
    "collect_group_memory",
    "worker_identity",
]

DEFAULT_TIMEOUT_S = 2.0
"""How long one cycle waits for every sampler's reading."""

DEFAULT_PSS_INTERVAL_SECONDS = 60.0
"""How often a sampler reads PSS per group by default (RSS is read every cycle)."""

DEFAULT_TREE_INTERVAL_SECONDS = 30.0
"""How often a sampler walks each worker's process tree again by default; a process a
worker spawns in between is counted from the next walk (a new worker is walked at once)."""

DEFAULT_MAX_MISSED = 3
"""Cycles a sampler may leave unanswered before it is replaced."""

DEFAULT_START_TIMEOUT_S = 300.0
"""How long a new sampler may take to give its first answer before it is replaced.

Generous: a sampler's first answer waits for a worker process to start on its node,
and for the job's runtime environment to be set up there if the node is new to it."""

_LOGGER = logging.getLogger("raylens.distributed")
#: Most group names one warning quotes.
_NAMES_QUOTED = 5


@dataclass(frozen=True)
class SamplerError:
    """Why a node has no reading this cycle."""

    node_id: str
    message: str


class GroupMemorySamplerActor:
    """What runs inside each node's sampler actor: a reader, read on demand or on its own timer.

    The reader arguments are those of :class:`GroupMemoryReader`; ``procfs_root`` is
    where procfs is mounted on the node (``/proc`` by default). :meth:`read` answers
    one reading to its caller. :meth:`set_workers` and :meth:`start` make the sampler
    read the node's workers every interval on a daemon thread and publish each reading
    through ``publisher`` (default: Ray's metrics pipeline, see
    :mod:`raylens.distributed._group_memory_publishing`), stamped with ``wall_clock``
    (default :func:`time.time`); ``clock`` times the reader's intervals.
    """

    def __init__(
        self,
        pss_interval_seconds: float | None = DEFAULT_PSS_INTERVAL_SECONDS,
        tree_interval_seconds: float | None = DEFAULT_TREE_INTERVAL_SECONDS,
        max_processes: int = DEFAULT_MAX_PROCESSES,
        procfs_root: str | None = None,
        host_name: str | None = None,
        publisher: GroupMemoryPublisher | None = None,
        clock: Callable[[], float] | None = None,
        wall_clock: Callable[[], float] | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._reader = GroupMemoryReader(
            ProcFS(procfs_root) if procfs_root is not None else None,
            pss_interval_seconds=pss_interval_seconds,
            tree_interval_seconds=tree_interval_seconds,
            max_processes=max_processes,
            host_name=host_name,
            clock=clock,
        )
        self._loop = PublishingLoop(
            self._reader,
            publisher if publisher is not None else RayMetricsPublisher(),
            lock=self._lock,
            wall_clock=wall_clock,
        )

    def read(self, workers: list[tuple[str, int, int | None]]) -> dict[str, Any]:
        """Read the given workers' groups now; the result as builtins (see ``as_plain``)."""
        with self._lock:
            return self._reader.read(workers).as_plain()

    def set_workers(self, workers: list[tuple[str, int, int | None]]) -> None:
        """Make ``workers`` (``(group, pid, start_ticks)``) the node's list for timed readings."""
        self._loop.set_workers(workers)

    def start(self, interval_s: float) -> None:
        """Read and publish every ``interval_s`` seconds, first at once (again: new interval)."""
        self._loop.start(interval_s)

    def stop(self, forget_groups: bool = False, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stop timed readings; with ``forget_groups``, mark every published group gone."""
        self._loop.stop(forget_groups=forget_groups, timeout_s=timeout_s)

    def sample_and_publish_once(self) -> dict[str, Any] | None:
        """One timed reading now, published; as builtins, None once stopped."""
        reading = self._loop.sample_and_publish_once()
        return None if reading is None else reading.as_plain()

    def ping(self) -> int:
        """Readings published so far: an answer at all says the actor is alive."""
        return self._loop.passes


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


def _check_node_id(node_id: object) -> str:
    if not isinstance(node_id, str) or not node_id:
        raise ValueError(f"node id must be a non-empty str, got {node_id!r:.80}")
    return node_id


def _describe(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return printable(f"{type(error).__name__}: {text[0] if text else ''}"[:300])


class GroupMemorySamplers:
    """The driver's side: keeps one sampler per node that hosts workers, and collects readings.

    ``ray`` is the ``ray`` module or a stand-in with ``remote``, ``wait``, ``get``,
    ``kill``, ``util.scheduling_strategies.NodeAffinitySchedulingStrategy`` and
    ``exceptions.RayActorError``; default the real one, imported on first use.
    ``timeout_s`` bounds how long :meth:`sample` waits for all readings together.
    A sampler that has answered is replaced after ``max_missed`` cycles in a row
    without an answer; one that has not answered yet, after ``start_timeout_s``
    seconds of ``clock`` (default :func:`time.monotonic`) since it was started,
    with one warning for the process.
    ``pss_interval_seconds``, ``tree_interval_seconds``, ``max_processes`` and
    ``procfs_root`` configure each sampler's reader (see :class:`GroupMemoryReader`).
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
    ) -> None:
        self._ray = ray
        self.timeout_s = positive_seconds("timeout_s", timeout_s)
        self.start_timeout_s = positive_seconds("start_timeout_s", start_timeout_s)
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
        }
        self.max_missed = max_missed
        self._max_processes = max_processes
        self._lock = threading.Lock()
        self._samplers: dict[str, _Sampler] = {}
        self._remote_class: Any = None

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
        return _Sampler(actor, started_at=self._clock())

    def _remove(self, node_id: str) -> None:
        sampler = self._samplers.pop(node_id, None)
        if sampler is None:
            return
        # An actor that is already gone needs no killing.
        with contextlib.suppress(Exception):
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
                except Exception as error:
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
            except Exception as error:
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
        except Exception as error:
            return SamplerError(node_id, f"sampler on node {node_id} failed: {_describe(error)}")
        sampler.missed = 0
        sampler.answered = True
        try:
            return NodeGroupMemory.from_plain(plain)
        except ValueError as error:
            return SamplerError(node_id, f"sampler on node {node_id}: {printable(error)}")

    def _missed(self, node_id: str, sampler: _Sampler, why: str) -> SamplerError:
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
            why += f"; replaced after {sampler.missed} cycles without an answer"
        return SamplerError(node_id, f"no group-memory reading from node {node_id}: {why}")

    def close(self) -> None:
        """Remove every sampler (idempotent)."""
        with self._lock:
            for node_id in list(self._samplers):
                self._remove(node_id)


def collect_group_memory(
    samplers: GroupMemorySamplers,
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
    source = registry if registry is not None else DEFAULT_REGISTRY
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


def worker_identity(_actor: object = None) -> tuple[str, int, int | None]:
    """``(node id, pid, start_ticks)`` of the calling Ray worker process.

    Shaped for ``ray.get(worker.__ray_call__.remote(worker_identity))``, which runs it
    inside the worker's own process whatever the worker class is; the result is what
    :func:`~raylens.telemetry.group_memory.register_group_workers` takes per worker.
    """
    import ray

    pid, ticks = own_process_identity()
    return ray.get_runtime_context().get_node_id(), pid, ticks
