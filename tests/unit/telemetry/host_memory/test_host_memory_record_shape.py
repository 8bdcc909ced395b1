"""A node's record is one flat immutable value; its health reads as it always did."""

from __future__ import annotations

import copy
import dataclasses
import gc
import pickle
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import pytest

from raylens.telemetry import host_memory as hm
from raylens.telemetry.host_memory import NodeRecord, RayNode
from raylens.telemetry.host_memory._snapshot import ScrapeHealth
from raylens.telemetry.raylet_payload import NodeOomCounts
from raylens.telemetry.scraping import Job, Outcome
from raylens_fakes import FakeCluster

NODE = RayNode("a" * 56, "host-a", "http://10.0.0.1:8080/metrics", "10.0.0.1")
HEALTH = ScrapeHealth(0, "timeout", 5.0, 10.0, 30.0)


def _record(health: ScrapeHealth | None = HEALTH) -> NodeRecord:
    return NodeRecord(
        NODE,
        {"host_memory_used": 1.0},
        9.0,
        "timed out",
        health,
        "policy",
        3,
        {"host.name": "host-a"},
        None,
        NodeOomCounts(1.0, None),
        29.0,
    )


def test_a_record_built_with_a_health_entry_gives_that_entry_back() -> None:
    record = _record()

    assert record.health == HEALTH and type(record.health) is ScrapeHealth
    assert _record(None).health is None
    assert (record.node, record.values, record.sampled_at, record.error) == (
        NODE,
        {"host_memory_used": 1.0},
        9.0,
        "timed out",
    )
    assert (record.worker_groups, record.labels_version, record.attributes) == (
        "policy",
        3,
        {"host.name": "host-a"},
    )
    assert (record.groups, record.oom, record.expires_at) == (None, NodeOomCounts(1.0, None), 29.0)
    assert NodeRecord(NODE, None, None, "x", None, "none", 0, {}).expires_at == float("-inf")


def test_a_record_is_frozen_slotted_and_copies_and_pickles_whole() -> None:
    record = _record()

    with pytest.raises(dataclasses.FrozenInstanceError):
        record.error = None  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        del record.values  # type: ignore[misc]
    assert not hasattr(record, "__dict__")
    for again in (copy.copy(record), pickle.loads(pickle.dumps(record))):
        assert type(again) is NodeRecord and again == record and again.health == HEALTH
    assert repr(record).startswith("NodeRecord(node=RayNode(") and "health=ScrapeHealth(" in repr(
        record
    )


def test_a_record_holds_no_health_object_for_the_collector_to_walk() -> None:
    assert not any(isinstance(part, ScrapeHealth) for part in gc.get_referents(_record()))


class _Canned:
    """A stand-in engine answering every batch with the outcomes a test sets."""

    def __init__(self) -> None:
        self.outcomes: dict[Hashable, Outcome] = {}

    def scrape(self, jobs: Sequence[Job], timeout: float | None = None) -> dict[Hashable, Outcome]:
        return {job[0]: self.outcomes[job[0]] for job in jobs if job[0] in self.outcomes}

    def close(self, timeout: float = 1.0) -> None:
        pass


@pytest.fixture
def canned(
    make_monitor: Callable[..., hm.HostMemoryMonitor],
) -> tuple[hm.HostMemoryMonitor, _Canned, list[tuple[str, str]], list[float]]:
    cluster = FakeCluster()
    ids = [cluster.add_node(port=8000 + index, hostname=f"n{index}") for index in range(6)]
    cluster.add_node(hostname="dark", extra={"MetricsExportPort": -1})
    now = [100.0]
    monitor = make_monitor(cluster, clock=lambda: now[0], max_age=20.0, scrape_timeout=2.0)
    engine = _Canned()
    monitor._engine = engine  # the engine seam: what a cycle gets back is the test's
    return monitor, engine, [(node_id, f"n{index}") for index, node_id in enumerate(ids)], now


def test_every_kind_of_outcome_publishes_the_health_it_always_had(canned: Any) -> None:
    monitor, engine, keys, _now = canned
    engine.outcomes = {
        keys[0]: Outcome({"host_memory_used": 1.0}, None, elapsed=0.5, duration=0.25),
        keys[1]: Outcome({"host_memory_used": 1.0}, None, elapsed=0.75),  # untimed engine
        keys[2]: Outcome(None, "HTTP 503", elapsed=0.1, error_type="http_status", duration=0.05),
        keys[3]: Outcome(None, "odd", elapsed=0.2),  # a failure without a type
        keys[4]: Outcome(None, "not asked", wedged=True, asked=False, elapsed=0.3),
    }  # keys[5] does not answer

    monitor.collect_once()

    records = monitor.records()
    health = {key: records[key].health for key in keys}
    assert health == {
        keys[0]: ScrapeHealth(1, None, 0.25, 100.5, 120.5),
        keys[1]: ScrapeHealth(1, None, 0.75, 100.75, 120.75),
        keys[2]: ScrapeHealth(0, "http_status", 0.05, 100.1, 120.1),
        keys[3]: ScrapeHealth(0, "internal", 0.2, 100.2, 120.2),
        keys[4]: ScrapeHealth(0, "timeout", None, 100.3, 120.3),
        keys[5]: ScrapeHealth(0, "timeout", 2.0, 100.0, 120.0),
    }
    assert all(type(entry) is ScrapeHealth for entry in health.values())
    (dark,) = [record for record in records.values() if record.node.host == "dark"]
    assert dark.health == ScrapeHealth(0, "no_metrics_port", None, 100.0, 120.0)
    assert records[keys[0]].sampled_at == 100.5 and records[keys[0]].expires_at == 120.5
    fresh = {record.node.host: entry for record, entry in monitor.snapshot.fresh_health(120.0)}
    assert fresh == {
        "n0": health[keys[0]],
        "n1": health[keys[1]],
        "n2": health[keys[2]],
        "n3": health[keys[3]],
        "n4": health[keys[4]],
        "n5": health[keys[5]],
        "dark": dark.health,
    }
    assert {record.node.host for record, _ in monitor.snapshot.fresh_health(120.6)} == {"n1"}


def test_a_record_of_a_cycle_cut_short_by_a_stop_has_no_health(canned: Any) -> None:
    monitor, _engine, _keys, _now = canned
    monitor.collect_once()
    nodes = [record.node for record in monitor.records().values()]

    monitor._publish(nodes, {}, 100.0, stopped=True)

    assert all(record.health is None for record in monitor.records().values())
    assert monitor.snapshot.fresh_health(100.0) == []


def test_unchanged_kill_counters_are_the_same_object_from_cycle_to_cycle(canned: Any) -> None:
    monitor, engine, keys, now = canned
    engine.outcomes = {keys[0]: Outcome({"used": 1.0}, None, oom=NodeOomCounts(2.0, None))}
    monitor.collect_once()
    first = monitor.records()[keys[0]].oom

    engine.outcomes = {keys[0]: Outcome({"used": 1.0}, None, oom=NodeOomCounts(2.0, None))}
    now[0] += 1.0
    monitor.collect_once()
    assert monitor.records()[keys[0]].oom is first

    engine.outcomes = {keys[0]: Outcome({"used": 1.0}, None, oom=NodeOomCounts(3.0, None))}
    monitor.collect_once()
    assert monitor.records()[keys[0]].oom == NodeOomCounts(3.0, None)
