"""What one group-memory reading costs a node, and what the driver pays per node.

Node side: forks N idle worker processes (8, 64 and 256 by default) from one small
Python process, so they cost little memory, registers them as workers of four
groups, and times one whole reading, from the registered ``(group, pid,
start_ticks)`` list to the per-group sums, four ways:

- raylens, RSS with trees remembered: a :class:`GroupMemoryReader` reading between
  tree walks and PSS reads (the pid-reuse check from ``stat``, then ``statm``), the
  sampler's usual reading
- raylens, RSS + tree walk: the same plus the per-thread ``children`` files of
  every process (once per ``tree_interval_seconds``)
- raylens, RSS + PSS + tree walk: the same with ``smaps_rollup`` instead of ``statm``
  (once per ``pss_interval_seconds``)
- psutil, RSS: one ``process_iter`` for the parent map, then per worker
  ``create_time()`` (the pid-reuse check), its tree, and ``memory_info()``
- psutil, RSS + PSS: the same with ``memory_full_info()``

CPU time is the reading thread's (``time.thread_time``), wall time
``time.perf_counter``; each figure is the median of ``--repeat`` readings.

Driver side: :class:`GroupMemorySamplers` plus :meth:`GroupMemorySnapshot.publish`
for ``--nodes`` nodes of 64 workers each, against an in-process stand-in for Ray
whose readings are ready at once, so what is measured is raylens' own work per
node per cycle (validating the worker lists, checking and rebuilding each answer,
publishing), not Ray's transport.

Driver side, the two ways side by side: :meth:`GroupMemorySamplers.sample` (ask
every sampler, collect, publish into the snapshot) against
:meth:`GroupMemorySamplers.maintain` (the samplers read on their own timers and
publish through Ray's metrics pipeline; the driver only keeps them), on
``raylens_fakes``' FakeRay at ``--nodes`` nodes of 64 workers, every cycle handed
fresh lists as the registry hands them out. maintain() is shown for a cycle with
no liveness round and averaged over cycles that include them (every
``ping_every`` cycles); the registry's ``workers_by_node()``, which builds the
input of either, is timed apart. FakeRay's bookkeeping is in both figures.

Phase boundary: on ``--phase-processes`` forked workers (64 by default), a phase's
begin on the node (each group's start reading, and ``5`` written to every process's
``clear_refs``) and its end (the end reading and every process's ``VmHWM``), with kernel
peaks on and off: what a sampler spends at each boundary.

A sampler at its default 1 s readings: on ``--sampler-processes`` forked workers (64 by
default), a :class:`GroupMemorySamplerActor` (its own ``/proc``, Ray's gauges replaced by
ones that keep the value) runs ``--sampler-seconds`` readings back to back (600 by
default), its clock moved 1 s per reading: every reading of the node and its groups, the
tree walks (every 30 s), PSS (every 60 s), recording into the node's history and the fits
(every tenth of the default 600 s window) and publishing. The reading thread's CPU
divided by the simulated seconds is the share of one core the sampler takes.
``--sampler-only`` runs this part alone.

OOM post-mortem: building and writing one post-mortem (:mod:`raylens.telemetry.oom`)
for a node with 8 worker groups and 10 minutes of 1 s samples in its history (the
default 600 s growth window), the file written atomically into a temporary
directory; its size is shown beside it.

Run: ``PYTHONPATH=src:fakes .venv/bin/python benchmarks/bench_group_memory.py
[--processes 8,64,256] [--threads 0] [--repeat 30] [--nodes 100,1000]
[--sampler-processes 64] [--sampler-seconds 600] [--sampler-only]``. Linux
only. Every forked process is killed on the way out.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import psutil

from raylens.distributed.group_memory_sampler import (
    DEFAULT_PING_EVERY,
    GroupMemorySamplerActor,
    GroupMemorySamplers,
)
from raylens.telemetry.group_memory import (
    GroupMemory,
    GroupMemoryReader,
    GroupMemorySnapshot,
    GroupWorkerRegistry,
    NodeGroupMemory,
)
from raylens.telemetry.growth import GrowthSettings, MemoryHistory, recent_history
from raylens.telemetry.oom import (
    Killer,
    LargestProcess,
    PostMortemWriter,
    Victim,
    build_postmortem,
)
from raylens.telemetry.phases.memory import KERNEL_SOURCE, NodePhaseTracker
from raylens.telemetry.process_memory import ProcFS
from raylens_fakes.ray import FakeRay

GROUPS = ("policy", "rollout", "reference", "reward")

# argv: workers, extra threads per worker. Each worker blocks reading a pipe that
# only the spawner holds open for writing, after starting its threads (which block
# on the same pipe); EOF on the spawner's stdin closes it and every worker exits.
SPAWNER = r"""
import os, sys, threading
workers, threads = int(sys.argv[1]), int(sys.argv[2])
block_r, block_w = os.pipe()
ready_r, ready_w = os.pipe()
pids = []
for _ in range(workers):
    pid = os.fork()
    if pid == 0:
        os.close(block_w)
        for _ in range(threads):
            threading.Thread(target=os.read, args=(block_r, 1), daemon=True).start()
        os.write(ready_w, b"r")
        os.read(block_r, 1)
        os._exit(0)
    pids.append(pid)
