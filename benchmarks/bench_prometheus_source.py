"""Reading a cluster's figures: scraping every node directly vs asking the Prometheus that holds them.

For each cluster size (default 1,000, 5,000 and 10,000 nodes, four worker groups each, every
node's sampler publishing its group and node figures), one run measures side by side:

- direct: ``HostMemoryMonitor.collect_once()`` scraping every node in this process
  (``scrape_mode="inprocess"``, so that all the reading CPU is this process's), against a
  :class:`raylens_fakes.SimulatedCluster` served from a child process; the raylets serve
  Ray's payload plus four groups' series and the node's growth figures;
- prometheus: ``PrometheusSource.collect_once()`` against a real Prometheus started on
  127.0.0.1 whose TSDB holds the same series for every node, backfilled with
  ``promtool tsdb create-blocks-from openmetrics`` (labels as a Prometheus that scrapes
  Ray's service-discovery file sees them: ``job``, ``instance``, ``WorkerId``...). The
  three sizes are three jobs of one TSDB. Prometheus' own CPU per cycle is reported apart.

Both run the growth cycle after each read (it names each node's published growth), as
``raylens watch`` does. Per size and reader: CPU of this process per cycle
(``time.process_time()``, all threads; median over ``--cycles`` after one warm-up cycle),
wall time of one cycle (median), and the nodes read completely (no error, four groups,
the node's growth figures).

Run: ``.venv/bin/python benchmarks/bench_prometheus_source.py [--nodes 1000,5000,10000]
[--cycles 3] [--direct-max 10000]`` (needs ``prometheus`` and ``promtool`` on PATH).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

import psutil

from raylens.telemetry.growth_outlook import GrowthCycle, attach_growth
from raylens.telemetry.host_memory import HostMemoryMonitor
from raylens.telemetry.prometheus_source import PrometheusSettings, PrometheusSource
from raylens.telemetry.raylet_payload import NODE_SERIES
from raylens_fakes import FakeCluster

GROUPS = ("policy", "rollout", "reward", "reference")
GIB = 1024**3
TARGET_CPU_S = 1.0


def _groups(index: int, _t: float) -> dict[str, float]:
    return {group: 2.0e9 + 1e8 * i + 4096 * index for i, group in enumerate(GROUPS)}


def _serve(n_nodes: int, conn: Connection) -> None:
    """Child process: serve the simulated cluster until the parent says stop."""
    from raylens_fakes import SimulatedCluster

    with SimulatedCluster(n_nodes, groups=_groups, sampler_interval_s=10.0) as sim:
        conn.send([(r.port, sim.hostname(i)) for i, r in enumerate(sim.raylets)])
        conn.recv()


@dataclass
class Measured:
    cpu_s: float
    wall_s: float
    nodes_ok: int
    server_cpu_s: float | None = None


def _complete(reader: HostMemoryMonitor | PrometheusSource) -> int:
    """Nodes read without an error, with four groups and the node's growth."""
    figures = reader.group_figures()
    return sum(
        1
        for sample in reader.latest()
        if sample.error is None
        and sample.node_id in figures
        and len(figures[sample.node_id][1].rows) == len(GROUPS)
        and figures[sample.node_id][1].node is not None
    )


def _cycles(
    collect: Callable[[], None],
    ok: Callable[[], int],
    cycles: int,
    server: psutil.Process | None = None,
) -> Measured:
    collect()  # warm-up: imports, first connections, the growth cycle's first names
    cpu, wall, served = [], [], []
    for _ in range(cycles):
        server_before = sum(server.cpu_times()[:2]) if server is not None else 0.0
        cpu_before, wall_before = time.process_time(), time.perf_counter()
        collect()
        wall.append(time.perf_counter() - wall_before)
        cpu.append(time.process_time() - cpu_before)
        if server is not None:
            served.append(sum(server.cpu_times()[:2]) - server_before)
    return Measured(
        statistics.median(cpu),
        statistics.median(wall),
        ok(),
        statistics.median(served) if served else None,
    )


def _direct(n_nodes: int, cycles: int) -> Measured:
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    server = context.Process(target=_serve, args=(n_nodes, child), daemon=True)
    server.start()
    try:
        cluster = FakeCluster()
        for port, hostname in parent.recv():
            cluster.add_node(address="127.0.0.1", port=port, hostname=hostname)
        monitor = HostMemoryMonitor(
            600.0, cluster=cluster, scrape_timeout=30.0, scrape_mode="inprocess", consumer=True
        )
        attach_growth(monitor, GrowthCycle())
        try:
            return _cycles(
                monitor.collect_once,
                lambda: _complete(monitor),
                cycles,
            )
        finally:
            monitor.stop()
    finally:
        parent.send("stop")
        server.join(30)
        if server.is_alive():
            server.kill()


# ------------------------------------------------------------------ the Prometheus side


