"""``raylens watch``, ``simulate`` and ``demo``: a cluster's host memory as a live node table."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Protocol

from raylens.cli.demo_frames import DEMO_GROUPS_WAIT_S, wait_for_group_figures
from raylens.cli.gcs_probe import GcsProbe, check_reachable, confirm_gcs
from raylens.cli.output import Output, sample_loop
from raylens.cli.parser import CliError, cluster_address
from raylens.cli.phase_notes import ended_phase_line, phase_on_board, phase_title
from raylens.cli.pipeline import scrape_timeout_for, start_telemetry, stop_monitoring
from raylens.cli.reachability import (
    DEFAULT_GIVE_UP_S,
    RAY_RECONNECT_ENV,
    GuardedCluster,
    ray_reconnect_setting,
    tcp_probe,
)
from raylens.cli.recording import frame_of_rows, open_recorder
from raylens.cli.sample_lines import node_line
from raylens.cluster import ray_call_errors
from raylens.demo import keep_sigterm_handler
from raylens.live_table import NodeRow, counted, format_kill, node_summary, node_table

if TYPE_CHECKING:
    from raylens.cluster import ClusterView, RayClusterView
    from raylens.telemetry.growth_outlook import GrowthSnapshot
    from raylens.telemetry.host_memory import HostMemoryMonitor, NodeSample
    from raylens.telemetry.raylet_payload import NodeGroupFigures

# How many samples of each node's trend the table keeps.
_HISTORY = 24
# What a node's row says while the cluster's GCS does not answer.
UNREACHABLE_ERROR = "cluster unreachable"


class ClusterLost(CliError):
    """The watched cluster did not answer for ``--give-up`` seconds: one line, status 2."""


class NodeSource(Protocol):
    """What :class:`NodeTable` reads of a monitor."""

    def latest(self) -> list[NodeSample]: ...

    def group_figures(self) -> dict[str, tuple[str, NodeGroupFigures, float]]: ...


class NodeTable:
    """Turns the monitor's latest samples into table rows, with a short trend per node.

    A row's ``age`` is its figures' own: Ray refreshes a node's ``used`` every few
    seconds, and scrapes in between return the same bytes, so ``used`` is as old as
    the first scrape that returned it; group figures are as old as their sampler's
    stamp (``wall``, Unix seconds, is what that stamp is compared with).
    """

    def __init__(
        self,
        monitor: NodeSource,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] | None = None,
        growth: GrowthSnapshot | None = None,
    ) -> None:
        self.monitor = monitor
        self.clock = clock
        self.wall = wall or (lambda: time.time())
        self.growth = growth
        self.history: dict[str, list[float]] = {}
        #: Per node: its latest ``used`` value and the scrape time that first returned it.
        self.first_seen: dict[str, tuple[float, float]] = {}

    def _used_age(
        self, node_id: str, used: float | None, sampled_at: float | None, now: float
    ) -> float | None:
        if sampled_at is None:
            return None
        if used is None:
            return max(0.0, now - sampled_at)
        seen = self.first_seen.get(node_id)
        if seen is None or seen[0] != used or seen[1] > sampled_at:
            seen = self.first_seen[node_id] = (used, sampled_at)
        return max(0.0, now - seen[1])

    def _group_ages(self) -> dict[str, float]:
        """Seconds since each node's sampler stamped the group figures it published."""
        wall = self.wall()
        return {
            node: max(0.0, wall - published.sampled_at)
            for node, (_host, published, _read_at) in self.monitor.group_figures().items()
        }

    def rows(self) -> list[NodeRow]:
        from raylens.telemetry.group_memory import DEFAULT_SNAPSHOT

        now = self.clock()
        rows = []
        seen = set()
        groups = {
            node: {g.group: float(g.rss_bytes) for g in reading.groups}
            for node, (reading, _age) in DEFAULT_SNAPSHOT.latest().items()
        }
        group_ages = {node: age for node, (_reading, age) in DEFAULT_SNAPSHOT.latest().items()}
        group_ages.update(self._group_ages())
        outlooks = self.growth.latest() if self.growth is not None else {}
        for sample in self.monitor.latest():
            seen.add(sample.node_id)
            outlook = outlooks.get(sample.node_id)
            history = self.history.setdefault(sample.node_id, [])
            if sample.error is None and sample.used is not None:
                history.append(sample.used)
                del history[:-_HISTORY]
            rows.append(
                NodeRow(
                    node_id=sample.node_id,
                    host=sample.host,
                    used=sample.used,
                    total=sample.total,
                    worker_groups=sample.worker_groups,
                    age_s=self._used_age(sample.node_id, sample.used, sample.sampled_at, now),
                    scrape_age_s=None
                    if sample.sampled_at is None
                    else max(0.0, now - sample.sampled_at),
                    group_age_s=group_ages.get(sample.node_id),
                    error=sample.error,
                    history=list(history),
                    group_rss=groups.get(sample.node_id, {}),
                    growth=outlook.growth if outlook else None,
                    group_growth=dict(outlook.group_growth) if outlook else {},
                    limit=outlook.limit if outlook else None,
                    time_to_limit=outlook.time_to_limit if outlook else None,
                    fastest_group=outlook.fastest_group if outlook else None,
                    growth_unavailable=outlook.unavailable if outlook else None,
                )
            )
        for gone in set(self.history) - seen:
            del self.history[gone]
        for gone in set(self.first_seen) - seen:
            del self.first_seen[gone]
        return rows


