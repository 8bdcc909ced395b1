"""SimulatedCluster: N fake raylets behind a FakeCluster, with memory that follows a script.

Each node is a real :class:`~raylens.simulation.raylet.FakeRaylet` on 127.0.0.1 and an
entry in a :class:`~raylens.simulation.scripted_cluster.FakeCluster` pointing at it, so anything
that takes a :class:`raylens.cluster.ClusterView` scrapes it over real sockets.
What each node reports is ``schedule(node_index, t)``, evaluated on every request,
with ``t`` the seconds since the cluster started as measured by ``clock`` (inject
one to make time-dependent memory deterministic).

A thousand nodes start in well under a second: raylets share one accept thread,
and the process's open-file soft limit is raised to its hard limit when the
cluster would not fit under it.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable, Mapping

from raylens.simulation.group_series import render_group_series
from raylens.simulation.kill_script import KillScript
from raylens.simulation.phase_script import PhaseScript
from raylens.simulation.raylet import FakeRaylet
from raylens.simulation.scripted_cluster import FakeCluster
from raylens.telemetry.growth import (
    DEFAULT_SAMPLE_INTERVAL_S,
    GrowthSettings,
    KillLineConfig,
    NodeGrowthKeeper,
    NodeReading,
)
from raylens.telemetry.phases.board import publish_current_phase, publish_ended_phase
from raylens.telemetry.phases.memory import (
    SAMPLED_SOURCE,
    GroupPhaseMemory,
    NodePhaseMemory,
    PhaseRecord,
)
from raylens.telemetry.raylet_payload import GroupFigure, NodeFigures
from raylens.validation import positive_seconds

__all__ = [
    "GroupSchedule",
    "Schedule",
    "SimulatedCluster",
    "constant_schedule",
    "ensure_open_file_limit",
]

Schedule = Callable[[int, float], tuple[float, float]]
#: ``(node_index, t) -> {group: bytes}``: what each worker group holds on a node.
GroupSchedule = Callable[[int, float], Mapping[str, float]]

GIB = 1024**3
_FDS_PER_NODE = 4  # listening socket, plus headroom for a connection's two ends


def constant_schedule(node_index: int, t: float) -> tuple[float, float]:
    """The default script: node ``i`` uses ``(1 + i / 1000)`` GiB of a 64 GiB host, forever."""
    return (1 + node_index / 1000) * GIB, 64.0 * GIB


def ensure_open_file_limit(needed: int) -> int:
    """Raise this process's open-file soft limit towards ``needed``; return the new limit.

    Never lowers it and never goes past the hard limit. Where the ``resource``
    module does not exist (Windows) nothing changes and 0 is returned.
    """
    try:
        import resource
    except ImportError:
        return 0
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return soft
    target = hard if hard == resource.RLIM_INFINITY else min(max(needed, soft), hard)
    if target == resource.RLIM_INFINITY:
        target = needed
    resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return target


class SimulatedCluster:
    """``n_nodes`` fake raylets, a FakeCluster that lists them, and scripted memory.

    ``schedule(node_index, t) -> (used_bytes, total_bytes)`` gives what node
    ``node_index`` reports ``t`` seconds after start (default
    :func:`constant_schedule`). ``clock`` is read on every request (default
    ``time.monotonic``). With ``same_host`` every node reports one host name, as
    nodes of ``ray.cluster_utils.Cluster`` do; otherwise node ``i`` is
    ``sim-node-<i>``.

    ``groups(node_index, t) -> {group: bytes}`` scripts what each worker group holds
    (default: no groups); :meth:`expected_groups` evaluates it on the same clock, and
    each raylet serves it as the node's sampler would publish it (:meth:`group_series`),
    so whatever scrapes the cluster reads per-group memory as from a real one;
    ``sampler_interval_s`` makes those figures change only once per interval. Each
    node's simulated sampler also keeps the node's growth as a real one does (a
    :class:`~raylens.telemetry.growth.NodeGrowthKeeper` fed one reading per sampler
    interval, default 1 s, on :attr:`clock`) over ``growth_window_s`` (default
    ``RAYLENS_GROWTH_WINDOW``, else 300 s) and serves its figures, kill line drawn by
    ``kill_line`` (default Ray's), so readers see growth exactly as from real samplers. A
    :class:`~raylens.simulation.memory_script.MemoryScript` provides both callables.
    ``kills`` (a :class:`~raylens.simulation.kill_script.KillScript`) scripts OOM kills:
    each raylet serves its eviction counter and kernel kill count on the same clock.

    ``phases`` scripts the job's phases on the same clock: :meth:`current_phase` names the
    one in progress and :meth:`publish_phase` writes it to the cluster's store, as a
    driver inside ``raylens.phase`` does, for whatever reads it there (``raylens watch``);
    each node's simulated sampler marks the boundaries for its growth judgement.

    Reach a node's raylet with :meth:`raylet` (to make it hang, trickle, ...) and
    its Ray node id with :meth:`node_id`. Close with :meth:`close` or use it as a
    context manager.
    """

    def __init__(
        self,
        n_nodes: int,
        *,
        schedule: Schedule | None = None,
        clock: Callable[[], float] = time.monotonic,
        same_host: bool = False,
        template: str | bytes = "worker",
        groups: GroupSchedule | None = None,
        sampler_interval_s: float | None = None,
        phases: PhaseScript | None = None,
        kills: KillScript | None = None,
        growth_window_s: float | None = None,
        kill_line: KillLineConfig | None = None,
    ) -> None:
        if not isinstance(n_nodes, int) or isinstance(n_nodes, bool) or n_nodes < 0:
            raise ValueError(f"n_nodes must be a non-negative int, got {n_nodes!r}")
        self.schedule: Schedule = schedule or constant_schedule
        self.groups: GroupSchedule | None = groups
        self.kills = kills
        self.sampler_interval_s = (
            None
            if sampler_interval_s is None
            else positive_seconds("sampler_interval_s", sampler_interval_s)
        )
        self.clock = clock
        self.growth_settings = (
            GrowthSettings.from_env()
            if growth_window_s is None
            else GrowthSettings.from_env(window_s=growth_window_s)
        )
        self.kill_line = kill_line if kill_line is not None else KillLineConfig()
        self._samplers: list[_SimulatedSampler] = []
        self.phases = phases
        self._published_phase: str | None = None
        self._published_at = 0.0
        self.same_host = same_host
        self._template = template
        self.cluster = FakeCluster()
        self.raylets: list[FakeRaylet] = []
        self.node_ids: list[str] = []
        self._closed = False
        self._start = clock()
        ensure_open_file_limit(256 + _FDS_PER_NODE * n_nodes)
        with contextlib.ExitStack() as on_failure:
            on_failure.callback(self.close)  # what started is closed if any node fails
            for _ in range(n_nodes):
                self.add_node()
            on_failure.pop_all()

    def __len__(self) -> int:
        return len(self.raylets)

    def elapsed(self) -> float:
        """Seconds since the cluster started, by :attr:`clock`."""
        return self.clock() - self._start

    def expected(self, node_index: int) -> tuple[float, float]:
        """What node ``node_index`` reports right now: ``(used_bytes, total_bytes)``."""
        return self.schedule(node_index, self.elapsed())

    def expected_groups(self, node_index: int) -> dict[str, float]:
        """What each worker group on node ``node_index`` holds right now (empty without ``groups``)."""
        if self.groups is None:
            return {}
        return dict(self.groups(node_index, self.elapsed()))

    def group_series(self, node_index: int) -> bytes:
        """The per-group series node ``node_index`` serves now, as its sampler would publish them.

        RSS only, one process per group, stamped with the wall clock, with the node's growth
        figures; empty without ``groups`` (a node with no group still has its sampler).
        With ``sampler_interval_s`` the stamp (and the figures) change only once per
        interval, as a real sampler's do.
        """
        now = time.time()
        if self.sampler_interval_s is not None:
            now -= now % self.sampler_interval_s
        if self.groups is None:
            return b""
        groups = self.expected_groups(node_index)
        reading = self._samplers[node_index].catch_up(self.elapsed())
        growth = {} if reading is None else reading.group_growth
        node = None
        if reading is not None:
            node = NodeFigures(
                reading.used,
                _shown(reading.growth),
                _shown(reading.outside_growth),
                reading.growing,
                reading.limit,
                reading.time_to_limit,
                self.growth_settings.window_s,
                f"simulated-{node_index}",
                "simulation",
            )
        return render_group_series(
            [
                GroupFigure(name, value, None, 1.0, _shown(growth.get(name)))
                for name, value in sorted(groups.items())
            ],
            sampled_at=now,
            worker_id=f"{node_index:056x}",
            node=node,
        )

    def current_phase(self) -> str | None:
        """The scripted phase in progress now (None without ``phases`` or between phases)."""
        return None if self.phases is None else self.phases.phase_at(self.elapsed())

    def publish_phase(self) -> str | None:
        """Write the phase in progress to the cluster's store (withdraw it between phases).

        Written only when it changed since the last call, stamped with the wall clock
        then; returns it.
        """
        current = self.current_phase()
        if current != self._published_phase:
            ended, began = self._published_phase, self._published_at
            publish_current_phase(self.cluster, current, time.time())
            self._published_phase, self._published_at = current, self.elapsed()
            if ended is not None:
                publish_ended_phase(self.cluster, self.phase_record(ended, began, self.elapsed()))
        return current

    def phase_record(self, name: str, start: float, end: float) -> PhaseRecord:
        """The figures of phase ``name`` run from ``start`` to ``end`` (elapsed seconds), as a
        driver would record them: each group's start, end and peak (sampled each second)."""
        steps = min(600, max(1, math.ceil(end - start)))
        times = [start + (end - start) * i / steps for i in range(steps + 1)]
        nodes = {}
        for index, node_id in enumerate(self.node_ids):
            readings = [self.groups(index, t) if self.groups else {} for t in times]
            figures = tuple(
                GroupPhaseMemory(
                    group,
                    round(readings[0].get(group, 0.0)),
                    round(readings[-1].get(group, 0.0)),
                    round(max(reading.get(group, 0.0) for reading in readings)),
                    SAMPLED_SOURCE,
                )
                for group in sorted({g for reading in readings for g in reading})
            )
            if figures:
                nodes[node_id] = NodePhaseMemory(self.hostname(index), figures)
        return PhaseRecord(name, duration_s=end - start, ended_at=time.time(), nodes=nodes)

    def kill_series(self, node_index: int) -> bytes:
        """The kill counters node ``node_index`` serves now (empty without ``kills``)."""
        if self.kills is None:
            return b""
        return self.kills.series(node_index, self.elapsed())

    def hostname(self, node_index: int) -> str:
        """The host name node ``node_index`` is listed under."""
        return "sim-host" if self.same_host else f"sim-node-{node_index}"

    def add_node(self) -> int:
        """Start one more raylet and list it; returns its node index."""
        index = len(self.raylets)
        raylet = FakeRaylet(
            memory=lambda: self.expected(index),
            template=self._template,
            extra=(
                (lambda: self.group_series(index) + self.kill_series(index))
                if self.groups is not None or self.kills is not None
                else None
            ),
        )
        with contextlib.ExitStack() as on_failure:
            on_failure.callback(raylet.close)  # a raylet the cluster did not take is closed
            node_id = self.cluster.add_node(
                address=raylet.host, port=raylet.port, hostname=self.hostname(index)
            )
            on_failure.pop_all()
        self.raylets.append(raylet)
        self.node_ids.append(node_id)
        self._samplers.append(_SimulatedSampler(self, index))
        return index

    def raylet(self, node_index: int) -> FakeRaylet:
        """The raylet serving node ``node_index``."""
        return self.raylets[node_index]

    def node_id(self, node_index: int) -> str:
        """Ray's hex id of node ``node_index``."""
        return self.node_ids[node_index]

    def index_of(self, node_id: str) -> int:
        """The node index of ``node_id``."""
        try:
            return self.node_ids.index(node_id)
        except ValueError:
            raise KeyError(f"no node {node_id!r} in this simulated cluster") from None

    def kill_node(self, node_index: int) -> None:
        """Mark node ``node_index`` dead in the cluster view; its raylet keeps serving."""
        self.cluster.kill_node(self.node_ids[node_index])

    def remove_node(self, node_index: int) -> None:
        """Drop node ``node_index`` from the cluster view and close its raylet."""
        self.cluster.remove_node(self.node_ids[node_index])
        self.raylets[node_index].close()

    def close(self) -> None:
        """Close every raylet. Idempotent; returns at once even with hung requests."""
        if self._closed:
            return
        self._closed = True
        for raylet in self.raylets:
            raylet.close()

    def __enter__(self) -> SimulatedCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SimulatedCluster(n_nodes={len(self.raylets)}, closed={self._closed})"


def _shown(rate: float | None) -> float | None:
    """A rate as a reader of the exposition gets it: negative ones are not served."""
    return None if rate is None or not rate >= 0 else rate


class _SimulatedSampler:
    """A node's sampler in the simulation: one reading per interval of the cluster's clock,
    made up for the time since the last scrape (at most a window's worth), into the node's
    keeper; each scripted phase boundary is marked there before the first reading after it,
    as a real sampler marks the driver's ``raylens.phase`` boundaries."""

    def __init__(self, cluster: SimulatedCluster, index: int) -> None:
        self._cluster = cluster
        self._index = index
        self._every = cluster.sampler_interval_s or DEFAULT_SAMPLE_INTERVAL_S
        self._keeper = NodeGrowthKeeper(cluster.growth_settings, cluster.kill_line)
        self._lock = threading.Lock()
        self._last_tick: int | None = None
        self._reading: NodeReading | None = None
        script = cluster.phases
        self._boundaries = None if script is None else script.boundaries(math.inf)
        self._next_boundary = self._advance()

    def _advance(self) -> float | None:
        """The next scripted boundary's time, None when there is none."""
        upcoming = None if self._boundaries is None else next(self._boundaries, None)
        return None if upcoming is None else upcoming[0]

    def _mark_phases_until(self, t: float) -> None:
        while self._next_boundary is not None and self._next_boundary <= t:
            self._keeper.mark_phase(self._next_boundary)
            self._next_boundary = self._advance()

    def catch_up(self, elapsed: float) -> NodeReading | None:
        """Record every reading due up to ``elapsed``; the node's figures after the latest."""
        cluster, index, every = self._cluster, self._index, self._every
        with self._lock:
            tick = math.floor(elapsed / every)
            if self._last_tick is not None and tick <= self._last_tick:
                return self._reading
            window_ticks = int(cluster.growth_settings.window_s / every) + 1
            first = (
                tick if self._last_tick is None else max(self._last_tick + 1, tick - window_ticks)
            )
            for due in range(first, tick + 1):
                t = due * every
                self._mark_phases_until(t)
                used, total = cluster.schedule(index, t)
                groups = {} if cluster.groups is None else dict(cluster.groups(index, t))
                if due < tick:
                    self._keeper.add(t, used, groups)
                else:
                    self._reading = self._keeper.record(t, used, groups, host_total=total)
            self._last_tick = tick
            return self._reading
