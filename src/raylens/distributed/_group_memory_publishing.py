"""A node's sampler reading its worker groups on its own timer and publishing through Ray.

Each node's sampler actor reads its registered workers' memory every interval and
sets Ray metrics (``ray.util.metrics`` gauges) with the result; the node's metrics
agent then serves them, with Ray's ``ray_`` prefix and its own labels, on the
endpoint that raylens' host-memory scrape already reads. The driver makes no call
per reading, and any process that scrapes the node sees the same figures.

The series, named in :mod:`raylens.telemetry.raylet_payload`:

- ``raylens_worker_group_memory_bytes{rl_worker_group, memory_type}``: a group's
  RSS (``memory_type="rss"``), and its PSS (``"pss"``) while that is known;
- ``raylens_worker_group_processes{rl_worker_group}``: processes measured;
- ``raylens_sampler_sampled_at_seconds``: the wall-clock time (``time.time()``) of
  the latest reading, so that a reader finding several samplers' series on one node
  (Ray keeps a dead actor's series for a while, told apart by ``WorkerId``) can take
  the freshest.

A group that leaves the node, and a PSS figure that stops being known, get NaN once,
so that readers drop the series at once rather than when Ray's gauge expiry removes
it, and are not set again after that.

:class:`GroupMemorySamplerActor` is what runs in the actor (it also answers
readings on demand); :class:`PublishingLoop` is its timer and bookkeeping;
:class:`GroupMemoryPublisher` is the seam between the loop and Ray: the default,
:class:`RayMetricsPublisher`, creates its gauges on first use, inside the actor
process (never at import); tests hand the actor their own.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol, runtime_checkable

from raylens.lens import warn_once
from raylens.safe_text import printable
from raylens.telemetry.group_memory import (
    DEFAULT_MAX_PROCESSES,
    GroupMemoryReader,
    NodeGroupMemory,
    as_group_worker,
)
from raylens.telemetry.history import GrowthSettings, MemoryHistory
from raylens.telemetry.phase_memory import NodePhaseTracker
from raylens.telemetry.process_memory import ProcFS
from raylens.telemetry.raylet_payload import (
    GROUP_GROWTH_GAUGE,
    GROUP_LABEL,
    GROUP_MEMORY_GAUGE,
    GROUP_PROCESSES_GAUGE,
    MEMORY_TYPE_LABEL,
    SAMPLER_SAMPLED_AT_GAUGE,
)
from raylens.validation import positive_seconds

__all__ = [
    "DEFAULT_PSS_INTERVAL_SECONDS",
    "DEFAULT_TREE_INTERVAL_SECONDS",
    "SAMPLER_THREAD_NAME",
    "STOP_TIMEOUT_S",
    "GroupMemoryPublisher",
    "GroupMemorySamplerActor",
    "PublishingLoop",
    "RayMetricsPublisher",
]

SAMPLER_THREAD_NAME = "raylens-group-sampler"
STOP_TIMEOUT_S = 5.0
"""How long :meth:`PublishingLoop.stop` waits for a reading in progress to finish."""

DEFAULT_PSS_INTERVAL_SECONDS = 60.0
"""How often a sampler reads PSS per group by default (RSS is read every cycle)."""

DEFAULT_TREE_INTERVAL_SECONDS = 30.0
"""How often a sampler walks each worker's process tree again by default; a process a
worker spawns in between is counted from the next walk (a new worker is walked at once)."""

_LOGGER = logging.getLogger("raylens.distributed")
_NAN = float("nan")
_RSS = "rss"
_PSS = "pss"


class GroupMemoryPublisher(Protocol):
    """Where a sampler's readings go: one call per group per reading, then the time."""

    def set_group(self, group: str, rss_bytes: int, pss_bytes: int | None, processes: int) -> None:
        """Publish one group's figures; ``pss_bytes`` None means PSS is not known now."""

    def forget_group(self, group: str) -> None:
        """The group is no longer on this node: mark its series gone (NaN)."""

    def set_sampled_at(self, seconds: float) -> None:
        """The wall-clock time of the reading just published."""


