"""Inside a node's sampler actor: read the node and its worker groups on a timer, publish through Ray.

:class:`GroupMemorySamplerActor` is what runs in the actor (it also answers readings on
demand); :class:`PublishingLoop` is its timer and bookkeeping; the seam to Ray, where each
reading goes, is in :mod:`raylens.distributed._sampler_gauges`. Tests hand the actor their
own publisher.

Invariants: the Ray gauges are created on first use inside the actor process, never at
import; each reading also sets the wall-clock ``sampled_at`` series, so a reader finding
several samplers' series on one node (told apart by ``WorkerId``) takes the freshest; a
group that leaves, and a PSS figure that stops being known, are set to NaN once and then no
more, so readers drop them at once rather than at Ray's gauge expiry.

Each reading also reads the node's used memory (Ray's definition, see
:mod:`raylens.telemetry.node_usage`) and records it, with each group's RSS, in the node's
own :class:`~raylens.telemetry.growth.NodeGrowthKeeper`: the node's growth, the growth
outside its groups, each group's growth, the growing state, the kill line and the time to
it are computed here, once, and published with the sampler's identity, so every reader of
the node's endpoint sees the same figures without keeping any history.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from raylens.cluster import ray_call_errors
from raylens.distributed._sampler_gauges import (
    GroupMemoryPublisher,
    GrowthPublisher,
    KernelOomPublisher,
    NodeGrowthPublisher,
    PssAgePublisher,
    RayMetricsPublisher,
)
from raylens.lens import warn_once
from raylens.safe_text import printable
from raylens.telemetry.group_memory import (
    DEFAULT_MAX_PROCESSES,
    GroupMemoryReader,
    NodeGroupMemory,
    as_group_worker,
)
from raylens.telemetry.growth import (
    GrowthSettings,
    KillLineConfig,
    NodeGrowthKeeper,
    NodeReading,
    RecentHistory,
    resolve_kill_line_config,
)
from raylens.telemetry.node_usage import CGROUP_ROOT, NodeUsage, read_node_usage
from raylens.telemetry.oom import KernelOomCount, read_kernel_oom_count
from raylens.telemetry.phases.memory import NodePhaseTracker
from raylens.telemetry.procfs import ProcFS
from raylens.validation import positive_seconds

__all__ = [
    "DEFAULT_PSS_INTERVAL_SECONDS",
    "DEFAULT_TREE_INTERVAL_SECONDS",
    "SAMPLER_THREAD_NAME",
    "STOP_TIMEOUT_S",
    "GroupMemoryPublisher",
    "GroupMemorySamplerActor",
    "NodeGrowthPublisher",
    "PublishingLoop",
    "RayMetricsPublisher",
    "ray_gauge_refresh_s",
]

SAMPLER_THREAD_NAME = "raylens-group-sampler"
STOP_TIMEOUT_S = 5.0
"""How long :meth:`PublishingLoop.stop` waits for a reading in progress to finish."""

DEFAULT_PSS_INTERVAL_SECONDS = 60.0
"""How often a sampler reads PSS per group by default (RSS is read every cycle)."""

LOSS_KEPT_S = 60.0
"""How long after workers are found gone the reading before them answers for the node's
largest processes: Ray's memory monitor kills whole workers, and the post-mortem asks after
the kill is noticed, by when the sampler has read the node without them."""

DEFAULT_TREE_INTERVAL_SECONDS = 30.0
"""How often a sampler walks each worker's process tree again by default; a process a
worker spawns in between is counted from the next walk (a new worker is walked at once)."""

_LOGGER = logging.getLogger("raylens.distributed")


class PublishingLoop:
    """Reads ``reader``'s workers every interval on a daemon thread and publishes the result.

    :meth:`set_workers` replaces the node's worker list; :meth:`start` starts the
    thread (or changes its interval); :meth:`sample_and_publish_once` is one pass,
    which the thread calls and tests may call directly. A pass that fails is logged
    once per process and the loop carries on. ``wall_clock`` (default
    :func:`time.time`) stamps each reading. ``lock`` guards ``reader``, which other
    callers in the process may share. ``on_reading`` is called with every reading
    published (a phase's sampled peaks come from there). With ``keeper`` and
    ``node_usage`` (a reading of the node's memory), each pass also records the node and
    its groups there and publishes the node's figures and each group's growth.

    Between two passes the latest figures are set again every ``refresh_s()`` seconds
    (default :func:`ray_gauge_refresh_s`; None: never), so that Ray's metrics agent,
    which drops a gauge value not reported again within two report intervals, keeps a
    group's series between two readings even where the worker reports only values set
    since its last report.
    Thread-safe.
    """

    def __init__(
        self,
        reader: GroupMemoryReader,
        publisher: GroupMemoryPublisher,
        *,
        lock: threading.Lock | None = None,
        wall_clock: Callable[[], float] | None = None,
        keeper: NodeGrowthKeeper | None = None,
        node_usage: Callable[[], NodeUsage | None] | None = None,
        clock: Callable[[], float] | None = None,
        on_reading: Callable[[NodeGroupMemory], None] | None = None,
        kernel_oom_count: Callable[[], KernelOomCount | None] | None = None,
        refresh_s: Callable[[], float | None] | None = None,
    ) -> None:
        self._reader = reader
        self._refresh_s = refresh_s or ray_gauge_refresh_s
        # What the latest pass published, set again between passes (see republish).
        self._last: (
            tuple[NodeGroupMemory, float, NodeReading | None, tuple[int, str] | None] | None
        ) = None
        self._on_reading = on_reading
        self._kernel_oom_count = kernel_oom_count
        self._kernel_kills: int | None = None
        # The largest processes of the latest reading, and of the one before it, with
        # their wall-clock stamps: a post-mortem wants the last reading before the kill.
        self._largest: tuple[tuple[tuple[int, str, int], ...], float] | None = None
        self._largest_before: tuple[tuple[tuple[int, str, int], ...], float] | None = None
        self._killed_since_previous = False
        # The last reading before workers were lost, and when they were found gone.
        self._largest_before_loss: tuple[tuple[tuple[int, str, int], ...], float] | None = None
        self._lost_at = -float("inf")
        self._gone_seen: set[tuple[str, int]] = set()
        self._keeper = keeper
        self._node_usage = node_usage
        self._clock = clock or time.monotonic
        self._publisher = publisher
        self._lock = lock or threading.Lock()
        self._wall_clock = wall_clock or time.time
        self._workers: list[tuple[str, int, int | None]] = []
        self._published: set[str] = set()
        self._interval: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._passes = 0
        self._closed = False

    @property
    def passes(self) -> int:
        """Readings published so far."""
        return self._passes

    @property
    def running(self) -> bool:
        """Whether the sampling thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def set_workers(self, workers: Iterable[tuple[str, int, int | None]]) -> None:
        """Make ``workers`` (``(group, pid, start_ticks)``) the node's whole list.

        Raises ValueError, naming it, for a malformed entry; the list in force is then kept.
        """
        checked = [(w.group, w.pid, w.start_ticks) for w in map(as_group_worker, workers)]
        with self._lock:
            self._workers = checked

    def start(self, interval_s: float) -> None:
        """Read and publish every ``interval_s`` seconds from now on, first at once.

        Calling it again while running changes the interval from the next wait on.
        """
        interval = positive_seconds("interval_s", interval_s, maximum=threading.TIMEOUT_MAX)
        with self._lock:
            self._interval = interval
            self._closed = False
            if self.running:
                return
            # A fresh event per thread: one left behind by a stop() that timed out ends on its own.
            self._stop = threading.Event()
            self._thread = threading.Thread(
                target=self._run, args=(self._stop,), name=SAMPLER_THREAD_NAME, daemon=True
            )
            self._thread.start()

    def stop(self, *, forget_groups: bool = False, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stop the thread, waiting up to ``timeout_s`` for a reading in progress.

        With ``forget_groups`` every group published so far gets NaN, so readers drop
        this sampler's series now rather than when Ray expires them (skipped when a
        reading is still stuck after the wait). No reading is published after this
        returns. Idempotent.
        """
        deadline = time.monotonic() + timeout_s
        self._closed = True
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
        if not self._lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            return
        try:
            self._thread = None
            if forget_groups:
                self._forget(set(self._published))
        finally:
            self._lock.release()

    def sample_and_publish_once(self) -> NodeGroupMemory | None:
        """Read the workers in force now and publish; the reading (None once stopped)."""
        with self._lock:
            if self._closed:
                return None
            reading = self._reader.read(self._workers)
            if self._closed:  # stopped while reading: stop() no longer waits for this pass
                return None
            present = {group.group for group in reading.groups}
            self._published |= present
            self._publish_groups(reading)
            self._forget(self._published - present)
            figures = self._record_node(reading)
            stamp = self._wall_clock()
            kernel = self._read_kernel_oom_kills()
            self._last = (reading, stamp, figures, kernel)
            self._publish_rest()
            self._largest_before = self._largest
            gone = {(worker.group, worker.pid) for worker in reading.gone}
            if gone - self._gone_seen and self._largest_before is not None:
                self._largest_before_loss, self._lost_at = self._largest_before, stamp
            self._gone_seen = gone
            self._largest = (self._reader.largest_processes, stamp)
            self._passes += 1
            if self._on_reading is not None:
                self._on_reading(reading)
            return reading

    def republish(self) -> bool:
        """Set the latest pass's figures again, unchanged; whether there were any. Never reads."""
        with self._lock:
            if self._closed or self._last is None:
                return False
            self._publish_groups(self._last[0])
            self._publish_rest()
            return True

    def _publish_groups(self, reading: NodeGroupMemory) -> None:
        publisher = self._publisher
        aged = publisher if isinstance(publisher, PssAgePublisher) else None
        for group in reading.groups:
            if group.group in self._published:
                publisher.set_group(
                    group.group, group.rss_bytes, group.pss_bytes, group.process_count
                )
                if aged is not None:
                    age = None if group.pss_bytes is None else group.pss_age_seconds
                    aged.set_pss_age(group.group, age)

    def _publish_rest(self) -> None:
        """Hand the latest pass's node figures, growth, kills and stamp to the publisher."""
        assert self._last is not None
        _reading, stamp, figures, kernel = self._last
        publisher = self._publisher
        if figures is not None and isinstance(publisher, GrowthPublisher):
            for group, rate in figures.group_growth.items():
                if rate is not None and group in self._published:
                    publisher.set_growth(group, rate)
        keeper = self._keeper
        if (
            keeper is not None
            and self._node_usage is not None
            and isinstance(publisher, NodeGrowthPublisher)
        ):
            publisher.set_node(figures, keeper.window_s)
        if kernel is not None and isinstance(publisher, KernelOomPublisher):
            publisher.set_kernel_oom_kills(*kernel)
        publisher.set_sampled_at(stamp)

    def _read_kernel_oom_kills(self) -> tuple[int, str] | None:
        """Read the kernel's OOM-kill count; note whether it rose since the last reading."""
        if self._kernel_oom_count is None or not isinstance(self._publisher, KernelOomPublisher):
            return None
        found = self._kernel_oom_count()
        if found is None:
            return None
        previous, self._kernel_kills = self._kernel_kills, found.kills
        self._killed_since_previous = previous is not None and found.kills > previous
        return found.kills, found.source

    def largest_processes(self) -> dict[str, Any] | None:
        """The node's largest processes at the last reading before a kill, as builtins.

        The latest reading's, unless the kernel's count rose at it, or workers were found
        gone within the last :data:`LOSS_KEPT_S`: the victims were then already gone, so the
        reading before is the one that shows them. None before the first reading.
        """
        with self._lock:
            chosen = self._largest
            if self._killed_since_previous and self._largest_before is not None:
                chosen = self._largest_before
            elif (
                self._largest_before_loss is not None
                and chosen is not None
                and chosen[1] - self._lost_at <= LOSS_KEPT_S
            ):
                chosen = self._largest_before_loss
        if chosen is None:
            return None
        processes, stamp = chosen
        return {"sampled_at": stamp, "processes": [list(entry) for entry in processes]}

    def _record_node(self, reading: NodeGroupMemory) -> NodeReading | None:
        """Record the node and its groups in the keeper; the node's figures (None if unknown)."""
        keeper = self._keeper
        if keeper is None or self._node_usage is None:
            return None
        usage = self._node_usage()
        if usage is None:
            return None
        return keeper.record(
            self._clock(),
            usage.used,
            {group.group: float(group.rss_bytes) for group in reading.groups},
            host_total=usage.host_total,
            cgroup_total=usage.cgroup_total,
        )

    def mark_phase(self) -> None:
        """A phase begins or ends now: a boundary for the keeper's growth judgement."""
        if self._keeper is not None:
            self._keeper.mark_phase(self._clock())

    def recent_history(self, at_wall: float) -> RecentHistory | None:
        """The node's recent memory up to the wall-clock time ``at_wall``; None without a keeper.

        The keeper runs on the monotonic clock, so ``at_wall`` is placed on it by the
        distance between the two clocks now.
        """
        if self._keeper is None:
            return None
        at = self._clock() - (self._wall_clock() - float(at_wall))
        return self._keeper.recent(at)

    def _forget(self, groups: set[str]) -> None:
        for group in sorted(groups):
            # Dropped from the set first: a publisher that fails here is not asked again.
            self._published.discard(group)
            self._publisher.forget_group(group)

    def _run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            _on_sampler_thread(self.sample_and_publish_once, None, _warn_unpublished)
            interval = self._interval
            if interval is None or self.wait_republishing(stop, interval):
                return

    def wait_republishing(self, stop: threading.Event, interval: float) -> bool:
        """Wait ``interval`` seconds on ``stop``, setting the figures again every refresh.

        Returns whether ``stop`` was set. Times are read on the loop's clock.
        """
        refresh = _on_sampler_thread(self._refresh_s, None, lambda _error: None)
        if refresh is None or not 0 < refresh < interval:
            return stop.wait(interval)
        deadline = self._clock() + interval
        while True:
            left = deadline - self._clock()
            if left <= 0:
                return False
            if stop.wait(min(refresh, left)):
                return True
            if deadline - self._clock() > 0:
                _on_sampler_thread(self.republish, False, _debug_not_republished)


_T = TypeVar("_T")


def _on_sampler_thread(
    action: Callable[[], _T], fallback: _T, report: Callable[[Exception], None]
) -> _T:
    """``action()``, or ``fallback`` once ``report`` has been told why it failed.

    The sampler thread's one guard: it reads ``/proc`` and the cgroup files, fits growth
    and sets gauges through Ray's metrics, and must keep sampling whatever fails.
    """
    try:
        return action()
    except Exception as error:  # noqa: BLE001 the sampler thread never dies
        report(error)
        return fallback


def _warn_unpublished(error: Exception) -> None:
    warn_once(
        "group_memory.sampler.publish",
        "the group-memory sampler could not read or publish its node's worker "
        f"groups: {printable(str(error)[:300])} (warned once; it keeps trying "
        "every interval)",
        logger=_LOGGER,
    )


def _debug_not_republished(_error: Exception) -> None:
    _LOGGER.debug("could not set the sampler's figures again", exc_info=True)


def ray_gauge_refresh_s() -> float | None:
    """How often a value published through Ray must be set again not to expire; None without Ray.

    Ray's metrics agent keeps a gauge value for two report intervals
    (``max(metrics_report_interval_ms, 1000)`` each) after the worker last exported it.
    A worker that exports only what was set since its previous export needs a value set
    at least every half interval, which then reaches the agent at every export or the
    one after (Ray 2.60's workers export the last value at every interval anyway).
    """
    ray = sys.modules.get("ray")
    try:
        report_ms = float(ray._config.metrics_report_interval_ms()) if ray is not None else None
    except ray_call_errors(ray, AttributeError):  # a Ray without that private setting
        return None
    if report_ms is None:
        return None
    return max(report_ms, 1000.0) / 1000.0 / 2


class GroupMemorySamplerActor:
    """What runs inside each node's sampler actor: a reader, read on demand or on its own timer.

    The reader arguments are those of :class:`GroupMemoryReader`; ``procfs_root`` is
    where procfs is mounted on the node (``/proc`` by default). :meth:`read` answers
    one reading to its caller. :meth:`set_workers` and :meth:`start` make the sampler
    read the node's workers every interval on a daemon thread and publish each reading
    through ``publisher`` (default: Ray's metrics pipeline, see
    :mod:`raylens.distributed._group_memory_publishing`), stamped with ``wall_clock``
    (default :func:`time.time`); ``clock`` times the reader's intervals and the
    growth history. Each reading also reads the node's used memory (``node_usage``,
    default :func:`~raylens.telemetry.node_usage.read_node_usage`) and records it with
    each group's RSS in the node's keeper: growth over ``growth_window_s`` (default
    ``RAYLENS_GROWTH_WINDOW``, else 300 s), the kill line drawn by ``kill_line`` (default:
    resolved from the node's environment) and the time to it are published with the
    sampler's identity (its Ray actor id, and ``started_by``, the monitor that started
    it), so any reader sees them without keeping history.

    Phases (see :mod:`raylens.distributed.phases`): :meth:`phase_begin` reads the
    groups' start and resets their processes' peaks; every timed reading raises their
    sampled peaks; :meth:`phase_end` answers the phase's figures. ``procfs`` replaces the
    reader over ``procfs_root`` (for an in-process test).
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
        growth_window_s: float | None = None,
        procfs: ProcFS | None = None,
        kill_line: KillLineConfig | None = None,
        started_by: str = "",
        node_usage: Callable[[], NodeUsage | None] | None = None,
    ) -> None:
        self._lock = threading.Lock()
        if procfs is None:
            procfs = ProcFS(procfs_root) if procfs_root is not None else ProcFS()
        settings = (
            GrowthSettings.from_env()
            if growth_window_s is None
            else GrowthSettings.from_env(window_s=growth_window_s)
        )
        if kill_line is None:
            try:
                kill_line = resolve_kill_line_config()
            except ValueError:
                kill_line = resolve_kill_line_config(env={})
        self.sampler_id = _own_sampler_id()
        if node_usage is None:
            node_usage = _node_usage_reader(procfs)
        self._phases = NodePhaseTracker(procfs, host_name=host_name)
        self._reader = GroupMemoryReader(
            procfs,
            pss_interval_seconds=pss_interval_seconds,
            tree_interval_seconds=tree_interval_seconds,
            max_processes=max_processes,
            host_name=host_name,
            clock=clock,
        )
        self._loop = PublishingLoop(
            self._reader,
            publisher
            if publisher is not None
            else RayMetricsPublisher(sampler=self.sampler_id, started_by=printable(started_by)),
            lock=self._lock,
            wall_clock=wall_clock,
            keeper=NodeGrowthKeeper(settings, kill_line),
            node_usage=node_usage,
            clock=clock,
            on_reading=self._phases.observe,
            kernel_oom_count=lambda: read_kernel_oom_count(procfs.root, opener=procfs.opener),
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

    def worker_id(self) -> str:
        """This actor's Ray worker id (``""`` outside Ray): the ``WorkerId`` Ray stamps on its
        series, by which readers tell them from another process's that copies its labels."""
        return _own_worker_id()

    def stop(self, forget_groups: bool = False, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stop timed readings; with ``forget_groups``, mark every published group gone."""
        self._loop.stop(forget_groups=forget_groups, timeout_s=timeout_s)

    def sample_and_publish_once(self) -> dict[str, Any] | None:
        """One timed reading now, published; as builtins, None once stopped."""
        reading = self._loop.sample_and_publish_once()
        return None if reading is None else reading.as_plain()

    def phase_begin(
        self, token: str, workers: list[tuple[str, int, int | None]], kernel_peaks: bool = True
    ) -> bool:
        """Begin phase ``token`` for ``workers`` (readings, peak resets, a growth boundary)."""
        self._loop.mark_phase()
        self._phases.begin(token, workers, kernel_peaks=kernel_peaks)
        return True

    def phase_end(self, token: str) -> dict[str, Any] | None:
        """Phase ``token``'s figures as builtins, ending it; None if it is not in progress."""
        self._loop.mark_phase()
        figures = self._phases.end(token)
        return None if figures is None else figures.as_plain()

    def largest_processes(self) -> dict[str, Any] | None:
        """The node's largest processes at the last reading before a kill (see the loop's)."""
        return self._loop.largest_processes()

    def recent_history(self, at_wall: float) -> RecentHistory | None:
        """The node's recent memory up to the Unix time ``at_wall``, as a post-mortem shows it."""
        return self._loop.recent_history(at_wall)

    def ping(self) -> int:
        """Readings published so far: an answer at all says the actor is alive."""
        return self._loop.passes


def _node_usage_reader(procfs: ProcFS) -> Callable[[], NodeUsage | None]:
    """How the sampler reads its node: through ``procfs``; the container's files only when
    that is the node's own ``/proc`` (a procfs mounted elsewhere is not this container's)."""
    root, opener = procfs.root, procfs.opener
    cgroup_root = CGROUP_ROOT if root == "/proc" else None
    return lambda: read_node_usage(root, cgroup_root=cgroup_root, opener=opener)


def _own_worker_id() -> str:
    """This process's Ray worker id (hex); ``""`` outside Ray."""
    ray = sys.modules.get("ray")
    try:
        if ray is not None and ray.is_initialized():
            return printable(str(ray.get_runtime_context().get_worker_id()))[:80]
    except ray_call_errors(ray, AttributeError):
        pass
    return ""


def _own_sampler_id() -> str:
    """This sampler's Ray actor id; the host and pid outside an actor (a test, a bench)."""
    ray = sys.modules.get("ray")  # imported already in an actor; never imported here
    try:
        if ray is not None and ray.is_initialized():
            actor = ray.get_runtime_context().get_actor_id()
            if actor:
                return printable(str(actor))[:80]
    except ray_call_errors(ray, AttributeError):
        pass
    return f"{socket.gethostname()}/{os.getpid()}"
