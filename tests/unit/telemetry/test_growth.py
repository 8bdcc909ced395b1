"""Growth, kill line and time to it, from a monitor's cycles, on simulated time."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from raylens.simulation import SimulatedCluster
from raylens.telemetry.growth import (
    RL_HOST_MEMORY_GROWTH_METRIC,
    RL_HOST_MEMORY_LIMIT_METRIC,
    RL_HOST_MEMORY_TIME_TO_LIMIT_METRIC,
    RL_WORKER_GROUP_MEMORY_GROWTH_METRIC,
    GrowthCycle,
    NodeOutlook,
    register_growth_gauges,
)
from raylens.telemetry.history import (
    GrowthSettings,
    MemoryHistory,
    NodeGrowth,
    resolve_kill_line_config,
)
from raylens.telemetry.host_memory import (
    DEFAULT_REGISTRY,
    NO_WORKER_GROUPS,
    TOTAL_KEY,
    USED_KEY,
    NodeRecord,
)
from raylens.telemetry.host_memory._nodes import RayNode
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


# The per-node record path, against the path it replaced, on a scripted cluster --------


class _Scripted:
    """Five nodes over simulated time, read as records (as the host-memory monitor is).

    Every cycle is 2 s and brings a new sampler reading every other cycle. ``a`` has a
    leaking group whose sampler starts publishing growth, and its total changes; ``b``
    hangs for a while (its record keeps its figures and carries no groups); ``c`` gains
    a group, then loses one; ``d`` has no groups; ``e`` has no figures at first, leaves,
    and comes back.
    """

    def __init__(self) -> None:
        self.cycle = 0
        self._records: dict[tuple[str, str], NodeRecord] = {}
        self._figures: dict[str, NodeGroupFigures] = {}

    def groups(self, node: str, t: float) -> dict[str, float] | None:
        if node == "a":
            return {"policy": 4 * GIB + 3e6 * t, "rollout": 2 * GIB + (t % 7) * 1e5}
        if node == "b":
            return {"rollout": 3 * GIB + (t % 5) * 2e5}
        if node == "c":
            names = ["critic", "policy", "rollout"]
            if self.cycle < 60:
                names.remove("critic")
            if self.cycle >= 110:
                names.remove("rollout")
            return {g: (2 + k) * GIB + 1e6 * t * k for k, g in enumerate(names)}
        return None

    def _figures_of(self, node: str, t: float) -> NodeGroupFigures | None:
        groups = self.groups(node, t)
        if groups is None:
            return None
        held = self._figures.get(node)
        if held is None or self.cycle % 2 == 0:
            published = 2e6 if node == "a" and self.cycle >= 30 else None
            held = self._figures[node] = NodeGroupFigures(
                1.7e9 + t,
                tuple(GroupFigure(g, v, None, 2.0, published) for g, v in sorted(groups.items())),
            )
        return held

    def advance(self) -> None:
        self.cycle += 1
        t = 2.0 * self.cycle
        nodes = ["a", "b", "c", "d"]
        if not 100 <= self.cycle < 130:
            nodes.append("e")
        records: dict[tuple[str, str], NodeRecord] = {}
        for node in nodes:
            ray_node = RayNode(node, "vm-" + node, "")
            previous = self._records.get(ray_node.key)
            figures = self._figures_of(node, t)
            if node == "b" and 50 <= self.cycle < 70 and previous is not None:
                values, at, figures = previous.values, previous.sampled_at, None
            elif node == "e" and self.cycle < 10:
                values, at = None, None
            else:
                inside = sum(g.rss_bytes for g in figures.groups) if figures else 0.0
                total = 32 * GIB if node == "a" and self.cycle >= 90 else TOTAL
                values = {USED_KEY: 5 * GIB + inside + 1e6 * (t % 3), TOTAL_KEY: total}
                at = t
            records[ray_node.key] = NodeRecord(
                ray_node, values, at, None, None, "", 0, {}, groups=figures
            )
        self._records = records

    # What a growth cycle reads of a host-memory monitor.

    def declare_consumer(self) -> None:
        pass

    def records(self) -> dict[tuple[str, str], NodeRecord]:
        return self._records


def _outlook(
    node_id: str, host: str, worker_groups: str, growth: NodeGrowth | None, limit: float | None
) -> NodeOutlook:
    if growth is None:
        return NodeOutlook(node_id, host, worker_groups, None, None, False, limit, None, None)
    return NodeOutlook(
        node_id,
        host,
        worker_groups,
        growth.used,
        growth.growth,
        growth.growing,
        limit,
        growth.time_to_limit(limit),
        growth.fastest_group,
        {name: part.growth for name, part in growth.groups.items() if part.growth is not None},
    )


def _with_published_growth(outlook: NodeOutlook, figures: NodeGroupFigures) -> NodeOutlook:
    published = {
        g.group: g.growth
        for g in figures.groups
        if g.growth is not None and g.group not in outlook.group_growth
    }
    if not published:
        return outlook
    merged = {**outlook.group_growth, **published}
    fastest = outlook.fastest_group or max(merged, key=lambda group: merged[group])
    return dataclasses.replace(outlook, group_growth=merged, fastest_group=fastest)


class _ReferenceCycle:
    """The per-node path the growth cycle had: a dict per reading, caches in dicts per node.

    A node's outlook is built from its history at most once per fit interval; a new label
    names the outlook already built.
    """

    def __init__(self, settings: GrowthSettings) -> None:
        self.history = MemoryHistory(settings)
        self.kill_line = resolve_kill_line_config()
        self.recorded_at: dict[str, float] = {}
        self.stamps: dict[str, float] = {}
        self.outlooks: dict[str, tuple[float, NodeOutlook]] = {}
        self.merged: dict[str, tuple[NodeOutlook, NodeGroupFigures, NodeOutlook]] = {}

    def __call__(self, monitor: _Scripted) -> dict[str, NodeOutlook]:
        _version, labels = DEFAULT_REGISTRY.labels_by_node()
        out = {}
        for record in monitor.records().values():
            node, values, at = record.node.node_id, record.values, record.sampled_at
            used = values.get(USED_KEY) if values else None
            total = values.get(TOTAL_KEY) if values else None
            carried = record.groups if at is not None else None
            if used is not None and at is not None and at > self.recorded_at.get(node, -math.inf):
                anew = carried is None or self.stamps.get(node) != carried.sampled_at
                if carried is None:
                    self.stamps.pop(node, None)
                elif anew:
                    self.stamps[node] = carried.sampled_at
                if anew:
                    groups = {g.group: g.rss_bytes for g in carried.groups} if carried else None
                    self.history.record_node(node, at, used, groups=groups)
                    self.recorded_at[node] = at
            worker_groups = labels.get(node, NO_WORKER_GROUPS)
            previous = self.outlooks.get(node)
            if (
                previous is not None
                and at is not None
                and at - previous[0] < self.history.settings.fit_interval_s
            ):
                outlook = dataclasses.replace(previous[1], worker_groups=worker_groups)
            else:
                limit = self.kill_line.limit(total) if at is not None else None
                outlook = _outlook(
                    node, record.node.host, worker_groups, self.history.node(node), limit
                )
                if at is not None:
                    self.outlooks[node] = (at, outlook)
            if carried is not None:
                held = self.merged.get(node)
                if held is None or held[0] != outlook or held[1] is not carried:
                    held = (outlook, carried, _with_published_growth(outlook, carried))
                    self.merged[node] = held
                outlook = held[2]
            out[node] = outlook
        for gone in [node for node in self.recorded_at if node not in out]:
            del self.recorded_at[gone]
            self.outlooks.pop(gone, None)
            self.merged.pop(gone, None)
            self.stamps.pop(gone, None)
            self.history.forget(gone)
        return out


def _same_history(history: MemoryHistory, reference: MemoryHistory) -> None:
    keys = reference.keys()
    assert history.keys() == keys
    for key in keys:
        assert history.series(key) == reference.series(key), key
        for mine, theirs in zip(history.window(key), reference.window(key)):
            np.testing.assert_array_equal(mine, theirs)
        assert history.buckets(key) == reference.buckets(key), key
    for node in ("a", "b", "c", "d", "e"):
        assert history.node(node) == reference.node(node), node


def test_the_growth_cycle_records_and_outlooks_as_the_per_node_dict_path_did() -> None:
    from raylens.telemetry.host_memory import register_worker_group_nodes

    settings = GrowthSettings(window_s=60.0)
    monitor = _Scripted()
    cycle = GrowthCycle(settings=settings, kill_line=resolve_kill_line_config())
    copies = GrowthCycle(settings=settings, kill_line=resolve_kill_line_config())
    reference = _ReferenceCycle(settings)

    for step in range(160):
        if step == 40:  # a label changes on one node
            register_worker_group_nodes("policy", ["a"])
        monitor.advance()
        cycle(monitor)
        expected = reference(monitor)
        assert cycle.snapshot.latest() == expected, step
        copies(_CopiesOnly(_RecordsAsCopies(monitor)))
        assert copies.snapshot.latest() == expected, step
        if step % 20 == 19:
            _same_history(cycle.history, reference.history)
            _same_history(copies.history, reference.history)

    a = cycle.snapshot.latest()["a"]
    assert a.growing and a.fastest_group == "policy" and a.worker_groups == "policy"
    assert a.limit == pytest.approx(0.95 * 32 * GIB)
    assert set(cycle.history.node("c").groups) == {"critic", "policy"}  # type: ignore[union-attr]


class _RecordsAsCopies:
    """``latest()`` and ``group_figures()`` of a scripted monitor, built from its records."""

    def __init__(self, monitor: _Scripted) -> None:
        self._monitor = monitor

    def latest(self) -> list[NodeSample]:
        _version, labels = DEFAULT_REGISTRY.labels_by_node()
        return [
            NodeSample(
                node_id=r.node.node_id,
                host=r.node.host,
                ip="",
                used=(r.values or {}).get(USED_KEY),
                total=(r.values or {}).get(TOTAL_KEY),
                worker_groups=labels.get(r.node.node_id, NO_WORKER_GROUPS),
                sampled_at=r.sampled_at,
            )
            for r in self._monitor.records().values()
        ]

    def group_figures(self) -> dict[str, tuple[str, NodeGroupFigures, float]]:
        return {
            r.node.node_id: (r.node.host, r.groups, r.sampled_at)
            for r in self._monitor.records().values()
            if r.groups is not None and r.sampled_at is not None
        }


def _scripted(cycles: int) -> tuple[_Scripted, GrowthCycle]:
    """A scripted monitor and a growth cycle run after each of its first ``cycles`` cycles."""
    monitor = _Scripted()
    cycle = GrowthCycle(settings=GrowthSettings(window_s=60.0))
    _advance(monitor, cycle, cycles)
    return monitor, cycle


def _advance(monitor: _Scripted, cycle: GrowthCycle, cycles: int) -> None:
    for _ in range(cycles):
        monitor.advance()
        cycle(monitor)


def test_a_record_seen_again_unchanged_is_not_recorded_again() -> None:
    monitor, cycle = _scripted(1)
    first = cycle.snapshot.latest()

    for _ in range(3):  # the same records, read again
        cycle(monitor)

    assert cycle.snapshot.latest() == first
    keys = cycle.history.keys()
    assert len(keys) == 12  # a, b, c, d (e has no figures yet), their groups, what is outside
    for key in keys:
        times, _values = cycle.history.window(key)
        assert len(times) == 1, key


def test_a_new_scrape_of_an_old_reading_leaves_the_groups_unrecorded() -> None:
    # Cycles 1 and 3 scrape the reading cycle 1 brought; cycle 2 brings a new one.
    _monitor, cycle = _scripted(3)

    times, _values = cycle.history.window(("a", "policy"))
    assert times.tolist() == [2.0, 4.0]
    times, _values = cycle.history.window("d")  # no groups: every new scrape counts
    assert times.tolist() == [2.0, 4.0, 6.0]


def test_a_node_whose_groups_change_has_its_new_groups_recorded() -> None:
    _monitor, cycle = _scripted(62)

    node = cycle.history.node("c")
    assert node is not None and set(node.groups) == {"critic", "policy", "rollout"}
    times, _values = cycle.history.window(("c", "critic"))
    assert times.tolist() == [120.0, 124.0]  # from its first reading on
    other = cycle.history.series(("c", None))
    assert other is not None and other.used is not None and node.used is not None
    inside = math.fsum(view.used or 0.0 for view in node.groups.values())
    assert node.used == pytest.approx(other.used + inside)


def test_a_node_that_leaves_and_comes_back_starts_a_new_history() -> None:
    monitor, cycle = _scripted(101)
    assert "e" not in cycle.snapshot.latest() and cycle.history.node("e") is None

    _advance(monitor, cycle, 30)

    times, _values = cycle.history.window("e")
    assert times.tolist() == [260.0, 262.0]  # its return, at cycle 130, and one cycle on
    assert cycle.snapshot.latest()["e"].growth is None
