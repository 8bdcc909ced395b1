"""Host memory of every Ray node, read from the raylets and exported through lens.

Every raylet serves its node's Prometheus metrics, and two of those series say how
much memory the host has and how much of it is in use: ``ray_node_mem_total`` and
``ray_node_mem_used``. The driver scrapes them from every live node on a timer
(:class:`HostMemoryMonitor`) and lens exports them as two observable gauges,
``rl.host.memory.used`` and ``rl.host.memory.total``, in bytes.

Each point carries three attributes: ``host.name``; ``ray.node.id``, which keeps
apart nodes that share a host (``ray.cluster_utils.Cluster`` starts several raylets
on one machine); and ``rl.worker_groups``, the worker groups with at least one
worker on that node.

What the figure means: ``ray_node_mem_used`` covers the whole host. The raylet,
the object store (often the largest consumer, and the usual reason a node runs out
of memory), every worker on the host and, on the head node, the driver are all in
it, with no breakdown. ``rl.worker_groups`` therefore says who lives on a node, not
who uses its memory; two groups sharing a node share one figure.

Why scraping is built the way it is: a cluster of a thousand nodes has, at any time,
some nodes that are slow, wedged, restarting or gone. Nodes are scraped concurrently
by a small pool of persistent threads, each scrape under a hard total deadline and
a size cap, so one bad node costs only its own sample: it never delays the other
nodes, never grows the thread count, and is not asked again while its last request
is still open. The gauges' callbacks only read the latest published samples, so an
export never waits on the network; a sample older than its maximum age is not
exported even when collection is stuck.

State, all reset by :func:`reset_host_memory_state`: the published samples
(:data:`_SNAPSHOT`), the worker-group placement map (:data:`_WORKER_GROUP_NODES`)
and the process's monitor (:data:`_MONITOR`).
"""

from __future__ import annotations

import functools
import logging
import math
import queue
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

import requests
import requests.adapters
import urllib3
import urllib3.connection
import urllib3.exceptions
from opentelemetry.metrics import CallbackOptions, Observation

from raylens.cluster import ClusterView, default_cluster_view
from raylens.lens import (
    OBSERVABLE_GAUGE,
    RecordedMetric,
    register_observable_gauge,
    registry_key,
    reset_warn_once,
    warn_once,
)
from raylens.telemetry.prometheus_text import extract_samples

__all__ = [
    "FALLBACK_COLLECTION_INTERVAL",
    "HOST_MEMORY_RECORDED_METRICS",
    "HOST_NAME_ATTR",
    "NO_WORKER_GROUPS",
    "RAY_NODE_ID_ATTR",
    "RAY_NODE_MEM_TOTAL",
    "RAY_NODE_MEM_USED",
    "RL_HOST_MEMORY_TOTAL_METRIC",
    "RL_HOST_MEMORY_USED_METRIC",
    "RL_WORKER_GROUPS_ATTR",
    "HostMemoryMonitor",
    "NodeSample",
    "RayNode",
    "forget_worker_group_nodes",
    "format_worker_groups",
    "parse_memory_samples",
    "ray_nodes",
    "register_worker_group_nodes",
    "register_worker_group_placement",
    "reset_host_memory_state",
    "start_host_memory_monitoring",
    "stop_host_memory_monitoring",
    "worker_group_names_on_node",
    "worker_groups_on_node",
]

logger = logging.getLogger(__name__)

RL_HOST_MEMORY_USED_METRIC = "rl.host.memory.used"
RL_HOST_MEMORY_TOTAL_METRIC = "rl.host.memory.total"

HOST_NAME_ATTR = "host.name"
#: Worker groups with at least one worker on the node: their names, sorted and joined
#: with commas, or :data:`NO_WORKER_GROUPS`. It tells which groups a node's memory
#: figure is shared by; it is not a per-group figure, and summing the memory of the
#: points that carry one group's name counts every shared node once per group.
RL_WORKER_GROUPS_ATTR = "rl.worker_groups"
RAY_NODE_ID_ATTR = "ray.node.id"
NO_WORKER_GROUPS = "none"

RAY_NODE_MEM_USED = "ray_node_mem_used"
RAY_NODE_MEM_TOTAL = "ray_node_mem_total"

_USED_KEY = registry_key(RL_HOST_MEMORY_USED_METRIC)
_TOTAL_KEY = registry_key(RL_HOST_MEMORY_TOTAL_METRIC)

#: The raylet series read from each payload, and the registry key each is filed under.
_SERIES_BY_RAY_NAME: dict[str, str] = {
    RAY_NODE_MEM_USED: _USED_KEY,
    RAY_NODE_MEM_TOTAL: _TOTAL_KEY,
}

#: Latest good sample of every node, ``{(node id, host name): {registry key: bytes}}``.
#: Written only by a finished collection cycle, read by the gauge callbacks.
_SNAPSHOT: dict[tuple[str, str], dict[str, float]] = {}
#: When each entry of :data:`_SNAPSHOT` stops being exported (``time.monotonic`` seconds).
_SNAPSHOT_EXPIRY: dict[tuple[str, str], float] = {}
_SNAPSHOT_LOCK = threading.Lock()

