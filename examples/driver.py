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

import ray

from raylens.distributed import RayVirtualCluster, RayWorkerBuilder, RayWorkerGroup
from raylens.driver import init_telemetry_driver
from raylens.lens import shutdown_telemetry

HERE = Path(__file__).resolve().parent
#: The longest run --duration may ask for: a year, well within what time.sleep accepts
#: (it fails with OverflowError or EINVAL somewhat below 2**63 nanoseconds).
MAX_DURATION_S = 365 * 24 * 3600


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
    # Checked here, before Ray or any group starts; NaN fails both comparisons.
    if not 0 < args.duration <= MAX_DURATION_S:
        parser.error(
            f"--duration {args.duration} must be a positive number of seconds, finite and "
            f"at most {MAX_DURATION_S} (a year)"
        )
    if args.nodes < 1:
        parser.error(f"--nodes {args.nodes} must be at least 1")
    return args


def _start_ray(address: str | None) -> bool:
    """Join ``address``, or start Ray here when it is None; True when Ray was started here."""
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


def run(duration: float, nodes: int = 1, worker_megabytes: int = 32) -> None:
    """Telemetry, one bundle per node and the groups policy and rollout, for ``duration`` s."""
    init_telemetry_driver(host_memory_interval=1.0)  # after ray.init, before the groups
    cluster = RayVirtualCluster([1] * nodes, use_gpus=False, name="raylens-example")
    builder = RayWorkerBuilder("workers.MemoryWorker", worker_megabytes)  # see workers.py
    groups = []
    try:
        for name in ("policy", "rollout"):
            groups.append(RayWorkerGroup(cluster, builder, workers_per_node=1, name_prefix=name))
            placed = ray.get(groups[-1].run_all_workers_single_data("where"), timeout=120)
            nodes_up = sorted({worker["node_id"][:8] for worker in placed})
            print(f"worker group {name!r} is up on node(s) {', '.join(nodes_up)}", flush=True)
        print(f"running for {duration:g} s", flush=True)
        time.sleep(duration)  # the job's work; the monitor and the exporter run meanwhile
    finally:
        shutdown_telemetry()  # first: its last export still sees the groups
        for group in groups:
            group.shutdown(timeout=10.0)  # each group withdraws its label
        cluster.shutdown()


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    started_here = _start_ray(args.address)
    try:
        run(args.duration, args.nodes, args.worker_megabytes)
    finally:
        ray.shutdown()
    print("worker groups and telemetry shut down" + (", Ray stopped" if started_here else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
