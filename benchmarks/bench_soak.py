"""Soak: distinct attribute sets churned through one observable gauge, lens against the bare SDK.

Each collection reports ``--live`` attribute sets (``host.name``, ``rl.worker_groups``,
``ray.node.id``) and replaces ``--churn`` of them by sets never seen before, until
``--distinct`` sets have been reported in all. That is what a long run on an
autoscaling cluster does to the host-memory gauges: nodes come and go, worker
groups relabel them, served processes restart under new pids.

Two pipelines are measured, each in a child process of its own so that their RSS
figures do not mix:

- ``lens``: the gauge registered with :func:`raylens.lens.register_observable_gauge`
  and read through lens' pipeline, which releases the attribute sets no
  collection has reported for ``IDLE_COLLECTIONS`` collections;
- ``sdk``: the same gauge on a bare ``MeterProvider`` with lens' cardinality limit
  (the SDK keeps every set it has ever seen).

At each checkpoint the table shows the points the collection exported, how many of
them were ``otel.metric.overflow`` points, how many live series were missing, the
median collection time since the last checkpoint (wall, and CPU time of the
process, which a loaded machine disturbs less), the aggregations the SDK holds and
the RSS growth since the first collection.

Two more sections run the same kind of churn through raylens' own producers, each
in a child process too:

- ``host``: a :class:`~raylens.telemetry.host_memory.HostMemoryMonitor` whose
  per-node ``_scrape`` answers with numbers (no sockets) over a FakeCluster whose
  nodes change every cycle, exported through lens with every host-memory gauge
  registered. ``--live`` nodes are live at a time: ten of them for the whole run,
  relabelled by a worker group of their own every cycle, and the rest replaced by
  new nodes every cycle, each with a worker group of its own, until ``--distinct``
  node ids have been listed. Every 97th node never answers, and the cluster lists
  malformed records under new ids, so warning keys churn as well. The table shows
  the median monitor cycle and lens collection (CPU ms), the ``rl.host.memory.used``
  points, overflow points and live series missing, the entries raylens holds for
  nodes (monitor, snapshot, placement registry, remembered warnings) and the SDK's
  aggregations over the host-memory gauges, and the RSS growth since the first
  collection and since the first ``IDLE_COLLECTIONS`` collections, which the SDK
  needs to fill up to what it holds from then on.
- ``profiler``: ``--restarts`` server restarts (four servers, each restart a new
  pid and a new name) through one :class:`~raylens.telemetry.process_memory.MemoryProfiler`
  on a FakeProcFS, sampled once per round and exported through lens; the table
  shows the entries the profiler and its export snapshot hold, the exported
  process points, the SDK's aggregations over every lens gauge and the RSS growth.

Run: ``.venv/bin/python benchmarks/bench_soak.py [--distinct 250000] [--live 1000]
[--churn 1000] [--checkpoints 6] [--restarts 20000] [--only lens|sdk|host|profiler]``
"""

from __future__ import annotations

import argparse
import gc
import logging
import multiprocessing
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import psutil
from opentelemetry.metrics import CallbackOptions, Observation


@dataclass
class Row:
    distinct: int
    points: int
    overflow: int
    missing: int
    collection_ms: float
    collection_cpu_ms: float
    held: int
    rss_growth_mib: float


class _Churn:
    """The live window: ids ``start .. start + live - 1``, moved by ``churn`` per collection."""

    def __init__(self, live: int, churn: int) -> None:
        self.live = live
        self.churn = churn
        self.start = 0

    @property
    def seen(self) -> int:
        return self.start + self.live

    def observe(self, options: CallbackOptions) -> list[Observation]:
        return [
            Observation(
                1e9 + i,
                {
                    "host.name": f"host-{i}",
                    "rl.worker_groups": f"group-{i % 17}",
                    "ray.node.id": f"{i:056x}",
                },
            )
            for i in range(self.start, self.start + self.live)
        ]

    def advance(self) -> None:
        self.start += self.churn