FALLBACK_COLLECTION_INTERVAL = 10.0
_SCRAPE_TIMEOUT_S = 5.0
#: How long past its scrape timeout :meth:`HostMemoryMonitor.stop` may wait for threads.
_SHUTDOWN_GRACE_S = 1.0
#: How long past the scrape deadline a cycle waits for results already on their way.
_CYCLE_SLACK_S = 0.25
#: Most of the cycle's time the first try at a node may take (see _scrape_task).
_FIRST_TRY_S = 1.0
#: A node is tried again only if the cycle has at least this much time left.
_RETRY_MIN_S = 0.1
_MAX_CONCURRENCY = 32
_STOPPED_ERROR = "not answered before monitoring stopped"
_MAX_BODY_BYTES = 16 * 1024 * 1024
_READ_CHUNK = 64 * 1024
# An uncompressed body keeps the deadline exact (a decoder can read many times for
# one returned chunk) and spares the CPU of inflating it; the connection is not kept
# because a pooled connection the raylet has since closed would cost a sample.
_REQUEST_HEADERS = {"Accept-Encoding": "identity", "Connection": "close"}

#: ``{worker group name: node ids}``, written by the driver's worker groups.
_WORKER_GROUP_NODES: dict[str, frozenset[str]] = {}
_WORKER_GROUP_LOCK = threading.Lock()

_PLACED_STATES = frozenset({"CREATED", "RESCHEDULING"})

HOST_MEMORY_RECORDED_METRICS: tuple[RecordedMetric, ...] = (
    RecordedMetric(
        RL_HOST_MEMORY_USED_METRIC,
        OBSERVABLE_GAUGE,
        "By",
        "Memory in use on a Ray node's host, as its raylet reports it: the whole host, "
        "object store, raylet, workers and driver included.",
    ),
    RecordedMetric(
        RL_HOST_MEMORY_TOTAL_METRIC,
        OBSERVABLE_GAUGE,
        "By",
        "Total memory of a Ray node's host, as its raylet reports it.",
    ),
)


# Export -------------------------------------------------------------------------------


def _observations(key: str) -> list[Observation]:
    """One observation per node with a fresh sample of ``key`` (a registry key).

    Reads only the published snapshot and the placement map: no I/O, so an export
    never waits on a node. Samples past their expiry are left out, and the worker
    group label is worked out now, so a group registered or forgotten since the
    sample was taken is already reflected.
    """
    now = time.monotonic()
    with _SNAPSHOT_LOCK:
        fresh = [
            (node_key, values[key])
            for node_key, values in _SNAPSHOT.items()
            if key in values and now <= _SNAPSHOT_EXPIRY.get(node_key, -math.inf)
        ]
    if not fresh:
        return []
    groups = _groups_by_node()
    return [
        Observation(
            value,
            {
                HOST_NAME_ATTR: host,
                RL_WORKER_GROUPS_ATTR: format_worker_groups(groups.get(node_id, ())),
                RAY_NODE_ID_ATTR: node_id,
            },
        )
        for (node_id, host), value in fresh
    ]


def _observe_used(options: CallbackOptions) -> list[Observation]:
    return _observations(_USED_KEY)


def _observe_total(options: CallbackOptions) -> list[Observation]:
    return _observations(_TOTAL_KEY)


def _declare_gauges() -> None:
    """Declare both gauges with lens (idempotent: a second call replaces the callbacks)."""
    used, total = HOST_MEMORY_RECORDED_METRICS
    register_observable_gauge(used, _observe_used)
    register_observable_gauge(total, _observe_total)


def _publish_snapshot(
    samples: dict[tuple[str, str], dict[str, float]], expiry: dict[tuple[str, str], float]
) -> None:
    with _SNAPSHOT_LOCK:
        _SNAPSHOT.clear()
        _SNAPSHOT.update(samples)
        _SNAPSHOT_EXPIRY.clear()
        _SNAPSHOT_EXPIRY.update(expiry)


# Worker groups -----------------------------------------------------------------------


def _check_group_name(name_prefix: object) -> str:
    if not isinstance(name_prefix, str):
        raise TypeError(
            f"worker group name must be a str, got {type(name_prefix).__name__} {name_prefix!r}"
        )
    if not name_prefix:
        raise ValueError("worker group name must not be empty: it labels the nodes it runs on")
    if "," in name_prefix:
        raise ValueError(
            f"worker group name {name_prefix!r} contains a comma; {RL_WORKER_GROUPS_ATTR} "
            f"joins names with commas, so a name may hold any character but ','"
        )
    if name_prefix == NO_WORKER_GROUPS:
        raise ValueError(
            f"worker group name {name_prefix!r} is the label of a node with no worker group; "
            "choose another name"
        )
    return name_prefix


def register_worker_group_nodes(name_prefix: str, node_ids: Iterable[str]) -> None:
    """Record that worker group ``name_prefix`` has workers on ``node_ids``.

    ``name_prefix`` is the group's name, the value its workers carry as their
    ``rl.worker_group`` resource attribute, so the two can be joined. ``node_ids``
    are Ray node ids (hex); empty ones are ignored. The entry replaces any earlier
    one for the group, so a group rebuilt elsewhere after a restart is not reported
    on its old nodes as well.

    Raises:
        ValueError: ``name_prefix`` is empty, contains a comma, or is
            :data:`NO_WORKER_GROUPS`.
        TypeError: ``name_prefix`` or a node id is not a ``str``, or ``node_ids`` is
            a single string rather than an iterable of them.
    """
    _check_group_name(name_prefix)
    if isinstance(node_ids, (str, bytes)):
        raise TypeError(
            f"node_ids must be an iterable of node id strings, not the single "
            f"{type(node_ids).__name__} {node_ids!r}; pass [{node_ids!r}] for one node"
        )
    nodes = set()
    for node_id in node_ids:
        if not isinstance(node_id, str):
            raise TypeError(
                f"node id {node_id!r} of worker group {name_prefix!r} must be a hex str, "
                f"not {type(node_id).__name__}"
            )
        if node_id:
            nodes.add(node_id)
    with _WORKER_GROUP_LOCK:
        _WORKER_GROUP_NODES[name_prefix] = frozenset(nodes)