def watch_nodes(
    monitor: HostMemoryMonitor,
    args: argparse.Namespace,
    *,
    output: Output,
    title: str,
    stop: threading.Event,
    deadline: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    cluster: ClusterView | None = None,
    before_sample: Callable[[], object] | None = None,
    guard: GuardedCluster | None = None,
    one_line: bool = True,
    groups_first_s: float = 0.0,
    growth_window_s: float | None = None,
    wall: Callable[[], float] | None = None,
) -> None:
    """Sample and show the node table every ``args.interval`` until --once, the end or stop.

    The end is ``deadline`` (a reading of ``clock``) when given, else ``args.duration``
    seconds from the first table. The phase each live job is in, as published in
    ``cluster``'s store (default: the connected one), shows in the title and under
    ``phases`` in ``--json``. ``before_sample`` runs before every sample.

    With a ``guard``, every sample first probes the cluster's GCS. While it does not
    answer, every row reads as failing and a line under the table says since when;
    once it has been silent for ``args.give_up`` seconds this raises
    :class:`ClusterLost`, at that moment rather than at the next interval.

    Outside a terminal each sample is one line, unless ``one_line`` is False (the
    demo, which is there to be looked at, draws its table everywhere). With
    ``groups_first_s`` the first frame waits up to that long for every labelled node's
    group figures; ``growth_window_s`` is the samplers' growth window (default theirs).
    ``wall`` stamps each sample (``time`` in ``--json``, and ``--record``'s lines).
    """
    from raylens.cluster import default_cluster_view
    from raylens.distributed.group_memory_cycle import attach_group_memory
    from raylens.telemetry.growth_outlook import attach_growth
    from raylens.telemetry.oom import OomWatch, attach_oom_watch
    from raylens.telemetry.phases.board import read_current_phases, read_ended_phases

    wall = wall or (lambda: time.time())  # looked up at each call: freezegun's, in tests
    monitor.declare_consumer()  # the table reads every cycle, so every cycle scrapes
    # Worker groups of this process (the demo's) get a per-group column; samplers start
    # only once a group registers its workers, so elsewhere this costs nothing.
    group_cycle = attach_group_memory(monitor)
    if growth_window_s is not None:
        group_cycle.samplers.configure_growth(window_s=growth_window_s)
    try:
        growth = attach_growth(monitor)
    except ValueError as error:  # RAYLENS_GROWTH_WINDOW or RAYLENS_MEMORY_USAGE_THRESHOLD
        raise CliError(str(error)) from None
    table = NodeTable(monitor, growth=growth.snapshot)
    # Kills are shown, not written: the driver's monitor writes the post-mortems. Their
    # phase is the one the cluster's phase board shows, whichever driver entered it.
    board = cluster if cluster is not None else default_cluster_view()
    kills = attach_oom_watch(
        monitor,
        OomWatch(growth=growth, phase_of=lambda: phase_on_board(read_current_phases(board))),
    )
    interval, duration = args.interval, args.duration
    once = getattr(args, "once", False)
    give_up = float(getattr(args, "give_up", None) or DEFAULT_GIVE_UP_S)
    recorder = open_recorder(getattr(args, "record", None))

    def give_up_if_silent() -> None:
        silent = guard.silent_for() if guard is not None else None
        if guard is not None and silent is not None and silent >= give_up:
            raise ClusterLost(guard.give_up_message(give_up))

    def sample() -> None:
        if guard is not None:
            guard.check()
            give_up_if_silent()
        if before_sample is not None:
            before_sample()
        monitor.collect_once()
        # A GCS that accepts connections but answers nothing is found out by the calls.
        give_up_if_silent()
        rows = table.rows()
        notes: list[str] = []
        unreachable = guard.describe(give_up) if guard is not None else None
        if unreachable is not None:
            rows = [dataclasses.replace(row, error=UNREACHABLE_ERROR) for row in rows]
            notes.append(unreachable)
        phases = read_current_phases(board)
        ended = read_ended_phases(board)
        notes.extend(
            ended_phase_line(e, now=wall(), several_jobs=len(ended) > 1) for e in ended[:4]
        )
        recent = [kill.as_plain() for kill in kills.ledger.recent()]
        record = {
            "time": wall(),
            "nodes": [row.to_json() for row in rows],
            "totals": node_summary(rows).to_json(),
            "warnings": [row.warning for row in rows if row.warning],
            "phases": [current.to_json() for current in phases],
            "last_phases": [e.to_json() for e in ended],
            "oom_kills": recent,
            "unreachable": unreachable,
        }
        shown = phase_title(title, phases)
        now = wall()
        if recorder is not None:
            recorder.append(frame_of_rows(now, rows, phases, recent))
        lines = [format_kill(kill, now=now) for kill in recent]
        output.show(
            lambda: node_table(rows, title=shown, kills=lines, notes=notes),
            record,
            line=(lambda: node_line(rows, title=shown, kills=lines, notes=notes))
            if one_line
            else None,
        )
        if output.closed:
            stop.set()

    def give_up_at() -> float | None:  # the guard reads the same clock as the loop
        return guard.give_up_at(give_up) if guard is not None else None

    if groups_first_s > 0:
        wait_for_group_figures(
            monitor, table, stop=stop, clock=clock, within_s=groups_first_s, poll_s=0.5
        )
    with output.session(live=not once):
        sample_loop(
            sample,
            interval=interval,
            once=once,
            duration=duration,
            deadline=deadline,
            stop=stop,
            clock=clock,
            wake_by=give_up_at,
        )


