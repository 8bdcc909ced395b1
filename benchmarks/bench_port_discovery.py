"""Port discovery for many bundles: one batch against one Ray call per bundle.

A worker group needs an address and a free port on the node of every bundle it uses.
NeMo-RL used to ask for them one bundle at a time (submit a task, wait for its answer,
next bundle); ``RayVirtualCluster.get_available_addresses_and_ports_batch`` submits
every task first and then fetches the answers ``batch_size`` at a time.

Both ways run raylens' own code here, side by side in one run: ``batched`` is one call
of the batch method for all bundles, ``per-bundle`` is one
``get_available_address_and_port`` call per bundle. Ray is replaced by a cost model
with a simulated clock, so the run takes seconds and does not depend on the machine:

- submitting a task costs the driver ``--submit-ms``;
- a task runs on its bundle's node for ``--task-ms``, each node running at most
  ``--slots`` tasks at once (the rest queue there);
- every ``ray.get`` / ``ray.wait`` costs a round trip of ``--rtt-ms`` and returns once
  the results it hands back are ready.

It prints, per way: the modelled wall time, the Ray calls made (tasks submitted, gets
and waits), and the driver CPU the raylens code and the model used together (measured
in this process, the least of ``--repeat`` runs).

Run: ``PYTHONPATH=src:fakes python benchmarks/bench_port_discovery.py [--bundles 1024]
[--bundles-per-node 8] [--batch-size 256] [--rtt-ms 1.0] [--submit-ms 0.05]
[--task-ms 3.0] [--slots 2] [--repeat 5]``
"""

from __future__ import annotations

import argparse
import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from raylens.distributed.ray_seam import RaySeam
from raylens.distributed.virtual_cluster import RayVirtualCluster


@dataclass(frozen=True)
class Strategy:
    placement_group: Any
    placement_group_bundle_index: int = -1


class GetTimeoutError(Exception):
    pass


@dataclass(eq=False)
class Ref:
    ready_at: float
    value: tuple[str, int]


@dataclass
class CostModelRay:
    """The parts of ``ray`` port discovery uses, on a simulated clock (milliseconds)."""

    bundles_per_node: int
    rtt_ms: float
    submit_ms: float
    task_ms: float
    slots: int
    now: float = 0.0
    submitted: int = 0
    gets: int = 0
    waits: int = 0
    node_slots: dict[int, list[float]] = field(default_factory=dict)
    next_port: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.exceptions = SimpleNamespace(GetTimeoutError=GetTimeoutError)
        self.util = SimpleNamespace(
            scheduling_strategies=SimpleNamespace(PlacementGroupSchedulingStrategy=Strategy)
        )

    def submit(self, bundle: int) -> Ref:
        self.submitted += 1
        self.now += self.submit_ms
        node = bundle // self.bundles_per_node
        free = self.node_slots.setdefault(node, [0.0] * self.slots)
        start = max(self.now, heapq.heappop(free))
        done = start + self.task_ms
        heapq.heappush(free, done)
        port = self.next_port.get(node, 1400)
        self.next_port[node] = port + 1
        return Ref(done, (f"10.0.{node // 256}.{node % 256}", port))

    def get(self, refs: list[Ref], timeout: float | None = None) -> list[tuple[str, int]]:
        self.gets += 1
        self.now = max(self.now + self.rtt_ms, max(ref.ready_at for ref in refs))
        return [ref.value for ref in refs]

    def wait(
        self, refs: list[Ref], num_returns: int = 1, timeout: float | None = None
    ) -> tuple[list[Ref], list[Ref]]:
        self.waits += 1
        by_time = sorted(refs, key=lambda ref: ref.ready_at)
        self.now = max(self.now + self.rtt_ms, by_time[num_returns - 1].ready_at)
        # Like Ray's, a wait hands back at most ``num_returns`` refs.
        ready = by_time[:num_returns]
        taken = {id(ref) for ref in ready}
        return ready, [ref for ref in refs if id(ref) not in taken]