def register_worker_group_placement(
    name_prefix: str,
    bundles: Iterable[tuple[Any, int]],
    *,
    cluster: ClusterView | None = None,
) -> None:
    """Find the nodes under ``bundles`` and register them for ``name_prefix``.

    ``bundles`` are the ``(placement group, bundle index)`` pairs the group's
    workers sit on; a bundle index of -1 stands for every bundle of its group.
    Each placement group is looked up once (``placement_group_table``), however
    many bundles it contributes: Ray's scheduling record, read on the driver
    without asking any worker. Only groups in state ``CREATED`` or ``RESCHEDULING``
    are read, since the node ids of any other state are not, or no longer, where
    the bundles are; unplaced bundles (empty node id) are skipped.

    Never raises because of the cluster: when a lookup fails, the failure is
    warned about once and the group keeps whatever it was registered with before.
    Only a bad ``name_prefix`` raises (ValueError or TypeError, as in
    :func:`register_worker_group_nodes`), since that is the caller's bug.
    """
    _check_group_name(name_prefix)
    try:
        nodes = _resolve_bundles(
            bundles, cluster if cluster is not None else default_cluster_view()
        )
    except Exception as exc:
        warn_once(
            f"host_memory.placement.{name_prefix}",
            f"could not resolve the placement of worker group {name_prefix!r} "
            f"({type(exc).__name__}: {exc}); its nodes stay as last registered",
            logger=logger,
        )
        return
    register_worker_group_nodes(name_prefix, nodes)


def _resolve_bundles(bundles: Iterable[tuple[Any, int]], cluster: ClusterView) -> set[str]:
    by_group: dict[tuple[str, Any], tuple[Any, list[int]]] = {}
    for placement_group, bundle_index in bundles:
        try:
            hash(placement_group)
            group_key: tuple[str, Any] = ("handle", placement_group)
        except TypeError:  # an unhashable handle is grouped by identity
            group_key = ("id", id(placement_group))
        by_group.setdefault(group_key, (placement_group, []))[1].append(bundle_index)
    nodes: set[str] = set()
    for placement_group, indices in by_group.values():
        table = cluster.placement_group_table(placement_group) or {}
        if table.get("state") not in _PLACED_STATES:
            continue
        placed = table.get("bundles_to_node_id") or {}
        for index in indices:
            if index == -1:
                candidates = list(placed.values())
            else:
                candidates = [placed.get(index, placed.get(str(index), ""))]
            nodes.update(node_id for node_id in candidates if node_id)
    return nodes


def forget_worker_group_nodes(name_prefix: str) -> None:
    """Drop ``name_prefix``'s placement, for a group that has shut down. No-op if unknown."""
    with _WORKER_GROUP_LOCK:
        _WORKER_GROUP_NODES.pop(name_prefix, None)


def worker_group_names_on_node(node_id: str) -> set[str]:
    """Names of the worker groups with at least one worker on ``node_id``."""
    with _WORKER_GROUP_LOCK:
        return {name for name, nodes in _WORKER_GROUP_NODES.items() if node_id in nodes}


def format_worker_groups(names: Iterable[str]) -> str:
    """``names`` as :data:`RL_WORKER_GROUPS_ATTR` carries them: sorted, comma-joined, or ``none``."""
    unique = sorted(set(names))
    return ",".join(unique) if unique else NO_WORKER_GROUPS


def worker_groups_on_node(node_id: str) -> str:
    """The :data:`RL_WORKER_GROUPS_ATTR` value of ``node_id`` right now."""
    return format_worker_groups(worker_group_names_on_node(node_id))


def _groups_by_node() -> dict[str, list[str]]:
    """Every node with a worker group on it, with the names of those groups."""
    inverted: dict[str, list[str]] = {}
    with _WORKER_GROUP_LOCK:
        for name, nodes in _WORKER_GROUP_NODES.items():
            for node_id in nodes:
                inverted.setdefault(node_id, []).append(name)
    return inverted


# Nodes -----------------------------------------------------------------------------


@dataclass(frozen=True)
class RayNode:
    """One live Ray node: who it is, and where its raylet serves metrics.

    ``node_id`` is Ray's hex node id, the only field that tells apart two nodes
    on one host; ``ip`` is the node manager's address.
    """

    node_id: str
    host: str
    metrics_url: str
    ip: str = ""

    @property
    def key(self) -> tuple[str, str]:
        """``(node_id, host)``: how this node's sample is filed in :data:`_SNAPSHOT`."""
        return (self.node_id, self.host)


def _valid_port(port: object) -> bool:
    return isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536


def ray_nodes(cluster: ClusterView | None = None) -> list[RayNode]:
    """Live nodes of ``cluster`` (default: the connected Ray) that serve metrics.

    Dead nodes are left out, and so are nodes without a metrics port (``-1`` or
    missing: Ray installed without its ``default`` extra serves none). An
    empty list when Ray is not initialised, so a monitor started before
    ``ray.init`` simply finds nothing to do yet.
    """
    view = cluster if cluster is not None else default_cluster_view()
    if not view.is_initialized():
        return []
    found: list[RayNode] = []
    seen: set[str] = set()
    for entry in view.nodes():
        if entry.get("Alive") is not True:
            continue
        port = entry.get("MetricsExportPort")
        node_id = entry.get("NodeID")
        address = entry.get("NodeManagerAddress")
        if not _valid_port(port) or not node_id or not address or node_id in seen:
            continue
        seen.add(node_id)
        url_host = f"[{address}]" if ":" in address and not address.startswith("[") else address
        found.append(
            RayNode(
                node_id=str(node_id),
                host=str(entry.get("NodeManagerHostname") or address),
                metrics_url=f"http://{url_host}:{port}/metrics",
                ip=str(address),
            )
        )
    return found


