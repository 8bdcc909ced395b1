"""OOM kills from the three sources, joined once each, on simulated time."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from raylens.simulation.kill_script import KillScript
from raylens.telemetry.growth import (
    GrowthSettings,
    NodeGrowthKeeper,
    RecentHistory,
    resolve_kill_line_config,
)
from raylens.telemetry.growth_outlook import GrowthCycle
from raylens.telemetry.host_memory import NodeSample
from raylens.telemetry.oom import (
    RL_HOST_OOM_KILLS_METRIC,
    LargestProcess,
    OomLedger,
    OomWatch,
    PostMortemWriter,
    register_oom_counter,
)
from raylens.telemetry.raylet_payload import (
    GroupFigure,
    NodeGroupFigures,
    NodeOomCounts,
    parse_oom_samples,
)
from raylens_fakes import MetricsProbe

GIB = 1024**3
#: How Ray's counter names the ``policy`` group's worker 0-1 killed in its constructor.
POLICY_WORKER = "policy-0-1:Worker.__init__"
TOTAL = 64 * GIB


class ScriptedCluster:
    """Nodes whose groups and kill counters follow scripts, read as a monitor would read them.

    Kill counters are rendered as the endpoint serves them and parsed back, so the
    payload parser is exercised too. ``policy`` grows 1 MiB/s on every node.
    """

    def __init__(self, kills: KillScript, nodes: int = 2, *, host: str | None = None) -> None:
        self.kills = kills
        self.t = 0.0
        self.nodes = [f"node{i:02d}" + "f" * 50 for i in range(nodes)]
        self.host = host

    def host_of(self, index: int) -> str:
        return self.host or f"host-{index}"

    def groups(self) -> dict[str, float]:
        return {"policy": 4 * GIB + 1024**2 * self.t, "rollout": 2 * GIB}

    def latest(self) -> list[NodeSample]:
        return [
            NodeSample(
                node_id=node,
                host=self.host_of(i),
                ip="127.0.0.1",
                used=8 * GIB + sum(self.groups().values()),
                total=TOTAL,
                worker_groups="policy,rollout",
                sampled_at=self.t,
            )
            for i, node in enumerate(self.nodes)
        ]

    def group_figures(self) -> dict[str, tuple[str, NodeGroupFigures, float]]:
        figures = tuple(GroupFigure(g, v, None, 1.0) for g, v in sorted(self.groups().items()))
        return {
            node: (self.host_of(i), NodeGroupFigures(1.7e9 + self.t, figures), self.t)
            for i, node in enumerate(self.nodes)
        }

    def oom_counts(self) -> dict[str, tuple[str, NodeOomCounts, float]]:
        found = {}
        for i, node in enumerate(self.nodes):
            counts = parse_oom_samples(self.kills.series(i, self.t))
            assert counts is not None
            found[node] = (self.host_of(i), counts, self.t)
        return found


class Harness:
    def __init__(self, tmp_path: Path, kills: KillScript, **cluster: object) -> None:
        self.cluster = ScriptedCluster(kills, **cluster)  # type: ignore[arg-type]
        kill_line = resolve_kill_line_config(threshold=0.9)
        # Each node's sampler keeps its history; a post-mortem asks it at the kill's wall time.
        self.keepers = {
            node: NodeGrowthKeeper(GrowthSettings(window_s=60.0), kill_line)
            for node in self.cluster.nodes
        }
        self.growth = GrowthCycle(
            kill_line=kill_line,
            node_history=self._node_history,
            wall_of=lambda at: 1.7e9 + at,
        )
        self.ledger = OomLedger()
        self.phase: str | None = "gen"
        self.dir = tmp_path / "pm"
        self.watch = OomWatch(
            growth=self.growth,
            writer=PostMortemWriter(self.dir),
            phase_of=lambda: self.phase,
            largest_processes_of=lambda node: (
                [LargestProcess(4242, "policy", 3 * GIB), LargestProcess(4343, "rollout", GIB)],
                1.7e9,
            ),
            ledger=self.ledger,
            wall_clock=lambda: 1.7e9 + self.cluster.t,
        )

    def _node_history(self, node: str, at_wall: float) -> RecentHistory:
        return self.keepers[node].recent(at_wall - 1.7e9)

    def run(self, seconds: int, step: float = 5.0) -> None:
        for _ in range(int(seconds / step)):
            self.cluster.t += step
            for sample in self.cluster.latest():
                assert sample.used is not None
                self.keepers[sample.node_id].record(
                    self.cluster.t, sample.used, self.cluster.groups(), host_total=TOTAL
                )
            self.growth(self.cluster)
            self.watch(self.cluster)

    def files(self) -> list[dict[str, object]]:
        if not self.dir.exists():
            return []
        return [json.loads(p.read_text()) for p in sorted(self.dir.iterdir())]


def test_a_raylet_counter_increase_is_one_post_mortem_and_the_first_scrape_only_sets_the_baseline(
    tmp_path: Path,
) -> None:
    # A kill before raylens first looked is history, not news; the one at 700 s is news.
    harness = Harness(tmp_path, KillScript([(0, 1.0, "ray"), (0, 702.0, "ray")]))
    harness.run(700)
    assert harness.files() == []
    harness.run(10)

    (postmortem,) = harness.files()
    assert postmortem["killer"] == "ray"
    assert postmortem["node_id"] == harness.cluster.nodes[0]
    assert postmortem["phase"] == "gen"
    assert postmortem["victim"] == {
        "group": None,
        "worker_rank": None,
        "pid": None,
        "ray_name": "MemoryWorker",
    }
    node = postmortem["node"]
    assert isinstance(node, dict)
    assert node["limit_bytes"] == round(0.9 * TOTAL)
    assert node["used_bytes"] > 14 * GIB
    groups = postmortem["worker_groups"]
    assert isinstance(groups, dict) and set(groups) == {"policy", "rollout"}
    # Ten minutes back, though the growth window is one: samples in it, buckets before it.
    samples, buckets = groups["policy"]["samples"], groups["policy"]["buckets"]
    assert samples[-1][0] == pytest.approx(0.0) and samples[0][0] >= -60.0
    assert buckets and buckets[0][1] > -600.0 and buckets[0][0] < -500.0
    assert samples[-1][1] > samples[0][1]  # policy grew
    assert postmortem["largest_processes"][0] == {
        "pid": 4242,
        "group": "policy",
        "rss_bytes": 3 * GIB,
    }
    assert harness.ledger.counts() == {(harness.cluster.nodes[0], "ray"): 1}


def test_a_counter_that_goes_down_and_up_adds_no_kill_below_its_high_water_mark(
    tmp_path: Path,
) -> None:
    kills = KillScript([(0, 1.0, "ray"), (0, 2.0, "ray"), (0, 3.0, "ray")])
    harness = Harness(tmp_path, kills)
    harness.run(20)  # met at 3 on the first scrape: a baseline
    kills.kills.clear()  # the counter drops to nothing...
    harness.run(20)
    for t in (45.0, 46.0, 47.0):  # ...and climbs back to 3: no kill it did not make
        kills.add(0, t, "ray")
    harness.run(10)
    assert harness.files() == []
    kills.add(0, 52.0, "ray")  # past 3: one kill
    harness.run(10)
    assert len(harness.files()) == 1
    assert harness.ledger.counts() == {(harness.cluster.nodes[0], "ray"): 1}


def test_a_kernel_kill_on_a_machine_shared_by_two_nodes_is_one_post_mortem(
    tmp_path: Path,
) -> None:
    kills = KillScript([(0, 32.0, "kernel")], same_machine=[(0, 1)])
    harness = Harness(tmp_path, kills, host="one-machine")
    harness.run(40)
    (postmortem,) = harness.files()
    assert postmortem["killer"] == "kernel"
    assert sum(harness.ledger.counts().values()) == 1


def test_kernel_kills_on_two_machines_are_two_post_mortems(tmp_path: Path) -> None:
    harness = Harness(tmp_path, KillScript([(0, 32.0, "kernel"), (1, 33.0, "kernel")]))
    harness.run(40)
    assert sorted(p["node_id"] for p in harness.files()) == sorted(harness.cluster.nodes)


def _report(harness: Harness, node: int = 0) -> None:
    harness.ledger.report(
        node_id=harness.cluster.nodes[node], group="policy", worker_rank=1, pid=4242
    )


def test_the_counter_and_the_error_of_one_worker_in_one_cycle_are_one_post_mortem(
    tmp_path: Path,
) -> None:
    harness = Harness(tmp_path, KillScript([(0, 32.0, "ray", POLICY_WORKER)]))
    harness.run(30)
    _report(harness)
    harness.run(10)
    (postmortem,) = harness.files()
    assert postmortem["victim"] == {
        "group": "policy",
        "worker_rank": 1,
        "pid": 4242,
        "ray_name": POLICY_WORKER,
    }
    assert postmortem["seen_by"] == ["out_of_memory_error", "ray_counter"]
    assert sum(harness.ledger.counts().values()) == 1


def test_an_error_reported_before_the_counter_shows_is_one_post_mortem(tmp_path: Path) -> None:
    harness = Harness(tmp_path, KillScript([(0, 37.0, "ray", POLICY_WORKER)]))
    harness.run(30)
    _report(harness)
    harness.run(5)  # written from the report; the counter moves in the next scrape
    assert [p["victim"]["group"] for p in harness.files()] == ["policy"]  # type: ignore[index]
    harness.run(10)
    assert len(harness.files()) == 1
    assert sum(harness.ledger.counts().values()) == 1


def test_an_error_reported_after_the_counter_names_the_victim_in_the_same_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    harness = Harness(tmp_path, KillScript([(0, 32.0, "ray", POLICY_WORKER)]))
    with caplog.at_level(logging.INFO, logger="raylens.oom"):
        harness.run(35)
        (first,) = harness.files()
        assert first["victim"]["group"] == "policy"  # type: ignore[index]
        assert first["victim"]["pid"] is None  # type: ignore[index]
        _report(harness)
        harness.run(5)
    (postmortem,) = harness.files()
    assert postmortem["victim"]["pid"] == 4242  # type: ignore[index]
    assert postmortem["seen_by"] == ["out_of_memory_error", "ray_counter"]
    assert sum(harness.ledger.counts().values()) == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "group 'policy'" in warnings[0]
    assert harness.ledger.recent()[-1].victim.pid == 4242


def test_an_error_long_after_a_counted_kill_is_a_kill_of_its_own(tmp_path: Path) -> None:
    harness = Harness(tmp_path, KillScript([(0, 32.0, "ray", POLICY_WORKER)]))
    harness.run(200)
    _report(harness)
    harness.run(5)
    assert len(harness.files()) == 2


def test_one_warning_line_names_the_group_and_the_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    harness = Harness(tmp_path, KillScript())
    harness.run(10)
    _report(harness)
    with caplog.at_level(logging.WARNING, logger="raylens.oom"):
        harness.run(5)
    (line,) = [r.getMessage() for r in caplog.records]
    (path,) = harness.dir.iterdir()
    assert "a worker of group 'policy' (rank 1, pid 4242)" in line and str(path) in line


def test_the_counter_counts_kills_by_node_and_killer(
    tmp_path: Path, metrics_probe: MetricsProbe
) -> None:
    harness = Harness(
        tmp_path, KillScript([(0, 32.0, "ray"), (1, 33.0, "kernel"), (0, 52.0, "ray")])
    )
    register_oom_counter(harness.ledger)
    harness.run(60)
    metrics_probe.collect()
    points = {
        (dict(a)["ray.node.id"], dict(a)["killer"]): v
        for a, v in metrics_probe.points(RL_HOST_OOM_KILLS_METRIC).items()
    }
    assert points == {
        (harness.cluster.nodes[0], "ray"): 2,
        (harness.cluster.nodes[1], "kernel"): 1,
    }


def test_recent_kills_are_bounded_and_plain(tmp_path: Path) -> None:
    harness = Harness(tmp_path, KillScript([(0, 10.0 + 5 * i, "ray") for i in range(40)]))
    harness.watch.writer = None  # a watch that only shows kills
    harness.run(5)
    harness.run(300)
    recent = harness.ledger.recent()
    assert len(recent) == 20
    assert recent[-1].as_plain()["killer"] == "ray"
    assert recent[-1].as_plain()["postmortem"] is None


def test_a_cycle_asks_few_samplers_for_their_largest_processes(tmp_path: Path) -> None:
    harness = Harness(tmp_path, KillScript([(0, 32.0, "ray")]), nodes=8)
    asked: list[str] = []
    harness.watch.largest_processes_of = lambda node: asked.append(node) or None
    harness.cluster.kills.kills.extend(KillScript([(i, 32.0, "ray") for i in range(1, 8)]).kills)
    harness.run(40)
    assert len(harness.files()) == 8 and len(asked) == 4
