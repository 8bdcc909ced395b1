"""What host-memory monitoring costs the driver while the driver is busy.

The monitor lives in the RL driver, whose Python thread the whole job waits on.
This benchmark serves a simulated cluster (default 1,000 fake raylets, 5% hung:
they accept the connection and never answer) from a child process, then keeps
this process's main thread busy with a CPU-bound pure-Python loop while the
monitor runs several cycles back to back on a background thread. It compares:

- ``helper``: the default; scraping and parsing in a spawned helper process,
  the driver only sends URLs and receives numbers;
- ``inprocess``: the same aiohttp engine on an event-loop thread of the driver;
- ``groups``: ``helper`` with per-group memory and growth on: every raylet also serves
  four worker groups' series and the node's growth figures as a node's metrics agent
  serves what its sampler publishes (new figures every 10 s, Ray's default report
  interval), 64 workers per node are registered, and the monitor runs the group-memory
  cycle as the driver does (publishing mode, a sampler kept on every scraped node through
  FakeRay, the figures the scrape carried published) and the growth cycle, which only
  names the growth each node published;
- ``old``: the design these replaced, kept here as a yardstick: 32 scrape threads
  in the driver using ``requests``, a first try of at most 1 s per node and a
  retry with the time left for nodes that did not answer.

Per mode it reports:

- driver CPU per node per cycle: this process's CPU time (every thread) minus
  the main thread's own and minus what the benchmark's own readings between cycles
  took (the raylets' request counts, the healthy nodes), over nodes x cycles. The
  helper's CPU, in another process, is reported apart;
- healthy nodes sampled per cycle (fewest over the cycles);
- requests each hung node received per cycle (most over nodes and cycles), as
  counted by the fake raylets;
- cycle wall time (longest);
- the main thread's loop rate against an unloaded run of the same loop.

Run: ``.venv/bin/python benchmarks/bench_driver_cost.py [--nodes 1000]
[--hung-fraction 0.05] [--cycles 3] [--scrape-timeout 5] [--modes helper,groups,inprocess,old]
[--max-concurrency 256]``
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import requests

from raylens.telemetry.host_memory import HostMemoryMonitor, parse_memory_samples, ray_nodes
from raylens_fakes import FakeCluster
from raylens_fakes.ray import FakeActor, FakeRay

TARGET_DRIVER_CPU_MS = 0.05


GROUPS = ("policy", "rollout", "reward", "reference")


def _serve(n_nodes: int, hung: list[int], conn: Connection) -> None:
    """Child process: serve the simulated cluster; answer request counts until told to stop."""
    from raylens_fakes import SimulatedCluster

    def groups(index: int, _t: float) -> dict[str, float]:
        # New figures at every 10 s reading, as a real group's RSS moves between readings
        # (so the driver can never keep a reading because it equals the one it holds).
        reading = int(time.time() // 10)
        return {
            group: 2.0e9 + 1e8 * i + 4096 * ((reading + index) % 997)
            for i, group in enumerate(GROUPS)
        }

    # Each node serves four groups' series and its growth as its sampler publishes them:
    # new figures every 10 s (what Ray's agent reports by default), whatever the scrape rate.
    with SimulatedCluster(n_nodes, groups=groups, sampler_interval_s=10.0) as sim:
        for index in hung:
            sim.raylet(index).hang()
        conn.send([(r.port, sim.hostname(i)) for i, r in enumerate(sim.raylets)])
        while conn.recv() == "counts":
            conn.send([r.requests for r in sim.raylets])


def _spin(stop: threading.Event) -> int:
    """The driver's own work: a CPU-bound pure-Python loop; returns its iterations."""
    iterations = 0
    while not stop.is_set():
        total = 0
        for i in range(2000):
            total += i * i
        iterations += 1
    return iterations


def _unloaded_rate(seconds: float = 2.0) -> float:
    stop = threading.Event()
    timer = threading.Timer(seconds, stop.set)
    timer.start()
    started = time.perf_counter()
    iterations = _spin(stop)
    return iterations / (time.perf_counter() - started)


