"""Each node's sampler as the home of its growth: it reads, fits and publishes; readers parse.

No Ray: the sampler runs in-process over a fake ``/proc``, on a hand-driven clock, and
publishes through stand-in gauges that render the exposition as Ray's agent serves it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from raylens.distributed._group_memory_publishing import RayMetricsPublisher
from raylens.distributed.group_memory_cycle import GroupMemoryCycle
from raylens.distributed.group_memory_sampler import GroupMemorySamplerActor, GroupMemorySamplers
from raylens.simulation.group_series import render_group_series
from raylens.telemetry.group_memory import GroupMemorySnapshot, GroupWorkerRegistry
from raylens.telemetry.growth import KillLineConfig
from raylens.telemetry.raylet_payload import (
    NODE_GROWING_GAUGE,
    NODE_GROWTH_GAUGE,
    NODE_LIMIT_GAUGE,
    NODE_TIME_TO_LIMIT_GAUGE,
    NODE_USED_GAUGE,
    OUTSIDE_GROWTH_GAUGE,
    SAMPLER_LABEL,
    SAMPLER_WINDOW_GAUGE,
    STARTED_BY_LABEL,
    GroupFigure,
    NodeFigures,
    NodeGroupFigures,
    parse_group_samples,
)
from raylens.telemetry.scraping import Outcome
from raylens.telemetry.scraping._wire import HeldFigures, decode_outcomes, encode_outcomes
from raylens_fakes.clock import ManualClock
from raylens_fakes.procfs import FakeProcFS
from raylens_fakes.ray import FakeRay

MB = 2**20
GIB = 2**30
TOTAL = 64 * GIB
NODE_A = "a" * 56
NODE_B = "b" * 56


class Gauges:
    """Stand-in for ``ray.util.metrics.Gauge``: every gauge made, with its latest values."""

    made: dict[str, Gauges]

    def __init__(self, name: str, description: str = "", tag_keys: tuple[str, ...] = ()) -> None:
        self.name, self.tag_keys = name, tag_keys
        self.values: dict[tuple[tuple[str, str], ...], float] = {}
        Gauges.made[name] = self

    def set(self, value: float, tags: dict[str, str] | None = None) -> None:
        assert set(tags or {}) == set(self.tag_keys), (self.name, tags)
        self.values[tuple(sorted((tags or {}).items()))] = value

    @classmethod
    def value(cls, name: str) -> float:
        (only,) = cls.made[name].values.values()
        return only


@pytest.fixture
def gauges() -> type[Gauges]:
    Gauges.made = {}
    return Gauges


def _sampler(
    procfs: FakeProcFS, ticks: ManualClock, publisher: Any, window_s: float = 60.0
) -> GroupMemorySamplerActor:
    return GroupMemorySamplerActor(
        procfs_root=str(procfs.root),
        host_name="node-a",
        publisher=publisher,
        clock=ticks,
        wall_clock=lambda: 1.7e9 + ticks.now,
        pss_interval_seconds=None,
        growth_window_s=window_s,
        kill_line=KillLineConfig(threshold=0.9),
        started_by="driver-host/4242",
    )


def _leaking_node(tmp_path: Path) -> tuple[FakeProcFS, list[tuple[str, int, int]]]:
    procfs = FakeProcFS(tmp_path / "node")
    procfs.set_machine(total_bytes=TOTAL, other_used_bytes=6 * GIB)
    procfs.add_process(200, rss_bytes=GIB)
    procfs.add_process(300, rss_bytes=GIB // 2)
    return procfs, [
        ("policy", 200, procfs.start_ticks(200)),
        ("rollout", 300, procfs.start_ticks(300)),
    ]


def test_a_sampler_publishes_its_node_s_figures_and_who_it_is(
    tmp_path: Path, gauges: type[Gauges]
) -> None:
    procfs, workers = _leaking_node(tmp_path)
    ticks = ManualClock(5_000.0)
    publisher = RayMetricsPublisher(gauges, sampler="actor-1", started_by="driver-host/4242")
    sampler = _sampler(procfs, ticks, publisher)
    sampler.set_workers(workers)
    leak = 2 * MB  # per second

    for second in range(10):
        ticks.now += 1.0
        procfs.set_memory(200, rss_bytes=GIB + leak * second)
        sampler.sample_and_publish_once()
    assert math.isnan(gauges.value(NODE_GROWTH_GAUGE))  # the window is not full yet
    assert gauges.value(NODE_LIMIT_GAUGE) == pytest.approx(0.9 * TOTAL)
    for second in range(10, 330):
        ticks.now += 1.0
        procfs.set_memory(200, rss_bytes=GIB + leak * second)
        sampler.sample_and_publish_once()

    used = 6 * GIB + GIB + leak * 329 + GIB // 2
    assert gauges.value(NODE_USED_GAUGE) == pytest.approx(used, rel=1e-3)
    assert gauges.value(NODE_GROWTH_GAUGE) == pytest.approx(leak, rel=0.1)
    assert abs(gauges.value(OUTSIDE_GROWTH_GAUGE)) < 0.05 * leak
    assert gauges.value(NODE_GROWING_GAUGE) == 1.0
    assert gauges.value(NODE_TIME_TO_LIMIT_GAUGE) == pytest.approx(
        (0.9 * TOTAL - used) / leak, rel=0.1
    )
    ((labels, window),) = gauges.made[SAMPLER_WINDOW_GAUGE].values.items()
    assert window == 60.0
    assert dict(labels) == {SAMPLER_LABEL: "actor-1", STARTED_BY_LABEL: "driver-host/4242"}
    group_growth = gauges.made["raylens_worker_group_memory_growth_bytes_per_second"].values
    assert group_growth[(("rl_worker_group", "policy"),)] == pytest.approx(leak, rel=0.1)


def test_a_sampler_on_a_node_without_workers_still_publishes_the_node(
    tmp_path: Path, gauges: type[Gauges]
) -> None:
    procfs = FakeProcFS(tmp_path / "node")
    procfs.set_machine(total_bytes=TOTAL, other_used_bytes=3 * GIB)
    ticks = ManualClock(5_000.0)
    sampler = _sampler(procfs, ticks, RayMetricsPublisher(gauges))
    sampler.set_workers([])
    for _ in range(70):
        ticks.now += 1.0
        sampler.sample_and_publish_once()
    assert gauges.value(NODE_USED_GAUGE) == pytest.approx(3 * GIB, rel=1e-3)
    assert gauges.value(NODE_GROWTH_GAUGE) == pytest.approx(0.0, abs=1.0)
    assert gauges.value(NODE_GROWING_GAUGE) == 0.0
    assert math.isnan(gauges.value(NODE_TIME_TO_LIMIT_GAUGE))


def _sampler_on_leaking_node(
    tmp_path: Path, gauges: type[Gauges]
) -> tuple[GroupMemorySamplerActor, ManualClock, list[tuple[str, int, int]]]:
    """A sampler reading :func:`_leaking_node`'s workers, its hand-driven clock, the workers."""
    procfs, workers = _leaking_node(tmp_path)
    ticks = ManualClock(5_000.0)
    sampler = _sampler(procfs, ticks, RayMetricsPublisher(gauges))
    sampler.set_workers(workers)
    return sampler, ticks, workers