waiting = workers
while waiting:
    waiting -= len(os.read(ready_r, waiting))
print(" ".join(map(str, pids)), flush=True)
sys.stdin.read()
os.close(block_w)
for pid in pids:
    os.waitpid(pid, 0)
"""


def _timed(
    read: Callable[[], object], repeat: int, setup: Callable[[], object] | None = None
) -> tuple[float, float]:
    """Median CPU and wall milliseconds of ``repeat`` calls of ``read``, each after an
    untimed ``setup()`` when given."""
    cpu, wall = [], []
    for _ in range(repeat):
        if setup is not None:
            setup()
        cpu_start, wall_start = time.thread_time(), time.perf_counter()
        read()
        wall.append(time.perf_counter() - wall_start)
        cpu.append(time.thread_time() - cpu_start)
    return statistics.median(cpu) * 1e3, statistics.median(wall) * 1e3


def _psutil_reading(workers: list[tuple[str, int, int | None]], full: bool) -> dict[str, int]:
    children: dict[int, list[int]] = {}
    for process in psutil.process_iter(["ppid"]):
        children.setdefault(process.info["ppid"], []).append(process.pid)
    totals: dict[str, int] = {}
    for group, pid, _ticks in workers:
        try:
            psutil.Process(pid).create_time()
        except psutil.NoSuchProcess:
            continue
        pending, seen = [pid], set()
        while pending:
            current = pending.pop()
            if current in seen:
                continue
            seen.add(current)
            pending.extend(children.get(current, ()))
        for member in seen:
            try:
                process = psutil.Process(member)
                memory = process.memory_full_info() if full else process.memory_info()
            except psutil.NoSuchProcess:
                continue
            totals[group] = totals.get(group, 0) + memory.rss + (memory.pss if full else 0)
    return totals


def _compare(workers: list[tuple[str, int, int | None]], repeat: int) -> dict[str, tuple]:
    """Median CPU and wall ms of one reading of ``workers``, per method."""
    procfs = ProcFS()
    steady = GroupMemoryReader(procfs, pss_interval_seconds=1e9, tree_interval_seconds=1e9)
    steady.read(workers)  # the first reading walks every tree and reads PSS; later ones do not
    walking = GroupMemoryReader(procfs, pss_interval_seconds=1e9)
    walking.read(workers)
    with_pss = GroupMemoryReader(procfs)
    reading = steady.read(workers)
    measured = sum(group.process_count for group in reading.groups)
    assert measured == len(workers), f"measured {measured} of {len(workers)} processes"
    return {
        "raylens, RSS (trees remembered)": _timed(lambda: steady.read(workers), repeat),
        "raylens, RSS + tree walk": _timed(lambda: walking.read(workers), repeat),
        "raylens, RSS + PSS + tree walk": _timed(lambda: with_pss.read(workers), repeat),
        "psutil, RSS": _timed(lambda: _psutil_reading(workers, False), repeat),
        "psutil, RSS + PSS": _timed(lambda: _psutil_reading(workers, True), repeat),
    }


@contextlib.contextmanager
def _spawned(count: int, threads: int) -> Iterator[list[tuple[str, int, int | None]]]:
    """``count`` idle forked workers of the four groups, as ``(group, pid, start_ticks)``."""
    procfs = ProcFS()
    spawner = subprocess.Popen(
        [sys.executable, "-c", SPAWNER, str(count), str(threads)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert spawner.stdout is not None
        pids = [int(pid) for pid in spawner.stdout.readline().split()]
        yield [
            (GROUPS[i % len(GROUPS)], pid, procfs.start_ticks(pid)) for i, pid in enumerate(pids)
        ]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(spawner.pid, signal.SIGKILL)
        spawner.wait(timeout=60)


def node_side(counts: list[int], threads: int, repeat: int) -> list[tuple[str, ...]]:
    rows = []
    for count in counts:
        with _spawned(count, threads) as workers:
            results = _compare(workers, repeat)
        base_cpu = next(iter(results.values()))[0]
        for method, (cpu_ms, wall_ms) in results.items():
            rows.append(
                (
                    str(count),
                    method,
                    f"{cpu_ms:.2f}",
                    f"{wall_ms:.2f}",
                    f"{cpu_ms / count * 64:.2f}",
                    f"{cpu_ms / base_cpu:.1f}",
                )
            )
    return rows


class _Answer(dict):
    """A prepared reading that is also its own object reference: unique and hashable."""

    _ids = itertools.count()

    def __init__(self, plain: dict[str, Any]) -> None:
        super().__init__(plain)
        self._id = next(self._ids)

    def __hash__(self) -> int:  # type: ignore[override]
        return self._id

    def __eq__(self, other: object) -> bool:
        return self is other


class _InstantRay:
    """A stand-in for Ray whose sampler actors answer at once with a prepared reading."""

    def __init__(self, plain: dict[str, Any]) -> None:
        read = SimpleNamespace(remote=lambda _workers: _Answer(plain))
        actor = SimpleNamespace(read=read)
        started = SimpleNamespace(remote=lambda **_kwargs: actor)
        self._remote_class = SimpleNamespace(options=lambda **_options: started)
        self.util = SimpleNamespace(
            scheduling_strategies=SimpleNamespace(
                NodeAffinitySchedulingStrategy=lambda node_id, soft: node_id
            )
        )
        self.exceptions = SimpleNamespace(RayActorError=RuntimeError)

    def remote(self, **_options: Any) -> Callable[[type], Any]:
        return lambda _cls: self._remote_class

    def wait(self, refs: list[Any], *, num_returns: int = 1, timeout: float | None = None):
        return refs, []

    def get(self, ref: Any, *, timeout: float | None = None) -> Any:
        return ref

    def kill(self, _actor: Any, *, no_restart: bool = True) -> None:
        pass


def driver_side(node_counts: list[int], repeat: int) -> list[tuple[str, ...]]:
    plain = NodeGroupMemory(
        host_name="worker-host",
        groups=tuple(GroupMemory(g, 2**30, 2**29, 3.0, 16, 16) for g in GROUPS),
    ).as_plain()
    workers = [(GROUPS[i % len(GROUPS)], 10_000 + i, 123_456 + i) for i in range(64)]
    rows = []
    for nodes in node_counts:
        by_node = {f"{n:056x}": workers for n in range(nodes)}
        cpu_ms = _driver_cycle_ms(by_node, plain, max(3, repeat // 5))
        rows.append((str(nodes), f"{cpu_ms:.1f}", f"{cpu_ms / nodes * 1e3:.0f}"))
    return rows


def _driver_cycle_ms(by_node: dict[str, list], plain: dict[str, Any], repeat: int) -> float:
    samplers = GroupMemorySamplers(ray=_InstantRay(plain))
    snapshot = GroupMemorySnapshot()
    samplers.sample(by_node)  # starts the samplers
    cpu_ms, _wall_ms = _timed(lambda: snapshot.publish(samplers.sample(by_node)), repeat)
    return cpu_ms


def _registry(nodes: int) -> GroupWorkerRegistry:
    """Four groups of 16 workers on every node: 64 workers per node."""
    registry = GroupWorkerRegistry()
    for index, group in enumerate(GROUPS):
        registry.register(
            group,
            [
                (f"{node:056x}", 10_000 + 16 * index + rank, 123_456 + rank)
                for node in range(nodes)
                for rank in range(16)
            ],
        )
    return registry


def _per_cycle_ms(
    call: Callable[[dict[str, list]], object], registry: GroupWorkerRegistry, cycles: int
) -> list[float]:
    """CPU ms of ``call`` on each of ``cycles`` fresh inputs (building them is not timed)."""
    spent = []
    for _ in range(cycles):
        by_node = registry.workers_by_node()
        started = time.thread_time()
        call(by_node)
        spent.append((time.thread_time() - started) * 1e3)
    return spent


def sample_versus_maintain(node_counts: list[int], repeat: int) -> list[tuple[str, ...]]:
    plain = NodeGroupMemory(
        host_name="worker-host",
        groups=tuple(GroupMemory(g, 2**30, 2**29, 3.0, 16, 16) for g in GROUPS),
    ).as_plain()
    rows = []
    for nodes in node_counts:
        figures = _both_ways_ms(_registry(nodes), plain, max(2 * DEFAULT_PING_EVERY, repeat // 5))
        sample_ms = figures[0][1]
        rows.extend(
            (
                str(nodes),
                label,
                f"{ms:.2f}",
                f"{ms / nodes * 1e3:.2f}",
                f"{sample_ms / ms:.0f}",
            )
            for label, ms in figures
        )
    return rows


def _both_ways_ms(
    registry: GroupWorkerRegistry, plain: dict[str, Any], cycles: int
) -> list[tuple[str, float]]:
    node_ids = list(registry.workers_by_node())
    polled = FakeRay(node_ids)
    asking = GroupMemorySamplers(ray=polled)
    asking.sample(registry.workers_by_node())  # starts the samplers
    for actor in polled.actors:  # answers ready at once: the node's reading is not timed
        actor.script("read", lambda _workers: plain)
    snapshot = GroupMemorySnapshot()
    sample_ms = statistics.median(_per_cycle_ms(asking.sample, registry, cycles))
    sample_publish_ms = statistics.median(
        _per_cycle_ms(lambda by_node: snapshot.publish(asking.sample(by_node)), registry, cycles)
    )

    keeping = GroupMemorySamplers(ray=FakeRay(node_ids), ping_every=DEFAULT_PING_EVERY)
    keeping.maintain(registry.workers_by_node())  # starts the samplers
    # Whole rounds: every DEFAULT_PING_EVERY cycles one sends pings, the next reads them.
    spent = _per_cycle_ms(keeping.maintain, registry, cycles - cycles % DEFAULT_PING_EVERY)

    build_ms = statistics.median(
        _per_cycle_ms(lambda _by_node: registry.workers_by_node(), registry, cycles)
    )
    return [
        ("sample()", sample_ms),
        ("sample() + snapshot.publish()", sample_publish_ms),
        ("maintain(), no liveness round", statistics.median(spent)),
        (f"maintain(), mean incl. a round every {DEFAULT_PING_EVERY}", statistics.fmean(spent)),
        ("registry.workers_by_node() (input of both)", build_ms),
    ]


def phase_boundary(count: int, repeat: int) -> list[tuple[str, ...]]:
    """CPU and wall ms of a phase's begin and end on a node of ``count`` worker processes."""
    rows = []
    with _spawned(count, 0) as workers:
        for kernel in (True, False):
            tracker = NodePhaseTracker(ProcFS())
            tracker.begin("warm", workers, kernel_peaks=kernel)
            figures = tracker.end("warm")
            assert figures is not None
            measured = len(figures.groups)
            assert measured == len(GROUPS), f"measured {measured} groups"
            if kernel:
                sources = {g.source for g in figures.groups}
                assert sources == {KERNEL_SOURCE}, f"kernel peaks not permitted here: {sources}"
            label = "kernel peaks" if kernel else "sampled peaks (kernel peaks off)"
            begin_cpu, begin_wall = _timed(
                lambda kernel=kernel, tracker=tracker: tracker.begin(
                    "t", workers, kernel_peaks=kernel
                ),
                repeat,
            )
            end_cpu, end_wall = _timed(
                lambda tracker=tracker: tracker.end("t"),
                repeat,
                setup=lambda kernel=kernel, tracker=tracker: tracker.begin(
                    "t", workers, kernel_peaks=kernel
                ),
            )
            rows.append((str(count), f"begin, {label}", f"{begin_cpu:.2f}", f"{begin_wall:.2f}"))
            rows.append((str(count), f"end, {label}", f"{end_cpu:.2f}", f"{end_wall:.2f}"))
    return rows