def _pipeline(mode: str, churn: _Churn) -> tuple[Callable[[], object], Callable[[], int]]:
    """``(collect, held)`` for ``mode``: collect returns MetricsData; held counts SDK aggregations."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.metrics.view import View

    from raylens.lens import (
        CARDINALITY_LIMIT,
        OBSERVABLE_GAUGE,
        RecordedMetric,
        TelemetryConfig,
        _sdk_state,
        get_telemetry_handle,
        init_telemetry,
        register_observable_gauge,
    )

    reader = InMemoryMetricReader()
    if mode == "lens":
        gauge = RecordedMetric("soak.memory", OBSERVABLE_GAUGE, "By", "churning gauge")
        register_observable_gauge(gauge, churn.observe)
        init_telemetry(TelemetryConfig(), metric_reader=reader)
        handle = get_telemetry_handle()
        assert handle is not None
        return reader.get_metrics_data, lambda: handle.held_attribute_sets(gauge.name)
    provider = MeterProvider(
        metric_readers=[reader],
        views=[View(instrument_name="*", aggregation_cardinality_limit=CARDINALITY_LIMIT)],
        shutdown_on_exit=False,
    )
    instrument = provider.get_meter("soak").create_observable_gauge(
        "soak.memory", callbacks=[churn.observe], unit="By"
    )
    return reader.get_metrics_data, lambda: _sdk_state.held_attribute_sets(instrument)


def _run(
    mode: str, distinct: int, live: int, churn_per: int, checkpoints: int, out: Connection
) -> None:
    churn = _Churn(live, churn_per)
    collect, held = _pipeline(mode, churn)
    process = psutil.Process()
    marks = sorted(
        {
            live,
            *(
                live + round(k * (distinct - live) / (checkpoints - 1))
                for k in range(1, checkpoints)
            ),
        }
    )
    times: list[float] = []
    cpu_times: list[float] = []
    rss_start = None
    while churn.seen <= distinct:
        started, cpu_started = time.perf_counter(), time.process_time()
        data = collect()
        times.append((time.perf_counter() - started) * 1000)
        cpu_times.append((time.process_time() - cpu_started) * 1000)
        if rss_start is None:
            gc.collect()
            rss_start = process.memory_info().rss
        if churn.seen >= marks[0]:
            points = [
                p
                for rm in data.resource_metrics
                for sm in rm.scope_metrics
                for m in sm.metrics
                for p in m.data.data_points
            ]
            overflow = sum(1 for p in points if "otel.metric.overflow" in p.attributes)
            exported = {p.attributes.get("ray.node.id") for p in points}
            missing = sum(
                1 for i in range(churn.start, churn.start + live) if f"{i:056x}" not in exported
            )
            gc.collect()
            out.send(
                Row(
                    distinct=churn.seen,
                    points=len(points),
                    overflow=overflow,
                    missing=missing,
                    collection_ms=statistics.median(times),
                    collection_cpu_ms=statistics.median(cpu_times),
                    held=held(),
                    rss_growth_mib=(process.memory_info().rss - rss_start) / 2**20,
                )
            )
            times, cpu_times = [], []
            marks.pop(0)
            if not marks:
                break
        churn.advance()
    out.send(None)


def _marks(first: int, last: int, checkpoints: int) -> list[int]:
    """``checkpoints`` values spread evenly from ``first`` to ``last``."""
    return sorted(
        {
            first,
            *(first + round(k * (last - first) / (checkpoints - 1)) for k in range(1, checkpoints)),
        }
    )


def _rss() -> int:
    gc.collect()
    return psutil.Process().memory_info().rss


# Host memory: the monitor and lens ---------------------------------------------------------

_STAYING = 10  # nodes live for the whole run, relabelled every cycle
_FAILING_EVERY = 97  # node i never answers when i % _FAILING_EVERY == 0
_MALFORMED_PER_CYCLE = 4


@dataclass
class HostRow:
    distinct: int
    cycle_cpu_ms: float
    collection_cpu_ms: float
    points: int
    overflow: int
    missing: int
    node_entries: int
    warnings: int
    sdk_held: int
    rss_growth_mib: float
    rss_growth_warm_mib: float


def _run_host(distinct: int, live: int, checkpoints: int, out: Connection) -> None:
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from raylens.lens import (
        IDLE_COLLECTIONS,
        TelemetryConfig,
        get_telemetry_handle,
        init_telemetry,
    )
    from raylens.lens.warnings import remembered_warning_count
    from raylens.telemetry import host_memory as hm
    from raylens.telemetry.host_memory._placement import DEFAULT_REGISTRY
    from raylens.telemetry.raylet_payload import (
        TOTAL_KEY,
        USED_KEY,
    )
    from raylens_fakes import FakeCluster

    logging.getLogger("raylens").setLevel(logging.ERROR)  # one warning per failing node
    churning = live - _STAYING

    class Cluster(FakeCluster):
        malformed: list[dict[str, Any]] = []

        def nodes(self) -> list[dict[str, Any]]:
            return [*self.malformed, *super().nodes()]

    class Monitor(hm.HostMemoryMonitor):
        def _scrape(self, node: hm.RayNode) -> dict[str, float]:
            index = int(node.node_id, 16)
            if index % _FAILING_EVERY == 0:
                return {}
            return {USED_KEY: float(index), TOTAL_KEY: 2.0**40}

    def node_id(index: int) -> str:
        return f"{index:056x}"

    def live_nodes(cycle: int) -> list[int]:
        first = _STAYING + cycle * churning
        return [*range(_STAYING), *range(first, first + churning)]

    cluster = Cluster()
    now = [0.0]
    monitor = Monitor(10.0, cluster=cluster, clock=lambda: now[0], consumer=True)
    reader = InMemoryMetricReader()
    init_telemetry(TelemetryConfig(), metric_reader=reader)
    handle = get_telemetry_handle()
    assert handle is not None
    gauges = [
        m.name for m in (*hm.HOST_MEMORY_RECORDED_METRICS, *hm.SCRAPE_HEALTH_RECORDED_METRICS)
    ]
    cycles = -(-(distinct - _STAYING) // churning)
    marks = _marks(0, cycles - 1, checkpoints)
    cycle_cpu: list[float] = []
    collection_cpu: list[float] = []
    rss_start = None
    rss_warm = 0
    for cycle in range(cycles):
        if cycle == 0:
            for index in range(_STAYING):
                cluster.add_node(
                    node_id=node_id(index), hostname=f"host-{index}", port=20_000 + index
                )
        else:
            for index in live_nodes(cycle - 1)[_STAYING:]:
                cluster.remove_node(node_id(index))
                hm.forget_worker_group_nodes(f"wg-{index}")
            hm.forget_worker_group_nodes(f"relabel-{cycle - 1}")
        for index in live_nodes(cycle)[_STAYING:]:
            cluster.add_node(
                node_id=node_id(index), hostname=f"host-{index}", port=20_000 + index % 40_000
            )
            hm.register_worker_group_nodes(f"wg-{index}", [node_id(index)])
        hm.register_worker_group_nodes(f"relabel-{cycle}", [node_id(i) for i in range(_STAYING)])
        cluster.malformed = [
            {
                "NodeID": f"malformed-{cycle}-{k}",
                "Alive": True,
                "MetricsExportPort": 9000,
                "NodeManagerAddress": 12345,  # not a str: a malformed record
            }
            for k in range(_MALFORMED_PER_CYCLE)
        ]
        now[0] += monitor.collection_interval
        started = time.process_time()
        monitor.collect_once()
        cycle_cpu.append((time.process_time() - started) * 1000)
        started = time.process_time()
        data = reader.get_metrics_data()
        collection_cpu.append((time.process_time() - started) * 1000)
        if rss_start is None:
            rss_start = _rss()
        if cycle == IDLE_COLLECTIONS - 1:
            rss_warm = _rss()
        if cycle != marks[0]:
            continue
        used = [
            p
            for rm in data.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
            if m.name == hm.RL_HOST_MEMORY_USED_METRIC
            for p in m.data.data_points
        ]
        exported = {p.attributes.get(hm.RAY_NODE_ID_ATTR) for p in used}
        answering = [i for i in live_nodes(cycle) if i % _FAILING_EVERY]
        snapshot = monitor.snapshot
        rss_now = _rss()
        out.send(
            HostRow(
                distinct=live_nodes(cycle)[-1] + 1,
                cycle_cpu_ms=statistics.median(cycle_cpu),
                collection_cpu_ms=statistics.median(collection_cpu),
                points=len(used),
                overflow=sum(1 for p in used if "otel.metric.overflow" in p.attributes),
                missing=sum(1 for i in answering if node_id(i) not in exported),
                node_entries=len(monitor._standing)
                + len(monitor.records())
                + len(monitor._warned)
                + len(snapshot.records)
                + len(DEFAULT_REGISTRY.nodes),
                warnings=remembered_warning_count(),
                sdk_held=sum(handle.held_attribute_sets(name) for name in gauges),
                rss_growth_mib=(rss_now - rss_start) / 2**20,
                rss_growth_warm_mib=(rss_now - rss_warm) / 2**20 if rss_warm else 0.0,
            )
        )
        cycle_cpu, collection_cpu = [], []
        marks.pop(0)
        if not marks:
            break
    monitor.stop()
    out.send(None)


# Process memory: the profiler --------------------------------------------------------------

_SERVERS = 4


@dataclass
class ProfilerRow:
    restarts: int
    sample_cpu_ms: float
    profiler_entries: int
    exported_servers: int
    process_points: int
    sdk_held: int
    rss_growth_mib: float


def _run_profiler(restarts: int, checkpoints: int, out: Connection) -> None:
    import tempfile
    from pathlib import Path

    from raylens.lens import get_telemetry_handle, recorded_metrics
    from raylens.telemetry import process_memory as pm
    from raylens.telemetry.process_memory import HostMemory, MemoryProfiler, ServerMemoryTarget
    from raylens_fakes.otel import MetricsProbe
    from raylens_fakes.procfs import PAGE_SIZE, FakeProcFS

    with tempfile.TemporaryDirectory() as root, MetricsProbe() as probe:
        fake = FakeProcFS(Path(root) / "proc")
        fake.add_process(10)
        pids = [
            fake.add_process(1000 + slot, parent=10, rss_bytes=8 * PAGE_SIZE)
            for slot in range(_SERVERS)
        ]
        targets = [
            ServerMemoryTarget(f"replica-{slot}", "vllm", pid, procfs=fake.procfs)
            for slot, pid in enumerate(pids)
        ]
        profiler = MemoryProfiler(
            targets,
            3600,
            host_collector=lambda: HostMemory(6, 10, 16),
            procfs=fake.procfs,
            pss_interval_seconds=3600,
        )
        # Checkpoints fall at the end of a round, right after its sample.
        marks = sorted({m - m % _SERVERS for m in _marks(_SERVERS, restarts, checkpoints)})
        next_pid = 1000 + _SERVERS
        sample_cpu: list[float] = []
        rss_start = None
        for restart in range(restarts):
            slot = restart % _SERVERS
            old = targets[slot]
            fake.restart(old.pid, next_pid)
            profiler.remove_target(old)
            targets[slot] = ServerMemoryTarget(
                f"replica-{restart + _SERVERS}", "vllm", next_pid, procfs=fake.procfs
            )
            profiler.add_target(targets[slot])
            next_pid += 1
            if slot == _SERVERS - 1:  # one sample per round: every server restarted once
                started = time.process_time()
                profiler.sample_once()
                sample_cpu.append((time.process_time() - started) * 1000)
                probe.collect()  # lens sees every pid the profiler exported
                if rss_start is None:
                    rss_start = _rss()
            if restart + 1 != marks[0]:
                continue
            points = probe.points("gym.server.processes")
            handle = get_telemetry_handle()
            assert handle is not None
            out.send(
                ProfilerRow(
                    restarts=restart + 1,
                    sample_cpu_ms=statistics.median(sample_cpu),
                    profiler_entries=len(profiler.targets)
                    + len(profiler._peaks)
                    + len(profiler._pss)
                    + len(profiler._pss_attempted),
                    exported_servers=pm.DEFAULT_SERIES.entry_count(),
                    process_points=len(points),
                    sdk_held=sum(handle.held_attribute_sets(name) for name in recorded_metrics()),
                    rss_growth_mib=(_rss() - (rss_start or 0)) / 2**20,
                )
            )
            sample_cpu = []
            marks.pop(0)
            if not marks:
                break
        profiler.stop()
    out.send(None)


def _child(target: Callable[..., None], *args: Any) -> Iterator[Any]:
    """Run ``target(*args, send)`` in a spawned child; yield what it sends until None."""
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=target, args=(*args, send))
    child.start()
    send.close()
    while (row := receive.recv()) is not None:
        yield row
    child.join()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--distinct", type=int, default=250_000)
    parser.add_argument("--live", type=int, default=1_000)
    parser.add_argument("--churn", type=int, default=1_000)
    parser.add_argument("--checkpoints", type=int, default=6)
    parser.add_argument("--restarts", type=int, default=20_000)
    parser.add_argument("--only", choices=("lens", "sdk", "host", "profiler"))
    args = parser.parse_args(argv)
    if not 0 < args.live <= args.distinct or args.churn < 1 or args.checkpoints < 2:
        parser.error("need 0 < --live <= --distinct, --churn >= 1 and --checkpoints >= 2")
    if args.live <= _STAYING or args.restarts < _SERVERS:
        parser.error(f"need --live > {_STAYING} and --restarts >= {_SERVERS}")

    from opentelemetry.sdk.version import __version__ as sdk_version

    print(f"# Python {platform.python_version()}, opentelemetry-sdk {sdk_version}")
    wanted = [mode for mode in ("lens", "sdk", "host", "profiler") if args.only in (None, mode)]
    if {"lens", "sdk"} & set(wanted):
        print(
            f"\n# one gauge: {args.live:,} live sets, {args.churn:,} new per collection, "
            f"{args.distinct:,} in all"
        )
        print(
            "| pipeline | distinct sets seen | points exported | overflow points | live missing "
            "| collection ms (median) | collection CPU ms (median) | SDK-held sets "
            "| RSS growth MiB |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for mode in ("lens", "sdk"):
        if mode not in wanted:
            continue
        for row in _child(_run, mode, args.distinct, args.live, args.churn, args.checkpoints):
            print(
                f"| {mode} | {row.distinct:,} | {row.points:,} | {row.overflow:,} | {row.missing:,} "
                f"| {row.collection_ms:.1f} | {row.collection_cpu_ms:.1f} | {row.held:,} "
                f"| {row.rss_growth_mib:+.1f} |",
                flush=True,
            )
    if "host" in wanted:
        print(
            f"\n# host memory: {args.live:,} live nodes ({_STAYING} relabelled every cycle), "
            f"{args.distinct:,} node ids in all"
        )
        print(
            "| node ids seen | monitor cycle CPU ms | lens collection CPU ms | used points "
            "| overflow points | live missing | node entries held | warning keys "
            "| SDK-held sets | RSS growth MiB | since warm-up MiB |"
        )
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for row in _child(_run_host, args.distinct, args.live, args.checkpoints):
            print(
                f"| {row.distinct:,} | {row.cycle_cpu_ms:.1f} | {row.collection_cpu_ms:.1f} "
                f"| {row.points:,} | {row.overflow:,} | {row.missing:,} | {row.node_entries:,} "
                f"| {row.warnings:,} | {row.sdk_held:,} | {row.rss_growth_mib:+.1f} "
                f"| {row.rss_growth_warm_mib:+.1f} |",
                flush=True,
            )
    if "profiler" in wanted:
        print(f"\n# profiler: {_SERVERS} servers, {args.restarts:,} restarts")
        print(
            "| restarts | sample CPU ms | profiler entries | exported servers "
            "| process points | SDK-held sets | RSS growth MiB |"
        )
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for row in _child(_run_profiler, args.restarts, args.checkpoints):
            print(
                f"| {row.restarts:,} | {row.sample_cpu_ms:.2f} | {row.profiler_entries:,} "
                f"| {row.exported_servers:,} | {row.process_points:,} | {row.sdk_held:,} "
                f"| {row.rss_growth_mib:+.1f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