def parse_memory_samples(metrics_text: str | bytes) -> dict[str, float]:
    """``{registry key: bytes}`` for the memory series found in one raylet payload.

    Only ``ray_node_mem_used`` and ``ray_node_mem_total`` are read, by exact name
    (``ray_node_mem_used_host`` is another series); everything else in the payload
    is skipped without being parsed. A series that is missing or has no usable
    value (NaN, infinite, negative) is absent from the result. Pure: no state,
    no telemetry.
    """
    samples = extract_samples(metrics_text, _SERIES_BY_RAY_NAME)
    return {key: samples[name] for name, key in _SERIES_BY_RAY_NAME.items() if name in samples}


# Monitor ---------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeSample:
    """What the monitor last learnt about one node, for tables and tools.

    ``used``, ``total`` and ``sampled_at`` (``time.monotonic`` seconds) describe the
    node's last successful scrape, or are None if it never had one. ``error`` says
    why the latest cycle got no sample from it (None when it did); a node with an
    error is not exported, whatever its older figures say. ``worker_groups`` is the
    :data:`RL_WORKER_GROUPS_ATTR` value when the sample was read out.
    """

    node_id: str
    host: str
    ip: str
    used: float | None
    total: float | None
    worker_groups: str
    sampled_at: float | None
    error: str | None = None
    metrics_url: str = ""

    def age(self, now: float | None = None) -> float | None:
        """Seconds since the last successful scrape, or None if there never was one."""
        if self.sampled_at is None:
            return None
        return (time.monotonic() if now is None else now) - self.sampled_at


@dataclass(frozen=True)
class _Outcome:
    values: dict[str, float] | None
    error: str | None
    #: The scrape held its thread until the deadline (or beyond): a wedged node.
    slow: bool = False
    #: False when the node was never asked (no thread was free before the deadline).
    asked: bool = True
    #: When the cycle received it (``time.monotonic`` seconds, on the publishing
    #: thread): a sample's age counts from here, not from the end of its cycle.
    received_at: float | None = None


class _ScrapeError(Exception):
    """A scrape that produced no usable sample; the message says why."""

    def __init__(self, message: str, *, slow: bool = False) -> None:
        super().__init__(message)
        self.slow = slow


class _Cycle:
    """Results of one collection cycle, which waits for them up to a deadline."""

    def __init__(self, expected: int) -> None:
        self._cond = threading.Condition()
        self._expected = expected
        self._results: dict[tuple[str, str], _Outcome] = {}
        self._done = False
        #: True once :meth:`abandon` cut the cycle short (the monitor is stopping).
        self.abandoned = False

    def deliver(self, key: tuple[str, str], outcome: _Outcome) -> None:
        with self._cond:
            if not self._done:
                self._results[key] = outcome
                self._cond.notify_all()

    def abandon(self) -> None:
        with self._cond:
            self._done = True
            self.abandoned = True
            self._cond.notify_all()

    def wait(self, deadline: float) -> dict[tuple[str, str], _Outcome]:
        """Results delivered by ``deadline`` (:func:`_scrape_clock`); later ones are dropped.

        Each result is stamped with ``received_at`` when it is seen here, on the
        thread that publishes it, so that its age and the export agree on the clock.
        """
        received: dict[tuple[str, str], float] = {}
        with self._cond:
            while True:
                now = time.monotonic()
                for key in self._results.keys() - received.keys():
                    received[key] = now
                if self._done or len(self._results) >= self._expected:
                    break
                left = deadline - _scrape_clock()
                if left <= 0:
                    break
                self._cond.wait(left)
            self._done = True
            return {
                key: replace(outcome, received_at=received[key])
                for key, outcome in self._results.items()
            }


