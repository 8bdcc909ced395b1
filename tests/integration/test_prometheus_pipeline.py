"""A real Prometheus server scrapes raylens' Prometheus exporter during `raylens simulate`."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from group_workers import wait_for

pytestmark = pytest.mark.integration

PROMETHEUS = shutil.which("prometheus")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def raylens_simulate() -> Iterator[int]:
    port = _free_port()
    env = dict(os.environ, RAYLENS_PROMETHEUS_ADDR=f"127.0.0.1:{port}")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "raylens",
            "simulate",
            "--nodes",
            "4",
            "--hung",
            "1",
            "--interval",
            "1",
            "--json",
            "--exporter",
            "prometheus",
            "--duration",
            "120",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(
            lambda: _scrape_ok(port) or process.poll() is not None,
            30,
            "raylens' Prometheus endpoint",
        )
        assert process.poll() is None, process.stderr.read().decode()
        yield port
    finally:
        _stop(process)


def _scrape_ok(port: int) -> bool:
    try:
        return (
            "rl_host_memory_used"
            in requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
        )
    except requests.RequestException:
        return False


@pytest.mark.skipif(PROMETHEUS is None, reason="the prometheus binary is not installed")
def test_prometheus_scrapes_host_memory_with_labels(raylens_simulate: int, tmp_path: Path) -> None:
    web_port = _free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n"
        "  scrape_interval: 1s\n"
        "scrape_configs:\n"
        "  - job_name: raylens\n"
        "    static_configs:\n"
        f"      - targets: ['127.0.0.1:{raylens_simulate}']\n"
    )
    server = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{web_port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        api = f"http://127.0.0.1:{web_port}/api/v1/query"

        def query(expr: str) -> list[dict]:
            try:
                body = requests.get(api, params={"query": expr}, timeout=2).json()
            except (requests.RequestException, ValueError):
                return []
            return body.get("data", {}).get("result", [])

        used = wait_for(lambda: query('{__name__=~"rl_host_memory_used.*"}'), 60, "used series")
        total = wait_for(lambda: query('{__name__=~"rl_host_memory_total.*"}'), 30, "totals")
        # Four simulated nodes, one hung: three live points, each a distinct node id.
        assert len({series["metric"]["ray_node_id"] for series in used}) == 3
        for series in used:
            labels = series["metric"]
            assert labels["host_name"].startswith("sim-node-")
            assert labels["rl_worker_groups"] in {"policy", "rollout"}
            assert 0 < float(series["value"][1]) <= 64 * 1024**3
        assert {float(series["value"][1]) for series in total} == {64 * 1024**3}
    finally:
        server.terminate()
        server.wait(timeout=15)