@runtime_checkable
class GrowthPublisher(Protocol):
    """A publisher that also takes each group's growth rate, where the sampler knows one."""

    def set_growth(self, group: str, bytes_per_second: float) -> None:
        """Publish the group's growth (bytes per second) over the sampler's window."""


def _ray_gauge_class() -> Any:
    from ray.util.metrics import Gauge

    return Gauge


class RayMetricsPublisher:
    """Publishes through ``ray.util.metrics`` gauges, made on the first call.

    ``gauge_class`` stands in for ``ray.util.metrics.Gauge`` (imported on first use
    when None): anything taking ``(name, description=..., tag_keys=...)`` whose
    instances have ``set(value, tags=...)``. Not thread-safe; one loop calls it.
    """

    def __init__(self, gauge_class: Callable[..., Any] | None = None) -> None:
        self._gauge_class = gauge_class
        self._gauges: tuple[Any, Any, Any, Any] | None = None
        # Groups whose PSS series holds a number, so a PSS that stops being known gets NaN.
        self._with_pss: set[str] = set()

    def _made(self) -> tuple[Any, Any, Any, Any]:
        if self._gauges is None:
            gauge = self._gauge_class or _ray_gauge_class()
            self._gauges = (
                gauge(
                    GROUP_MEMORY_GAUGE,
                    description="Memory of a worker group's process trees on this node, in "
                    "bytes, by memory_type (rss or pss), read by raylens' sampler.",
                    tag_keys=(GROUP_LABEL, MEMORY_TYPE_LABEL),
                ),
                gauge(
                    GROUP_PROCESSES_GAUGE,
                    description="Processes in a worker group's process trees on this node.",
                    tag_keys=(GROUP_LABEL,),
                ),
                gauge(
                    SAMPLER_SAMPLED_AT_GAUGE,
                    description="Unix time of raylens' sampler's latest reading on this node.",
                    tag_keys=(),
                ),
                gauge(
                    GROUP_GROWTH_GAUGE,
                    description="Growth of a worker group's RSS on this node, in bytes per "
                    "second, over raylens' growth window; absent until the window is full.",
                    tag_keys=(GROUP_LABEL,),
                ),
            )
        return self._gauges

    def set_group(self, group: str, rss_bytes: int, pss_bytes: int | None, processes: int) -> None:
        memory, counts, _, _ = self._made()
        memory.set(float(rss_bytes), tags={GROUP_LABEL: group, MEMORY_TYPE_LABEL: _RSS})
        if pss_bytes is not None:
            memory.set(float(pss_bytes), tags={GROUP_LABEL: group, MEMORY_TYPE_LABEL: _PSS})
            self._with_pss.add(group)
        elif group in self._with_pss:
            memory.set(_NAN, tags={GROUP_LABEL: group, MEMORY_TYPE_LABEL: _PSS})
            self._with_pss.discard(group)
        counts.set(float(processes), tags={GROUP_LABEL: group})

    def forget_group(self, group: str) -> None:
        memory, counts, _, growth = self._made()
        growth.set(_NAN, tags={GROUP_LABEL: group})
        memory.set(_NAN, tags={GROUP_LABEL: group, MEMORY_TYPE_LABEL: _RSS})
        if group in self._with_pss:
            memory.set(_NAN, tags={GROUP_LABEL: group, MEMORY_TYPE_LABEL: _PSS})
            self._with_pss.discard(group)
        counts.set(_NAN, tags={GROUP_LABEL: group})

    def set_sampled_at(self, seconds: float) -> None:
        self._made()[2].set(float(seconds))

    def set_growth(self, group: str, bytes_per_second: float) -> None:
        self._made()[3].set(float(bytes_per_second), tags={GROUP_LABEL: group})