class OldDesign:
    """The replaced design, reduced to what costs the driver: threads, requests, retry."""

    def __init__(self, cluster: FakeCluster, timeout: float, threads: int = 32) -> None:
        self.cluster = cluster
        self.timeout = timeout
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="old-scrape")
        self.local = threading.local()
        self.sampled = 0

    def _session(self) -> requests.Session:
        if not hasattr(self.local, "session"):
            self.local.session = requests.Session()
        return self.local.session

    def _try(self, url: str, seconds: float) -> dict[str, float]:
        headers = {"Accept-Encoding": "identity", "Connection": "close"}
        with self._session().get(
            url, timeout=(seconds, seconds), stream=True, headers=headers
        ) as response:
            return parse_memory_samples(response.raw.read())

    def collect_once(self) -> None:
        nodes = ray_nodes(self.cluster)
        deadline = time.monotonic() + self.timeout
        done: queue.SimpleQueue[bool] = queue.SimpleQueue()

        def task(url: str, first: bool) -> None:
            left = deadline - time.monotonic()
            if left <= 0:
                done.put(False)
                return
            try:
                values = self._try(url, min(left, 1.0) if first else left)
                done.put(bool(values))
            except requests.Timeout:
                if first and deadline - time.monotonic() > 0.1:
                    self.pool.submit(task, url, False)  # the retry the spec forbids
                else:
                    done.put(False)
            except requests.RequestException:
                done.put(False)

        for node in nodes:
            self.pool.submit(task, node.metrics_url, True)
        answered = 0
        for _ in nodes:
            try:
                answered += done.get(timeout=max(0.0, deadline + 0.25 - time.monotonic()))
            except queue.Empty:
                break
        self.sampled = answered

    def healthy_sampled(self) -> int:
        return self.sampled

    def stop(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


@dataclass
class Result:
    mode: str
    nodes: int
    hung: int
    cycles: int
    driver_cpu_ms: float
    helper_cpu_ms: float | None
    fewest_sampled: int
    most_hung_requests: int
    fewest_hung_requests: int
    longest_cycle_s: float
    throughput: float


def _helper_cpu_s(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class _SamplerElsewhere:
    """What the driver sees of a sampler actor that runs on its own node: its answers.

    Ray runs a sampler in a process on its node, so nothing of it lives in the driver's
    heap; the fake Ray runs actors in-process, where a thousand real samplers (each
    with its reader and history) would load the driver's garbage collector with objects
    the driver never has.
    """

    def __init__(self, *_args: object, **_kwargs: object) -> None:
        self.passes = 0

    def ping(self) -> int:
        self.passes += 1
        return self.passes

    def set_workers(self, _workers: object) -> None:
        pass

    def start(self, _interval_s: float) -> None:
        pass

    def stop(self, *_args: object, **_kwargs: object) -> None:
        pass


class _RayWithSamplersElsewhere(FakeRay):
    """The fake Ray, with every sampler actor a :class:`_SamplerElsewhere`."""

    def _start_actor(
        self, cls: type, options: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> FakeActor:
        return super()._start_actor(_SamplerElsewhere, options, (), {})


def _attach_groups(monitor: HostMemoryMonitor, cluster: FakeCluster) -> None:
    """Per-group memory and growth on ``monitor``: 64 registered workers per node."""
    from raylens.distributed.group_memory_cycle import GroupMemoryCycle, attach_group_memory
    from raylens.distributed.group_memory_sampler import GroupMemorySamplers
    from raylens.telemetry.group_memory import GroupMemorySnapshot, GroupWorkerRegistry
    from raylens.telemetry.growth_outlook import GrowthCycle, attach_growth

    node_ids = [str(node["NodeID"]) for node in cluster.nodes()]
    registry = GroupWorkerRegistry()
    for index, group in enumerate(GROUPS):
        registry.register(
            group,
            [
                (node, 10_000 + 16 * index + rank, 123_456 + rank)
                for node in node_ids
                for rank in range(16)
            ],
        )
    samplers = GroupMemorySamplers(ray=_RayWithSamplersElsewhere(node_ids))
    attach_group_memory(
        monitor,
        GroupMemoryCycle(
            samplers, registry=registry, snapshot=GroupMemorySnapshot(), every_node=True
        ),
    )
    attach_growth(monitor, GrowthCycle())


def _run_mode(
    mode: str,
    cluster: FakeCluster,
    hung: set[int],
    counts: Callable[[], list[int]],
    args: argparse.Namespace,
    unloaded: float,
) -> Result:
    if mode == "old":
        monitor: object = OldDesign(cluster, args.scrape_timeout)
        collect = monitor.collect_once  # type: ignore[attr-defined]

        def healthy() -> int:
            return monitor.healthy_sampled()  # type: ignore[attr-defined]

        def helper_pid() -> int | None:
            return None
    else:
        real = HostMemoryMonitor(
            600.0,
            cluster=cluster,
            scrape_timeout=args.scrape_timeout,
            scrape_mode="helper" if mode == "groups" else mode,
            consumer=True,
            max_concurrency=args.max_concurrency,
        )
        if mode == "groups":
            _attach_groups(real, cluster)
        monitor = real
        collect = real.collect_once

        def healthy() -> int:
            return sum(1 for s in real.latest() if s.error is None)

        def helper_pid() -> int | None:
            return real.helper_pid

    collect()  # warm-up cycle: helper start-up, imports, first connections
    helper_before = _helper_cpu_s(helper_pid())
    walls: list[float] = []
    sampled: list[int] = []
    hung_requests: list[int] = []
    stop = threading.Event()
    driver_cpu = [0.0]

    instruments = [0.0]  # CPU of this thread spent reading the counts, not monitoring

    def cycles() -> None:
        try:
            for _ in range(args.cycles):
                reading = time.thread_time()
                before = counts()
                instruments[0] += time.thread_time() - reading
                started = time.perf_counter()
                collect()
                walls.append(time.perf_counter() - started)
                reading = time.thread_time()
                after = counts()
                sampled.append(healthy())
                hung_requests.extend(after[i] - before[i] for i in hung)
                instruments[0] += time.thread_time() - reading
        finally:
            stop.set()

    process_before, main_before = time.process_time(), time.thread_time()
    worker = threading.Thread(target=cycles, name="bench-cycles")
    started = time.perf_counter()
    worker.start()
    iterations = _spin(stop)
    elapsed = time.perf_counter() - started
    worker.join()
    driver_cpu[0] = (
        (time.process_time() - process_before) - (time.thread_time() - main_before) - instruments[0]
    )
    helper_after = _helper_cpu_s(helper_pid())
    monitor.stop()  # type: ignore[attr-defined]
    n_nodes = len(cluster.nodes())
    helper_ms = (
        1000 * (helper_after - helper_before) / (n_nodes * args.cycles)
        if helper_after is not None and helper_before is not None
        else None
    )
    return Result(
        mode=mode,
        nodes=n_nodes,
        hung=len(hung),
        cycles=args.cycles,
        driver_cpu_ms=1000 * driver_cpu[0] / (n_nodes * args.cycles),
        helper_cpu_ms=helper_ms,
        fewest_sampled=min(sampled),
        most_hung_requests=max(hung_requests, default=0),
        fewest_hung_requests=min(hung_requests, default=0),
        longest_cycle_s=max(walls),
        throughput=(iterations / elapsed) / unloaded,
    )


def _print(results: list[Result], args: argparse.Namespace) -> None:
    print(
        f"\ndriver cost of host-memory monitoring: {args.nodes} fake raylets in another "
        f"process, {args.hung_fraction:.0%} hung, {args.cycles} cycles back to back, "
        f"scrape timeout {args.scrape_timeout:g} s, at most {args.max_concurrency} requests "
        "in flight (raylens), driver main thread CPU-bound"
    )
    print(f"python {platform.python_version()}, {os.cpu_count()} CPUs\n")
    print(
        "| mode | driver CPU ms/node/cycle | helper CPU ms/node/cycle "
        "| healthy sampled (fewest) | requests per hung node per cycle (min-max) "
        "| longest cycle s | main-thread rate vs unloaded |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        helper = f"{r.helper_cpu_ms:.3f}" if r.helper_cpu_ms is not None else "-"
        print(
            f"| {r.mode} | {r.driver_cpu_ms:.3f} | {helper} "
            f"| {r.fewest_sampled}/{r.nodes - r.hung} "
            f"| {r.fewest_hung_requests}-{r.most_hung_requests} "
            f"| {r.longest_cycle_s:.2f} | {r.throughput:.2f} |"
        )
    print(
        f"\ntargets: helper driver CPU <= {TARGET_DRIVER_CPU_MS} ms/node/cycle; every healthy "
        f"node sampled every cycle; each hung node asked once per cycle; cycle <= "
        f"{args.scrape_timeout + 0.5:g} s"
    )
    for r in results:
        if r.mode == "old":
            continue
        checks = [
            ("sampled", r.fewest_sampled == r.nodes - r.hung),
            ("hung asked once", r.fewest_hung_requests == r.most_hung_requests == 1),
            ("cycle", r.longest_cycle_s <= args.scrape_timeout + 0.5),
        ]
        if r.mode in ("helper", "groups"):
            checks.insert(0, ("driver CPU", r.driver_cpu_ms <= TARGET_DRIVER_CPU_MS))
        verdict = ", ".join(f"{name} {'ok' if ok else 'MISSED'}" for name, ok in checks)
        print(f"  {r.mode}: {verdict}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--hung-fraction", type=float, default=0.05)
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--scrape-timeout", type=float, default=5.0)
    parser.add_argument("--modes", default="helper,groups,inprocess,old")
    parser.add_argument(
        "--max-concurrency", type=int, default=256, help="raylens' bound on requests in flight"
    )
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if args.cycles < 1 or not modes or set(modes) - {"helper", "groups", "inprocess", "old"}:
        parser.error("--cycles must be >= 1 and --modes a list of helper, groups, inprocess, old")

    step = round(1 / args.hung_fraction) if args.hung_fraction > 0 else 0
    hung = set(range(step // 2, args.nodes, step)) if step else set()
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    server = context.Process(target=_serve, args=(args.nodes, sorted(hung), child), daemon=True)
    server.start()
    try:
        endpoints = parent.recv()
        cluster = FakeCluster()
        for port, hostname in endpoints:
            cluster.add_node(address="127.0.0.1", port=port, hostname=hostname)

        def counts() -> list[int]:
            parent.send("counts")
            return parent.recv()

        unloaded = _unloaded_rate()
        results = [_run_mode(m, cluster, hung, counts, args, unloaded) for m in modes]
    finally:
        parent.send("stop")
        server.join(timeout=30)
        if server.is_alive():
            server.kill()
    _print(results, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
