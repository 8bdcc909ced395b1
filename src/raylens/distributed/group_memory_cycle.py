"""The distributed layer's part in per-group memory: who the workers are, and the cycle hook.

:class:`WorkerProcesses`, held by each :class:`RayWorkerGroup`, keeps the group's workers
registered in the group-worker registry; :class:`GroupMemoryCycle` is the host-memory
monitor cycle hook that keeps the samplers running and publishes their figures (or asks
the samplers, in :attr:`CollectionMode.ASK`). Its place in a scrape's path is drawn in
``docs/architecture.md``.

Invariants: after a worker is recreated only the new one is asked for its identity (the
others may be busy in a long method); the hook runs on the monitor's thread in the driver,
since the scrape helper process cannot call Ray; neither piece ever raises into its caller:
a failure is logged once and costs only the figures it concerns.
"""

from __future__ import annotations

import enum
import logging
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from raylens import forking
from raylens.cluster import ray_call_errors
from raylens.distributed.group_memory_sampler import (
    GroupMemorySamplers,
    SamplerError,
    collect_group_memory,
    worker_identity,
)
from raylens.lens import warn_once
from raylens.safe_text import printable
from raylens.telemetry.group_memory import (
    DEFAULT_SNAPSHOT,
    DEFAULT_WORKER_REGISTRY,
    GroupMemorySnapshot,
    GroupWorkerRegistry,
    NodeGroupMemory,
    PublishedReading,
    register_group_memory_gauges,
)
from raylens.telemetry.host_memory import RecordSource
from raylens.telemetry.sampler_registry import SamplerRegistry

if TYPE_CHECKING:
    from raylens.telemetry.host_memory import HostMemoryMonitor
    from raylens.telemetry.raylet_payload import NodeGroupFigures

__all__ = [
    "IDENTITY_TIMEOUT_S",
    "CollectionMode",
    "CycleCost",
    "GroupMemoryCycle",
    "WorkerProcesses",
    "attach_group_memory",
    "default_group_memory_cycle",
]

_LOGGER = logging.getLogger("raylens.distributed")

IDENTITY_TIMEOUT_S = 10.0
"""How long a group waits for its new workers to say where they run (they are ready by then)."""

Identity = tuple[str, int, "int | None"]
WorkersByNode = dict[str, list[tuple[str, int, "int | None"]]]
_NO_WORKERS: Counter[str] = Counter()


class WorkerProcesses:
    """The ``(node id, pid, start_ticks)`` of each worker of one group, kept registered.

    ``registry`` defaults to the process-wide group-worker registry.
    """

    def __init__(self, registry: GroupWorkerRegistry | None = None) -> None:
        self._registry = registry if registry is not None else DEFAULT_WORKER_REGISTRY
        self._identities: list[Identity | None] = []

    @property
    def identities(self) -> list[Identity | None]:
        """Per worker rank, where it runs; None for a worker that could not say."""
        return list(self._identities)

    def learn(
        self,
        group: str,
        ray: Any,
        workers: Sequence[Any],
        changed: Sequence[int] | None = None,
        *,
        timeout_s: float = IDENTITY_TIMEOUT_S,
    ) -> None:
        """Ask the workers at ``changed`` (all when None) where they run, then register all.

        ``ray`` is the connected ``ray`` module (or a stand-in); None registers nothing.
        Never raises: a failure is logged once and leaves the group's last registration.
        """
        if ray is None:
            return
        indices = range(len(workers)) if changed is None else list(changed)
        try:
            refs = [workers[i].__ray_call__.remote(worker_identity) for i in indices]
            answers = ray.get(refs, timeout=timeout_s) if refs else []
            known = (self._identities + [None] * len(workers))[: len(workers)]
            for index, answer in zip(indices, answers):
                node_id, pid, ticks = answer
                known[index] = (node_id, pid, ticks)
            self._registry.register(group, [identity for identity in known if identity])
            self._identities = known
        except ray_call_errors(ray, IndexError) as error:  # and a malformed answer
            warn_once(
                f"worker_groups.group_memory.{group}",
                f"worker group {printable(group)!r}: could not register its workers' processes "
                f"for per-group memory ({type(error).__name__}: {printable(error)[:200]})",
                logger=_LOGGER,
            )

    def forget(self, group: str) -> None:
        """Withdraw ``group``'s workers from the registry. Never raises."""
        self._identities = []
        self._registry.forget(group)


@dataclass(frozen=True)
class CycleCost:
    """What one collection cost the driver: nodes asked, wall and CPU seconds of its thread."""

    nodes: int
    wall_s: float
    cpu_s: float


class CollectionMode(enum.Enum):
    """How a :class:`GroupMemoryCycle` gets each node's per-group figures.

    ``PUBLISH`` (the default): each node's sampler reads on its own timer and publishes
    through Ray's metrics pipeline; the figures come back with the host-memory scrape,
    so the driver only keeps the samplers running and every process that scrapes the
    nodes sees the same figures. It needs Ray's metrics agent (``ray[default]``).
    ``ASK``: the driver asks every sampler for a reading each cycle, which costs the
    driver a Ray call per node per cycle but needs no metrics agent.
    """

    PUBLISH = "publish"
    ASK = "ask"