def test_the_sampler_s_recent_history_is_placed_at_the_wall_time_asked(
    tmp_path: Path, gauges: type[Gauges]
) -> None:
    sampler, ticks, _workers = _sampler_on_leaking_node(tmp_path, gauges)
    for _ in range(30):
        ticks.now += 1.0
        sampler.sample_and_publish_once()

    history = sampler.recent_history(1.7e9 + ticks.now - 10.0)  # ten seconds ago
    assert history is not None
    samples = history["worker_groups"]["policy"]["samples"]
    assert samples[-1][0] == pytest.approx(0.0) and samples[0][0] == pytest.approx(-19.0)
    assert history["node_used"] is not None and history["outside_groups"] is not None


def test_readers_parse_the_node_figures_from_the_freshest_sampler_and_carry_them_whole() -> None:
    node = NodeFigures(9e9, 2e6, 1e3, True, 0.9 * TOTAL, 3000.0, 120.0, "actor-2", "driver/1")
    stale = render_group_series(
        [GroupFigure("policy", 1e9, None, 1.0, 5.0)],
        sampled_at=100.0,
        worker_id="old",
        node=node._replace(growth=1.0, sampler="actor-1"),
    )
    fresh = render_group_series(
        [GroupFigure("policy", 2e9, None, 1.0, 2e6)], sampled_at=160.0, worker_id="new", node=node
    )
    figures = parse_group_samples(stale + fresh)
    assert figures == NodeGroupFigures(160.0, (GroupFigure("policy", 2e9, None, 1.0, 2e6),), node)

    quiet = node._replace(growth=None, outside_growth=None, growing=False, time_to_limit=None)
    parsed = parse_group_samples(render_group_series([], sampled_at=5.0, node=quiet))
    assert parsed is not None and parsed.node == quiet and parsed.groups == ()
    assert parse_group_samples(render_group_series([], sampled_at=5.0)).node is None  # type: ignore[union-attr]

    # From the scrape helper to the driver, unchanged.
    job = [("key", "http://127.0.0.1:1/metrics", None)]
    outcome = Outcome({}, None, groups=figures)
    held = HeldFigures()
    rows = encode_outcomes(job, {"key": outcome}, ())  # type: ignore[arg-type]
    decoded = decode_outcomes(rows, ["key"], 0.0, held)
    assert decoded["key"].groups == figures and decoded["key"].groups.node == node  # type: ignore[union-attr]