class PortTask:
    """The port task as a remote function of the cost model."""

    def __init__(self, model: CostModelRay, strategy: Strategy | None = None) -> None:
        self.model = model
        self.strategy = strategy

    def options(self, **options: Any) -> PortTask:
        return PortTask(self.model, options.get("scheduling_strategy"))

    def remote(self, low: int, high: int) -> Ref:
        assert self.strategy is not None
        return self.model.submit(self.strategy.placement_group_bundle_index)


class ModelSeam(RaySeam):
    def __init__(self, model: CostModelRay) -> None:
        super().__init__()
        self.model = model
        self.remote("node_ip_and_free_port", lambda _ray: PortTask(model))

    def connected_ray(self) -> Any:
        return self.model

    def ray(self) -> Any:
        return self.model


@dataclass
class Outcome:
    way: str
    modelled_ms: float
    submitted: int
    gets: int
    waits: int
    driver_cpu_ms: float


def run(way: str, args: argparse.Namespace, call: Callable[[RayVirtualCluster], Any]) -> Outcome:
    model = CostModelRay(
        args.bundles_per_node, args.rtt_ms, args.submit_ms, args.task_ms, args.slots
    )
    nodes = -(-args.bundles // args.bundles_per_node)
    counts = [args.bundles_per_node] * nodes
    counts[-1] = args.bundles - args.bundles_per_node * (nodes - 1)
    cluster = RayVirtualCluster(
        counts, use_gpus=False, use_unified_pg=True, ray_seam=ModelSeam(model), name="bench"
    )
    cluster._node_placement_groups = [SimpleNamespace(bundle_specs=[{"CPU": 1}] * args.bundles)]
    started = time.process_time()
    found = call(cluster)
    cpu_ms = (time.process_time() - started) * 1000
    modelled = model.now
    assert len(found) == args.bundles
    assert len(set(found)) == args.bundles, "every (address, port) is distinct"
    return Outcome(way, modelled, model.submitted, model.gets, model.waits, cpu_ms)


def best_of(repeat: int, once: Callable[[], Outcome]) -> Outcome:
    """The run with the least driver CPU (the model's figures are the same every run)."""
    return min((once() for _ in range(repeat)), key=lambda outcome: outcome.driver_cpu_ms)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bundles", type=int, default=1024)
    parser.add_argument("--bundles-per-node", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--rtt-ms", type=float, default=1.0)
    parser.add_argument("--submit-ms", type=float, default=0.05)
    parser.add_argument("--task-ms", type=float, default=3.0)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    pairs = [(0, i) for i in range(args.bundles)]
    for way in ("batched", "per-bundle"):  # warm-up: first calls build caches
        warm = argparse.Namespace(**{**vars(args), "bundles": 16})
        run(
            way,
            warm,
            lambda c: c.get_available_addresses_and_ports_batch([(0, i) for i in range(16)]),
        )
    outcomes = [
        best_of(
            args.repeat,
            lambda: run(
                "batched",
                args,
                lambda c: c.get_available_addresses_and_ports_batch(
                    pairs, batch_size=args.batch_size
                ),
            ),
        ),
        best_of(
            args.repeat,
            lambda: run(
                "per-bundle",
                args,
                lambda c: [c.get_available_address_and_port(pg, b) for pg, b in pairs],
            ),
        ),
    ]
    print(
        f"port discovery for {args.bundles} bundles ({args.bundles_per_node} per node), "
        f"batch_size={args.batch_size}; model: rtt {args.rtt_ms} ms, submit {args.submit_ms} ms, "
        f"task {args.task_ms} ms, {args.slots} task slots per node"
    )
    print(
        f"{'way':<11} {'modelled wall':>14} {'tasks':>6} {'gets':>6} {'waits':>6} {'driver CPU':>11}"
    )
    for o in outcomes:
        print(
            f"{o.way:<11} {o.modelled_ms:>11.1f} ms {o.submitted:>6} {o.gets:>6} {o.waits:>6} "
            f"{o.driver_cpu_ms:>8.1f} ms"
        )
    batched, single = outcomes
    print(
        f"per-bundle / batched: {single.modelled_ms / batched.modelled_ms:.0f}x modelled wall time, "
        f"{(single.gets + single.waits) / (batched.gets + batched.waits):.0f}x Ray round trips"
    )


if __name__ == "__main__":
    main()