class GroupMemoryCycle:
    """A monitor cycle hook that collects per-group memory; see the module docstring.

    ``samplers`` defaults to a :class:`GroupMemorySamplers` on the real Ray (imported
    only once a worker is registered); ``registry`` and ``snapshot`` default to the
    process-wide ones; ``mode`` to :attr:`CollectionMode.PUBLISH`. :attr:`last_cost`
    says what the latest collection cost the driver's thread. With :attr:`every_node`
    (what the driver sets) a publishing cycle keeps a sampler on every node the monitor
    scrapes, workers or not, since the sampler is where a node's growth is computed;
    without it (a ``raylens watch``, which only reads) only on nodes with workers here.
    A publishing cycle also has the monitor believe only the series of known samplers:
    those it started, which it lists in the cluster's registry, and those the registry
    lists (``trust``, default a :class:`~raylens.telemetry.sampler_registry.SamplerRegistry`
    over the cluster in force).
    """

    def __init__(
        self,
        samplers: GroupMemorySamplers | None = None,
        *,
        registry: GroupWorkerRegistry | None = None,
        snapshot: GroupMemorySnapshot | None = None,
        mode: CollectionMode | str = CollectionMode.PUBLISH,
        every_node: bool = False,
        trust: SamplerRegistry | None = None,
    ) -> None:
        self.every_node = every_node
        self.trust = trust if trust is not None else SamplerRegistry()
        self._ids_version = -1  # of the samplers' ids last noted in ``trust``
        self.samplers = samplers if samplers is not None else GroupMemorySamplers()
        self.registry = registry if registry is not None else DEFAULT_WORKER_REGISTRY
        self.snapshot = snapshot if snapshot is not None else DEFAULT_SNAPSHOT
        try:
            self.mode = CollectionMode(mode)
        except ValueError:
            allowed = ", ".join(repr(m.value) for m in CollectionMode)
            raise ValueError(f"mode must be one of {allowed}, got {mode!r:.80}") from None
        self.last_cost: CycleCost | None = None
        self._lock = threading.Lock()
        # The registry's workers per node and their count per group, as of its version.
        self._workers: tuple[int, WorkersByNode, dict[str, Counter[str]]] | None = None
        # Per node: the reading last published, with the stamp, host and registration it had.
        self._built: dict[str, PublishedReading] = {}
        # The nodes the monitor scraped last, and a count of the times that set changed.
        self._nodes: frozenset[str] = frozenset()
        self._nodes_version = 0
        forking.reset_after_fork_in_child(self)

    def reset_after_fork(self) -> None:
        """In a forked child: a fresh lock (a collection may have held it at the fork)."""
        self._lock = threading.Lock()

    def _registered(self) -> tuple[int, WorkersByNode, dict[str, Counter[str]]]:
        """The registry's version, its workers by node and their count per group there.

        Rebuilt only when the registration changed; the version is the one read before
        the workers, so a registration made in between only brings the next rebuild.
        """
        version = self.registry.version
        if self._workers is None or self._workers[0] != version:
            workers = self.registry.workers_by_node()
            counts = {
                node: Counter(group for group, _pid, _ticks in listed)
                for node, listed in workers.items()
            }
            self._workers = (version, workers, counts)
        return self._workers

    def __call__(self, monitor: HostMemoryMonitor) -> None:
        """Collect once for ``monitor``'s cycle (nothing while nobody consumes it)."""
        with self._lock:
            if not monitor.has_consumer:
                self.samplers.close()
                return
            wall, cpu = time.perf_counter(), time.thread_time()
            results: Mapping[str, object]
            if self.mode is CollectionMode.ASK:
                results = collect_group_memory(
                    self.samplers,
                    registry=self.registry,
                    snapshot=self.snapshot,
                    max_age=monitor.max_age,
                )
            else:
                results = self._from_scrape(monitor)
            self.last_cost = CycleCost(
                len(results), time.perf_counter() - wall, time.thread_time() - cpu
            )

    def _from_scrape(
        self, monitor: HostMemoryMonitor
    ) -> dict[str, PublishedReading | NodeGroupMemory | SamplerError]:
        """Keep the samplers running, and publish the figures the scrape brought back.

        With :attr:`every_node`, every node the monitor scrapes keeps a sampler. A node whose
        sampler has stopped publishing (its figures marked stale) gets its error, not its
        figures. Only the
        nodes whose sampler published anew (or whose host or registration changed) get a
        new reading; every other node's reading stands as built, so a cycle costs what
        changed plus one look per node.
        """
        version, workers, counts_by_node = self._registered()
        scraped = (
            _scraped_nodes(monitor) if self.every_node and self.samplers.ray_ready() else set()
        )
        if scraped != self._nodes:
            self._nodes = frozenset(scraped)
            self._nodes_version += 1
        # The samplers walk the worker lists only when the registry or the nodes changed.
        maintained = self.samplers.maintain(
            workers, version=(version, self._nodes_version), nodes=self._nodes
        )
        results: dict[str, PublishedReading | NodeGroupMemory | SamplerError] = dict(maintained)
        self._trust_known_samplers(monitor)
        before = self._built
        built: dict[str, PublishedReading] = {}
        for node_id, host, figures in _carried_figures(monitor):
            if node_id in results:
                continue
            stale = None if figures.node is None else figures.node.stale_for
            if stale is not None:  # its sampler stopped publishing: nothing of it is exported
                results[node_id] = SamplerError(
                    node_id,
                    f"the sampler on node {node_id} has published nothing for {stale:.0f} s, "
                    "so its figures are stale",
                )
                continue
            previous = before.get(node_id)
            if (
                previous is not None
                and (
                    previous.figures is figures or previous.figures.sampled_at == figures.sampled_at
                )
                and previous.host_name == host
                and previous.registry_version == version
            ):
                # The sampler has published nothing new since: the same reading stands.
                reading = previous
            else:
                reading = PublishedReading(
                    host, figures, counts_by_node.get(node_id, _NO_WORKERS), version
                )
            results[node_id] = built[node_id] = reading
        self._built = built
        self.snapshot.publish(results, max_age=monitor.max_age)
        return results

    def _trust_known_samplers(self, monitor: HostMemoryMonitor) -> None:
        """List this driver's samplers in the registry; have ``monitor`` believe the known."""
        samplers = self.samplers
        if not isinstance(monitor, _TrustingMonitor) or not isinstance(samplers, _Listing):
            return  # a stand-in that starts no sampler, or a monitor that believes any
        if not samplers.ray_ready():
            return
        if samplers.ids_version != self._ids_version:
            self._ids_version = samplers.ids_version
            self.trust.started(samplers.sampler_ids())
        self.trust.publish()
        monitor.trust_samplers(self.trust.trusted())

    def close(self) -> None:
        """Remove every sampler; the next collection starts them again."""
        with self._lock:
            self.samplers.close()


