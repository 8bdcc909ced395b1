"""``raylens watch --prometheus`` against a real Prometheus scraping a real three-raylet cluster.

The cluster runs in a driver process of its own (``prometheus_driver.py``: samplers on
every node, ``policy`` and ``rollout``, a 40 s growth window); Prometheus finds the nodes
through Ray's service-discovery file and scrapes them every second. Read through
Prometheus, the watch shows the same nodes, groups and growth as the watch that scrapes
the nodes; and a node stopped under it turns failing within two scrape intervals.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from group_workers import wait_for

pytestmark = pytest.mark.integration
pytest.importorskip("ray")

HERE = Path(__file__).resolve().parent
PROMETHEUS = shutil.which("prometheus")
SCRAPE_INTERVAL_S = 1.0
WATCH_INTERVAL_S = 0.5
WINDOW_S = 40


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _env() -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    return dict(
        os.environ,
        PYTHONPATH=path,
        RAYLENS_GROWTH_WINDOW=str(WINDOW_S),
        RAYLENS_PROMETHEUS_SCRAPE_INTERVAL=str(SCRAPE_INTERVAL_S),
    )


@pytest.fixture
def driver() -> Iterator[tuple[subprocess.Popen[str], dict[str, Any]]]:
    process = subprocess.Popen(
        [sys.executable, str(HERE / "prometheus_driver.py")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
        assert first, "the driver ended before its cluster was up"
        yield process, json.loads(first)
    finally:
        assert process.stdin is not None
        process.stdin.close()
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def prometheus(
    driver: tuple[subprocess.Popen[str], dict[str, Any]], tmp_path: Path
) -> Iterator[str]:
    if PROMETHEUS is None:
        pytest.skip("the prometheus binary is not installed")
    _process, info = driver
    port = _free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n"
        f"  scrape_interval: {SCRAPE_INTERVAL_S:g}s\n"
        "scrape_configs:\n"
        "  - job_name: ray\n"
        "    file_sd_configs:\n"
        f"      - files: ['{info['sd_file']}']\n"
    )
    server = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=30)


def _query(url: str, expr: str) -> list[dict[str, Any]]:
    try:
        body = requests.post(f"{url}/api/v1/query", data={"query": expr}, timeout=5).json()
    except (requests.RequestException, ValueError):
        return []
    return body.get("data", {}).get("result", [])


def _watch_once(*args: str) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-m", "raylens", "watch", *args, "--once", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1])


def _shown(record: dict[str, Any]) -> dict[str, tuple[Any, ...]]:
    return {
        node["node_id"]: (
            node["error"],
            node["worker_groups"],
            sorted(node["worker_group_rss_bytes"]),
            node["growth_bytes_per_second"] is not None,
            sorted(node["worker_group_growth_bytes_per_second"]),
            node["growth_unavailable"],
        )
        for node in record["nodes"]
    }


@pytest.mark.timeout(600)
def test_watch_through_prometheus_matches_the_direct_watch_and_sees_a_node_stop(
    driver: tuple[subprocess.Popen[str], dict[str, Any]], prometheus: str
) -> None:
    process, info = driver
    address = info["address"]
    instances = {node["metrics"] for node in info["nodes"]}
    assert len(instances) == 3
    # Every node's sampler publishes, and its growth window is full, in Prometheus.
    wait_for(
        lambda: (
            {
                series["metric"]["instance"]
                for series in _query(prometheus, "ray_raylens_node_memory_growth_bytes_per_second")
            }
            >= instances
        ),
        240,
        "every node's growth in Prometheus",
    )

    def agree() -> tuple[dict[str, Any], dict[str, Any]] | None:
        direct = _shown(_watch_once("--address", address))
        through = _shown(_watch_once("--prometheus", prometheus, "--address", address))
        return (direct, through) if direct == through else None

    _direct, through = wait_for(agree, 120, "both watches to show the same figures")
    assert set(through) == {node["node_id"] for node in info["nodes"]}
    labels = {groups for _error, groups, *_rest in through.values()}
    assert any("policy" in label for label in labels), labels
    assert any("rollout" in label for label in labels), labels
    assert all(error is None and grows for error, _g, _r, grows, *_rest in through.values())

    # A node stopped under a running watch turns failing within two scrape intervals.
    records: list[dict[str, Any]] = []
    watch = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "raylens",
            "watch",
            "--prometheus",
            prometheus,
            "--json",
            "--interval",
            str(WATCH_INTERVAL_S),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=_env(),
    )

    def read() -> None:
        assert watch.stdout is not None
        for line in watch.stdout:
            if line.startswith("{"):
                records.append(json.loads(line))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        wait_for(
            lambda: records and len([n for n in records[-1]["nodes"] if n["error"] is None]) == 3,
            60,
            "the watch to show three live nodes",
        )
        victim = info["killable"][0]
        instance = next(n["metrics"] for n in info["nodes"] if n["node_id"] == victim)
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(f"kill {victim}\n")
        process.stdin.flush()
        # Ray may say something of the node it stopped first: the answer is the line after.
        answer = process.stdout.readline()
        while answer and not answer.startswith("killed "):
            answer = process.stdout.readline()
        killed = float(answer.split()[1])

        def failing_at() -> float | None:
            for record in list(records):
                if record["time"] < killed:
                    continue
                for node in record["nodes"]:
                    if node["node_id"] == instance and node["error"] is not None:
                        return float(record["time"])
            return None

        seen = wait_for(failing_at, 30, "the stopped node to turn failing")
        assert seen - killed <= 2 * SCRAPE_INTERVAL_S + WATCH_INTERVAL_S
    finally:
        watch.terminate()
        watch.wait(timeout=30)
