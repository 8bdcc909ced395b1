"""The host-memory monitor: its lifetime, its cycle, and what readers get from it.

:class:`HostMemoryMonitor` lists the live nodes, hands them to a scrape engine
(the helper process by default, or the in-process engine, or threads running a
replaced ``_scrape``), and publishes what came back into its own
:class:`Snapshot`, which the gauges read. It never touches the network itself.

This module owns starting and stopping the monitor, its collection thread, one
cycle from listing the nodes to running the cycle hooks, and :meth:`~HostMemoryMonitor.latest`.
The rest of the class lives beside it, in its bases: which engine runs a cycle's
batch and what it falls back to (``_scrape_engines``), the replaceable per-node
``_scrape`` (``_scrape_override``), and the node standings that order the next
cycle and the records a cycle publishes (``_cycle_records``).

Time: sample ages and expiry run on the injected ``clock`` (default
``time.monotonic``); request deadlines are held by the engine in real time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable, Mapping

from raylens import forking
from raylens.cluster import ClusterView, default_cluster_view, ray_call_errors
from raylens.lens import get_telemetry_handle, warn_once
from raylens.safe_text import printable
from raylens.telemetry.host_memory._cycle_hooks import CycleHooks
from raylens.telemetry.host_memory._cycle_records import _NEW, CycleRecords, _Standing
from raylens.telemetry.host_memory._cycle_records import NO_METRICS_ERROR as NO_METRICS_ERROR
from raylens.telemetry.host_memory._cycle_records import STOPPED_ERROR as STOPPED_ERROR
from raylens.telemetry.host_memory._cycle_records import NodeKey as NodeKey
from raylens.telemetry.host_memory._gauges import declare_gauges
from raylens.telemetry.host_memory._nodes import RayNode, ray_nodes
from raylens.telemetry.host_memory._placement import DEFAULT_REGISTRY
from raylens.telemetry.host_memory._scrape_engines import (
    SCRAPE_MODE_ENV,
    EngineChoice,
    ScrapeMode,
    _scrape_mode,
)
from raylens.telemetry.host_memory._snapshot import (
    NodeRecord,
    NodeSample,
    Snapshot,
    hold_publisher,
    register_publisher,
    release_publisher,
)
from raylens.telemetry.host_memory._threaded_scrapes import ThreadedScrapes
from raylens.telemetry.names import LOGGER_NAME, NO_WORKER_GROUPS
from raylens.telemetry.raylet_payload import (
    ERROR_NO_METRICS_PORT,
    TOTAL_KEY,
    USED_KEY,
)
from raylens.telemetry.scraping import (
    MAX_BODY_BYTES,
    MAX_CONCURRENCY,
    Outcome,
    PrestartingEngine,
    ScrapeEngine,
    ScrapeLimits,
)
from raylens.validation import positive_seconds

__all__ = [
    "SCRAPE_MODE_ENV",
    "SCRAPE_TIMEOUT_S",
    "SHUTDOWN_GRACE_S",
    "HostMemoryMonitor",
    "ScrapeMode",
]

logger = logging.getLogger(LOGGER_NAME)

SCRAPE_TIMEOUT_S = 5.0
#: How long past its scrape timeout :meth:`HostMemoryMonitor.stop` may take.
SHUTDOWN_GRACE_S = 1.0

Clock = Callable[[], float]
CycleHook = Callable[["HostMemoryMonitor"], None]


class HostMemoryMonitor(EngineChoice, CycleRecords):
    """Scrapes every Ray node's host memory on a timer and publishes it for lens.

    Runs in the driver and only reads: it asks the cluster for its nodes (and the
    worker-group placement other jobs published) and has each raylet's metrics
    endpoint fetched, touching no worker. Starting it before
    the cluster is up is fine; it finds no nodes until there are some.

    Results go into :attr:`snapshot`, which the observable gauges read when lens
    exports, so collecting and exporting run on their own schedules: an exported
    figure can be up to one collection interval old. A cycle scrapes only when
    someone consumes the result: lens exporting, a ``consumer=True`` monitor, a
    :meth:`declare_consumer` call, or a :meth:`latest` reader. Otherwise it lists
    the nodes and sends nothing.

    Lifetime: once started or collected, a monitor is kept alive (and its samples
    exported) until :meth:`stop`, whether or not its creator keeps a reference, so
    stop every monitor you use.

    Args:
        collection_interval: Seconds between cycles (positive).
        cluster: Where the nodes come from; default the connected Ray.
        scrape_timeout: Hard limit, in seconds, on every request of a cycle, body included.
        max_concurrency: Most requests in flight at once in each of the two lanes
            (nodes in good standing, wedged nodes); default 256.
        max_age: Seconds, counted from the node's answer, after which its sample is
            no longer exported even if no newer one replaced it; default two
            intervals plus the scrape timeout.
        max_body_bytes: A payload larger than this is abandoned (no sample).
        clock: Monotonic seconds for sample ages and expiry (default ``time.monotonic``).
        scrape_mode: :class:`ScrapeMode` or its value; default from the
            ``RAYLENS_SCRAPE_MODE`` environment variable, else ``helper``.
        consumer: True when the caller reads :meth:`latest` (a table, a CLI).
        snapshot: Where to publish; default a snapshot of this monitor's own.

    Raises:
        ValueError: any argument out of range; the message names it.
    """

    def __init__(
        self,
        collection_interval: float,
        *,
        cluster: ClusterView | None = None,
        scrape_timeout: float = SCRAPE_TIMEOUT_S,
        max_concurrency: int = MAX_CONCURRENCY,
        max_age: float | None = None,
        max_body_bytes: int = MAX_BODY_BYTES,
        clock: Clock = time.monotonic,
        scrape_mode: ScrapeMode | str | None = None,
        consumer: bool = False,
        snapshot: Snapshot | None = None,
    ) -> None:
        self.collection_interval = positive_seconds("collection_interval", collection_interval)
        self.limits = ScrapeLimits(scrape_timeout, max_body_bytes, max_concurrency).checked()
        self.scrape_timeout = float(scrape_timeout)
        self.max_concurrency = max_concurrency
        self.max_body_bytes = max_body_bytes
        self.max_age = (
            2 * self.collection_interval + self.scrape_timeout
            if max_age is None
            else positive_seconds("max_age", max_age)
        )
        self.scrape_mode = _scrape_mode(scrape_mode)
        self.clock = clock
        self.snapshot = snapshot if snapshot is not None else Snapshot()
        self._cluster = cluster if cluster is not None else default_cluster_view()
        self._consumer = bool(consumer)
        self._lock = threading.Lock()
        self._cycle_lock = threading.Lock()
        self._stop_event = threading.Event()  # replaced on every start()
        self._thread: threading.Thread | None = None
        self._engine: ScrapeEngine | None = None
        self._trusted_samplers: Mapping[str, str] | None = None
        self._threads: ThreadedScrapes[RayNode] | None = None
        #: The nodes of the cycle in progress, by key, for a replaced ``_scrape``.
        self._overridden_nodes: dict[Hashable, RayNode] = {}
        self._generation = 0
        self._cycles = 0
        #: The latest cycle's record of every live node, as published to the snapshot.
        self._records: Mapping[NodeKey, NodeRecord] = {}
        self._standing: dict[NodeKey, tuple[_Standing, int]] = {}
        self._warned: set[NodeKey] = set()
        self._cycle_hooks = CycleHooks("host-memory", "host_memory.cycle_hook", logger)
        # Once the gauges read this monitor, they are declared: by whoever they read.
        register_publisher(self)
        declare_gauges()
        forking.reset_after_fork_in_child(self)

    def reset_after_fork(self) -> None:
        """In a forked child: not sampling, with fresh locks and none of the parent's hooks.

        The collection thread does not exist in the child, and its locks may have
        been copied held. The cycle hooks belong to the parent's wiring (they may
        call Ray, which a forked child cannot use), so they are dropped. The engine
        forgets the parent's helper by itself; a later :meth:`start` in the child
        starts afresh.
        """
        self._lock = threading.Lock()
        self._cycle_lock = threading.Lock()
        self._stop_event = threading.Event()
        self._thread = None
        self._threads = None
        self._cycle_hooks.clear()

    # Cycle hooks ---------------------------------------------------------------------

    def add_cycle_hook(self, hook: CycleHook, *, on_stop: Callable[[], None] | None = None) -> None:
        """Run ``hook(monitor)`` after every cycle, on the cycle's thread; ``on_stop`` at stop.

        Lets a layer above (the driver, the worker groups) collect its own figures at
        the monitor's pace without this package knowing it. A hook that raises is
        logged once and the cycle carries on. Adding a hook already added does nothing.
        """
        self._cycle_hooks.add(hook, on_stop)

    def remove_cycle_hook(self, hook: CycleHook) -> None:
        """Stop running ``hook`` (its ``on_stop`` is not called); unknown hooks are ignored."""
        self._cycle_hooks.remove(hook)

    # Consumers -----------------------------------------------------------------------

    def declare_consumer(self) -> None:
        """Say that someone reads :meth:`latest`, so every cycle scrapes."""
        self._consumer = True

    @property
    def has_consumer(self) -> bool:
        """True when a cycle's result is read: a declared consumer, or lens exporting."""
        if self._consumer:
            return True
        handle = get_telemetry_handle()
        return handle is not None and handle.is_exporting

    # Lifetime ------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """True between :meth:`start` and :meth:`stop`."""
        with self._lock:
            return self._thread is not None

    def start(self) -> None:
        """Start sampling on a background thread (``raylens-host-memory``). Idempotent."""
        hold_publisher(self)
        with self._lock:
            if self._thread is not None:
                return
            # A fresh event per loop: a loop from before a stop() that is still stuck
            # (say, in the cluster's nodes()) must stay stopped after a new start().
            self._stop_event = threading.Event()
            self._thread = threading.Thread(
                target=self._collection_loop,
                args=(self._stop_event,),
                name="raylens-host-memory",
                daemon=True,
            )
            self._thread.start()
        wanted = self.has_consumer and not self._scrape_overridden()
        if wanted and self.scrape_mode is ScrapeMode.HELPER:
            try:
                engine = self._engine_for_use()
                if isinstance(engine, PrestartingEngine):
                    engine.prestart()
            except Exception:  # the helper is another process: the first cycle tries again
                logger.debug("could not pre-start the scrape helper", exc_info=True)

    def stop(self) -> None:
        """Stop sampling and end the helper and engine threads. Idempotent; never raises.

        Returns within ``scrape_timeout`` plus a second however the nodes behave: a
        cycle in progress is cut short and publishes what it has.
        """
        deadline = time.monotonic() + self.scrape_timeout + SHUTDOWN_GRACE_S / 2
        with self._lock:
            self._stop_event.set()
            self._generation += 1
            thread, self._thread = self._thread, None
            engine, self._engine = self._engine, None
            threads, self._threads = self._threads, None
        if threads is not None:
            threads.close()
        if engine is not None:
            try:
                engine.close(min(SHUTDOWN_GRACE_S / 2, max(0.0, deadline - time.monotonic())))
            except Exception:  # noqa: BLE001 stop never raises: a broken engine must not keep the monitor running
                warn_once(
                    "host_memory.engine.close", "closing the scrape engine failed", logger=logger
                )
        if thread is not None and thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))
        self._cycle_hooks.run(self, stopping=True)
        release_publisher(self)

    def _collection_loop(self, stop: threading.Event) -> None:
        """Run a cycle every :attr:`collection_interval` seconds until ``stop`` is set."""
        while not stop.is_set():
            started = time.monotonic()  # real waiting, so real time
            self._guarded_cycle(stop)
            stop.wait(max(0.0, self.collection_interval - (time.monotonic() - started)))

    # One cycle -----------------------------------------------------------------------

    def collect_once(self) -> None:
        """Scrape every node once and publish the result. Never raises.

        Returns within ``scrape_timeout`` plus a fraction of a second (plus, in
        helper mode, the helper's start-up on the first cycle). A node whose
        previous request is still open is not asked again. From here on the monitor
        is kept alive until :meth:`stop`.
        """
        hold_publisher(self)
        self._guarded_cycle(None)

    def _guarded_cycle(self, stop: threading.Event | None) -> None:
        try:
            self._collect_once(stop)
        except Exception:  # noqa: BLE001 a cycle never raises: the one guard over all it calls
            warn_once(
                "host_memory.collect",
                "a host-memory collection cycle failed; samples are kept until they age out",
                logger=logger,
            )
        if stop is None or not stop.is_set():
            self._cycle_hooks.run(self, stopping=False)

    def _collect_once(self, stop: threading.Event | None = None) -> None:
        """Body of :meth:`collect_once`; ``stop`` is the calling loop's stop event."""
        # Listed outside the cycle lock: a cluster call that hangs must not keep a
        # restarted loop (or a caller's own collect_once) from running.
        try:
            nodes = ray_nodes(self._cluster, include_unscrapeable=True)
        except ray_call_errors(None, LookupError) as exc:
            warn_once(
                "host_memory.nodes",
                f"could not list the cluster's nodes ({type(exc).__name__}: {printable(exc)}); "
                "samples are kept until they age out",
                logger=logger,
            )
            return
        if nodes and self.has_consumer:
            # Other processes' worker groups (a driver's, seen from a watch). Read outside
            # the cycle lock, like the nodes, and never raises.
            DEFAULT_REGISTRY.refresh_published(self._cluster)
        with self._cycle_lock:
            if stop is not None and stop.is_set():
                return
            self._forget_departed({node.key for node in nodes})
            if not nodes or not self.has_consumer:
                return
            generation = self._generation
            self._cycles += 1
            scrapeable = [node for node in nodes if node.metrics_url]
            standing = self._standing.get
            order = sorted(scrapeable, key=lambda node: standing(node.key, _NEW))
            started = self.clock()
            results = self._run(order) if order else {}
            if len(scrapeable) != len(nodes):
                for node in nodes:
                    if not node.serves_metrics:
                        results[node.key] = Outcome(
                            None, NO_METRICS_ERROR, asked=False, error_type=ERROR_NO_METRICS_PORT
                        )
            self._publish(nodes, results, started, stopped=generation != self._generation)

    # Reading -------------------------------------------------------------------------

    def latest(self) -> list[NodeSample]:
        """What the last cycle learnt about each node, sorted by host then node id.

        Nodes whose scrape failed are included, with their error and their last
        good figures, so a table can show a hung node rather than drop it; so are
        live nodes that serve no metrics, with an error saying so. Nodes that left
        the cluster are not. Reads no network. Calling it makes this
        monitor a consumer: its cycles scrape from now on.
        """
        self._consumer = True
        _version, labels = DEFAULT_REGISTRY.labels_by_node()
        rows = []
        for record in list(self._records.values()):
            node, values = record.node, record.values or {}
            rows.append(
                NodeSample(
                    node_id=node.node_id,
                    host=node.host,
                    ip=node.ip,
                    used=values.get(USED_KEY),
                    total=values.get(TOTAL_KEY),
                    worker_groups=labels.get(node.node_id, NO_WORKER_GROUPS),
                    sampled_at=record.sampled_at,
                    error=record.error,
                    metrics_url=node.metrics_url,
                )
            )
        return sorted(rows, key=lambda s: (s.host, s.node_id))

    def __repr__(self) -> str:
        return (
            f"HostMemoryMonitor(collection_interval={self.collection_interval:g}, "
            f"scrape_timeout={self.scrape_timeout:g}, scrape_mode={self.scrape_mode.value}, "
            f"running={self.running})"
        )
