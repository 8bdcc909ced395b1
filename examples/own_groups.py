"""Host-memory labels for worker groups you build yourself, without RayWorkerGroup.

raylens' :class:`RayWorkerGroup` registers where its workers run. A team with its
own worker groups (its own placement groups and actors) tells raylens itself, in two
calls: once the group's workers are up, ``register_worker_group_placement(name,
[(placement_group, bundle_index), ...])`` (``-1`` stands for every bundle) or, when
the group knows its nodes rather than a placement group,
``register_worker_group_nodes(name, node_ids)``; and when the group shuts down,
``forget_worker_group_nodes(name)``, even if the shutdown failed. The two context
managers below hold a label for as long as a block runs.

Run it (needs ``ray[default]``)::

    RAYLENS_EXPORTER=console python examples/own_groups.py --duration 12

It starts Ray on this machine, builds a ``trainer`` group on a placement group and
a ``samplers`` group of plain actors, and prints points labelled
``rl.worker_groups="samplers,trainer"``. Only the Ray part needs Ray: the labelling
runs anywhere, which is how the unit tests run it on a simulated cluster.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from raylens.telemetry.host_memory import (
    forget_worker_group_nodes,
    register_worker_group_nodes,
    register_worker_group_placement,
)

HERE = Path(__file__).resolve().parent
EVERY_BUNDLE = -1


@contextmanager
def placement_label(
    name: str, placement_group: Any, bundle_indices: Iterable[int] = (EVERY_BUNDLE,)
) -> Iterator[None]:
    """Label the nodes under ``placement_group``'s bundles with ``name`` while the block runs.

    Enter it once the group's workers are up. Ray is asked where the bundles were
    placed when the block starts; the label goes when it ends, however it ends.
    """
    register_worker_group_placement(name, [(placement_group, i) for i in bundle_indices])
    try:
        yield
    finally:
        forget_worker_group_nodes(name)


@contextmanager
def nodes_label(name: str, node_ids: Iterable[str]) -> Iterator[None]:
    """Label the Ray nodes ``node_ids`` (hex ids) with ``name`` while the block runs."""
    register_worker_group_nodes(name, list(node_ids))
    try:
        yield
    finally:
        forget_worker_group_nodes(name)


# Everything below needs Ray: a driver with two hand-built worker groups. ------------


def _start_trainer(stack: ExitStack, count: int, megabytes: int) -> list[Any]:
    """``count`` workers on one placement group, labelled ``trainer`` from the placement."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    from workers import MemoryWorker  # importable by the workers too (see workers.py)

    group = placement_group([{"CPU": 0.5}] * count, name="trainer")
    stack.callback(remove_placement_group, group)
    ray.get(group.ready(), timeout=60)
    actor_class = ray.remote(MemoryWorker)
    workers = [
        actor_class.options(
            num_cpus=0.5,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                group, placement_group_bundle_index=i
            ),
        ).remote(megabytes)
        for i in range(count)
    ]
    for worker in workers:
        stack.callback(ray.kill, worker)
    ray.get([worker.where.remote() for worker in workers], timeout=120)
    stack.enter_context(placement_label("trainer", group))
    return workers


def _start_samplers(stack: ExitStack, count: int, megabytes: int) -> list[Any]:
    """``count`` plain actors, labelled ``samplers`` on the nodes they report."""
    import ray
    from workers import MemoryWorker

    actor_class = ray.remote(MemoryWorker)
    workers = [actor_class.options(num_cpus=0.5).remote(megabytes) for _ in range(count)]
    for worker in workers:
        stack.callback(ray.kill, worker)
    placed = ray.get([worker.where.remote() for worker in workers], timeout=120)
    stack.enter_context(nodes_label("samplers", {worker["node_id"] for worker in placed}))
    return workers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=12.0, help="seconds to run")
    args = parser.parse_args(argv)
    if not args.duration > 0:
        parser.error(f"--duration {args.duration} must be a positive number of seconds")

    import ray

    from raylens.driver import init_telemetry_driver
    from raylens.lens import shutdown_telemetry

    # "local": a Ray of our own even where another runs on this machine. The
    # workers' module travels with the job, so any node can import it.
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        logging_level="ERROR",
        log_to_driver=False,
        runtime_env={"py_modules": [str(HERE / "workers.py")]},
    )
    try:
        init_telemetry_driver(host_memory_interval=1.0)
        # The stack undoes in reverse: each label goes before its workers and
        # placement group, and telemetry (its last export still labelled) first.
        with ExitStack() as stack:
            _start_trainer(stack, count=2, megabytes=32)
            _start_samplers(stack, count=1, megabytes=32)
            stack.callback(shutdown_telemetry)
            print(
                f"groups trainer and samplers are up; running for {args.duration:g} s", flush=True
            )
            time.sleep(args.duration)
    finally:
        shutdown_telemetry()
        ray.shutdown()
    print("groups, telemetry and Ray shut down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