@pytest.fixture
def fake_ray(tmp_path: Path) -> FakeRay:
    nodes = {node: FakeProcFS(tmp_path / node[:1]) for node in (NODE_A, NODE_B)}
    return FakeRay.over_procfs(nodes)


def test_every_node_listed_gets_a_sampler_even_without_workers(fake_ray: FakeRay) -> None:
    manager = GroupMemorySamplers(
        ray=fake_ray, kill_line=KillLineConfig(threshold=0.8), started_by="driver/7"
    )
    assert manager.maintain({}, nodes={NODE_A, NODE_B}) == {}
    assert manager.nodes == {NODE_A, NODE_B}
    for actor in fake_ray.actors:
        assert [name for name, *_ in actor.calls] == ["set_workers", "start"]
        assert actor.calls[0][1] == ([],) and actor.calls[1][1] == (1.0,)  # read every second

    fake_ray.actors.clear()
    assert manager.maintain({}, nodes={NODE_A, NODE_B}) == {}  # nothing new to say
    assert fake_ray.actors == []
    manager.maintain({}, nodes={NODE_A})
    assert manager.nodes == {NODE_A}
    manager.close()


def test_a_post_mortem_asks_the_node_s_sampler_for_its_history(fake_ray: FakeRay) -> None:
    manager = GroupMemorySamplers(ray=fake_ray)
    manager.maintain({}, nodes={NODE_A})
    found = manager.recent_history(NODE_A, 1.7e9)
    assert found is not None and set(found) == {"node_used", "worker_groups", "outside_groups"}
    assert fake_ray.get_timeouts[-1] == 2.0  # a bounded wait
    assert manager.recent_history(NODE_B, 1.7e9) is None  # no sampler there
    manager.close()


class _Monitor:
    has_consumer = True
    max_age = 30.0

    def __init__(self, nodes: list[str]) -> None:
        self.nodes = nodes

    def latest(self) -> list[Any]:
        from raylens.telemetry.host_memory._snapshot import NodeSample

        return [NodeSample(n, "vm", "127.0.0.1", 1.0, 2.0, "", 1.0) for n in self.nodes]

    def group_figures(self) -> dict[str, Any]:
        return {}


def test_the_driver_s_cycle_keeps_a_sampler_on_every_scraped_node_and_a_reader_s_does_not(
    fake_ray: FakeRay,
) -> None:
    monitor = _Monitor([NODE_A, NODE_B])
    driver = GroupMemoryCycle(
        GroupMemorySamplers(ray=fake_ray),
        registry=GroupWorkerRegistry(),
        snapshot=GroupMemorySnapshot(),
        every_node=True,
    )
    driver(monitor)  # type: ignore[arg-type]
    assert driver.samplers.nodes == {NODE_A, NODE_B}

    reader = GroupMemoryCycle(
        GroupMemorySamplers(ray=fake_ray),
        registry=GroupWorkerRegistry(),
        snapshot=GroupMemorySnapshot(),
    )
    reader(monitor)  # type: ignore[arg-type]
    assert reader.samplers.nodes == set()

    monitor.nodes = [NODE_B]
    driver(monitor)  # type: ignore[arg-type]
    assert driver.samplers.nodes == {NODE_B}
    driver.close()


def test_a_sampler_that_gives_no_history_costs_one_wait_per_pause(fake_ray: FakeRay) -> None:
    clock = ManualClock(5_000.0)
    fake_ray.hang_actors_on(NODE_B)
    manager = GroupMemorySamplers(ray=fake_ray, clock=clock)
    manager.maintain({}, nodes={NODE_A, NODE_B})
    waits = len(fake_ray.get_timeouts)

    assert manager.recent_history(NODE_B, 1.7e9) is None  # it never answers
    assert len(fake_ray.get_timeouts) == waits + 1
    assert manager.recent_history(NODE_A, 1.7e9) is None  # paused: not even asked
    assert len(fake_ray.get_timeouts) == waits + 1

    clock.now += 31.0
    assert manager.recent_history(NODE_A, 1.7e9) is not None
    manager.close()


def test_phase_boundaries_reach_the_node_s_growth_judgement(
    tmp_path: Path, gauges: type[Gauges]
) -> None:
    sampler, ticks, workers = _sampler_on_leaking_node(tmp_path, gauges)
    sampler.sample_and_publish_once()
    ticks.now += 10.0
    assert sampler.phase_begin("gen-1", workers)
    ticks.now += 30.0
    sampler.phase_end("gen-1")
    keeper = sampler._loop._keeper
    assert keeper is not None
    assert keeper.history.phase_boundaries("node") == (5_010.0, 5_040.0)
