"""A driver on a three-node Ray cluster of its own, with raylens' samplers and two worker groups.

Run by ``test_prometheus_source_ray.py`` in a process of its own, since it starts its own
cluster (the head with its dashboard, which writes Ray's Prometheus service-discovery
file; metrics reported every second) while the test session may hold another. Telemetry
starts the way a job starts it (:func:`init_telemetry_driver`), then ``policy`` and
``rollout`` are built. It prints one JSON line (the GCS address, the service-discovery
file, each node's id and metrics address), then reads commands from standard input:
``kill NODE_ID`` stops that node at once and prints ``killed <Unix time>``; end of input
shuts everything down.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

import ray
from ray._private import ray_constants
from ray.cluster_utils import Cluster

from raylens.driver import init_telemetry_driver
from raylens.lens import TelemetryConfig, shutdown_telemetry


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> int:
    from group_workers import policy_and_rollout

    node_args = {"num_cpus": 2, "object_store_memory": 80 * 1024 * 1024}
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            **node_args,
            "include_dashboard": True,
            "dashboard_host": "127.0.0.1",
            "dashboard_port": _free_port(),
            "_system_config": {"metrics_report_interval_ms": 1000},
        },
    )
    try:
        workers = [cluster.add_node(**node_args) for _ in range(2)]
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        init_telemetry_driver(TelemetryConfig(exporter="none"), host_memory_interval=1.0)
        with policy_and_rollout("prometheus-source"):
            sd_file = os.path.join(
                cluster.head_node.get_session_dir_path(),
                ray_constants.PROMETHEUS_SERVICE_DISCOVERY_FILE,
            )
            nodes = [
                {
                    "node_id": node["NodeID"],
                    "metrics": f"{node['NodeManagerAddress']}:{node['MetricsExportPort']}",
                }
                for node in ray.nodes()
                if node["Alive"]
            ]
            by_id = {worker.node_id: worker for worker in workers}
            print(
                json.dumps(
                    {
                        "address": cluster.address,
                        "sd_file": sd_file,
                        "nodes": nodes,
                        "killable": sorted(by_id),
                    }
                ),
                flush=True,
            )
            for line in sys.stdin:
                command, _, node_id = line.strip().partition(" ")
                if command == "kill" and node_id in by_id:
                    cluster.remove_node(by_id.pop(node_id), allow_graceful=False)
                    print(f"killed {time.time()!r}", flush=True)
    finally:
        shutdown_telemetry()
        ray.shutdown()
        cluster.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
