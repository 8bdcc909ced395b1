"""A driver on a one-node Ray whose memory monitor kills a ``policy`` worker; prints what raylens saw.

Run by ``test_oom_postmortem_ray.py`` in a process of its own, since it starts its own
Ray (``memory_usage_threshold`` set just above the memory in use, a 100 ms memory
monitor) while the test session may hold another. Usage: ``oom_driver.py OUT_DIR``;
the last line printed is a JSON summary.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import ray
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from ray.cluster_utils import Cluster

from raylens.distributed._worker_dispatch import MultiWorkerFuture
from raylens.distributed.group_memory_cycle import GroupMemoryCycle, attach_group_memory
from raylens.distributed.group_memory_sampler import GroupMemorySamplers
from raylens.distributed.virtual_cluster import RayVirtualCluster
from raylens.distributed.worker_groups import RayWorkerBuilder, RayWorkerGroup
from raylens.lens import init_telemetry, shutdown_telemetry
from raylens.telemetry import host_memory
from raylens.telemetry.growth import GrowthCycle, attach_growth
from raylens.telemetry.history import resolve_kill_line_config
from raylens.telemetry.oom import (
    RL_HOST_OOM_KILLS_METRIC,
    OomWatch,
    PostMortemWriter,
    attach_oom_watch,
)

HERE = Path(__file__).resolve().parent
GIB = 2**30
#: The threshold sits this far above the memory in use before Ray starts: room for Ray
#: itself, the worker group and the samplers, which must not be killed.
HEADROOM = 3 * GIB
INTERVAL_S = 1.0


def _allocate(worker: Any, target: int) -> int:
    """Hold ``target`` bytes, touched, in 64 MiB steps, then wait to be killed."""
    held = worker.__dict__.setdefault("_raylens_ballast", [])
    step = 64 * 2**20
    for _ in range(target // step):
        held.append(bytearray(b"\x01") * step)
        time.sleep(0.02)  # the allocation's own pace, so the monitor sees it climb
    time.sleep(120)  # killed long before this ends
    return len(held)


def _counter_points(reader: InMemoryMetricReader) -> dict[str, float]:
    data = reader.get_metrics_data()
    found: dict[str, float] = {}
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == RL_HOST_OOM_KILLS_METRIC:
                    for point in metric.data.data_points:
                        attrs = dict(point.attributes or {})
                        found[f"{attrs['ray.node.id']}/{attrs['killer']}"] = point.value
    return found


def main(out_dir: str) -> dict[str, Any]:
    memory = psutil.virtual_memory()
    in_use = (memory.total - memory.available) / memory.total
    threshold = min(0.95, in_use + HEADROOM / memory.total)
    pythonpath = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    os.environ["PYTHONPATH"] = pythonpath
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 2,
            "object_store_memory": 80 * 2**20,
            "include_dashboard": False,
            "_system_config": {
                "memory_usage_threshold": threshold,
                "memory_monitor_refresh_ms": 100,
                "metrics_report_interval_ms": 1000,
            },
        },
    )
    summary: dict[str, Any] = {"threshold": threshold, "in_use": in_use}
    monitor = None
    try:
        ray.init(address=cluster.address, runtime_env={"env_vars": {"PYTHONPATH": pythonpath}})
        reader = InMemoryMetricReader()
        init_telemetry(metric_reader=reader)
        monitor = host_memory.HostMemoryMonitor(
            INTERVAL_S, scrape_mode="helper", consumer=True, scrape_timeout=2.0
        )
        kill_line = resolve_kill_line_config(threshold=threshold)
        # As the driver has it: a sampler on the node keeps its history, which the
        # post-mortem asks for.
        samplers = GroupMemorySamplers(kill_line=kill_line, growth_window_s=60.0)
        attach_group_memory(monitor, GroupMemoryCycle(samplers, every_node=True))
        growth = attach_growth(
            monitor, GrowthCycle(kill_line=kill_line, node_history=samplers.recent_history)
        )
        attach_oom_watch(monitor, OomWatch(growth=growth, writer=PostMortemWriter(out_dir)))
        # The sampler starts first and answers before the group exists: Ray's memory
        # monitor picks the newest of the driver's workers, which must be the policy one.
        monitor.start()
        node_id = ray.get_runtime_context().get_node_id()
        deadline = time.monotonic() + 60.0
        while samplers.recent_history(node_id, time.time()) is None:
            assert time.monotonic() < deadline, "the node's sampler never answered"
            time.sleep(0.2)
        virtual = RayVirtualCluster([1], use_gpus=False, name="oom", placement_timeout_s=60)
        group = RayWorkerGroup(
            virtual, RayWorkerBuilder("group_workers.EnvWorker"), name_prefix="policy"
        )
        time.sleep(3 * INTERVAL_S)  # the eviction counter's baseline is read
        ref = group.workers[0].__ray_call__.remote(_allocate, HEADROOM + 2 * GIB)
        started = time.monotonic()
        try:
            group.get_all_worker_results(MultiWorkerFuture([ref], called_workers=[0]))
            summary["error"] = None
        except Exception as error:
            summary["error"] = type(error).__name__
        failed_at = time.monotonic()
        summary["kill_after_s"] = failed_at - started

        def named() -> list[dict[str, Any]]:
            files = [json.loads(p.read_text()) for p in Path(out_dir).glob("*.json")]
            return [f for f in files if f["victim"]["group"] == "policy"]

        deadline = failed_at + 10 * INTERVAL_S
        while not named() and time.monotonic() < deadline:
            time.sleep(0.05)
        summary["postmortem_after_s"] = time.monotonic() - failed_at
        summary["postmortems"] = [json.loads(p.read_text()) for p in Path(out_dir).glob("*.json")]
        time.sleep(3 * INTERVAL_S)  # the counter reaches the endpoint: still one kill
        summary["counter"] = _counter_points(reader)
        summary["interval_s"] = INTERVAL_S
        summary["node_id"] = ray.get_runtime_context().get_node_id()
        group.shutdown()
        virtual.shutdown()
    finally:
        if monitor is not None:
            monitor.stop()
        shutdown_telemetry()
        ray.shutdown()
        cluster.shutdown()
    return summary


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])), flush=True)
