"""One host-memory collection cycle over a simulated cluster: raylens against a naive scraper.

For each cluster size (default 100, 300 and 1,000 nodes, 5% of them hung: they
accept the connection and never answer), this starts a
:class:`raylens_fakes.SimulatedCluster` in a child process, so that the CPU time
measured here is the scraper's alone, and times:

- raylens: ``HostMemoryMonitor.collect_once()`` scraping in this process
  (``scrape_mode="inprocess"``: one aiohttp event loop, up to 256 requests in
  flight, a 5 s hard deadline), so that its CPU is measured here; the default
  helper-process mode moves that CPU out of the driver (``bench_driver_cost.py``). The first cycle meets the hung nodes unprepared;
  later cycles ask them last. Both are reported.
- raylens again, on the healthy nodes alone: how long the cycle takes when
  nothing makes it wait for the deadline.
- a naive sequential scraper, as a straightforward implementation would be
  written: one node after another, ``requests.get(url, timeout=5)``, the whole
  payload parsed with ``prometheus_client``'s text parser, the two series picked
  out. With hung nodes it waits the full 5 s on each, so by default it is run on
  at most ``--sequential-nodes`` healthy nodes and its cycle time is ESTIMATED:
  measured wall time per healthy node x healthy nodes + hung nodes x 5 s. Pass
  ``--sequential-full`` to run it over every node instead (about 250 s of
  waiting at 1,000 nodes).

CPU time is ``time.process_time()`` of this process (all threads), divided by
the number of nodes in the cycle. Wall time is ``time.perf_counter()``.

Run: ``.venv/bin/python benchmarks/bench_scrape_cycle.py [--nodes 100,300,1000]
[--hung-fraction 0.05] [--cycles 3] [--sequential-nodes 100] [--sequential-full]``
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection

import requests
from prometheus_client.parser import text_string_to_metric_families

from raylens.telemetry.host_memory import HostMemoryMonitor
from raylens_fakes import FakeCluster

SCRAPE_TIMEOUT_S = 5.0
WANTED = ("ray_node_mem_used", "ray_node_mem_total")


def _serve(n_nodes: int, hung: list[int], conn: Connection) -> None:
    """Child process: run the simulated cluster until the parent says stop."""
    from raylens_fakes import SimulatedCluster

    with SimulatedCluster(n_nodes) as sim:
        for index in hung:
            sim.raylet(index).hang()
        conn.send([(r.port, sim.hostname(i)) for i, r in enumerate(sim.raylets)])
        conn.recv()


@dataclass
class Cycle:
    wall_s: float
    cpu_s: float
    nodes: int
    sampled: int

    @property
    def cpu_ms_per_node(self) -> float:
        return 1000.0 * self.cpu_s / self.nodes


def _raylens_cycles(cluster: FakeCluster, cycles: int) -> list[Cycle]:
    monitor = HostMemoryMonitor(
        10.0,
        cluster=cluster,
        scrape_timeout=SCRAPE_TIMEOUT_S,
        scrape_mode="inprocess",
        consumer=True,
    )
    results = []
    try:
        for _ in range(cycles):
            wall, cpu = time.perf_counter(), time.process_time()
            monitor.collect_once()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            latest = monitor.latest()
            sampled = sum(1 for s in latest if s.error is None)
            results.append(Cycle(wall, cpu, len(latest), sampled))
    finally:
        monitor.stop()
    return results


def _naive_scrape(url: str) -> dict[str, float]:
    """What a straightforward scraper does: GET, parse everything, keep two series."""
    response = requests.get(url, timeout=SCRAPE_TIMEOUT_S)
    response.raise_for_status()
    found = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.name in WANTED:
                found[sample.name] = sample.value
    return found


def _sequential(urls: list[str]) -> Cycle:
    sampled = 0
    wall, cpu = time.perf_counter(), time.process_time()
    for url in urls:
        try:
            if len(_naive_scrape(url)) == 2:
                sampled += 1
        except requests.RequestException:
            pass
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return Cycle(wall, cpu, len(urls), sampled)


@dataclass
class Row:
    nodes: int
    hung: int
    first: Cycle
    steady: Cycle | None
    healthy_only: Cycle
    sequential_wall_s: float
    sequential_cpu_ms: float
    sequential_measured: int
    sequential_estimated: bool


def _run_size(n_nodes: int, hung_fraction: float, cycles: int, args: argparse.Namespace) -> Row:
    step = round(1 / hung_fraction) if hung_fraction > 0 else 0
    hung = list(range(step // 2, n_nodes, step)) if step else []
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    server = context.Process(target=_serve, args=(n_nodes, hung, child), daemon=True)
    server.start()
    try:
        endpoints = parent.recv()
        cluster = FakeCluster()
        for port, hostname in endpoints:
            cluster.add_node(address="127.0.0.1", port=port, hostname=hostname)
        urls = [f"http://127.0.0.1:{port}/metrics" for port, _ in endpoints]

        raylens = _raylens_cycles(cluster, cycles)
        steady = raylens[1:]
        steady_cycle = (
            Cycle(
                statistics.median(c.wall_s for c in steady),
                statistics.median(c.cpu_s for c in steady),
                steady[0].nodes,
                min(c.sampled for c in steady),
            )
            if steady
            else None
        )

        hung_set = set(hung)
        healthy_urls = [u for i, u in enumerate(urls) if i not in hung_set]
        healthy_cluster = FakeCluster()
        for index, (port, hostname) in enumerate(endpoints):
            if index not in hung_set:
                healthy_cluster.add_node(address="127.0.0.1", port=port, hostname=hostname)
        healthy_only = _raylens_cycles(healthy_cluster, 1)[0]
        if args.sequential_full:
            seq = _sequential(urls)
            seq_wall, seq_cpu_ms, measured, estimated = (
                seq.wall_s,
                seq.cpu_ms_per_node,
                len(urls),
                False,
            )
        else:
            sample = healthy_urls[: args.sequential_nodes]
            seq = _sequential(sample)
            per_node_wall = seq.wall_s / len(sample)
            seq_wall = per_node_wall * len(healthy_urls) + len(hung) * SCRAPE_TIMEOUT_S
            seq_cpu_ms = seq.cpu_ms_per_node * len(healthy_urls) / n_nodes
            measured, estimated = len(sample), True
        return Row(
            n_nodes,
            len(hung),
            raylens[0],
            steady_cycle,
            healthy_only,
            seq_wall,
            seq_cpu_ms,
            measured,
            estimated,
        )
    finally:
        parent.send("stop")
        server.join(timeout=30)
        if server.is_alive():
            server.kill()


def _print(rows: list[Row], args: argparse.Namespace) -> None:
    print(
        f"\nhost-memory scrape cycle, {SCRAPE_TIMEOUT_S:g} s scrape timeout, "
        f"{args.hung_fraction:.0%} of nodes hung (accept, never answer)"
    )
    print(
        f"python {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"fake raylets in a separate process, CPU = this process only\n"
    )
    header = (
        "| nodes | hung | raylens 1st cycle wall s | raylens steady wall s "
        "| raylens CPU ms/node (1st / steady) | healthy sampled (1st / steady) "
        "| raylens, healthy nodes only: wall s, CPU ms/node "
        "| sequential wall s | sequential CPU ms/node | wall x | CPU x |"
    )
    print(header)
    print("|---:" * 11 + "|")
    for row in rows:
        steady = row.steady or row.first
        healthy = row.nodes - row.hung
        seq_wall = f"{row.sequential_wall_s:.1f}" + (" (est.)" if row.sequential_estimated else "")
        print(
            f"| {row.nodes} | {row.hung} | {row.first.wall_s:.2f} | {steady.wall_s:.2f} "
            f"| {row.first.cpu_ms_per_node:.2f} / {steady.cpu_ms_per_node:.2f} "
            f"| {row.first.sampled}/{healthy} / {steady.sampled}/{healthy} "
            f"| {row.healthy_only.wall_s:.2f}, {row.healthy_only.cpu_ms_per_node:.2f} "
            f"| {seq_wall} | {row.sequential_cpu_ms:.2f} "
            f"| {row.sequential_wall_s / steady.wall_s:.0f} "
            f"| {row.sequential_cpu_ms / steady.cpu_ms_per_node:.1f} |"
        )
    if any(row.sequential_estimated for row in rows):
        print(
            f"\n(est.) sequential cycle time is ESTIMATED, not measured: wall time per node "
            f"over the first {args.sequential_nodes} healthy nodes x healthy nodes, plus "
            f"{SCRAPE_TIMEOUT_S:g} s for each hung node. Its CPU ms/node is measured on the "
            f"same healthy nodes and spread over all nodes (a hung node costs no CPU). "
            f"Run with --sequential-full to measure it outright."
        )
    print("\ntargets: raylens cycle <= scrape timeout + 1 s; raylens CPU < 2 ms per node")
    for row in rows:
        for name, cycle in (("1st", row.first), ("steady", row.steady)):
            if cycle is None:
                continue
            wall_ok = cycle.wall_s <= SCRAPE_TIMEOUT_S + 1.0
            cpu_ok = cycle.cpu_ms_per_node < 2.0
            print(
                f"  {row.nodes:>5} nodes, {name:>6} cycle: "
                f"wall {cycle.wall_s:.2f} s {'ok' if wall_ok else 'MISSED'}, "
                f"CPU {cycle.cpu_ms_per_node:.2f} ms/node {'ok' if cpu_ok else 'MISSED'}"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="100,300,1000", help="comma-separated cluster sizes")
    parser.add_argument("--hung-fraction", type=float, default=0.05)
    parser.add_argument("--cycles", type=int, default=3, help="raylens cycles per size (>= 1)")
    parser.add_argument(
        "--sequential-nodes",
        type=int,
        default=100,
        help="healthy nodes the sequential scraper is measured on (the rest is estimated)",
    )
    parser.add_argument(
        "--sequential-full", action="store_true", help="run the sequential scraper on every node"
    )
    args = parser.parse_args(argv)
    # Every hung node is warned about once; expected here, so kept off the table.
    logging.getLogger("raylens").addHandler(logging.NullHandler())
    logging.getLogger("raylens").propagate = False
    sizes = [int(part) for part in args.nodes.split(",") if part.strip()]
    if args.cycles < 1 or not 0 <= args.hung_fraction < 1 or args.sequential_nodes < 1:
        parser.error("need --cycles >= 1, 0 <= --hung-fraction < 1, --sequential-nodes >= 1")
    rows = []
    for size in sizes:
        print(f"running {size} nodes ...", file=sys.stderr, flush=True)
        rows.append(_run_size(size, args.hung_fraction, args.cycles, args))
    _print(rows, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
