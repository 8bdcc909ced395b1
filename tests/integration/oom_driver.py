"""A driver whose ``policy`` and ``rollout`` workers Ray's memory monitor kills; prints what raylens saw.

Run by ``test_oom_postmortem_ray.py`` in a process of its own, since it starts its own
one-node Ray (``memory_usage_threshold`` :data:`HEADROOM` above the memory in use, a
100 ms memory monitor, metrics reported every second) while the test session may hold
another. Telemetry is started the way a job starts it (:func:`init_telemetry_driver`,
post-mortems into ``RAYLENS_POSTMORTEM_DIR``); the two groups share one bundle; inside
``raylens.phase("train")`` ``rollout`` holds :data:`ROLLOUT_BYTES` and ``policy``
allocates past the threshold, and the results are fetched with a plain ``ray.get``.
Usage: ``oom_driver.py OUT_DIR``; the last line printed is a JSON summary.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import ray
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from ray.cluster_utils import Cluster

import raylens
from raylens.distributed.virtual_cluster import RayVirtualCluster
from raylens.distributed.worker_groups import RayWorkerBuilder, RayWorkerGroup
from raylens.driver import init_telemetry_driver
from raylens.lens import shutdown_telemetry
from raylens.telemetry.oom import POSTMORTEM_DIR_ENV, RL_HOST_OOM_KILLS_METRIC
from raylens.telemetry.raylet_payload import RAY_GROUP_MEMORY, parse_oom_samples

HERE = Path(__file__).resolve().parent
GIB = 2**30
#: The threshold sits this far above the memory in use before Ray starts.
HEADROOM = int(2.5 * GIB)
#: What ``rollout`` holds; ``policy`` then allocates past the threshold on its own, so
#: that after ``rollout`` (the newer worker) is killed the node is still over it.
ROLLOUT_BYTES = 1 * GIB
POLICY_BYTES = HEADROOM + 1 * GIB
INTERVAL_S = 1.0


def _allocate(worker: Any, target: int) -> int:
    """Hold ``target`` bytes, touched, in 64 MiB steps, then wait (to be killed)."""
    held = worker.__dict__.setdefault("_raylens_ballast", [])
    step = 64 * 2**20
    for _ in range(target // step):
        held.append(bytearray(b"\x01") * step)
        time.sleep(0.02)  # the allocation's own pace, so the monitor sees it climb
    time.sleep(60)  # killed before this ends, or woken by the driver's shutdown
    return len(held)


def _hold(worker: Any, target: int) -> bool:
    held = worker.__dict__.setdefault("_raylens_ballast", [])
    held.append(bytearray(b"\x01") * target)
    return True


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


def _until(what: str, condition: Any, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout_s:g} s")
        time.sleep(0.1)


def main(out_dir: str) -> dict[str, Any]:
    memory = psutil.virtual_memory()
    in_use = (memory.total - memory.available) / memory.total
    threshold = min(0.95, in_use + HEADROOM / memory.total)
    pythonpath = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    os.environ["PYTHONPATH"] = pythonpath
    os.environ[POSTMORTEM_DIR_ENV] = out_dir
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
    made: list[Any] = []
    try:
        ray.init(address=cluster.address, runtime_env={"env_vars": {"PYTHONPATH": pythonpath}})
        (node,) = [n for n in ray.nodes() if n["Alive"]]
        endpoint = f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics"
        reader = InMemoryMetricReader()
        init_telemetry_driver(metric_reader=reader, host_memory_interval=INTERVAL_S)
        virtual = RayVirtualCluster(
            [1], use_gpus=False, name="oom", placement_timeout_s=60, max_colocated_worker_groups=2
        )
        made.append(virtual)
        groups = {}
        for name in ("policy", "rollout"):
            groups[name] = RayWorkerGroup(
                virtual, RayWorkerBuilder("group_workers.EnvWorker"), name_prefix=name
            )
            made.insert(0, groups[name])

        def published() -> bool:
            text = urllib.request.urlopen(endpoint, timeout=5).read().decode()
            return RAY_GROUP_MEMORY in text and 'rl_worker_group="policy"' in text

        _until("the samplers publish the groups' memory", published, 60)
        ray.get(groups["rollout"].workers[0].__ray_call__.remote(_hold, ROLLOUT_BYTES))
        started = time.monotonic()
        try:
            with raylens.phase("train"):
                ray.get(groups["policy"].workers[0].__ray_call__.remote(_allocate, POLICY_BYTES))
            summary["error"] = None
        except Exception as error:
            summary["error"] = type(error).__name__
        summary["kill_after_s"] = time.monotonic() - started

        def counted() -> dict[str, float]:
            text = urllib.request.urlopen(endpoint, timeout=5).read()
            counts = parse_oom_samples(text)
            return {} if counts is None else dict(counts.ray_victims)

        def files() -> list[dict[str, Any]]:
            return [json.loads(p.read_text()) for p in sorted(Path(out_dir).glob("oom-*.json"))]

        def all_written() -> bool:
            named = {v["ray_name"] for f in files() for v in f["victims"]}
            victims = counted()
            return bool(victims) and set(victims) <= named

        try:
            _until("every victim the raylet counts is in a post-mortem", all_written, 30)
        except TimeoutError as error:
            summary["timeout"] = str(error)
        summary["raylet_victims"] = counted()
        summary["postmortems"] = files()
        summary["counter"] = _counter_points(reader)
        summary["node_id"] = node["NodeID"]
        summary["modes"] = sorted(
            {oct(p.stat().st_mode & 0o777) for p in Path(out_dir).glob("oom-*.json")}
        )
    finally:
        for thing in made:
            thing.shutdown()
        shutdown_telemetry()
        ray.shutdown()
        cluster.shutdown()
    return summary


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])), flush=True)
