"""A driver believes the samplers it started and lists them for the cluster (FakeRay, FakeCluster)."""

from __future__ import annotations

import json
from pathlib import Path

from raylens.distributed.group_memory_cycle import GroupMemoryCycle
from raylens.distributed.group_memory_sampler import GroupMemorySamplers
from raylens.telemetry import host_memory as hm
from raylens.telemetry.group_memory import GroupMemorySnapshot, GroupWorkerRegistry
from raylens.telemetry.raylet_payload import NodeGroupFigures
from raylens.telemetry.sampler_registry import SAMPLER_KEY_PREFIX, SamplerRegistry
from raylens.telemetry.scraping import AsyncScrapeEngine
from raylens_fakes import FakeCluster, FakeProcFS
from raylens_fakes.ray import FakeRay

NODE_A = "a" * 56
NODE_B = "b" * 56


class _TrustingMonitor:
    has_consumer = True
    max_age = 30.0

    def __init__(self) -> None:
        self.trusted: list[dict[str, str] | None] = []

    def group_figures(self) -> dict[str, tuple[str, NodeGroupFigures, float]]:
        return {}

    def trust_samplers(self, ids: dict[str, str] | None) -> None:
        self.trusted.append(ids)


def test_the_driver_believes_its_own_samplers_and_those_other_drivers_registered(
    tmp_path: Path,
) -> None:
    procfs = {node: FakeProcFS(tmp_path / node[:1]) for node in (NODE_A, NODE_B)}
    fake = FakeRay.over_procfs(procfs)
    procfs[NODE_A].add_process(200, rss_bytes=2**20)
    registry = GroupWorkerRegistry()
    registry.register("policy", [(NODE_A, 200, procfs[NODE_A].start_ticks(200))])
    cluster = FakeCluster()
    other = SamplerRegistry(cluster.for_job("02000000"))
    other.started({"f" * 32: "wf"})
    other.publish()
    cycle = GroupMemoryCycle(
        GroupMemorySamplers(ray=fake, ping_every=100),
        registry=registry,
        snapshot=GroupMemorySnapshot(),
        trust=SamplerRegistry(cluster),
    )
    monitor = _TrustingMonitor()

    cycle(monitor)  # type: ignore[arg-type]

    (sampler,) = fake.actors
    own = sampler._actor_id.hex()
    assert monitor.trusted == [{own: "", "f" * 32: "wf"}]
    entry = cluster.kv_get(f"{SAMPLER_KEY_PREFIX}{FakeCluster.DEFAULT_JOB_ID}")
    assert entry is not None and json.loads(entry) == {own: ""}

    cycle(monitor)  # type: ignore[arg-type]  # nothing changed: the same mapping, no new work
    assert monitor.trusted[1] is monitor.trusted[0]


def test_a_monitor_hands_the_samplers_it_believes_to_its_engine() -> None:
    monitor = hm.HostMemoryMonitor(1.0, cluster=FakeCluster(), scrape_mode="inprocess")
    try:
        monitor.trust_samplers({"s1": ""})
        engine = monitor._engine_for_use()
        assert isinstance(engine, AsyncScrapeEngine)
        assert engine.trusted == {"s1": ""}
        monitor.trust_samplers({"s1": "w1", "s2": ""})
        assert engine.trusted == {"s1": "w1", "s2": ""}
    finally:
        monitor.stop()
