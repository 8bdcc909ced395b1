"""The driver's own CPU per node in a helper-mode cycle, and the objects a cycle leaves behind.

Runs :class:`HostMemoryMonitor` cycles in helper mode against a stand-in helper: the real
helper program (``serve``) in a forked child, its engine replaced by one that answers at
once with canned outcomes shaped like the benchmark cluster's (four series, four worker
groups whose sampler publishes a new reading every other cycle, kill counters on a third
of the nodes, 5% of nodes never answering). No network, no Ray: what is timed is the
driver's thread only (``time.thread_time``), split into listing the nodes, the scrape
(queueing the batch, receiving and decoding the answer) and publishing, with the
garbage collector off. Then it counts, per node, the GC-tracked objects that a cycle
leaves alive (what a full collection walks until they are replaced).

Run: ``PYTHONPATH=src:fakes python benchmarks/bench_driver_scrape.py [--nodes 1000] [--cycles 60]``
"""

from __future__ import annotations

import argparse
import gc
import logging
import mmap
import os
import socket
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from raylens.telemetry.host_memory import HostMemoryMonitor, _helper_engine, _monitor
from raylens.telemetry.raylet_payload import GroupFigure, NodeGroupFigures, NodeOomCounts
from raylens.telemetry.scraping import Job, Outcome, ScrapeLimits, _helper_program

GROUPS = ("policy", "rollout", "reward", "reference")
#: The cycle number, shared with the forked helper (its readings change every other cycle).
_CYCLE = mmap.mmap(-1, 8)


def _cycle() -> int:
    return int.from_bytes(_CYCLE[:8], "little")


def _next_cycle() -> None:
    _CYCLE[:8] = (_cycle() + 1).to_bytes(8, "little")


class _Cluster:
    def __init__(self, nodes: int) -> None:
        self.count = nodes

    def is_initialized(self) -> bool:
        return True

    def nodes(self) -> list[dict[str, Any]]:  # fresh records each time, as Ray's are
        return [
            {
                "NodeID": f"{index:056x}",
                "Alive": True,
                "NodeManagerAddress": f"10.0.{index // 250}.{index % 250}",
                "MetricsExportPort": 8080,
                "NodeManagerHostname": f"host-{index}",
                "Resources": {"CPU": 8.0},
            }
            for index in range(self.count)
        ]


class _CannedEngine:
    """Answers at once, as a helper's engine whose nodes all answered (hung ones aside)."""

    def __init__(self, limits: ScrapeLimits) -> None:
        del limits

    def scrape(self, jobs: Sequence[Job], seconds: float, slack: float) -> dict[Hashable, Any]:
        stamp = 1000.0 + 10.0 * (_cycle() // 2)
        out: dict[Hashable, Outcome] = {}
        for number, (key, _url, _wedged) in enumerate(jobs):
            if int(str(key[0]), 16) % 20 == 0:  # type: ignore[index]
                continue  # hung: no answer by the deadline
            figures = tuple(
                GroupFigure(name, 2.0e9 + i + number, 1.5e9, 8.0, None if i else 1234.5)
                for i, name in enumerate(GROUPS)
            )
            out[key] = Outcome(
                {
                    "host_memory_used": 1.0e10 + number,
                    "host_memory_total": 6.4e10,
                    "host_machine_memory_used": 2.0e10,
                    "host_machine_memory_total": 6.4e10,
                },
                None,
                elapsed=0.01 + number * 1e-5,
                duration=0.005,
                groups=NodeGroupFigures(stamp, figures),
                oom=NodeOomCounts(0.0, 1.0) if number % 3 == 0 else None,
            )
        return out

    def close(self, timeout: float = 0.5) -> None:
        pass


class _Child:
    """The forked helper, as ``HelperEngine`` sees its process."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def poll(self) -> int | None:
        return None

    def wait(self, timeout: float | None = None) -> int:
        os.kill(self.pid, 9)
        os.waitpid(self.pid, 0)
        return 0

    def kill(self) -> None:
        pass


def _start_forked_helper(engine: Any) -> None:
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        ours.close()
        try:
            _helper_program.serve(theirs, engine.limits)
        finally:
            os._exit(0)
    theirs.close()
    engine._process = _Child(pid)
    engine._channel = _helper_engine.DriverChannel(ours)
    engine._ready, engine._stalled = False, 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--cycles", type=int, default=60)
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # the hung nodes' warnings
    _helper_program.AsyncScrapeEngine = _CannedEngine  # type: ignore[misc,assignment]
    _helper_engine.HelperEngine._start = _start_forked_helper  # type: ignore[method-assign]

    monitor = HostMemoryMonitor(
        5.0, cluster=_Cluster(args.nodes), scrape_timeout=0.5, consumer=True, scrape_mode="helper"
    )
    samples: dict[str, list[float]] = {"list": [], "scrape": [], "publish": [], "total": []}

    def timed(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            started = time.thread_time()
            try:
                return function(*args, **kwargs)
            finally:
                samples[name].append(time.thread_time() - started)

        return run

    try:
        monitor._collect_once()  # the helper ready and the first figures held
        _next_cycle()
        gc.collect()
        gc.disable()
        _monitor.ray_nodes = timed("list", _monitor.ray_nodes)  # type: ignore[assignment]
        monitor._run = timed("scrape", monitor._run)  # type: ignore[method-assign]
        monitor._publish = timed("publish", monitor._publish)  # type: ignore[method-assign]
        for _ in range(args.cycles):
            started = time.thread_time()
            monitor._collect_once()
            samples["total"].append(time.thread_time() - started)
            _next_cycle()
        per_node = 1000.0 / args.nodes
        print(f"{args.nodes} nodes, {args.cycles} cycles, GC off: driver-thread ms per node")
        for name, values in samples.items():
            values.sort()
            print(
                f"  {name:8} min {values[0] * per_node:.4f}  "
                f"median {values[len(values) // 2] * per_node:.4f}"
            )
        left = []
        for _ in range(4):
            gc.collect()
            before = gc.get_objects()
            known = set(map(id, before))
            monitor._collect_once()
            _next_cycle()
            gc.collect()
            left.append(sum(1 for o in gc.get_objects() if id(o) not in known) / args.nodes)
            del before, known
        print(
            "  GC-tracked objects a cycle leaves alive, per node, 4 cycles "
            f"(a new group reading every other one): {left}"
        )
    finally:
        gc.enable()
        monitor.stop()


if __name__ == "__main__":
    main()
