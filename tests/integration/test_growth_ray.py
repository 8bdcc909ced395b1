"""Growth on real Ray: a policy worker that leaks shows up as policy's growth, everywhere.

The samplers publish through Ray's metrics pipeline (the shared cluster reports every
second), the driver's monitor reads the figures back from the raylets' endpoints, and
``raylens watch`` started as another process shows the same group's memory and growth.
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

from raylens.distributed._group_memory_wiring import (  # noqa: E402
    GroupMemoryCycle,
    attach_group_memory,
)
from raylens.distributed.group_memory_sampler import GroupMemorySamplers  # noqa: E402
from raylens.distributed.worker_groups import RayWorkerGroup  # noqa: E402
from raylens.telemetry import host_memory  # noqa: E402
from raylens.telemetry.growth import GrowthCycle, attach_growth  # noqa: E402
from raylens.telemetry.history import GrowthSettings  # noqa: E402

MB = 10**6
RATE = 10 * MB  # bytes per second
LEAK_S = 90.0
WINDOW_S = 30.0


def _leak(worker: Any, rate: int, seconds: float) -> None:
    """Grow the worker by ``rate`` bytes a second for ``seconds``, on a thread of its own."""

    def grow() -> None:
        held = worker.__dict__.setdefault("_raylens_leak", [])
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            held.append(b"\x01" * (rate // 10))  # touched: every page is resident
            time.sleep(0.1)  # the leak's own pace, not synchronisation

    threading.Thread(target=grow, daemon=True).start()


@pytest.fixture
def groups(ray_cluster) -> Iterator[dict[str, RayWorkerGroup]]:
    with policy_and_rollout("growth") as made:
        yield made


@pytest.mark.timeout(420)
def test_a_leaking_policy_worker_grows_policy_only_and_watch_elsewhere_shows_it(
    ray_cluster, groups, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAYLENS_GROWTH_WINDOW", str(int(WINDOW_S)))
    monitor = host_memory.HostMemoryMonitor(
        1.0, scrape_mode="inprocess", consumer=True, scrape_timeout=5.0
    )
    samplers = GroupMemorySamplers(sample_interval_s=1.0)
    attach_group_memory(monitor, GroupMemoryCycle(samplers))
    growth = attach_growth(monitor, GrowthCycle(settings=GrowthSettings.from_env()))
    policy = groups["policy"]
    policy_node = ray.get(policy.workers[0].node_id.remote())
    try:
        # The samplers start at the first cycle and publish within a report interval.
        def published() -> bool:
            monitor.collect_once()
            figures = monitor.group_figures().get(policy_node)
            return figures is not None and "policy" in {f.group for f in figures[1].groups}

        started = time.monotonic()
        wait_for(published, 90.0, "policy's figures on its node's endpoint")
        print(f"policy's figures published after {time.monotonic() - started:.1f} s")
        ray.get(policy.workers[0].__ray_call__.remote(_leak, RATE, LEAK_S))
        leak_started = time.monotonic()

        def grown() -> dict[str, float] | None:
            monitor.collect_once()
            outlook = growth.snapshot.latest().get(policy_node)
            if outlook is None or time.monotonic() - leak_started < 2 * WINDOW_S:
                return None
            return outlook.group_growth

        rates = wait_for(grown, LEAK_S, "a full growth window of the leak")
        assert rates.get("policy", 0.0) >= 0.8 * RATE, rates
        for node, outlook in growth.snapshot.latest().items():
            if "rollout" in outlook.group_growth:
                assert abs(outlook.group_growth["rollout"]) < 1 * MB, (node, outlook)

        # Another process, attached to the same cluster, sees the group and its growth.
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
        print(
            f"policy grew {rates['policy'] / MB:.2f} MB/s in the driver, "
            f"{row['worker_group_growth_bytes_per_second']['policy'] / MB:.2f} MB/s in watch"
        )
    finally:
        monitor.stop()