_GIB = 1024**3


def _simulated_memory(node_index: int, t: float) -> tuple[float, float]:
    """A gentle, node-specific wave: 64 GiB hosts between 20% and 80% used."""
    total = 64 * _GIB
    phase = node_index * 0.7
    used = total * (0.5 + 0.3 * math.sin(t / 6.0 + phase))
    return used, total


def _simulated_groups(policy_nodes: int) -> Callable[[int, float], dict[str, float]]:
    """The first ``policy_nodes`` nodes run ``policy``, the rest ``rollout``, holding most of
    what is used, as the simulation's samplers publish it (so its nodes show growth)."""

    def groups(node_index: int, t: float) -> dict[str, float]:
        used, _total = _simulated_memory(node_index, t)
        return {("policy" if node_index < policy_nodes else "rollout"): 0.6 * used}

    return groups


# The most nodes ``raylens simulate`` starts. Each is a real HTTP server in this
# process, scraped over its own connection every cycle: on two cores 2,000 nodes are
# all scraped within a 5 s deadline (8 s, 0.5 GB), while 4,000 leave half of them
# failed, so a larger simulation would show the machine's limits, not a cluster's.
MAX_SIMULATED_NODES = 2000
# Open files a simulated node may hold at once (its listening socket, a connection's
# two ends, one spare), and those the rest of the process needs.
_FILES_PER_NODE = 4
_FILES_SPARE = 256


def _check_simulated_size(nodes: int) -> None:
    """Refuse, before anything starts, a simulated cluster this process cannot hold."""
    from raylens.simulation.simulated_cluster import ensure_open_file_limit

    if nodes > MAX_SIMULATED_NODES:
        raise CliError(
            f"--nodes {nodes} is more than a simulated cluster may have: "
            f"at most {MAX_SIMULATED_NODES}"
        )
    needed = _FILES_SPARE + _FILES_PER_NODE * nodes
    limit = ensure_open_file_limit(needed)
    if 0 < limit < needed:
        raise CliError(
            f"--nodes {nodes} needs about {needed} open files, and this process may open "
            f"at most {limit} (see ulimit -n): simulate at most "
            f"{max(0, (limit - _FILES_SPARE) // _FILES_PER_NODE)} nodes, or raise the limit"
        )