def postmortem_cost(repeat: int) -> list[tuple[str, ...]]:
    """Build, and build and write, one post-mortem of a node with 8 or 256 groups and 10 min of history."""
    rows: list[tuple[str, ...]] = []
    largest = [LargestProcess(1000 + i, f"group{i % 8}", 2**30 - i) for i in range(10)]
    for count in (8, 256):
        history = MemoryHistory(GrowthSettings(window_s=600.0))
        times = np.arange(600.0)
        groups = {f"group{i}": 2e9 + 1e6 * i + 1e5 * np.sin(times / 30 + i) for i in range(count)}
        history.record_node_many("n" * 56, times, 3e10 + sum(groups.values()), groups)

        def build(history: MemoryHistory = history) -> dict[str, Any]:
            return build_postmortem(
                node_id="n" * 56,
                host="vm",
                killer=Killer.RAY,
                wall_time=time.time(),
                victims=[Victim("group0", 0, 1000, "group0-0-0:Worker.step")],
                phase="train",
                limit_bytes=9.5e10,
                used_bytes=4.8e10,
                total_bytes=1e11,
                history=recent_history(history, "n" * 56, 599.0),
                largest=largest,
                largest_sampled_at=time.time(),
            )

        with tempfile.TemporaryDirectory() as directory:
            writer = PostMortemWriter(directory, max_files=10**6)
            build_ms = _timed(build, repeat)
            write_ms = _timed(lambda writer=writer, build=build: writer.write(build()), repeat)
            size = max(p.stat().st_size for p in Path(directory).iterdir())
        rows.append(
            (f"{count} groups: build the document", f"{build_ms[0]:.2f}", f"{build_ms[1]:.2f}", "")
        )
        rows.append(
            (
                f"{count} groups: build + write (bounded, atomic)",
                f"{write_ms[0]:.2f}",
                f"{write_ms[1]:.2f}",
                f"{size / 1024:.0f}",
            )
        )
    return rows


