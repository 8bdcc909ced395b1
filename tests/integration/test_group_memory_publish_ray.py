"""Per-group memory through Ray's own metrics pipeline, on real Ray.

A publishing sampler (started by :meth:`GroupMemorySamplers.maintain`, reading every
0.5 s) sets its gauges inside its actor; the node's metrics agent must then serve
``ray_raylens_worker_group_memory_bytes{rl_worker_group=...,memory_type="rss"}`` on
the endpoint raylens scrapes, with the worker's RSS, and drop the group (NaN or gone)
once the sampler is told its workers no longer include it.

The module starts its own one-node Ray with ``metrics_report_interval_ms`` = 1000
(``RAYLENS_IT_REPORT_INTERVAL_MS`` sets another value; ``default`` leaves Ray's own,
10 s), unless Ray is already connected (the session cluster of ``conftest.py``),
which it then uses at Ray's default. It prints how long each reading took from the
sampler's set to the endpoint.
"""

from __future__ import annotations

import math
import os
import statistics
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration
ray = pytest.importorskip("ray")

from group_workers import EnvWorker, wait_for  # noqa: E402

from raylens.distributed.group_memory_sampler import (  # noqa: E402
    DEFAULT_PSS_INTERVAL_SECONDS,
    GroupMemorySamplers,
    worker_identity,
)
from raylens.telemetry.raylet_payload import (  # noqa: E402
    RAY_SAMPLER_SAMPLED_AT,
    parse_group_samples,
)

HERE = Path(__file__).resolve().parent
MB = 2**20
BALLAST = 64 * MB
DEFAULT_REPORT_INTERVAL_S = 10.0


@dataclass
class Endpoint:
    url: str
    node_id: str
    report_interval_s: float


def _report_interval_ms() -> int | None:
    value = os.environ.get("RAYLENS_IT_REPORT_INTERVAL_MS", "1000")
    return None if value == "default" else int(value)


@pytest.fixture(scope="module")
def endpoint() -> Iterator[Endpoint]:
    """The metrics endpoint of the node the driver runs on, in a Ray that reports at a known pace."""
    started_here = not ray.is_initialized()
    interval_ms = _report_interval_ms() if started_here else None
    saved = os.environ.get("PYTHONPATH")
    if started_here:
        pythonpath = os.pathsep.join(filter(None, [str(HERE), saved]))
        os.environ["PYTHONPATH"] = pythonpath
        system_config = {} if interval_ms is None else {"metrics_report_interval_ms": interval_ms}
        ray.init(
            address="local",  # a Ray of its own, never one already running on the machine
            num_cpus=2,
            object_store_memory=80 * MB,
            include_dashboard=False,
            runtime_env={"env_vars": {"PYTHONPATH": pythonpath}},
            _system_config=system_config,
        )
    try:
        node_id = ray.get_runtime_context().get_node_id()
        (node,) = [n for n in ray.nodes() if n["NodeID"] == node_id]
        yield Endpoint(
            url=f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics",
            node_id=node_id,
            report_interval_s=DEFAULT_REPORT_INTERVAL_S
            if interval_ms is None
            else interval_ms / 1e3,
        )
    finally:
        if started_here:
            ray.shutdown()
            if saved is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = saved


def _labels(text: str) -> dict[str, str]:
    """``k="v",...`` as a dict, undoing the exposition format's escapes."""
    labels: dict[str, str] = {}
    i = 0
    while i < len(text):
        eq = text.index("=", i)
        key = text[i:eq].strip().lstrip(",").strip()
        i = eq + 2  # past '="'
        value = []
        while text[i] != '"':
            if text[i] == "\\":
                i += 1
                value.append({"n": "\n"}.get(text[i], text[i]))
            else:
                value.append(text[i])
            i += 1
        labels[key] = "".join(value)
        i += 1
    return labels


