"""Growth, kill line and time to it, from a monitor's cycles, on simulated time."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from raylens.simulation import SimulatedCluster
from raylens.telemetry.growth import (
    RL_HOST_MEMORY_GROWTH_METRIC,
    RL_HOST_MEMORY_LIMIT_METRIC,
    RL_HOST_MEMORY_TIME_TO_LIMIT_METRIC,
    RL_WORKER_GROUP_MEMORY_GROWTH_METRIC,
    GrowthCycle,
    register_growth_gauges,
)
from raylens.telemetry.history import GrowthSettings, resolve_kill_line_config
from raylens.telemetry.host_memory._snapshot import NodeSample
from raylens.telemetry.raylet_payload import GroupFigure, NodeGroupFigures
from raylens_fakes import MetricsProbe

GIB = 1024**3
TOTAL = 64 * GIB


class ScriptedMonitor:
    """Two nodes; on ``a`` the group ``policy`` leaks ``leak`` bytes/s, ``rollout`` stays flat."""

    def __init__(self, leak: float) -> None:
        self.leak = leak
        self.t = 0.0
        self.nodes = ["a", "b"]

    def groups(self, node: str) -> dict[str, float]:
        if node == "a":
            return {"policy": 4 * GIB + self.leak * self.t, "rollout": 2 * GIB}
        return {"rollout": 3 * GIB}

    def latest(self) -> list[NodeSample]:
        return [
            NodeSample(
                node_id=node,
                host="vm",
                ip="127.0.0.1",
                used=8 * GIB + sum(self.groups(node).values()),
                total=TOTAL,
                worker_groups=",".join(sorted(self.groups(node))),
                sampled_at=self.t,
            )
            for node in self.nodes
        ]

    def group_figures(self) -> dict[str, tuple[str, NodeGroupFigures, float]]:
        return {
            node: (
                "vm",
                NodeGroupFigures(
                    1.7e9 + self.t,
                    tuple(
                        GroupFigure(g, v, None, 1.0) for g, v in sorted(self.groups(node).items())
                    ),
                ),
                self.t,
            )
            for node in self.nodes
        }


def _run(cycle: GrowthCycle, monitor: ScriptedMonitor, seconds: int) -> None:
    for _ in range(seconds):
        monitor.t += 1.0
        cycle(monitor)


def test_a_leaking_group_is_found_with_its_rate_and_the_time_left_to_the_kill_line() -> None:
    leak = 10 * 1024**2  # 10 MiB/s
    monitor = ScriptedMonitor(leak)
    cycle = GrowthCycle(
        settings=GrowthSettings(window_s=60.0), kill_line=resolve_kill_line_config(threshold=0.95)
    )

    _run(cycle, monitor, 30)
    assert cycle.snapshot.latest()["a"].growth is None  # the window is not full yet

    _run(cycle, monitor, 90)
    a, b = cycle.snapshot.latest()["a"], cycle.snapshot.latest()["b"]
    assert a.group_growth["policy"] == pytest.approx(leak, rel=0.1)
    assert abs(a.group_growth["rollout"]) < 0.05 * leak
    assert a.growth == pytest.approx(leak, rel=0.1)
    assert a.growing and a.fastest_group == "policy"
    assert a.limit == pytest.approx(0.95 * TOTAL)
    used = 8 * GIB + 4 * GIB + leak * monitor.t + 2 * GIB
    assert a.time_to_limit == pytest.approx((0.95 * TOTAL - used) / leak, rel=0.1)
    assert not b.growing and b.time_to_limit is None


def test_a_node_that_left_is_forgotten() -> None:
    monitor = ScriptedMonitor(0.0)
    cycle = GrowthCycle(settings=GrowthSettings(window_s=60.0))
    _run(cycle, monitor, 5)
    monitor.nodes = ["b"]
    _run(cycle, monitor, 1)
    assert set(cycle.snapshot.latest()) == {"b"}
    assert cycle.history.node("a") is None


def test_the_gauges_export_growth_limit_and_time_to_limit(metrics_probe: MetricsProbe) -> None:
    leak = 10 * 1024**2
    monitor = ScriptedMonitor(leak)
    cycle = GrowthCycle(settings=GrowthSettings(window_s=60.0))
    register_growth_gauges(cycle.snapshot)
    _run(cycle, monitor, 120)

    metrics_probe.collect()
    growth = metrics_probe.points_by(RL_HOST_MEMORY_GROWTH_METRIC, "ray.node.id")
    groups = {
        (dict(a)["ray.node.id"], dict(a)["rl.worker_group"]): v
        for a, v in metrics_probe.points(RL_WORKER_GROUP_MEMORY_GROWTH_METRIC).items()
    }
    assert growth["a"] == pytest.approx(leak, rel=0.1)
    assert groups[("a", "policy")] == pytest.approx(leak, rel=0.1)
    assert set(groups) == {("a", "policy"), ("a", "rollout"), ("b", "rollout")}
    limits = metrics_probe.points_by(RL_HOST_MEMORY_LIMIT_METRIC, "ray.node.id")
    assert limits == {"a": pytest.approx(0.95 * TOTAL), "b": pytest.approx(0.95 * TOTAL)}
    ttl = metrics_probe.points_by(RL_HOST_MEMORY_TIME_TO_LIMIT_METRIC, "ray.node.id")
    assert set(ttl) == {"a"}


def test_a_group_growth_its_sampler_published_shows_before_this_history_has_one() -> None:
    monitor = ScriptedMonitor(0.0)
    published = NodeGroupFigures(1.7e9, (GroupFigure("policy", 4 * GIB, None, 1.0, 5e6),))
    monitor.group_figures = lambda: {"a": ("vm", published, 1.0)}  # type: ignore[method-assign]
    cycle = GrowthCycle(settings=GrowthSettings(window_s=60.0))

    _run(cycle, monitor, 1)  # one cycle, as `raylens watch --once` takes

    outlook = cycle.snapshot.latest()["a"]
    assert outlook.growth is None  # the node's own figure needs a full window here
    assert outlook.group_growth == {"policy": 5e6}
    assert outlook.fastest_group == "policy"


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_scripted_leak_on_a_simulated_cluster_is_found_end_to_end(
    simulated_cluster: Callable[..., SimulatedCluster], make_monitor: Callable[..., Any]
) -> None:
    from raylens.simulation.memory_script import Leak, MemoryScript

    clock = _Clock()
    script = MemoryScript(seed=1)
    leak = 4 * 1024**2  # bytes per second
    script.set_group(0, "policy", Leak(leak), base=6 * GIB)
    script.set_group(0, "rollout", base=2 * GIB)
    script.set_group(1, "rollout", base=3 * GIB)
    for node in (0, 1):
        script.set_other(node, base=5 * GIB)
    sim = simulated_cluster(2, schedule=script.schedule, groups=script.groups, clock=clock)
    monitor = make_monitor(sim.cluster, scrape_mode="inprocess", clock=clock)
    cycle = GrowthCycle(settings=GrowthSettings(window_s=60.0))

    for _ in range(100):
        clock.now += 1.0
        monitor.collect_once()
        cycle(monitor)

    outlook = cycle.snapshot.latest()[sim.node_id(0)]
    assert outlook.group_growth["policy"] == pytest.approx(leak, rel=0.1)
    assert abs(outlook.group_growth["rollout"]) < 0.05 * leak
    assert outlook.fastest_group == "policy"
    assert cycle.snapshot.latest()[sim.node_id(1)].group_growth["rollout"] == pytest.approx(
        0.0, abs=0.05 * leak
    )


def test_a_reading_scraped_again_is_not_recorded_again() -> None:
    monitor = ScriptedMonitor(0.0)
    stale = NodeGroupFigures(1.7e9, (GroupFigure("policy", 4 * GIB, None, 1.0),))
    monitor.group_figures = lambda: {"a": ("vm", stale, 1.0)}  # type: ignore[method-assign]
    monitor.nodes = ["a"]
    cycle = GrowthCycle(settings=GrowthSettings(window_s=60.0))

    _run(cycle, monitor, 5)  # five scrapes of one sampler reading

    times, _values = cycle.history.window(("a", "policy"))
    assert len(times) == 1


class _CopiesOnly:
    """A monitor seen only through the copies it hands out: ``latest()`` and ``group_figures()``."""

    def __init__(self, monitor: Any) -> None:
        self._monitor = monitor

    def latest(self) -> list[NodeSample]:
        return self._monitor.latest()

    def group_figures(self) -> dict[str, tuple[str, NodeGroupFigures, float]]:
        return self._monitor.group_figures()


def test_reading_the_monitor_s_records_gives_the_outlooks_its_copies_give(
    simulated_cluster: Callable[..., SimulatedCluster], make_monitor: Callable[..., Any]
) -> None:
    from raylens.simulation.memory_script import Leak, MemoryScript
    from raylens.telemetry.host_memory import register_worker_group_nodes

    clock = _Clock()
    script = MemoryScript(seed=2)
    script.set_group(0, "policy", Leak(4 * 1024**2), base=6 * GIB)
    script.set_group(1, "rollout", base=3 * GIB)
    for node in (0, 1, 2):
        script.set_other(node, base=5 * GIB)
    sim = simulated_cluster(3, schedule=script.schedule, groups=script.groups, clock=clock)
    monitor = make_monitor(sim.cluster, scrape_mode="inprocess", clock=clock)
    from_records = GrowthCycle(settings=GrowthSettings(window_s=30.0))
    from_copies = GrowthCycle(settings=GrowthSettings(window_s=30.0))

    for second in range(60):
        clock.now += 1.0
        if second == 20:  # a label changes on one node
            register_worker_group_nodes("policy", [sim.node_id(0)])
        monitor.collect_once()
        from_records(monitor)
        from_copies(_CopiesOnly(monitor))
        assert from_records.snapshot.latest() == from_copies.snapshot.latest()

    assert from_records.snapshot.latest()[sim.node_id(0)].worker_groups == "policy"
    assert from_records.snapshot.latest()[sim.node_id(0)].growth is not None