class PublishingLoop:
    """Reads ``reader``'s workers every interval on a daemon thread and publishes the result.

    :meth:`set_workers` replaces the node's worker list; :meth:`start` starts the
    thread (or changes its interval); :meth:`sample_and_publish_once` is one pass,
    which the thread calls and tests may call directly. A pass that fails is logged
    once per process and the loop carries on. ``wall_clock`` (default
    :func:`time.time`) stamps each reading. ``lock`` guards ``reader``, which other
    callers in the process may share. ``on_reading`` is called with every reading
    published (a phase's sampled peaks come from there). Thread-safe.
    """

    def __init__(
        self,
        reader: GroupMemoryReader,
        publisher: GroupMemoryPublisher,
        *,
        lock: threading.Lock | None = None,
        wall_clock: Callable[[], float] | None = None,
        history: MemoryHistory | None = None,
        clock: Callable[[], float] | None = None,
        on_reading: Callable[[NodeGroupMemory], None] | None = None,
    ) -> None:
        self._reader = reader
        self._on_reading = on_reading
        self._history = history
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
            present = set()
            now = self._clock()
            for group in reading.groups:
                self._publisher.set_group(
                    group.group, group.rss_bytes, group.pss_bytes, group.process_count
                )
                present.add(group.group)
                self._published.add(group.group)
                self._publish_growth(group.group, now, group.rss_bytes)
            self._forget(self._published - present)
            self._publisher.set_sampled_at(self._wall_clock())
            self._passes += 1
            if self._on_reading is not None:
                self._on_reading(reading)
            return reading

    def _publish_growth(self, group: str, now: float, rss_bytes: int) -> None:
        """Record the group's RSS in this node's history and publish its growth once known."""
        if self._history is None or not isinstance(self._publisher, GrowthPublisher):
            return
        self._history.record(group, now, rss_bytes)
        series = self._history.series(group)
        if series is not None and series.growth is not None:
            self._publisher.set_growth(group, series.growth)

    def _forget(self, groups: set[str]) -> None:
        for group in sorted(groups):
            if self._history is not None:
                self._history.forget(group)
            # Dropped from the set first: a publisher that fails here is not asked again.
            self._published.discard(group)
            self._publisher.forget_group(group)

    def _run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.sample_and_publish_once()
            except Exception as error:
                warn_once(
                    "group_memory.sampler.publish",
                    "the group-memory sampler could not read or publish its node's worker "
                    f"groups: {printable(str(error)[:300])} (warned once; it keeps trying "
                    "every interval)",
                    logger=_LOGGER,
                )
            interval = self._interval
            if interval is None or stop.wait(interval):
                return


class GroupMemorySamplerActor:
    """What runs inside each node's sampler actor: a reader, read on demand or on its own timer.

    The reader arguments are those of :class:`GroupMemoryReader`; ``procfs_root`` is
    where procfs is mounted on the node (``/proc`` by default). :meth:`read` answers
    one reading to its caller. :meth:`set_workers` and :meth:`start` make the sampler
    read the node's workers every interval on a daemon thread and publish each reading
    through ``publisher`` (default: Ray's metrics pipeline, see
    :mod:`raylens.distributed._group_memory_publishing`), stamped with ``wall_clock``
    (default :func:`time.time`); ``clock`` times the reader's intervals and the
    growth history. Each group's RSS also feeds a history on the node, and its growth
    over ``growth_window_s`` (default ``RAYLENS_GROWTH_WINDOW``, else 600 s) is
    published once the window is full, so any reader sees it without keeping history.

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
    ) -> None:
        self._lock = threading.Lock()
        if procfs is None:
            procfs = ProcFS(procfs_root) if procfs_root is not None else ProcFS()
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
            publisher if publisher is not None else RayMetricsPublisher(),
            lock=self._lock,
            wall_clock=wall_clock,
            history=MemoryHistory(
                GrowthSettings.from_env()
                if growth_window_s is None
                else GrowthSettings.from_env(window_s=growth_window_s)
            ),
            clock=clock,
            on_reading=self._phases.observe,
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

    def phase_begin(
        self, token: str, workers: list[tuple[str, int, int | None]], kernel_peaks: bool = True
    ) -> bool:
        """Begin phase ``token`` for ``workers``: start readings and peak resets; True once done."""
        self._phases.begin(token, workers, kernel_peaks=kernel_peaks)
        return True

    def phase_end(self, token: str) -> dict[str, Any] | None:
        """The figures of phase ``token`` as builtins, ending it; None if it is not in progress."""
        figures = self._phases.end(token)
        return None if figures is None else figures.as_plain()

    def ping(self) -> int:
        """Readings published so far: an answer at all says the actor is alive."""
        return self._loop.passes
