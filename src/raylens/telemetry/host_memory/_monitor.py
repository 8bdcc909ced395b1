"""The monitor's policy: when to scrape, in what order, and what a cycle publishes.

:class:`HostMemoryMonitor` lists the live nodes, hands them to a scrape engine
(the helper process by default, or the in-process engine, or threads running a
replaced ``_scrape``), and publishes what came back into its own
:class:`Snapshot`, which the gauges read. It never touches the network itself.

Ordering and fairness: exactly one request per node per cycle and no retry
within it. Nodes that answered last time are asked first, nodes that failed fast
next. Wedged nodes (those that ran into the deadline, or whose deadline passed
before a request slot freed up) are asked in a lane of their own with its own
request slots, least recently asked first: they cannot keep healthy nodes
waiting for a slot, and when there are more of them than slots they take turns.

Time: sample ages and expiry run on the injected ``clock`` (default
``time.monotonic``); request deadlines are held by the engine in real time.
"""

from __future__ import annotations

import enum
import logging
import os
import threading
import time
from collections.abc import Callable, Hashable, Mapping

from raylens import forking
from raylens.cluster import ClusterView, default_cluster_view, ray_call_errors
from raylens.lens import get_telemetry_handle, reset_warn_once, warn_once
from raylens.safe_text import printable
from raylens.telemetry.host_memory._cycle_hooks import CycleHooks
from raylens.telemetry.host_memory._gauges import declare_gauges
from raylens.telemetry.host_memory._helper_engine import HelperEngine
from raylens.telemetry.host_memory._nodes import RayNode, ray_nodes
from raylens.telemetry.host_memory._placement import DEFAULT_REGISTRY
from raylens.telemetry.host_memory._snapshot import (
    HealthFields,
    NodeRecord,
    NodeSample,
    Snapshot,
    hold_publisher,
    node_attributes,
    register_publisher,
    release_publisher,
)
from raylens.telemetry.host_memory._threaded_scrapes import ThreadedScrapes
from raylens.telemetry.names import LOGGER_NAME, NO_WORKER_GROUPS
from raylens.telemetry.raylet_payload import (
    ERROR_INTERNAL,
    ERROR_NO_METRICS_PORT,
    ERROR_TIMEOUT,
    TOTAL_KEY,
    USED_KEY,
    NodeGroupFigures,
    NodeOomCounts,
)
from raylens.telemetry.scraping import (
    MAX_BODY_BYTES,
    MAX_CONCURRENCY,
    AsyncScrapeEngine,
    Outcome,
    PrestartingEngine,
    ScrapeEngine,
    ScrapeLimits,
    TrustingEngine,
    fetch_once,
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
STOPPED_ERROR = "not answered before monitoring stopped"
#: Why a node without a metrics port has no sample; short enough for a table cell.
NO_METRICS_ERROR = "serves no metrics (MetricsExportPort missing or -1): needs 'ray[default]'"
#: Environment variable that picks the scrape mode when none is passed.
SCRAPE_MODE_ENV = "RAYLENS_SCRAPE_MODE"
_OVERRIDE_THREADS = 32

Clock = Callable[[], float]
NodeKey = tuple[str, str]
CycleHook = Callable[["HostMemoryMonitor"], None]


class _Standing(enum.IntEnum):
    """How a node fared last time; lower is asked earlier."""

    ANSWERED = 0
    FAILED = 1
    WEDGED = 2


#: Standing of a node never asked: treated like one that failed fast.
_NEW = (_Standing.FAILED, -1)


class ScrapeMode(enum.Enum):
    """Where scraping and parsing run."""

    #: In a helper process of its own; the driver only sends URLs and receives numbers.
    HELPER = "helper"
    #: On an event-loop thread of this process, for places where a child process is unwanted.
    INPROCESS = "inprocess"


def _scrape_mode(value: ScrapeMode | str | None) -> ScrapeMode:
    if isinstance(value, ScrapeMode):
        return value
    if value is None:
        raw = os.environ.get(SCRAPE_MODE_ENV, "")
        try:
            return ScrapeMode(raw.strip().lower()) if raw.strip() else ScrapeMode.HELPER
        except ValueError:
            warn_once(
                "host_memory.scrape_mode_env",
                f"{SCRAPE_MODE_ENV}={printable(repr(raw))} is not one of "
                f"{[m.value for m in ScrapeMode]}; scraping in a helper process",
                logger=logger,
            )
            return ScrapeMode.HELPER
    try:
        return ScrapeMode(value)
    except ValueError:
        raise ValueError(
            f"scrape_mode must be one of {[m.value for m in ScrapeMode]}, got {value!r}"
        ) from None


class HostMemoryMonitor:
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

    @property
    def helper_pid(self) -> int | None:
        """The scrape helper's pid while one runs (helper mode), else None."""
        engine = self._engine
        return engine.pid if isinstance(engine, HelperEngine) else None

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

    def _scrape_overridden(self) -> bool:
        return "_scrape" in vars(self) or type(self)._scrape is not _DEFAULT_SCRAPE

    def _run(self, order: list[RayNode]) -> dict[Hashable, Outcome]:
        standing = self._standing
        jobs = [
            (node.key, node.metrics_url, standing.get(node.key, _NEW)[0] is _Standing.WEDGED)
            for node in order
        ]
        if self._scrape_overridden():
            # Filled in place: the engine looks nodes up in this very dict.
            self._overridden_nodes.clear()
            self._overridden_nodes.update((node.key, node) for node in order)
            return self._override_engine().scrape(jobs, self.scrape_timeout)
        try:
            return self._engine_for_use().scrape(jobs, self.scrape_timeout)
        except Exception:  # whatever breaks the helper process, scraping goes on in this one
            if self.scrape_mode is not ScrapeMode.HELPER:
                raise
            warn_once(
                "host_memory.helper.failed",
                "the host-memory scrape helper could not run; scraping in this process instead",
                logger=logger,
            )
            self.scrape_mode = ScrapeMode.INPROCESS
            with self._lock:
                broken, self._engine = self._engine, None
            if broken is not None:
                broken.close(0.5)
            return self._engine_for_use().scrape(jobs, self.scrape_timeout)

    def _override_engine(self) -> ScrapeEngine:
        """The engine that calls the replaced ``_scrape`` of each node, in this process."""
        with self._lock:
            if self._threads is None:
                self._threads = ThreadedScrapes(
                    min(self.max_concurrency, _OVERRIDE_THREADS),
                    self._overridden_node,
                    self._scrape,
                )
            return self._threads

    def _overridden_node(self, key: Hashable) -> RayNode:
        """The node of ``key`` in the cycle in progress (the table is replaced every cycle)."""
        return self._overridden_nodes[key]

    def _engine_for_use(self) -> ScrapeEngine:
        with self._lock:
            if self._engine is None:
                self._engine = (
                    HelperEngine(self.limits)
                    if self.scrape_mode is ScrapeMode.HELPER
                    else AsyncScrapeEngine(self.limits)
                )
                if self._trusted_samplers is not None and isinstance(self._engine, TrustingEngine):
                    self._engine.trust_samplers(self._trusted_samplers)
            return self._engine

    def trust_samplers(self, ids: Mapping[str, str] | None) -> None:
        """Believe, from the next scrape on, only the series of the samplers in ``ids``: the
        Ray actor ids of the samplers raylens started, each to the Ray worker id its series
        must carry (``""`` while not known); None, the default: any sampler's."""
        with self._lock:
            if ids is self._trusted_samplers:
                return  # the same mapping again: nothing to tell the engine
            self._trusted_samplers = ids
            engine = self._engine
        if isinstance(engine, TrustingEngine):
            engine.trust_samplers(ids)

    def _forget_departed(self, live: set[NodeKey]) -> None:
        """Drop everything held about nodes that left, so state stays as large as the cluster."""
        # Every node stays, cycle after cycle, in a steady cluster: checked in one call each.
        if not live.issuperset(self._standing):
            for key in [key for key in self._standing if key not in live]:
                del self._standing[key]
        for key in [key for key in self._warned if key not in live]:
            self._warned.discard(key)
            reset_warn_once(_warning_key(key))
        if not live.issuperset(self._records):
            self._records = {key: r for key, r in self._records.items() if key in live}
        self.snapshot.retain(live)

    def _publish(
        self,
        nodes: list[RayNode],
        results: dict[Hashable, Outcome],
        started: float,
        *,
        stopped: bool,
    ) -> None:
        """Publish one cycle; ``stopped`` when :meth:`stop` cut it short (nobody is blamed).

        Builds one :class:`NodeRecord` per listed node and publishes them as one mapping.
        """
        previous = self._records
        records: dict[NodeKey, NodeRecord] = {}
        version, labels = DEFAULT_REGISTRY.labels_by_node()
        # One standing shared by every node that answers this cycle (a tuple per cycle).
        answered = (_Standing.ANSWERED, self._cycles)
        standing, warned, max_age = self._standing, self._warned, self.max_age
        for node in nodes:
            key = node.key
            label = labels.get(node.node_id, NO_WORKER_GROUPS)
            before = previous.get(key)
            attributes = (
                before.attributes
                if before is not None and before.worker_groups == label
                else node_attributes(node, label)
            )
            outcome = results.get(key)
            if outcome is None:
                outcome = self._unanswered(stopped)
            elif outcome.values:  # the node answered: the common case, kept short
                values, _, _, asked, elapsed, error_type, duration, groups, oom, refused = outcome
                if refused is not None:
                    _warn_refused(node, refused)
                standing[key] = answered
                # Aged from the node's answer, not from the end of the cycle.
                sampled_at = started + elapsed
                expires_at = sampled_at + max_age
                duration = _request_seconds(duration, asked, error_type, elapsed)
                if oom is not None and before is not None and oom == before.oom:
                    oom = before.oom  # unchanged counters: the object the last record holds
                records[key] = NodeRecord(
                    node,
                    values,
                    sampled_at,
                    None,
                    (1, None, duration, sampled_at, expires_at),
                    label,
                    version,
                    attributes,
                    groups,
                    oom,
                    expires_at,
                )
                if key in warned:
                    warned.discard(key)
                    reset_warn_once(_warning_key(key))
                continue
            records[key] = self._unanswered_record(
                node, outcome, before, label, version, attributes, started
            )
        self._records = records
        self.snapshot.publish(records)

    def _unanswered(self, stopped: bool) -> Outcome:
        """The outcome of a node missing from an engine's results."""
        if stopped:
            return Outcome(None, STOPPED_ERROR, asked=False)
        return Outcome(
            None,
            f"no answer within the {self.scrape_timeout:g} s scrape timeout",
            wedged=True,
            error_type=ERROR_TIMEOUT,
            duration=self.scrape_timeout,
        )

    def _unanswered_record(
        self,
        node: RayNode,
        outcome: Outcome,
        before: NodeRecord | None,
        label: str,
        version: int,
        attributes: Mapping[str, str],
        started: float,
    ) -> NodeRecord:
        """The record of a node that gave no sample: its last good figures, why, and a warning."""
        self._note_standing(node.key, outcome)
        error = printable(outcome.error or "no sample")
        if outcome.error_type == ERROR_NO_METRICS_PORT:
            warn_once(
                "host_memory.no_metrics_port",
                f"Ray node {node.node_id} ({printable(node.host)}) serves no metrics, so "
                "raylens shows no memory for it (nor for any other such node): its Ray was "
                "installed without its default extra. Run pip install 'ray[default]' "
                "on every node and restart Ray there.",
                logger=logger,
            )
        elif error != STOPPED_ERROR:
            self._warned.add(node.key)
            warn_once(
                _warning_key(node.key),
                f"no host-memory sample from node {node.node_id} ({printable(node.host)}, "
                f"{printable(node.metrics_url)}): {error}",
                logger=logger,
            )
        return NodeRecord(
            node,
            None if before is None else before.values,
            None if before is None else before.sampled_at,
            error,
            self._health(outcome, started) if outcome.error != STOPPED_ERROR else None,
            label,
            version,
            attributes,
        )

    def records(self) -> Mapping[NodeKey, NodeRecord]:
        """The latest cycle's :class:`NodeRecord` of every live node, by ``(node id, host)``.

        The mapping the cycle published to :attr:`snapshot`; never changed afterwards.
        """
        return self._records

    def group_figures(self) -> dict[str, tuple[str, NodeGroupFigures, float]]:
        """Per node id: host name, the per-group figures its payload carried, and when read.

        Only nodes whose latest scrape answered and carried a sampler's series; the
        time is on this monitor's clock.
        """
        return {
            record.node.node_id: (record.node.host, record.groups, record.sampled_at)
            for record in self._records.values()
            if record.groups is not None and record.sampled_at is not None
        }

    def oom_counts(self) -> dict[str, tuple[str, NodeOomCounts, float]]:
        """Per node id: host name, the kill counters its latest scrape carried, and when read.

        Only nodes whose latest scrape answered and carried a counter; the time is on
        this monitor's clock.
        """
        return {
            record.node.node_id: (record.node.host, record.oom, record.sampled_at)
            for record in self._records.values()
            if record.oom is not None and record.sampled_at is not None
        }

    def _health(self, outcome: Outcome, started: float) -> HealthFields:
        """The scrape-health entry's fields (as :class:`ScrapeHealth` orders them) for one
        node's ``outcome`` in a cycle begun at ``started``."""
        observed_at = started + outcome.elapsed
        if outcome.values:
            up, error_type = 1, None
        else:
            up = 0
            error_type = outcome.error_type or (ERROR_TIMEOUT if outcome.wedged else ERROR_INTERNAL)
        duration = _request_seconds(
            outcome.duration, outcome.asked, outcome.error_type, outcome.elapsed
        )
        return (up, error_type, duration, observed_at, observed_at + self.max_age)

    def _note_standing(self, key: NodeKey, outcome: Outcome) -> None:
        if outcome.error == STOPPED_ERROR or outcome.error_type == ERROR_NO_METRICS_PORT:
            return
        if outcome.values:
            standing = _Standing.ANSWERED
        elif outcome.wedged:
            standing = _Standing.WEDGED
        else:
            standing = _Standing.FAILED
        last_asked = self._standing.get(key, (_Standing.FAILED, -1))[1]
        self._standing[key] = (standing, self._cycles if outcome.asked else last_asked)

    # One node ------------------------------------------------------------------------

    def _scrape(self, node: RayNode) -> dict[str, float]:
        """Fetch and parse one node's memory series now; ``{}`` when that fails.

        The per-node seam: a subclass or a test that replaces this method changes
        what every cycle fetches (the cycle then calls it in this process). A
        failure is not retried: the next cycle is the retry.
        """
        return dict(fetch_once(node.metrics_url, self.limits).values or {})

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


_DEFAULT_SCRAPE = HostMemoryMonitor._scrape


def _request_seconds(
    duration: float | None, asked: bool, error_type: str | None, elapsed: float
) -> float | None:
    """How long a node's request took: the engine's own timing, else (for a replaced engine
    that does not time its requests) the time to its outcome; None when nothing was sent."""
    if duration is None and asked and error_type != ERROR_NO_METRICS_PORT:
        return elapsed
    return duration


def _warn_refused(node: RayNode, refused: tuple[int, tuple[str, ...]]) -> None:
    """One warning per node naming what of its payload was not believed: values beyond
    physical bounds, samplers stamped in the future, publishers that are no known sampler."""
    count, named = refused
    more = f" and {count - len(named)} more" if count > len(named) else ""
    warn_once(
        f"host_memory.refused.{node.node_id}",
        f"node {printable(node.node_id[:56])} ({printable(node.host)}) published {count} "
        "value(s) or sampler(s) raylens does not believe (beyond physical bounds, stamped "
        "in the future, or not a sampler raylens started), refused: "
        f"{printable(', '.join(named))[:600]}{more}; "
        "another job may be publishing series under raylens' names (warned once per node)",
        logger=logger,
    )


def _warning_key(key: NodeKey) -> str:
    return f"host_memory.scrape.{key[0]}"
