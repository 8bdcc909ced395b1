"""`raylens watch` against a real Ray cluster, and against an address nobody serves."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def _watch(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "raylens", "watch", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_watch_once_json_lists_every_node_of_the_cluster(ray_cluster) -> None:
    result = _watch("--address", ray_cluster.address, "--once", "--json", "--interval", "5")
    assert result.returncode == 0, result.stderr
    (record,) = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    nodes = {node["node_id"]: node for node in record["nodes"]}
    assert set(nodes) == set(ray_cluster.node_ids)
    for node in nodes.values():
        assert node["error"] is None
        assert 0 < node["used_bytes"] < node["total_bytes"]


def test_watch_of_an_unreachable_address_is_one_line_and_exit_2() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        result = _watch("--address", f"127.0.0.1:{port}", "--once", timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"raylens: error: cannot reach a Ray cluster at '127.0.0.1:{port}': Connection refused"
    ]


def test_watch_of_a_grpc_server_that_is_not_a_gcs_is_one_line_and_exit_2() -> None:
    """As the Ray Client port, a raylet or an OTLP collector: gRPC, but no GCS service."""
    from concurrent import futures

    import grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        result = _watch("--address", f"127.0.0.1:{port}", "--once", timeout=60)
    finally:
        server.stop(grace=None)
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"raylens: error: cannot reach a Ray cluster at '127.0.0.1:{port}': ")
    assert "speaks gRPC but is not a Ray GCS" in line


def test_watch_of_a_ray_client_address_says_what_to_pass() -> None:
    result = _watch("--address", "ray://127.0.0.1:10001", "--once", timeout=60)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "Ray Client" in line and "--address 127.0.0.1:6379" in line