# The time one more simulated node adds to a scrape cycle, at most: measured on two
# shared cores, 1,000 nodes need well over a second and 2,000 finish within 5 s.
_SECONDS_PER_SIMULATED_NODE = 0.005


def simulated_scrape_timeout(nodes: int, interval: float) -> float:
    """The default deadline of a simulated node's scrape.

    Every simulated raylet shares this process with the scraper, so the time a cycle
    takes grows with the node count: the deadline is the refresh interval, raised to
    about 5 ms per node, and never past the monitor's own deadline. A cut shorter
    than that would report the machine's load as failed nodes.
    """
    return scrape_timeout_for(max(interval, _SECONDS_PER_SIMULATED_NODE * nodes))


def simulate_title(nodes: int, hung: int) -> str:
    """The title of ``raylens simulate``'s table."""
    return f"Simulated cluster: {counted(nodes, 'node')}, {hung} hung"


def run_simulate(args: argparse.Namespace, stop: threading.Event) -> int:
    if args.hung > args.nodes:
        raise CliError(f"--hung {args.hung} is more than --nodes {args.nodes}")
    _check_simulated_size(args.nodes)
    from raylens.simulation.phase_script import PhaseScript
    from raylens.simulation.simulated_cluster import SimulatedCluster
    from raylens.telemetry import host_memory

    start_telemetry(args.exporter, as_json=args.json)
    scrape_timeout = args.scrape_timeout or simulated_scrape_timeout(args.nodes, args.interval)
    output = Output(as_json=args.json)
    # A training loop's phases, a minute per step, shown in the title as watch shows a job's.
    phases = PhaseScript(
        [("generation", 0.0, 40.0), ("training", 40.0, 55.0), ("weight refit", 55.0, 60.0)],
        repeat_s=60.0,
    )
    policy_nodes = max(1, args.nodes // 2)
    with SimulatedCluster(
        args.nodes,
        schedule=_simulated_memory,
        groups=_simulated_groups(policy_nodes),
        phases=phases,
    ) as simulated:
        for index in range(args.hung):
            simulated.raylet(args.nodes - 1 - index).hang()
        node_ids = simulated.node_ids
        host_memory.register_worker_group_nodes("policy", node_ids[:policy_nodes])
        host_memory.register_worker_group_nodes("rollout", node_ids[policy_nodes:])
        # The fake raylets are served by this process anyway: scrape here, without a helper.
        monitor = host_memory.HostMemoryMonitor(
            args.interval,
            cluster=simulated.cluster,
            scrape_timeout=scrape_timeout,
            scrape_mode="inprocess",
        )
        try:
            watch_nodes(
                monitor,
                args,
                output=output,
                title=simulate_title(args.nodes, args.hung),
                stop=stop,
                cluster=simulated.cluster,
                before_sample=simulated.publish_phase,
            )
        finally:
            stop_monitoring(monitor)
            host_memory.forget_worker_group_nodes("policy")
            host_memory.forget_worker_group_nodes("rollout")
    return output.exit_status()


def import_ray() -> ModuleType:
    try:
        import ray
    except ImportError:
        raise CliError(
            "Ray is not installed; install it with: pip install 'raylens[ray]'"
        ) from None
    return ray


def run_watch(
    args: argparse.Namespace,
    stop: threading.Event,
    *,
    probe: GcsProbe | None = None,
    leave: Callable[[ClusterLost], None] | None = None,
) -> int:
    """Watch the cluster at ``--address``, once it is known to be a Ray GCS (see ``probe``).

    When the cluster stops answering for ``--give-up`` seconds, ``leave`` is called
    with the one line to say (default :func:`leave_at_once`); if it returns, the
    :class:`ClusterLost` is raised.
    """
    address = args.address
    if address is None:
        try:
            address = cluster_address(os.environ.get("RAY_ADDRESS") or "auto", source="RAY_ADDRESS")
        except ValueError as error:
            raise CliError(str(error)) from None
    ray = import_ray()
    from raylens.cluster import RayClusterView, use_cluster_view
    from raylens.telemetry import host_memory

    check_reachable(address)
    confirm_gcs(address, probe=probe)
    start_telemetry(args.exporter, as_json=args.json)
    give_up = float(getattr(args, "give_up", None) or DEFAULT_GIVE_UP_S)
    # Ray's client ends the process once its GCS is silent for a minute: a longer
    # --give-up moves that limit, in this process only.
    setting = ray_reconnect_setting(give_up, os.environ)
    if setting is not None:
        os.environ[RAY_RECONNECT_ENV] = setting
    try:
        with keep_sigterm_handler():
            ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    except ray_call_errors(ray) as error:  # ConnectionError, RuntimeError, ValueError, RayError
        first_line = (
            str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        )
        raise CliError(f"cannot reach a Ray cluster at {address!r}: {first_line}") from None
    guard = guard_for(RayClusterView(), _connected_gcs_address(ray, address), args.interval)
    monitor = host_memory.HostMemoryMonitor(
        args.interval, scrape_timeout=scrape_timeout_for(args.interval), cluster=guard
    )
    output = Output(as_json=args.json)
    lost: ClusterLost | None = None
    try:
        with use_cluster_view(guard):
            watch_nodes(
                monitor,
                args,
                output=output,
                title=f"Ray host memory at {address}",
                stop=stop,
                guard=guard,
            )
    except ClusterLost as error:
        lost = error
    finally:
        stop_monitoring(monitor)
        if lost is None:
            ray.shutdown()
    if lost is not None:
        (leave or leave_at_once)(lost)
        raise lost
    return output.exit_status()


def guard_for(view: RayClusterView, gcs_address: str, interval: float) -> GuardedCluster:
    """The watch's guard over ``view``: GCS probes and calls under deadlines of their own.

    A probe may take a fifth of the interval (at most 1 s, at least 0.1 s). A GCS call
    may take the interval, at least 2 s and at most 10 s: a GCS that is gone is found
    by the probe, so the call's deadline only has to catch one that hangs, without
    mistaking a slow answer on a busy cluster for silence.
    """
    from raylens.cli.parser import split_host_port

    host, port = split_host_port(gcs_address)
    probe_timeout = min(1.0, max(0.1, interval / 5))
    return GuardedCluster(
        view,
        gcs_address,
        probe=lambda: tcp_probe(host, port, probe_timeout),
        call_timeout=max(2.0, min(10.0, interval)),
    )


def _connected_gcs_address(ray: ModuleType, address: str) -> str:
    """The GCS this process connected to (``auto`` resolved); ``address`` if Ray cannot say."""
    try:
        found = ray.get_runtime_context().gcs_address
    except ray_call_errors(ray, AttributeError):
        return address
    return found if isinstance(found, str) and ":" in found else address


def leave_at_once(lost: ClusterLost) -> None:
    """Say ``lost``'s line on stderr and end the process with status 2 now.

    Once the GCS is gone, Ray's own disconnect waits seconds on it, and its exit
    hook would wait again; the watch has already stopped what it started.
    """
    from raylens.safe_text import printable

    print(f"raylens: error: {printable(str(lost))}", file=sys.stderr)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe, a closed stream
            stream.flush()
    os._exit(lost.exit_code)


# What the demo says while its cluster starts: three nodes and two worker groups take
# 15 s on an idle machine, and twice that or more on a loaded one.
_DEMO_START_NOTE = (
    "Starting a local Ray cluster of {nodes} (15 s or more, longer on a busy machine)"
)


def run_demo(
    args: argparse.Namespace,
    stop: threading.Event,
    *,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Start the demo cluster and show its table; ``--duration`` counts from this call."""
    import_ray()
    from raylens import demo

    deadline = None if args.duration is None else clock() + args.duration
    start_telemetry(args.exporter)
    output = Output(as_json=False)
    note = _DEMO_START_NOTE.format(nodes=counted(args.nodes, "node"))
    if args.duration is not None:
        note += "; --duration counts from now, start-up included"
    output.note(note + "...")
    with demo.DemoCluster(args.nodes) as cluster:
        output.note(cluster.describe())
        from raylens.telemetry import host_memory
        from raylens.telemetry.growth import shortest_growth_window

        monitor = host_memory.HostMemoryMonitor(
            args.interval, scrape_timeout=scrape_timeout_for(args.interval)
        )
        phases = demo.DemoPhases(clock=clock)
        try:
            watch_nodes(
                monitor,
                args,
                output=output,
                title=f"raylens demo: {args.nodes} Ray nodes, worker groups policy and rollout",
                stop=stop,
                deadline=deadline,
                clock=clock,
                one_line=False,
                groups_first_s=DEMO_GROUPS_WAIT_S,
                growth_window_s=shortest_growth_window(),
                before_sample=phases.step,
            )
        finally:
            phases.close()
            stop_monitoring(monitor)
    output.note("Demo finished; the Ray cluster is shut down.")
    return output.exit_status()
