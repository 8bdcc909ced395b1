"""The driver's CPU per node per cycle, measured directly: cycles on the main thread.

``bench_driver_cost.py`` measures the driver's cost while its main thread is busy, so
its figure carries the noise of two threads sharing the interpreter. This one runs the
monitor's cycles on the main thread alone and reads ``time.process_time()`` around them:
what a cycle costs the driver's process (helper mode, so the helper's own CPU is not in
it), per node and per cycle. Each cycle may be followed by one metrics collection
(``--collect``), which runs the host-memory gauges' callbacks as an exporter would.

The simulated cluster is served from a child process, as in ``bench_driver_cost.py``
(its ``_serve``), and per-group memory and growth are attached as there (its
``_attach_groups``). ``--profile FILE`` writes a cProfile of the measured cycles.

``--warmup`` cycles run first (default 1). ``--hung-fraction`` of the raylets hold every
request (default none), so each cycle waits out the 5 s timeout, a new group reading
comes every other cycle, and with ``--warmup 3 --cycles 20`` the measured cycles span the
first fit interval (60 s at the default window): the growth outlooks built then are in
the figure, as in a long run.

Run: ``python benchmarks/bench_driver_cycle.py [--nodes 1000] [--cycles 10] [--warmup 1]
[--hung-fraction 0] [--modes helper,groups] [--collect] [--profile out.prof]``
"""

from __future__ import annotations

import argparse
import cProfile
import multiprocessing
import os
import sys
import time

from opentelemetry.sdk.metrics.export import InMemoryMetricReader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_driver_cost import _attach_groups, _serve
from raylens.lens import TelemetryConfig, init_telemetry, shutdown_telemetry
from raylens.telemetry.host_memory import HostMemoryMonitor
from raylens_fakes import FakeCluster


def _measure(
    mode: str, cluster: FakeCluster, args: argparse.Namespace, reader: InMemoryMetricReader | None
) -> tuple[float, int]:
    """``(driver CPU ms per node per cycle, nodes)`` of ``args.cycles`` cycles of ``mode``."""
    monitor = HostMemoryMonitor(
        600.0, cluster=cluster, scrape_mode="helper", consumer=True, scrape_timeout=5.0
    )
    if mode == "groups":
        _attach_groups(monitor, cluster)
    try:
        for _ in range(args.warmup):  # the helper's start, imports, first connections
            monitor.collect_once()
        if reader is not None:
            reader.get_metrics_data()
        profiler = cProfile.Profile() if args.profile else None
        before = time.process_time()
        if profiler is not None:
            profiler.enable()
        for _ in range(args.cycles):
            monitor.collect_once()
            if reader is not None:
                reader.get_metrics_data()
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(f"{args.profile}.{mode}")
        spent = time.process_time() - before
    finally:
        monitor.stop()
    nodes = len(cluster.nodes())
    return 1000 * spent / (nodes * args.cycles), nodes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--cycles", type=int, default=10)
    parser.add_argument(
        "--warmup", type=int, default=1, help="cycles run before the measured ones (at least 1)"
    )
    parser.add_argument("--hung-fraction", type=float, default=0.0)
    parser.add_argument("--modes", default="helper,groups")
    parser.add_argument("--collect", action="store_true", help="one export after each cycle")
    parser.add_argument("--profile", default="", help="write a cProfile per mode to FILE.<mode>")
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if args.cycles < 1 or args.warmup < 1 or not modes or set(modes) - {"helper", "groups"}:
        parser.error("--cycles and --warmup must be >= 1 and --modes a list of helper, groups")

    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    step = round(1 / args.hung_fraction) if args.hung_fraction > 0 else 0
    hung = sorted(range(step // 2, args.nodes, step)) if step else []
    server = context.Process(target=_serve, args=(args.nodes, hung, child), daemon=True)
    server.start()
    reader = InMemoryMetricReader() if args.collect else None
    try:
        endpoints = parent.recv()
        cluster = FakeCluster()
        for port, hostname in endpoints:
            cluster.add_node(address="127.0.0.1", port=port, hostname=hostname)
        if reader is not None:
            init_telemetry(TelemetryConfig(), metric_reader=reader)
        rows = [(mode, *_measure(mode, cluster, args, reader)) for mode in modes]
    finally:
        shutdown_telemetry()
        parent.send("stop")
        server.join(timeout=30)
        if server.is_alive():
            server.kill()
    export = "with one export after each cycle" if args.collect else "no export"
    print(f"{args.cycles} cycles on the main thread, helper mode, {export}")
    print("| mode | nodes | driver CPU ms/node/cycle |")
    print("|---|---:|---:|")
    for mode, cost, nodes in rows:
        print(f"| {mode} | {nodes} | {cost:.4f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