@runtime_checkable
class _TrustingMonitor(Protocol):
    def trust_samplers(self, ids: Mapping[str, str] | None) -> None: ...


@runtime_checkable
class _Listing(Protocol):
    @property
    def ids_version(self) -> int: ...

    def ray_ready(self) -> bool: ...

    def sampler_ids(self) -> dict[str, str]: ...


def _scraped_nodes(monitor: HostMemoryMonitor) -> set[str]:
    """The ids of the nodes ``monitor`` scrapes (its live nodes)."""
    if isinstance(monitor, RecordSource):
        return {record.node.node_id for record in monitor.records().values()}
    latest = getattr(monitor, "latest", None)  # a stand-in may only carry figures
    if latest is None:
        return set(monitor.group_figures())
    return {sample.node_id for sample in latest()}


def _carried_figures(monitor: HostMemoryMonitor) -> Iterator[tuple[str, str, NodeGroupFigures]]:
    """``(node id, host, figures)`` of every node whose latest scrape carried group figures.

    Read from the monitor's records where it has them (no table of copies is built),
    else from its ``group_figures()``.
    """
    if isinstance(monitor, RecordSource):
        for record in monitor.records().values():
            if record.groups is not None and record.sampled_at is not None:
                yield record.node.node_id, record.node.host, record.groups
        return
    for node_id, (host, figures, _read_at) in monitor.group_figures().items():
        yield node_id, host, figures


_DEFAULT_CYCLE: GroupMemoryCycle | None = None
_DEFAULT_LOCK = threading.Lock()
forking.renew_lock_in_child(sys.modules[__name__], "_DEFAULT_LOCK")


def default_group_memory_cycle() -> GroupMemoryCycle:
    """The process's cycle over the process-wide registry and snapshot, made on first use."""
    global _DEFAULT_CYCLE
    with _DEFAULT_LOCK:
        if _DEFAULT_CYCLE is None:
            _DEFAULT_CYCLE = GroupMemoryCycle()
        return _DEFAULT_CYCLE


def attach_group_memory(
    monitor: HostMemoryMonitor, cycle: GroupMemoryCycle | None = None
) -> GroupMemoryCycle:
    """Export the group-memory gauges and collect them at every cycle of ``monitor``.

    ``cycle`` defaults to :func:`default_group_memory_cycle`. Attaching the same
    cycle again does nothing more; the monitor's stop removes the samplers.
    """
    cycle = cycle if cycle is not None else default_group_memory_cycle()
    register_group_memory_gauges(cycle.snapshot)
    monitor.add_cycle_hook(cycle, on_stop=cycle.close)
    return cycle
