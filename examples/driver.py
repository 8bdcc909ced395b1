"""A Ray driver with two worker groups and raylens telemetry: labelled host memory in seconds.

Run it (needs ``ray[default]``; plain ``ray`` serves no metrics to read)::

    RAYLENS_EXPORTER=console python examples/driver.py --duration 12

It starts a single-node Ray on this machine (or joins ``--address`` / ``RAY_ADDRESS``),
reserves one bundle per node with :class:`RayVirtualCluster`, places the worker groups
``policy`` and ``rollout`` on those bundles with :class:`RayWorkerGroup`, and starts
raylens with :func:`init_telemetry_driver`. The groups register where they run, so
every ``rl.host.memory.used`` / ``rl.host.memory.total`` point of a node carries
``rl.worker_groups="policy,rollout"``. The console exporter prints every 5 seconds in
a driver (``OTEL_METRIC_EXPORT_INTERVAL``, in milliseconds, changes that). At the end
telemetry is stopped first, so its final export still sees the groups, then the groups,
then Ray, which this script stops only if it started it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

# Every worker imports its class by this dotted path, never from the driver's
# __main__: see workers.py, which runtime_env ships to every node below.
WORKER_CLASS = "workers.MemoryWorker"
GROUP_NAMES = ("policy", "rollout")


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--duration", type=float, default=12.0, help="seconds to run once the groups are up"
    )
    parser.add_argument(
        "--nodes", type=int, default=1, help="nodes to place bundles on (1 when Ray is local)"
    )
    parser.add_argument(
        "--address",
        default=os.environ.get("RAY_ADDRESS") or None,
        help="Ray cluster to join (default RAY_ADDRESS; without either, start Ray here)",
    )
    parser.add_argument("--worker-megabytes", type=int, default=32, help="memory each worker holds")
    args = parser.parse_args(argv)
    if not args.duration > 0:
        parser.error(f"--duration {args.duration} must be a positive number of seconds")
    if args.nodes < 1:
        parser.error(f"--nodes {args.nodes} must be at least 1")
    return args


def _start_ray(address: str | None) -> bool:
    """Join ``address``, or start Ray here when it is None; True when Ray was started here."""
    import ray

    runtime_env = {"py_modules": [str(HERE / "workers.py")]}
    if address is None:
        # "local" starts a new Ray even where another one already runs on this
        # machine, which a bare ray.init() would join instead.
        ray.init(
            address="local",
            num_cpus=2,
            include_dashboard=False,
            logging_level="ERROR",
            log_to_driver=False,
            runtime_env=runtime_env,
        )
        return True
    ray.init(address=address, logging_level="ERROR", log_to_driver=False, runtime_env=runtime_env)
    return False


def _build_groups(nodes: int, worker_megabytes: int) -> tuple[Any, dict[str, Any]]:
    """Reserve one bundle per node and place both groups on every bundle."""
    import ray

    from raylens.distributed import RayVirtualCluster, RayWorkerBuilder, RayWorkerGroup

    cluster = RayVirtualCluster(
        [1] * nodes, use_gpus=False, name="raylens-example", placement_timeout_s=60.0
    )
    builder = RayWorkerBuilder(WORKER_CLASS, worker_megabytes)
    groups: dict[str, Any] = {}
    try:
        for name in GROUP_NAMES:
            groups[name] = RayWorkerGroup(cluster, builder, workers_per_node=1, name_prefix=name)
        for name, group in groups.items():
            placed = ray.get(group.run_all_workers_single_data("where"), timeout=120)
            nodes_of_group = sorted({worker["node_id"][:8] for worker in placed})
            print(
                f"worker group {name!r}: {len(placed)} worker(s) on node(s) "
                f"{', '.join(nodes_of_group)}",
                flush=True,
            )
    except BaseException:
        _shut_down_groups(cluster, groups)
        raise
    return cluster, groups


def _shut_down_groups(cluster: Any, groups: dict[str, Any]) -> None:
    for group in groups.values():
        group.shutdown(timeout=10.0)
    cluster.shutdown()


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    import ray

    from raylens.driver import init_telemetry_driver
    from raylens.lens import shutdown_telemetry

    started_here = _start_ray(args.address)
    try:
        # After ray.init (the monitor lists the cluster's nodes) and before the
        # groups, so that their first points are already labelled.
        init_telemetry_driver(host_memory_interval=1.0)
        cluster, groups = _build_groups(args.nodes, args.worker_megabytes)
        try:
            print(f"running for {args.duration:g} s", flush=True)
            time.sleep(args.duration)
        finally:
            # Telemetry first: its last export then still shows the groups' labels.
            shutdown_telemetry()
            _shut_down_groups(cluster, groups)
    finally:
        shutdown_telemetry()
        ray.shutdown()
    print("worker groups and telemetry shut down" + (", Ray stopped" if started_here else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