class _ScrapePool:
    """A fixed ceiling of persistent daemon threads that run scrapes.

    Threads are started only as work needs them, up to ``size``, and live until
    :meth:`shutdown`; a scrape stuck past its deadline occupies one of them, never
    a new one.
    """

    def __init__(self, size: int, name: str) -> None:
        self._size = size
        self._name = name
        self._tasks: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._waiting = 0
        self._queued = 0
        self._closed = False

    def submit(self, task: Callable[[], None]) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("scrape pool is shut down")
            self._queued += 1
            if self._queued > self._waiting and len(self._threads) < self._size:
                thread = threading.Thread(
                    target=self._work, name=f"{self._name}-{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
        self._tasks.put(task)

    def _work(self) -> None:
        while True:
            with self._lock:
                self._waiting += 1
            task = self._tasks.get()
            with self._lock:
                self._waiting -= 1
                if task is not None:
                    self._queued -= 1
            if task is None:
                return
            try:
                task()
            except Exception:  # a task must never take its thread down
                warn_once("host_memory.pool", "a host-memory scrape task failed", logger=logger)

    def shutdown(self, deadline: float) -> None:
        """Stop every thread once it is idle, waiting for them until ``deadline``."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            threads = list(self._threads)
        for _ in threads:
            self._tasks.put(None)
        for thread in threads:
            if thread is threading.current_thread():
                continue
            thread.join(max(0.0, deadline - _scrape_clock()))


def _incomplete(size: int) -> _ScrapeError:
    return _ScrapeError(f"payload not complete by the deadline ({size} bytes received)", slow=True)


def _socket_of(raw: Any) -> socket.socket | None:
    """The socket under a streamed urllib3 response, when there is a real one."""
    connection = getattr(raw, "connection", None) or getattr(raw, "_connection", None)
    sock = getattr(connection, "sock", None)
    return sock if isinstance(sock, socket.socket) else None


def _scrape_clock(_monotonic: Callable[[], float] = time.monotonic) -> float:
    """Seconds on the clock scrape deadlines run on: the monotonic clock, bound at import.

    Deadlines are checked on scrape threads deep inside HTTP reads and set on the
    collecting thread, and must stay real time when a test freezes
    ``time.monotonic`` to age samples (freezegun): a frozen deadline never passes,
    and a hung node would then hang the test. Sample ages and expiry, which such
    tests do move, stay on ``time.monotonic``.
    """
    return _monotonic()


#: Deadline of the scrape running on this thread, read by the sockets of the monitor's
#: own session (see :class:`_DeadlineSocket`); None outside a scrape.
_SCRAPE_DEADLINE = threading.local()


class _DeadlineSocket(socket.socket):
    """A socket whose every receive ends by the scrape deadline of the thread using it.

    A socket timeout bounds one receive, not a response: a raylet that sends its
    status line and headers a byte at a time keeps each receive short and the
    request open indefinitely, before :meth:`HostMemoryMonitor._fetch` has a
    response to check the clock against. Setting the timeout to the time left
    before every receive makes the deadline hold from the first byte.
    """

    def _limit(self) -> None:
        deadline = getattr(_SCRAPE_DEADLINE, "value", None)
        if deadline is None:
            return
        left = deadline - _scrape_clock()
        if left <= 0:
            raise TimeoutError("the scrape deadline has passed")
        self.settimeout(left)

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        self._limit()
        return super().recv(bufsize, flags)

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        self._limit()
        return super().recv_into(buffer, nbytes, flags)


class _DeadlineConnection(urllib3.connection.HTTPConnection):
    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()
        timeout = sock.gettimeout()
        wrapped = _DeadlineSocket(sock.family, sock.type, sock.proto, fileno=sock.detach())
        wrapped.settimeout(timeout)
        return wrapped


class _DeadlineConnectionPool(urllib3.HTTPConnectionPool):
    ConnectionCls = _DeadlineConnection


class _DeadlineAdapter(requests.adapters.HTTPAdapter):
    """Plain-HTTP adapter whose sockets are :class:`_DeadlineSocket` (raylets serve http)."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        # A copy: the pool manager starts out sharing urllib3's module-level mapping.
        self.poolmanager.pool_classes_by_scheme = {
            **self.poolmanager.pool_classes_by_scheme,
            "http": _DeadlineConnectionPool,
        }


def _positive_seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a positive finite number of seconds, got {value!r}")
    if value <= 0:
        raise ValueError(f"{name} must be a positive finite number of seconds, got {value!r}")
    return float(value)


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int of at least 1, got {value!r}")
    return value


_LIVE_MONITORS: weakref.WeakSet[HostMemoryMonitor] = weakref.WeakSet()


class HostMemoryMonitor:
    """Scrapes every Ray node's host memory on a timer and publishes it for lens.

    Runs in the driver and only reads: it asks the cluster for its nodes and
    fetches each raylet's metrics endpoint, touching no worker. Starting it before
    the cluster is up is fine; it finds no nodes until there are some.

    Results go into :data:`_SNAPSHOT`, which the observable gauges read when lens
    exports, so collecting and exporting run on their own schedules: an exported
    figure can be up to one collection interval old, and samples taken between
    two exports are not all seen. Neither matters for a gauge.

    Each cycle asks every node concurrently on at most ``max_concurrency``
    threads, under one deadline ``scrape_timeout`` seconds away. Nodes that
    answered last time are asked first and nodes that ran into the deadline last
    time are asked last; a node's first try gets at most a second before it is
    put back behind everyone else with the time that is left. A node whose
    previous request is still open is skipped. :meth:`latest` reports, per node,
    the last figures and why the last cycle got none, for tools that show a table.

    Args:
        collection_interval: Seconds between cycles (positive).
        cluster: Where the nodes come from; default the connected Ray.
        session: The ``requests.Session`` to scrape with; default a private one that
            ignores proxy environment variables (raylets are cluster-internal) and
            holds the deadline even against a response trickled from its first byte.
            A session passed in keeps its own adapters: there the deadline is checked
            between reads of the body, and each read is bounded by the time left.
        scrape_timeout: Hard limit, in seconds, on one cycle's scrapes, body included.
        max_concurrency: Most scrapes in flight at once, hence most scrape threads.
        max_age: Seconds, counted from the node's answer, after which its sample is
            no longer exported, even if no newer one replaced it; default two
            intervals plus the scrape timeout.
        max_body_bytes: A payload larger than this is abandoned (no sample).

    Raises:
        ValueError: any argument out of range; the message names it.
    """

    def __init__(
        self,
        collection_interval: float,
        *,
        cluster: ClusterView | None = None,
        session: requests.Session | None = None,
        scrape_timeout: float = _SCRAPE_TIMEOUT_S,
        max_concurrency: int = _MAX_CONCURRENCY,
        max_age: float | None = None,
        max_body_bytes: int = _MAX_BODY_BYTES,
    ) -> None:
        self.collection_interval = _positive_seconds("collection_interval", collection_interval)
        self.scrape_timeout = _positive_seconds("scrape_timeout", scrape_timeout)
        self.max_concurrency = _positive_int("max_concurrency", max_concurrency)
        self.max_body_bytes = _positive_int("max_body_bytes", max_body_bytes)
        self.max_age = (
            2 * self.collection_interval + self.scrape_timeout
            if max_age is None
            else _positive_seconds("max_age", max_age)
        )
        self._cluster = cluster if cluster is not None else default_cluster_view()
        self._session = session
        self._owns_session = session is None
        self._lock = threading.Lock()
        self._cycle_lock = threading.Lock()
        self._stop_event = threading.Event()  # replaced on every start()
        self._thread: threading.Thread | None = None
        self._pool: _ScrapePool | None = None
        self._cycle: _Cycle | None = None
        self._in_flight: set[tuple[str, str]] = set()
        self._latest: dict[tuple[str, str], NodeSample] = {}
        self._slow: set[tuple[str, str]] = set()
        _LIVE_MONITORS.add(self)

    # Lifetime ------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """True between :meth:`start` and :meth:`stop`."""
        with self._lock:
            return self._thread is not None

    def start(self) -> None:
        """Start sampling on a background thread (``raylens-host-memory``). Idempotent."""
        _declare_gauges()
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

    def stop(self) -> None:
        """Stop sampling and its threads. Idempotent; never raises.

        Returns within ``scrape_timeout`` plus a second however the nodes behave:
        a cycle in progress is cut short (what it has is published), and scrape
        threads still stuck after that bound are left to end on their own
        deadline, as daemons.
        """
        # Half the grace is kept in hand so that the bound holds with room to spare.
        deadline = _scrape_clock() + self.scrape_timeout + _SHUTDOWN_GRACE_S / 2
        with self._lock:
            self._stop_event.set()
            thread, self._thread = self._thread, None
            pool, self._pool = self._pool, None
            cycle = self._cycle
        if cycle is not None:
            cycle.abandon()
        if thread is not None and thread is not threading.current_thread():
            thread.join(max(0.0, deadline - _scrape_clock()))
        if pool is not None:
            pool.shutdown(deadline)
        if self._owns_session:
            with self._lock:
                session, self._session = self._session, None
            if session is not None:
                try:
                    session.close()
                except Exception:
                    warn_once("host_memory.session", "closing the scrape session failed")

    def _collection_loop(self, stop: threading.Event | None = None) -> None:
        """Run a cycle every :attr:`collection_interval` seconds until ``stop`` is set."""
        stop = stop if stop is not None else self._stop_event
        while not stop.is_set():
            started = time.monotonic()
            self._guarded_cycle(stop)
            elapsed = time.monotonic() - started
            stop.wait(max(0.0, self.collection_interval - elapsed))

    # One cycle -----------------------------------------------------------------------

    def collect_once(self) -> None:
        """Scrape every node once and publish the result. Never raises.

        Returns within ``scrape_timeout`` plus a fraction of a second: scrapes not
        finished by then count as failed for this cycle. A node whose previous
        scrape is still running is not asked again; it has no fresh sample.
        """
        self._guarded_cycle(None)

    def _guarded_cycle(self, stop: threading.Event | None) -> None:
        try:
            self._collect_once(stop)
        except Exception:
            warn_once(
                "host_memory.collect",
                "a host-memory collection cycle failed; samples are kept until they age out",
                logger=logger,
            )

    def _collect_once(self, stop: threading.Event | None = None) -> None:
        """Body of :meth:`collect_once`, without its exception guard.

        ``stop`` is the calling loop's stop event: a loop stopped while it was
        listing nodes publishes nothing and starts no scrape.
        """
        # Listed outside the cycle lock: a cluster call that hangs must not keep a
        # restarted loop (or a caller's own collect_once) from running.
        try:
            nodes = ray_nodes(self._cluster)
        except Exception as exc:
            warn_once(
                "host_memory.nodes",
                f"could not list the cluster's nodes ({type(exc).__name__}: {exc}); "
                f"samples are kept until they age out",
                logger=logger,
            )
            return
        with self._cycle_lock:
            if stop is not None and stop.is_set():
                return
            deadline = _scrape_clock() + self.scrape_timeout
            pool = self._ensure_pool()
            with self._lock:
                skipped = {node.key for node in nodes if node.key in self._in_flight}
                to_scrape = sorted(
                    (node for node in nodes if node.key not in skipped), key=self._priority
                )
                self._in_flight.update(node.key for node in to_scrape)
                cycle = self._cycle = _Cycle(len(to_scrape))
            try:
                for index, node in enumerate(to_scrape):
                    try:
                        first_try = node.key not in self._slow
                        pool.submit(
                            functools.partial(
                                self._scrape_task, pool, node, cycle, deadline, first_try
                            )
                        )
                    except RuntimeError:  # stopped meanwhile: these were never started
                        with self._lock:
                            self._in_flight.difference_update(n.key for n in to_scrape[index:])
                        break
                results = cycle.wait(deadline + _CYCLE_SLACK_S)
            finally:
                with self._lock:
                    self._cycle = None
            self._publish(nodes, results, skipped, stopped=cycle.abandoned)

    def _priority(self, node: RayNode) -> int:
        """Scrape order: nodes that answered last time, then the rest, then wedged ones.

        A wedged node (last scrape ran into the deadline) holds a scrape thread
        until the deadline. Asking those last, once everything else has been
        served, keeps a handful of them from taking every thread while healthy
        nodes wait in the queue. Nodes that failed fast (an HTTP error, a refused
        connection) cost nothing and are not held back.
        """
        if node.key in self._slow:
            return 2
        previous = self._latest.get(node.key)
        return 0 if previous is not None and previous.error is None else 1

    def _ensure_pool(self) -> _ScrapePool:
        with self._lock:
            if self._pool is None:
                self._pool = _ScrapePool(self.max_concurrency, "raylens-host-memory-scrape")
            return self._pool

    def _scrape_task(
        self, pool: _ScrapePool, node: RayNode, cycle: _Cycle, deadline: float, first_try: bool
    ) -> None:
        """Scrape ``node`` for ``cycle`` and deliver the outcome; runs on a pool thread.

        A first try gets at most :data:`_FIRST_TRY_S` of the cycle's time. A node
        that does not answer within it is put back at the end of the queue with
        whatever time the cycle has left, so that more wedged nodes than there
        are threads cannot keep the healthy nodes behind them from being asked.
        """
        outcome = None
        try:
            now = _scrape_clock()
            if now >= deadline:
                outcome = _Outcome(
                    None,
                    "not asked: no scrape thread was free before the deadline",
                    asked=False,
                )
            else:
                try_deadline = min(deadline, now + _FIRST_TRY_S) if first_try else deadline
                outcome = self._scrape_outcome(node, try_deadline)
                retry = (
                    outcome.slow
                    and try_deadline < deadline
                    and deadline - _scrape_clock() > _RETRY_MIN_S
                )
                if retry:
                    try:
                        pool.submit(
                            functools.partial(self._scrape_task, pool, node, cycle, deadline, False)
                        )
                        return  # still in flight: the retry delivers
                    except RuntimeError:
                        pass  # the monitor is stopping: report the first try
        except Exception as exc:  # reported as this node's failure
            outcome = _Outcome(None, f"{type(exc).__name__}: {exc}")
        with self._lock:
            self._in_flight.discard(node.key)
        cycle.deliver(node.key, outcome)

    def _publish(
        self,
        nodes: list[RayNode],
        results: dict[tuple[str, str], _Outcome],
        skipped: set[tuple[str, str]],
        *,
        stopped: bool = False,
    ) -> None:
        """Publish one cycle's results; ``stopped`` when :meth:`stop` cut it short.

        A node cut off by a stop has no sample, but is not warned about: it did
        nothing wrong, and the timeout it would be blamed for never ran out.
        """
        samples: dict[tuple[str, str], dict[str, float]] = {}
        expiry: dict[tuple[str, str], float] = {}
        latest: dict[tuple[str, str], NodeSample] = {}
        slow: set[tuple[str, str]] = set()
        now = time.monotonic()
        for node in nodes:
            previous = self._latest.get(node.key)
            outcome = results.get(node.key)
            if outcome is None and node.key in skipped:
                outcome = _Outcome(
                    None, "not asked: its previous scrape is still running", slow=True
                )
            elif outcome is None and stopped:
                outcome = _Outcome(None, _STOPPED_ERROR, asked=False)
            elif outcome is None:
                outcome = _Outcome(
                    None,
                    f"no answer within the {self.scrape_timeout:g} s scrape timeout",
                    slow=True,
                )
            if outcome.slow or (not outcome.asked and node.key in self._slow):
                slow.add(node.key)
            if outcome.values:
                # Aged from the node's answer: slow nodes that held the cycle open
                # after it must not stretch how long this sample is exported.
                sampled_at = outcome.received_at if outcome.received_at is not None else now
                samples[node.key] = outcome.values
                expiry[node.key] = sampled_at + self.max_age
                latest[node.key] = NodeSample(
                    node_id=node.node_id,
                    host=node.host,
                    ip=node.ip,
                    used=outcome.values.get(_USED_KEY),
                    total=outcome.values.get(_TOTAL_KEY),
                    worker_groups="",
                    sampled_at=sampled_at,
                    metrics_url=node.metrics_url,
                )
                if previous is not None and previous.error is not None:
                    reset_warn_once(_scrape_warning_key(node))
                continue
            error = outcome.error or "no sample"
            if error != _STOPPED_ERROR:
                warn_once(
                    _scrape_warning_key(node),
                    f"no host-memory sample from node {node.node_id} ({node.host}, "
                    f"{node.metrics_url}): {error}",
                    logger=logger,
                )
            latest[node.key] = NodeSample(
                node_id=node.node_id,
                host=node.host,
                ip=node.ip,
                used=previous.used if previous else None,
                total=previous.total if previous else None,
                worker_groups="",
                sampled_at=previous.sampled_at if previous else None,
                error=error,
                metrics_url=node.metrics_url,
            )
        self._latest = latest
        self._slow = slow
        _publish_snapshot(samples, expiry)

    # One node ------------------------------------------------------------------------

    def _scrape(self, node: RayNode) -> dict[str, float]:
        """Fetch and parse one node's memory series now; ``{}`` when that fails.

        A failure is not retried: the next cycle is the retry, and a node that is
        down or overloaded is exactly the one that must not hold the others up.
        """
        outcome = self._scrape_outcome(node, _scrape_clock() + self.scrape_timeout)
        return dict(outcome.values or {})

    def _scrape_outcome(self, node: RayNode, deadline: float) -> _Outcome:
        try:
            body = self._fetch(node.metrics_url, deadline)
        except _ScrapeError as exc:
            return _Outcome(None, str(exc), slow=exc.slow)
        except (requests.Timeout, urllib3.exceptions.TimeoutError):
            return _Outcome(None, "timed out waiting for the raylet to answer", slow=True)
        except Exception as exc:
            return _Outcome(None, f"{type(exc).__name__}: {exc}")
        values = parse_memory_samples(body)
        if not values:
            return _Outcome(
                None,
                f"no valid {RAY_NODE_MEM_USED} or {RAY_NODE_MEM_TOTAL} sample "
                f"in the {len(body)}-byte payload",
            )
        return _Outcome(values, None)

    def _session_for_use(self) -> requests.Session:
        with self._lock:
            if self._session is None:
                session = requests.Session()
                session.trust_env = False
                session.mount("http://", _DeadlineAdapter())
                self._session = session
            return self._session

    def _fetch(self, url: str, deadline: float) -> bytes:
        """The body at ``url``, read entirely before ``deadline`` and within the size cap.

        The socket timeout is reset to the time left before every read, and each
        read returns whatever has arrived, so a body trickled byte by byte ends at
        the deadline rather than at one timeout per byte. With the monitor's own
        session the same holds while the status line and headers arrive.
        """
        remaining = deadline - _scrape_clock()
        if remaining <= 0:
            raise _ScrapeError("not started before the scrape deadline")
        session = self._session_for_use()
        _SCRAPE_DEADLINE.value = deadline
        try:
            response = session.get(
                url,
                stream=True,
                timeout=(remaining, remaining),
                headers=_REQUEST_HEADERS,
                allow_redirects=False,
            )
            return self._read_body(response, deadline)
        finally:
            _SCRAPE_DEADLINE.value = None

    def _read_body(self, response: requests.Response, deadline: float) -> bytes:
        """``response``'s body, read before ``deadline`` and within the size cap; closes it."""
        try:
            if response.status_code != 200:
                raise _ScrapeError(f"HTTP {response.status_code} {response.reason or ''}".strip())
            announced = response.headers.get("Content-Length", "")
            if announced.isdigit() and int(announced) > self.max_body_bytes:
                raise _ScrapeError(
                    f"payload of {announced} bytes exceeds the {self.max_body_bytes}-byte cap"
                )
            raw = response.raw
            sock = _socket_of(raw)
            read = functools.partial(
                raw.read1 if hasattr(raw, "read1") else raw.read, decode_content=True
            )
            chunks: list[bytes] = []
            size = 0
            while True:
                remaining = deadline - _scrape_clock()
                if remaining <= 0:
                    raise _incomplete(size)
                if sock is not None:
                    sock.settimeout(remaining)
                try:
                    chunk = read(_READ_CHUNK)
                except (TimeoutError, urllib3.exceptions.TimeoutError):
                    raise _incomplete(size) from None
                if not chunk:
                    break
                size += len(chunk)
                if size > self.max_body_bytes:
                    raise _ScrapeError(f"payload exceeds the {self.max_body_bytes}-byte cap")
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            response.close()

    # Reading -------------------------------------------------------------------------

    def latest(self) -> list[NodeSample]:
        """What the last cycle learnt about each node, sorted by host then node id.

        Nodes whose scrape failed are included, with their error and their last
        good figures, so a table can show a hung node rather than drop it. Nodes
        that left the cluster are not. Reads no network.
        """
        latest = list(self._latest.values())
        groups = _groups_by_node()
        return sorted(
            (
                NodeSample(
                    node_id=s.node_id,
                    host=s.host,
                    ip=s.ip,
                    used=s.used,
                    total=s.total,
                    worker_groups=format_worker_groups(groups.get(s.node_id, ())),
                    sampled_at=s.sampled_at,
                    error=s.error,
                    metrics_url=s.metrics_url,
                )
                for s in latest
            ),
            key=lambda s: (s.host, s.node_id),
        )

    def __repr__(self) -> str:
        return (
            f"HostMemoryMonitor(collection_interval={self.collection_interval:g}, "
            f"scrape_timeout={self.scrape_timeout:g}, running={self.running})"
        )


def _scrape_warning_key(node: RayNode) -> str:
    return f"host_memory.scrape.{node.node_id}"


# The process's monitor -----------------------------------------------------------------

_MONITOR: HostMemoryMonitor | None = None
_MONITOR_LOCK = threading.Lock()


def _usable_interval(collection_interval: object) -> float:
    try:
        return _positive_seconds("collection_interval", collection_interval)
    except ValueError:
        logger.warning(
            "host-memory collection interval %r is not a positive finite number of seconds; "
            "using %g s",
            collection_interval,
            FALLBACK_COLLECTION_INTERVAL,
        )
        return FALLBACK_COLLECTION_INTERVAL


def start_host_memory_monitoring(
    collection_interval: float, *, cluster: ClusterView | None = None
) -> None:
    """Start this process's monitor unless one is running. Never raises.

    lens' ``init_telemetry_driver`` calls this, which puts the monitor in the
    driver. That is where it must be: the worker-group placement map is an
    ordinary global of the process that registers groups, the driver, and a
    monitor anywhere else would label every node with no group at all.

    An interval that is not a positive finite number is logged and replaced by
    :data:`FALLBACK_COLLECTION_INTERVAL`. ``cluster`` overrides the connected Ray.
    """
    global _MONITOR
    try:
        interval = _usable_interval(collection_interval)
        # Started under the lock (start() only launches a thread): a stop that comes
        # in meanwhile then finds the monitor running and stops it, rather than
        # taking it away before it starts and leaving it running unowned.
        with _MONITOR_LOCK:
            if _MONITOR is None:
                _MONITOR = HostMemoryMonitor(interval, cluster=cluster)
            _MONITOR.start()
    except Exception:
        warn_once(
            "host_memory.start",
            "could not start host-memory monitoring; no host memory will be exported",
            logger=logger,
        )


def stop_host_memory_monitoring() -> None:
    """Stop this process's monitor. Never raises; does nothing when none runs.

    lens' ``shutdown_telemetry`` calls this in every process, most of which never
    started a monitor, hence the quiet no-op.
    """
    global _MONITOR
    with _MONITOR_LOCK:
        monitor, _MONITOR = _MONITOR, None
    if monitor is None:
        return
    try:
        monitor.stop()
    except Exception:
        warn_once("host_memory.stop", "stopping host-memory monitoring failed", logger=logger)


def reset_host_memory_state() -> None:
    """Return this module to its state at import: no monitor, samples or placements.

    Stops the process's monitor and any other monitor still running, forgets
    every published sample and worker-group placement, and declares the gauges
    again (in case lens' declarations were reset). Meant for tests.
    """
    stop_host_memory_monitoring()
    for monitor in list(_LIVE_MONITORS):
        monitor.stop()
    _publish_snapshot({}, {})
    with _WORKER_GROUP_LOCK:
        _WORKER_GROUP_NODES.clear()
    _declare_gauges()


_declare_gauges()