def _series(url: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample of ``name`` on the endpoint: its labels and value."""
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    found = []
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, _, value = line[len(name) + 1 :].rpartition("} ")
            found.append((_labels(labels), float(value.split()[0])))
        elif line.startswith(name + " "):
            found.append(({}, float(line.split()[1])))
    return found


def _pss_ages(url: str, group: str) -> list[float]:
    """The age of the group's PSS as the newest sampler on the endpoint published it."""
    with urllib.request.urlopen(url, timeout=5) as response:
        figures = parse_group_samples(response.read())
    if figures is None:
        return []
    return [
        figure.pss_age_s
        for figure in figures.groups
        if figure.group == group and figure.pss_bytes is not None and figure.pss_age_s is not None
    ]


def _group_rss(url: str, group: str) -> list[float]:
    """The group's RSS as the newest sampler on the endpoint published it (none: empty).

    Ray serves a stopped sampler's series until they age out, and other tests on the
    shared cluster may have had a ``policy`` group on this node: only the sampler with
    the latest ``sampled_at`` speaks for the node, as raylens reads it.
    """
    with urllib.request.urlopen(url, timeout=5) as response:
        figures = parse_group_samples(response.read())
    if figures is None:
        return []
    return [figure.rss_bytes for figure in figures.groups if figure.group == group]


def _proc_rss(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _sampled_at(url: str) -> float | None:
    stamps = [value for _, value in _series(url, RAY_SAMPLER_SAMPLED_AT)]
    return max(stamps) if stamps else None


def _latencies(url: str, count: int, within_s: float) -> list[float]:
    """Seconds from each new reading's stamp to its first sight on the endpoint."""
    seen = _sampled_at(url)
    found: list[float] = []
    deadline = time.monotonic() + within_s
    while len(found) < count and time.monotonic() < deadline:
        stamp = _sampled_at(url)
        if stamp is not None and stamp != seen:
            found.append(time.time() - stamp)
            seen = stamp
        time.sleep(0.05)
    return found


@pytest.fixture
def worker(endpoint: Endpoint) -> Iterator[Any]:
    actor = EnvWorker.options(
        scheduling_strategy=ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(
            node_id=endpoint.node_id, soft=False
        )
    ).remote()
    try:
        yield actor
    finally:
        ray.kill(actor)


def test_a_sampler_read_twice_a_second_to_be_quick_publishes_a_groups_rss_on_its_endpoint(
    endpoint, worker
) -> None:
    # The default interval's path is test_growth_ray's, which reads the same RSS back.
    node_id, pid, ticks = ray.get(worker.__ray_call__.remote(worker_identity), timeout=60)
    assert node_id == endpoint.node_id

    def allocate(instance: Any, size: int) -> int:  # touches every page it holds
        instance._raylens_ballast = b"\x01" * size
        return len(instance._raylens_ballast)

    assert ray.get(worker.__ray_call__.remote(allocate, BALLAST), timeout=60) == BALLAST
    manager = GroupMemorySamplers(sample_interval_s=0.5, ping_every=1)
    bound = 3 * endpoint.report_interval_s + 30.0
    try:
        asked = time.monotonic()
        assert manager.maintain({node_id: [("policy", pid, ticks)]}) == {}
        published = wait_for(
            lambda: _group_rss(endpoint.url, "policy"), bound, "policy's RSS on the endpoint"
        )
        first_seen_s = time.monotonic() - asked
        expected = _proc_rss(pid)
        assert abs(published[-1] - expected) <= 0.2 * expected, (published, expected)
        assert expected > BALLAST
        assert manager.maintain({node_id: [("policy", pid, ticks)]}) == {}  # its ping answered

        latencies = _latencies(endpoint.url, 4, 4 * endpoint.report_interval_s + 10.0)
        assert latencies, "no new reading reached the endpoint"
        # PSS is read every 60 s by default; the readings in between carry it with its age.
        ages = wait_for(
            lambda: [age for age in _pss_ages(endpoint.url, "policy") if age > 0],
            bound,
            "policy's PSS served with the age it has carried",
        )
        assert all(0 < age <= DEFAULT_PSS_INTERVAL_SECONDS for age in ages), ages

        # Told a list without policy: policy reads NaN, then (Ray's expiry) is gone.
        assert manager.maintain({node_id: [("rollout", pid, ticks)]}) == {}
        started = time.monotonic()
        wait_for(
            lambda: (
                _group_rss(endpoint.url, "rollout")
                and all(math.isnan(v) for v in _group_rss(endpoint.url, "policy"))
            ),
            bound,
            "policy to read NaN or be gone, and rollout to appear",
        )
        dropped_s = time.monotonic() - started
        dropped = _group_rss(endpoint.url, "policy")

        # The node's last worker leaves: the sampler marks its groups gone and exits.
        manager.maintain({})
        started = time.monotonic()
        wait_for(
            lambda: all(math.isnan(v) for v in _group_rss(endpoint.url, "rollout")),
            bound,
            "rollout to read NaN or be gone once the sampler stopped",
        )
        stopped_s = time.monotonic() - started
    finally:
        manager.close()
    print(
        f"report interval {endpoint.report_interval_s:g} s: policy first on the endpoint "
        f"{first_seen_s:.2f} s after maintain(); set-to-visible latency of {len(latencies)} "
        f"readings: min {min(latencies):.2f} s, median {statistics.median(latencies):.2f} s, "
        f"max {max(latencies):.2f} s; a dropped group {'NaN' if dropped else 'gone'} after "
        f"{dropped_s:.2f} s, "
        f"a stopped sampler's after {stopped_s:.2f} s; published RSS "
        f"{published[-1] / MB:.1f} MiB against /proc {expected / MB:.1f} MiB; PSS served "
        f"{ages[-1]:.1f} s old"
    )


def test_a_groups_series_never_leaves_the_endpoint_between_readings(endpoint, worker) -> None:
    """With readings further apart than Ray's gauge expiry, every scrape still finds the group.

    Ray's agent drops a gauge value not exported again within two report intervals. The
    sampler here reads every 5 s, longer than that expiry at a 1 s report interval; for
    ten report intervals, every scrape (every 0.1 s) must find the group.
    """
    reading_s = 5.0
    node_id, pid, ticks = ray.get(worker.__ray_call__.remote(worker_identity), timeout=60)
    manager = GroupMemorySamplers(sample_interval_s=reading_s, ping_every=1)
    try:
        assert manager.maintain({node_id: [("policy", pid, ticks)]}) == {}
        wait_for(
            lambda: _group_rss(endpoint.url, "policy"),
            3 * endpoint.report_interval_s + 30.0,
            "policy's RSS on the endpoint",
        )
        scrapes = missing = 0
        until = time.monotonic() + max(10 * endpoint.report_interval_s, 2 * reading_s)
        while time.monotonic() < until:
            scrapes += 1
            missing += not _group_rss(endpoint.url, "policy")
            time.sleep(0.1)
    finally:
        manager.close()
    print(
        f"report interval {endpoint.report_interval_s:g} s, readings every {reading_s:g} s: "
        f"policy missing from {missing} of {scrapes} scrapes"
    )
    assert scrapes >= 20 and missing == 0
