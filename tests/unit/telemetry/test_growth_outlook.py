"""Growth, kill line and time to it as the nodes' samplers publish them, named by the growth cycle.

The cycle keeps no history: every figure comes from the node (here, a keeper per node as a
sampler holds one, or the simulated cluster's samplers), on simulated time.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import pytest

from raylens.simulation import SimulatedCluster
from raylens.telemetry.growth import (
    GrowthSettings,
    KillLineConfig,
    NodeGrowthKeeper,
    RecentHistory,
    resolve_kill_line_config,
)
from raylens.telemetry.growth_outlook import (
    NO_SAMPLER,
    NO_SCRAPE,
    OLD_SAMPLER,
    OUT_OF_BOUNDS,
    RL_HOST_MEMORY_GROWTH_METRIC,
    RL_HOST_MEMORY_LIMIT_METRIC,
    RL_HOST_MEMORY_TIME_TO_LIMIT_METRIC,
    RL_WORKER_GROUP_MEMORY_GROWTH_METRIC,
    GrowthCycle,
    register_growth_gauges,
)
from raylens.telemetry.host_memory._snapshot import NodeSample
from raylens.telemetry.raylet_payload import GroupFigure, NodeFigures, NodeGroupFigures
from raylens_fakes import MetricsProbe
from raylens_fakes.clock import ManualClock

GIB = 1024**3
TOTAL = 64 * GIB
LINE = KillLineConfig(threshold=0.95)


class SamplerMonitor:
    """Nodes whose samplers keep their own history (a keeper each) and publish its figures.

    On ``a`` the group ``policy`` leaks ``leak`` bytes/s and ``rollout`` stays flat; ``b``
    hosts ``rollout`` only. Nodes in ``bare`` have no sampler; nodes in ``old`` have one
    that publishes group figures but no node figures; nodes in ``failing`` were not scraped.
    """

    def __init__(self, leak: float, window_s: float = 60.0) -> None:
        self.leak = leak
        self.t = 0.0
        self.nodes = ["a", "b"]
        self.bare: set[str] = set()
        self.old: set[str] = set()
        self.failing: set[str] = set()
        self.keepers = {
            node: NodeGrowthKeeper(GrowthSettings(window_s=window_s), LINE) for node in "ab"
        }
        self._published: dict[str, NodeGroupFigures] = {}

    def groups(self, node: str) -> dict[str, float]:
        if node == "a":
            return {"policy": 4 * GIB + self.leak * self.t, "rollout": 2 * GIB}
        return {"rollout": 3 * GIB}

    def used(self, node: str) -> float:
        return 8 * GIB + sum(self.groups(node).values())

    def tick(self) -> None:
        """One second passes: each sampler reads its node and publishes."""
        self.t += 1.0
        for node in self.nodes:
            groups = self.groups(node)
            reading = self.keepers[node].record(self.t, self.used(node), groups, host_total=TOTAL)
            self._published[node] = NodeGroupFigures(
                1.7e9 + self.t,
                tuple(
                    GroupFigure(g, v, None, 1.0, reading.group_growth.get(g))
                    for g, v in sorted(groups.items())
                ),
                NodeFigures(
                    reading.used,
                    reading.growth,
                    reading.outside_growth,
                    reading.growing,
                    reading.limit,
                    reading.time_to_limit,
                    60.0,
                    f"sampler-{node}",
                    "driver/1",
                ),
            )

    def latest(self) -> list[NodeSample]:
        return [
            NodeSample(
                node_id=node,
                host="vm",
                ip="127.0.0.1",
                used=None if node in self.failing else self.used(node),
                total=None if node in self.failing else TOTAL,
                worker_groups=",".join(sorted(self.groups(node))),
                sampled_at=None if node in self.failing else self.t,
            )
            for node in self.nodes
        ]

    def group_figures(self) -> dict[str, tuple[str, NodeGroupFigures, float]]:
        carried = {}
        for node in self.nodes:
            if node in self.bare or node in self.failing or node not in self._published:
                continue
            figures = self._published[node]
            if node in self.old:
                figures = NodeGroupFigures(figures.sampled_at, figures.groups)
            carried[node] = ("vm", figures, self.t)
        return carried


def _run(cycle: GrowthCycle, monitor: SamplerMonitor, seconds: int) -> None:
    for _ in range(seconds):
        monitor.tick()
        cycle(monitor)


def test_a_leaking_group_shows_as_its_sampler_found_it_with_the_time_to_the_kill_line() -> None:
    leak = 10 * 1024**2  # 10 MiB/s
    monitor = SamplerMonitor(leak)
    cycle = GrowthCycle(kill_line=LINE)

    _run(cycle, monitor, 30)
    early = cycle.snapshot.latest()["a"]
    assert early.growth is None
    assert early.unavailable == "its sampler's 60 s growth window is not full yet"

    _run(cycle, monitor, 270)  # the shortest scale and the two it is confirmed on, 60 s to 240 s
    a, b = cycle.snapshot.latest()["a"], cycle.snapshot.latest()["b"]
    assert a.unavailable is None and b.unavailable is None
    assert a.group_growth["policy"] == pytest.approx(leak, rel=0.1)
    assert abs(a.group_growth["rollout"]) < 0.05 * leak
    assert a.growth == pytest.approx(leak, rel=0.1)
    assert a.growing and a.fastest_group == "policy"
    assert a.limit == pytest.approx(0.95 * TOTAL)
    assert a.time_to_limit == pytest.approx((0.95 * TOTAL - monitor.used("a")) / leak, rel=0.1)
    assert not b.growing and b.time_to_limit is None


def test_the_cycle_keeps_no_history_and_the_growth_relay_is_gone() -> None:
    cycle = GrowthCycle(kill_line=LINE)
    assert not hasattr(cycle, "history") and not hasattr(cycle, "keeper")
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("raylens.telemetry.scraping._growth_relay")
    import raylens.telemetry.growth as history

    assert not hasattr(history, "GrowthKeeper")


def test_a_node_without_a_sampler_says_why_and_keeps_its_kill_line() -> None:
    monitor = SamplerMonitor(0.0)
    monitor.bare = {"b"}
    cycle = GrowthCycle(kill_line=LINE)
    _run(cycle, monitor, 3)

    b = cycle.snapshot.latest()["b"]
    assert b.unavailable == NO_SAMPLER and "sampler" in NO_SAMPLER
    assert b.growth is None and b.group_growth == {} and b.time_to_limit is None
    assert b.limit == pytest.approx(0.95 * TOTAL)  # drawn here, from the scraped total
    assert cycle.snapshot.unavailable()["b"] == NO_SAMPLER


def test_a_sampler_publishing_no_node_figures_and_a_failed_scrape_each_say_why() -> None:
    monitor = SamplerMonitor(0.0)
    monitor.old = {"a"}
    monitor.failing = {"b"}
    cycle = GrowthCycle(kill_line=LINE)
    _run(cycle, monitor, 100)

    a, b = cycle.snapshot.latest()["a"], cycle.snapshot.latest()["b"]
    assert a.unavailable == OLD_SAMPLER and a.growth is None
    assert set(a.group_growth) == {"policy", "rollout"}  # its group figures still show
    assert b.unavailable == NO_SCRAPE and b.limit is None


def test_figures_that_cannot_be_the_node_s_are_ignored_and_say_why() -> None:
    monitor = SamplerMonitor(10 * 1024**2)
    cycle = GrowthCycle(kill_line=LINE)
    _run(cycle, monitor, 100)
    published = monitor.group_figures()["a"][1]
    assert published.node is not None
    forged = NodeGroupFigures(
        published.sampled_at,
        published.groups,
        published.node._replace(used=2 * TOTAL, growth=1e12, growing=True, time_to_limit=1.0),
    )
    monitor.group_figures = lambda: {"a": ("vm", forged, monitor.t)}  # type: ignore[method-assign]
    cycle(monitor)

    a = cycle.snapshot.latest()["a"]
    assert a.unavailable == OUT_OF_BOUNDS
    assert a.growth is None and a.time_to_limit is None and a.group_growth == {}
    assert a.limit == pytest.approx(0.95 * TOTAL)  # drawn here, from the scraped total


def test_a_stale_samplers_figures_are_shown_as_stale_with_their_age_not_believed() -> None:
    monitor = SamplerMonitor(10 * 1024**2)
    cycle = GrowthCycle(kill_line=LINE)
    _run(cycle, monitor, 100)
    published = monitor.group_figures()["a"][1]
    assert published.node is not None and published.node.growth is not None
    stuck = NodeGroupFigures(
        published.sampled_at, published.groups, published.node._replace(stale_for=240.0)
    )
    monitor.group_figures = lambda: {"a": ("vm", stuck, monitor.t)}  # type: ignore[method-assign]
    cycle(monitor)

    a = cycle.snapshot.latest()["a"]
    assert a.unavailable == "its sampler has published nothing for 240 s, so its figures are stale"
    assert a.growth is None and a.time_to_limit is None and a.group_growth == {}


def test_a_node_that_left_is_forgotten() -> None:
    monitor = SamplerMonitor(0.0)
    cycle = GrowthCycle(kill_line=LINE)
    _run(cycle, monitor, 5)
    monitor.nodes = ["b"]
    _run(cycle, monitor, 1)
    assert set(cycle.snapshot.latest()) == {"b"}


def test_figures_read_again_unchanged_give_the_very_same_outlook() -> None:
    monitor = SamplerMonitor(1e6)
    cycle = GrowthCycle(kill_line=LINE)
    _run(cycle, monitor, 2)
    first = cycle.snapshot.latest()["a"]
    cycle(monitor)  # the same publication, scraped again
    assert cycle.snapshot.latest()["a"] is first
    _run(cycle, monitor, 1)
    assert cycle.snapshot.latest()["a"] is not first


def test_the_gauges_export_growth_limit_and_time_to_limit(metrics_probe: MetricsProbe) -> None:
    leak = 10 * 1024**2
    monitor = SamplerMonitor(leak)
    cycle = GrowthCycle(kill_line=LINE)
    register_growth_gauges(cycle.snapshot)
    _run(cycle, monitor, 300)  # the shortest scale and the two it is confirmed on, 60 s to 240 s

    metrics_probe.collect()
    growth = metrics_probe.points_by(RL_HOST_MEMORY_GROWTH_METRIC, "ray.node.id")
    groups = {
        (dict(a)["ray.node.id"], dict(a)["rl.worker_group"]): v
        for a, v in metrics_probe.points(RL_WORKER_GROUP_MEMORY_GROWTH_METRIC).items()
    }
    assert growth["a"] == pytest.approx(leak, rel=0.1)
    assert groups[("a", "policy")] == pytest.approx(leak, rel=0.1)
    assert {key for key in groups if key[1] == "policy"} == {("a", "policy")}
    limits = metrics_probe.points_by(RL_HOST_MEMORY_LIMIT_METRIC, "ray.node.id")
    assert limits == {"a": pytest.approx(0.95 * TOTAL), "b": pytest.approx(0.95 * TOTAL)}
    ttl = metrics_probe.points_by(RL_HOST_MEMORY_TIME_TO_LIMIT_METRIC, "ray.node.id")
    assert set(ttl) == {"a"}


def test_a_post_mortem_s_history_is_asked_of_the_node_at_the_kill_s_wall_time() -> None:
    asked: list[tuple[str, float]] = []
    history: RecentHistory = {"node_used": None, "worker_groups": {}, "outside_groups": None}

    def from_sampler(node_id: str, at_wall: float) -> RecentHistory:
        asked.append((node_id, at_wall))
        return history

    import time

    cycle = GrowthCycle(kill_line=LINE, node_history=from_sampler)
    assert cycle.recent_history("a", time.monotonic() - 5.0) is history
    ((node, at_wall),) = asked
    assert node == "a" and at_wall == pytest.approx(time.time() - 5.0, abs=1.0)
    assert GrowthCycle(kill_line=LINE).recent_history("a", 0.0) is None


def test_a_scripted_leak_on_a_simulated_cluster_is_found_end_to_end(
    simulated_cluster: Callable[..., SimulatedCluster], make_monitor: Callable[..., Any]
) -> None:
    from raylens.simulation.memory_script import Leak, MemoryScript

    clock = ManualClock()
    script = MemoryScript(seed=1)
    leak = 4 * 1024**2  # bytes per second
    script.set_group(0, "policy", Leak(leak), base=6 * GIB)
    script.set_group(0, "rollout", base=2 * GIB)
    script.set_group(1, "rollout", base=3 * GIB)
    for node in (0, 1):
        script.set_other(node, base=5 * GIB)
    sim = simulated_cluster(
        2,
        schedule=script.schedule,
        groups=script.groups,
        clock=clock,
        growth_window_s=60.0,
        kill_line=resolve_kill_line_config(threshold=0.9),
    )
    monitor = make_monitor(sim.cluster, scrape_mode="inprocess", clock=clock)
    cycle = GrowthCycle(kill_line=LINE)

    for _ in range(20):  # scraped every 5 s; the simulated samplers read every second
        clock.now += 5.0
        monitor.collect_once()
        cycle(monitor)

    outlook = cycle.snapshot.latest()[sim.node_id(0)]
    assert outlook.group_growth["policy"] == pytest.approx(leak, rel=0.1)
    assert abs(outlook.group_growth.get("rollout", 0.0)) < 0.05 * leak
    assert outlook.fastest_group == "policy" and outlook.unavailable is None
    total = script.schedule(0, clock.now)[1]
    assert outlook.limit == pytest.approx(0.9 * total)  # the node's line, not this process's
    other = cycle.snapshot.latest()[sim.node_id(1)]
    assert other.group_growth.get("rollout", 0.0) == pytest.approx(0.0, abs=0.05 * leak)
