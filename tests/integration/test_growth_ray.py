"""Growth on real Ray, through the documented path: a leaking policy worker, seen by every reader.

The driver starts telemetry with :func:`init_telemetry_driver` and nothing else: the
samplers read every node at their default interval and compute each node's growth there,
over ``RAYLENS_GROWTH_WINDOW=120`` (the one setting a user would change here). The driver's
exported series show policy's growth and the node's time to its kill line, and ``raylens
watch --once --json`` started as another process shows the same growth in its one record,
since it reads the figures the nodes publish and keeps no history of its own. (The shared
cluster's metrics agents report every second, a Ray setting of the session fixture.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytestmark = pytest.mark.integration
ray = pytest.importorskip("ray")

from group_workers import policy_and_rollout, wait_for  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402

from raylens.distributed.worker_groups import RayWorkerGroup  # noqa: E402
from raylens.driver import init_telemetry_driver  # noqa: E402
from raylens.lens import TelemetryConfig, shutdown_telemetry  # noqa: E402

MB = 10**6
RATE = 10 * MB  # bytes per second
WINDOW_S = 120
WITHIN_S = 200.0
LEAK_S = WITHIN_S + 60.0  # still leaking while watch runs


def _leak(worker: Any, rate: int, seconds: float) -> None:
    """Grow the worker by ``rate`` bytes a second for ``seconds``, on a thread of its own."""

    def grow() -> None:
        held = worker.__dict__.setdefault("_raylens_leak", [])
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            held.append(b"\x01" * (rate // 10))  # touched: every page is resident
            time.sleep(0.1)  # the leak's own pace, not synchronisation
        held.clear()

    threading.Thread(target=grow, daemon=True).start()


def _points(reader: InMemoryMetricReader, name: str) -> list[tuple[dict[str, Any], float]]:
    data = reader.get_metrics_data()
    found = []
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    found.extend(
                        (dict(point.attributes or {}), point.value)
                        for point in metric.data.data_points
                    )
    return found


@pytest.fixture
def groups(ray_cluster) -> Iterator[dict[str, RayWorkerGroup]]:
    with policy_and_rollout("growth") as made:
        yield made


@pytest.mark.timeout(600)
def test_a_leaking_policy_worker_shows_in_the_driver_and_in_watch_elsewhere_with_defaults(
    ray_cluster, groups, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAYLENS_GROWTH_WINDOW", str(WINDOW_S))
    reader = InMemoryMetricReader()
    init_telemetry_driver(TelemetryConfig(exporter="none"), metric_reader=reader)
    policy = groups["policy"]
    policy_node = ray.get(policy.workers[0].node_id.remote())
    try:

        def every_node_publishes() -> bool:
            limits = _points(reader, "rl.host.memory.limit")
            return {attrs["ray.node.id"] for attrs, _ in limits} >= set(ray_cluster.node_ids)

        wait_for(every_node_publishes, 120.0, "a kill line from every node's sampler")
        ray.get(policy.workers[0].__ray_call__.remote(_leak, RATE, LEAK_S))
        leak_started = time.monotonic()
        seen: dict[str, float] = {}

        def grown_and_timed() -> bool:
            elapsed = time.monotonic() - leak_started
            for attrs, value in _points(reader, "rl.worker_group.memory.growth"):
                if attrs.get("ray.node.id") != policy_node:
                    continue
                if attrs.get("rl.worker_group") == "policy" and value >= 0.8 * RATE:
                    seen.setdefault("growth", elapsed)
                if attrs.get("rl.worker_group") == "rollout":
                    seen["rollout"] = max(seen.get("rollout", 0.0), abs(value))
            for attrs, _value in _points(reader, "rl.host.memory.time_to_limit"):
                if attrs.get("ray.node.id") == policy_node:
                    seen.setdefault("time_to_limit", elapsed)
            return "growth" in seen and "time_to_limit" in seen

        try:
            wait_for(grown_and_timed, WITHIN_S, "policy's growth and its node's time to limit")
        finally:
            print(f"after the leak started (s): {seen}")
        assert seen["growth"] <= WITHIN_S, seen
        assert seen["time_to_limit"] <= WITHIN_S, seen
        assert seen.get("rollout", 0.0) < 1 * MB, seen

        # Another process, attached to the same cluster, reads the same figures at once.
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "raylens",
                "watch",
                "--address",
                ray_cluster.address,
                "--once",
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env=dict(os.environ),
        )
        assert run.returncode == 0, run.stderr[-2000:]
        record = json.loads(run.stdout.strip().splitlines()[-1])
        row = next(node for node in record["nodes"] if node["node_id"] == policy_node)
        assert row["worker_group_rss_bytes"].get("policy", 0) > 0, row
        assert row["worker_group_growth_bytes_per_second"].get("policy", 0) >= 0.8 * RATE, row
        assert row["growth_unavailable"] is None, row
        print(f"watch elsewhere: policy grows {row['worker_group_growth_bytes_per_second']}")
    finally:
        shutdown_telemetry()
