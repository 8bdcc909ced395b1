"""The growth cycle alone: CPU per node per cycle, and what it leaves to the collector.

Builds the records a helper-mode monitor publishes for ``--nodes`` nodes with four worker
groups each, as in ``bench_driver_cost.py``'s groups mode: a cycle every 5 s, a new
sampler reading (new group figures) every other cycle, 5% of nodes hung (their record
keeps its last good figures and carries no groups). Runs ``--warmup`` cycles so the
windows are full and fits run as in a long run, then times ``--cycles`` cycles of
:class:`~raylens.telemetry.growth_outlook.GrowthCycle` with the garbage collector off, and counts
the GC-tracked objects that as many more cycles left alive (per node per cycle). The
inputs are built before each cycle, outside the measure.

Each node's figures carry what its sampler published about the node (growth, limit, time
to limit), as the samplers compute them on their nodes: the cycle keeps no history and only
names what it reads. ``--warmup`` only fills its caches.

The machine it runs on may be shared: ``--repeat`` runs it again from the start and
reports the fastest run.

Run: ``PYTHONPATH=src:fakes python benchmarks/bench_growth_cycle.py [--nodes 1000]
[--cycles 24] [--warmup 150] [--repeat 1] [--profile out.prof]``
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import time
from collections.abc import Mapping

from raylens.telemetry.growth import KillLineConfig
from raylens.telemetry.growth_outlook import GrowthCycle
from raylens.telemetry.host_memory import NodeRecord
from raylens.telemetry.host_memory._nodes import RayNode
from raylens.telemetry.host_memory._snapshot import NodeKey
from raylens.telemetry.raylet_payload import (
    TOTAL_KEY,
    USED_KEY,
    GroupFigure,
    NodeFigures,
    NodeGroupFigures,
)

GIB = float(1 << 30)
MIB = float(1 << 20)
GROUPS = ("policy", "reference", "rollout", "trainer")
CYCLE_S = 5.0
HUNG_SHARE = 0.05


class _Records:
    """A monitor seen as its records, the way the growth cycle reads a host-memory one."""

    def __init__(self, nodes: int) -> None:
        self.nodes = [
            RayNode(f"{k:056x}", f"host-{k}", f"http://127.0.0.1:{9000 + k}/metrics")
            for k in range(nodes)
        ]
        self.hung = {node.node_id for node in self.nodes[: int(nodes * HUNG_SHARE)]}
        self.cycle = 0
        self._records: dict[NodeKey, NodeRecord] = {}
        self._figures: dict[str, NodeGroupFigures] = {}

    def declare_consumer(self) -> None:
        pass

    def records(self) -> Mapping[NodeKey, NodeRecord]:
        return self._records

    def advance(self) -> None:
        """Publish the next cycle's records (a new reading every other cycle)."""
        self.cycle += 1
        now = 1_000.0 + CYCLE_S * self.cycle
        new_reading = self.cycle % 2 == 0
        records = {}
        for k, node in enumerate(self.nodes):
            previous = self._records.get(node.key)
            if node.node_id in self.hung and previous is not None:
                values, at, groups = previous.values, previous.sampled_at, None
            else:
                figures = self._figures.get(node.node_id)
                if figures is None or new_reading:
                    stamp = now - 1.0
                    figures = NodeGroupFigures(
                        1.7e9 + stamp,
                        tuple(
                            GroupFigure(g, 2.0e9 + j + (k % 7) * MIB, None, 16.0, 1e3 * j)
                            for j, g in enumerate(GROUPS)
                        ),
                        NodeFigures(1e10, 6e3, 0.0, False, 0.95 * 256 * GIB, None, 600.0, "s", "d"),
                    )
                    self._figures[node.node_id] = figures
                inside = sum(g.rss_bytes for g in figures.groups)
                values = {USED_KEY: 6 * GIB + inside, TOTAL_KEY: 256 * GIB}
                at, groups = now, figures
            records[node.key] = NodeRecord(
                node, values, at, None, None, "", 0, {}, groups=groups, expires_at=now + 60
            )
        self._records = records


def _new_objects(seen: set[int]) -> int:
    return sum(1 for o in gc.get_objects() if id(o) not in seen)


def _counting_overhead() -> int:
    """What counting alone leaves (the list, the set of ids, the generator)."""
    gc.collect()
    before = gc.get_objects()
    seen = {id(o) for o in before}
    gc.collect()
    return _new_objects(seen)


_COUNTING = _counting_overhead()


def _run(args: argparse.Namespace, profiler: cProfile.Profile | None) -> tuple[float, float]:
    """``(driver CPU seconds, tracked objects left alive)`` of ``args.cycles`` cycles after
    the warm-up.

    The cycles are timed first, then as many more are run to count what each leaves alive
    (counting walks every object, which would leave the timed cycles' caches cold).
    """
    monitor = _Records(args.nodes)
    cycle = GrowthCycle(kill_line=KillLineConfig())
    for _ in range(args.warmup):
        monitor.advance()
        cycle(monitor)
    gc.collect()
    gc.disable()
    spent = 0.0
    left_alive = 0
    try:
        for _ in range(args.cycles):
            monitor.advance()
            if profiler is not None:
                profiler.enable()
            start = time.process_time()
            cycle(monitor)
            spent += time.process_time() - start
            if profiler is not None:
                profiler.disable()
        for _ in range(args.cycles):
            monitor.advance()
            gc.collect()
            before = gc.get_objects()
            seen = {id(o) for o in before}
            cycle(monitor)
            gc.collect()
            left_alive += _new_objects(seen) - _COUNTING
            del before, seen
    finally:
        gc.enable()
    return spent, left_alive


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--cycles", type=int, default=24)
    parser.add_argument("--warmup", type=int, default=150)
    parser.add_argument("--repeat", type=int, default=1, help="runs; the fastest is reported")
    parser.add_argument("--profile", default="")
    args = parser.parse_args()

    profiler = cProfile.Profile() if args.profile else None
    runs = [_run(args, profiler) for _ in range(args.repeat)]
    if profiler is not None:
        profiler.dump_stats(args.profile)
    spent, left_alive = min(runs)
    per = args.nodes * args.cycles
    print(
        f"growth cycle, naming what the nodes publish: driver {1e3 * spent / per:.4f} ms per "
        f"node per cycle (GC off, best of {args.repeat}), {left_alive / per:.2f} GC-tracked "
        f"objects left alive per node per cycle ({args.nodes} nodes, {args.cycles} cycles "
        f"after {args.warmup})"
    )


if __name__ == "__main__":
    main()
