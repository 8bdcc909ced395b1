"""Real Ray for the integration tests: one three-node local cluster for the whole session.

``ray.cluster_utils.Cluster`` starts a head and two more raylets on this machine, each
with its own metrics endpoint, two CPUs and a small object store. Starting it takes
seconds, so every test shares it; the fixture shuts it down at the end of the session
and checks that none of its raylet or GCS processes outlive it.

The directory of this file is put on ``PYTHONPATH`` for the driver and every Ray
worker, so worker classes in ``group_workers.py`` import by name on any node.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent

NODE_COUNT = 3
NODE_CPUS = 2
OBJECT_STORE_BYTES = 80 * 1024 * 1024


@dataclass
class RayTestCluster:
    """What tests need to know about the session cluster."""

    address: str
    node_ids: list[str]
    node_ips: dict[str, str] = field(default_factory=dict)


def _cluster_pids(cluster: Any) -> dict[int, str]:
    """pid -> process type of every raylet and GCS server the cluster started."""
    pids: dict[int, str] = {}
    for node in cluster.list_all_nodes():
        for process_type, infos in node.all_processes.items():
            if process_type in ("raylet", "gcs_server"):
                for info in infos:
                    pids[info.process.pid] = process_type
    return pids


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[RayTestCluster]:
    """A connected three-node Ray cluster, shared by the whole session."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    saved_pythonpath = os.environ.get("PYTHONPATH")
    pythonpath = os.pathsep.join(filter(None, [str(HERE), saved_pythonpath]))
    os.environ["PYTHONPATH"] = pythonpath
    node_args = {"num_cpus": NODE_CPUS, "object_store_memory": OBJECT_STORE_BYTES}
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            **node_args,
            "include_dashboard": False,
            # Ray's metrics agents report every second (default 10 s), so what the
            # group-memory samplers publish reaches the node endpoints within seconds.
            "_system_config": {"metrics_report_interval_ms": 1000},
        },
    )
    pids: dict[int, str] = {}
    try:
        for _ in range(NODE_COUNT - 1):
            cluster.add_node(**node_args)
        cluster.wait_for_nodes()
        pids = _cluster_pids(cluster)
        ray.init(
            address=cluster.address,
            runtime_env={"env_vars": {"PYTHONPATH": pythonpath}},
            log_to_driver=True,
        )
        nodes = [node for node in ray.nodes() if node["Alive"]]
        yield RayTestCluster(
            address=cluster.address,
            node_ids=[node["NodeID"] for node in nodes],
            node_ips={node["NodeID"]: node["NodeManagerAddress"] for node in nodes},
        )
    finally:
        ray.shutdown()
        cluster.shutdown()
        if saved_pythonpath is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved_pythonpath
    left = {pid: kind for pid, kind in pids.items() if _alive(pid)}
    assert not left, f"Ray processes outlived the session cluster: {left}"