class _KeptGauge:
    """Stands in for ``ray.util.metrics.Gauge``: keeps the last value, sends nothing."""

    def __init__(self, name: str, description: str = "", tag_keys: tuple[str, ...] = ()) -> None:
        self.values: dict[tuple[tuple[str, str], ...], float] = {}

    def set(self, value: float, tags: dict[str, str] | None = None) -> None:
        self.values[tuple(sorted((tags or {}).items()))] = value


def sampler_cost(count: int, seconds: int) -> list[tuple[str, ...]]:
    """A sampler's CPU over ``seconds`` 1 s readings of ``count`` workers, as a share of a core."""
    from raylens.distributed._group_memory_publishing import RayMetricsPublisher

    clock = SimpleNamespace(now=0.0)
    with _spawned(count, 0) as workers:
        sampler = GroupMemorySamplerActor(
            publisher=RayMetricsPublisher(_KeptGauge),
            clock=lambda: clock.now,
            growth_window_s=600.0,
        )
        sampler.set_workers(workers)
        cpu = time.thread_time()
        wall = time.perf_counter()
        for _ in range(seconds):
            clock.now += 1.0
            sampler.sample_and_publish_once()
        cpu = time.thread_time() - cpu
        wall = time.perf_counter() - wall
    per_reading_ms = 1e3 * cpu / seconds
    return [
        (
            str(count),
            str(seconds),
            f"{per_reading_ms:.3f}",
            f"{1e3 * wall / seconds:.3f}",
            f"{100 * cpu / seconds:.2f} %",
        )
    ]


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |"]
    lines.append("|" + "|".join("---:" if i != 1 else "---" for i in range(len(header))) + "|")
    lines.extend("| " + " | ".join(row) + " |" for row in rows)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", default="8,64,256", help="worker counts, comma-separated")
    parser.add_argument("--threads", type=int, default=0, help="extra threads per worker")
    parser.add_argument("--repeat", type=int, default=30, help="readings per figure")
    parser.add_argument("--nodes", default="100,1000", help="node counts for the driver side")
    parser.add_argument(
        "--phase-processes", type=int, default=64, help="worker processes for the phase boundary"
    )
    parser.add_argument("--sampler-processes", type=int, default=64)
    parser.add_argument("--sampler-seconds", type=int, default=600)
    parser.add_argument("--sampler-only", action="store_true")
    args = parser.parse_args()
    if not sys.platform.startswith("linux"):
        sys.exit("bench_group_memory needs Linux procfs")
    sampler_header = ("workers", "readings", "CPU ms per reading", "wall ms", "CPU share at 1 s")
    sampler_title = "A sampler at 1 s readings, amortised over its tree walks, PSS reads and fits:"
    if args.sampler_only:
        print(sampler_title)
        print(_table(sampler_header, sampler_cost(args.sampler_processes, args.sampler_seconds)))
        return
    counts = [int(part) for part in args.processes.split(",")]
    print(
        f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
        f"{len(psutil.pids())} processes on the host, {args.threads} extra threads per worker"
    )
    print()
    print("One reading on a node (median of", args.repeat, "readings):")
    print(
        _table(
            ("workers", "method", "CPU ms", "wall ms", "CPU ms per 64", "CPU x first row"),
            node_side(counts, args.threads, args.repeat),
        )
    )
    print()
    print(
        "A phase boundary on a node (reset and start reading at the begin, VmHWM and end "
        f"reading at the end; median of {args.repeat}):"
    )
    print(
        _table(
            ("workers", "step", "CPU ms", "wall ms"),
            phase_boundary(args.phase_processes, args.repeat),
        )
    )
    print()
    print("Driver, one cycle (64 workers per node, Ray's transport not included):")
    node_counts = [int(part) for part in args.nodes.split(",")]
    print(_table(("nodes", "CPU ms", "CPU µs per node"), driver_side(node_counts, args.repeat)))
    print()
    print("Driver, one cycle: sample() against maintain() (FakeRay, 64 workers per node):")
    print(
        _table(
            ("nodes", "call", "CPU ms", "CPU µs per node", "sample() / this"),
            sample_versus_maintain(node_counts, args.repeat),
        )
    )
    print()
    print(sampler_title)
    print(_table(sampler_header, sampler_cost(args.sampler_processes, args.sampler_seconds)))
    print()
    print(f"OOM post-mortem, 8 groups, 10 min of 1 s samples (median of {args.repeat}):")
    print(_table(("step", "CPU ms", "wall ms", "file KiB"), postmortem_cost(args.repeat)))


if __name__ == "__main__":
    main()