def _openmetrics(sizes: list[int], at: float) -> str:
    """Every series of every node of every size, as one OpenMetrics text, one sample each."""
    families: dict[str, list[str]] = {}

    def add(name: str, labels: dict[str, str], value: float) -> None:
        shown = ",".join(f'{key}="{value}"' for key, value in labels.items())
        families.setdefault(name, []).append(f"{name}{{{shown}}} {value!r} {at:.3f}")

    window = NODE_SERIES[-1]
    for size in sizes:
        job = f"ray{size}"
        for index in range(size):
            ip = f"10.{index // 65536}.{index // 256 % 256}.{index % 256}"
            me = {"job": job, "instance": f"{ip}:8080"}
            worker = {**me, "WorkerId": f"{index:056x}"}
            add("up", me, 1.0)
            add("ray_node_mem_used", {**me, "ip": ip}, 24.0 * GIB + index)
            add("ray_node_mem_total", {**me, "ip": ip}, 64.0 * GIB)
            add("ray_raylens_sampler_sampled_at_seconds", worker, at)
            for number, group in enumerate(GROUPS):
                named = {**worker, "rl_worker_group": group}
                rss = 2.0e9 + 1e8 * number + 4096 * index
                add("ray_raylens_worker_group_memory_bytes", {**named, "memory_type": "rss"}, rss)
                add("ray_raylens_worker_group_processes", named, 16.0)
                add("ray_raylens_worker_group_memory_growth_bytes_per_second", named, 1024.0)
            for name, value in zip(NODE_SERIES[:-1], (24.0 * GIB, 4096.0, 0.0, 1.0, 60 * GIB, 9e5)):
                add(name, worker, value)
            add(window, {**worker, "rl_sampler": f"a{index}", "rl_started_by": "h/1"}, 600.0)
            add("ray_raylens_node_oom_kills", {**me, "oom_source": "vmstat"}, 0.0)
    lines = []
    for name, samples in families.items():
        lines.append(f"# TYPE {name} gauge")
        lines.extend(samples)
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_ready(url: str, process: subprocess.Popen[bytes], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError("prometheus exited before it was ready")
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"prometheus at {url} not ready within {seconds:g} s")


@dataclass
class Prometheus:
    url: str
    process: subprocess.Popen[bytes]
    backfill_s: float


def _start_prometheus(sizes: list[int], folder: Path) -> Prometheus:
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if prometheus is None or promtool is None:
        raise SystemExit("needs prometheus and promtool on PATH (apt-get install prometheus)")
    data = folder / "data"
    source = folder / "series.om"
    started = time.perf_counter()
    source.write_text(_openmetrics(sizes, time.time() - 5.0))
    subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    backfill_s = time.perf_counter() - started
    config = folder / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 15s\n")
    port = _free_port()
    process = subprocess.Popen(
        [
            prometheus,
            f"--config.file={config}",
            f"--storage.tsdb.path={data}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=1d",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    _wait_ready(url, process, 300)
    return Prometheus(url, process, backfill_s)


def _through_prometheus(server: Prometheus, size: int, cycles: int) -> Measured:
    # The backfilled samples do not age with the run: a long scrape interval keeps them fresh.
    settings = PrometheusSettings(
        server.url, job=f"ray{size}", scrape_interval_s=3600.0, timeout_s=120.0
    )
    source = PrometheusSource(settings, interval=600.0)
    source.declare_consumer()
    attach_growth(source, GrowthCycle())
    try:
        return _cycles(
            source.collect_once,
            lambda: _complete(source),
            cycles,
            psutil.Process(server.process.pid),
        )
    finally:
        source.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="1000,5000,10000", help="comma-separated sizes")
    parser.add_argument("--cycles", type=int, default=3, help="measured cycles per reader")
    parser.add_argument(
        "--direct-max", type=int, default=10_000, help="largest size scraped directly"
    )
    args = parser.parse_args(argv)
    sizes = [int(text) for text in args.nodes.split(",")]
    print(
        f"# {platform.python_implementation()} {platform.python_version()}, "
        f"{os.cpu_count()} CPUs, {platform.machine()}; 4 worker groups per node; "
        f"median of {args.cycles} cycles after a warm-up"
    )
    rows = []
    with tempfile.TemporaryDirectory(prefix="raylens-bench-prom-") as folder:
        server = _start_prometheus(sizes, Path(folder))
        print(f"# backfill of {sum(sizes)} nodes' series: {server.backfill_s:.1f} s", flush=True)
        try:
            for size in sizes:
                through = _through_prometheus(server, size, args.cycles)
                direct = _direct(size, args.cycles) if size <= args.direct_max else None
                rows.append((size, direct, through))
                print(f"# {size} nodes done", flush=True)
        finally:
            server.process.terminate()
            server.process.wait(30)
    print()
    print(
        "| nodes | direct: CPU/cycle | direct: wall/cycle | direct: nodes read "
        "| Prometheus: CPU/cycle | Prometheus: wall/cycle | Prometheus: nodes read "
        "| Prometheus server CPU/cycle |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    worst = 0.0
    for size, direct, through in rows:
        shown = (
            f"{direct.cpu_s:.2f} s | {direct.wall_s:.2f} s | {direct.nodes_ok}"
            if direct is not None
            else "not run | not run | -"
        )
        worst = max(worst, through.cpu_s if size >= 10_000 else 0.0)
        print(
            f"| {size:,} | {shown} | {through.cpu_s:.3f} s | {through.wall_s:.3f} s "
            f"| {through.nodes_ok} | {through.server_cpu_s or 0.0:.3f} s |"
        )
    print(f"\ntarget: a 10,000-node cycle under {TARGET_CPU_S:g} s of CPU through Prometheus")
    return 0 if worst < TARGET_CPU_S else 1


if __name__ == "__main__":
    sys.exit(main())
