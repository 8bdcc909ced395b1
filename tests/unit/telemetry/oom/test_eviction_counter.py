"""Ray's eviction counter: every kill the raylet counts, and nothing a worker forges."""

from __future__ import annotations

import logging
from importlib import resources
from pathlib import Path

import pytest

from raylens.simulation.kill_script import KillScript
from raylens.telemetry.oom import LargestProcess
from raylens.telemetry.oom._kills import EvictionWatch, victim_from_ray_name
from raylens.telemetry.oom._watch import MAX_POSTMORTEMS_PER_CYCLE
from raylens.telemetry.raylet_payload import (
    MAX_EVICTION_NAMES,
    RAY_WORKER_EVICTIONS,
    parse_oom_samples,
)

from .test_oom_watch import Harness

#: A real Ray 2.60 head-node payload after its memory monitor killed ``policy-0-0`` and
#: ``rollout-0-0``, with two series a worker published under the counter's name (a
#: gauge with ``Component="raylet"`` asked for, and a counter).
REAL = resources.files("raylens.simulation").joinpath("payloads/head_evictions.prom").read_bytes()


def test_only_the_raylets_own_series_of_a_real_payload_count() -> None:
    counts = parse_oom_samples(REAL)
    assert counts is not None
    assert counts.ray_evictions == 2.0
    assert counts.ray_victims == (
        ("policy-0-0:Hog.__init__", 1.0),
        ("rollout-0-0:Hog.__init__", 1.0),
    )
    # The payload does carry the forged series: they are refused, not missing.
    assert REAL.count(RAY_WORKER_EVICTIONS.encode() + b'{Component="core_worker"') == 2


def test_a_counter_that_appears_after_an_empty_scrape_counts_its_first_kill(
    tmp_path: Path,
) -> None:
    # The raylet exports the counter only once the node has had a kill.
    harness = Harness(tmp_path, KillScript([(0, 32.0, "ray", "policy-0-0:Worker.__init__")]))
    harness.run(30)
    assert b"eviction" not in harness.cluster.kills.series(0, 30.0)
    harness.run(5)
    (postmortem,) = harness.files()
    assert postmortem["kills"] == 1
    assert postmortem["victim"]["group"] == "policy"  # type: ignore[index]
    assert postmortem["victim"]["ray_name"] == "policy-0-0:Worker.__init__"  # type: ignore[index]
    assert harness.ledger.counts() == {(harness.cluster.nodes[0], "ray"): 1}


def test_several_victims_of_one_round_are_one_post_mortem_listing_them_all(
    tmp_path: Path,
) -> None:
    names = ["policy-0-0:Worker.__init__", "rollout-0-0:Worker.__init__", "IdleTask"]
    harness = Harness(
        tmp_path, KillScript([(0, 31.0 + i / 4, "ray", n) for i, n in enumerate(names)])
    )
    harness.run(35)
    (postmortem,) = harness.files()
    assert postmortem["kills"] == 3
    victims = postmortem["victims"]
    assert isinstance(victims, list)
    assert sorted(v["ray_name"] for v in victims) == sorted(names)
    assert {v["group"] for v in victims} == {"policy", "rollout", None}
    assert harness.ledger.counts() == {(harness.cluster.nodes[0], "ray"): 3}
    (record,) = harness.ledger.recent()
    assert record.as_plain()["kills"] == 3 and record.as_plain()["phase"] == "gen"


def _forged(value: float) -> bytes:
    return (
        f"# TYPE {RAY_WORKER_EVICTIONS} gauge\n"
        f'{RAY_WORKER_EVICTIONS}{{Component="core_worker",Name="x-0-0:W.f",Type="Actor",'
        f'WorkerId="{"ab" * 28}"}} {value}\n'
    ).encode()


def test_a_worker_gauge_of_the_same_name_going_0_16_0_16_adds_no_kill() -> None:
    watch = EvictionWatch()
    added = []
    for value in [0.0, 16.0, 0.0, 16.0, 0.0, 16.0]:
        counts = parse_oom_samples(_forged(value))
        assert counts is None or counts.ray_evictions is None
        added.append(watch.kills("n", None if counts is None else counts.ray_evictions))
    assert added == [(0, [])] * 6


def test_a_raylet_counter_going_down_and_up_counts_past_its_high_water_mark_only() -> None:
    watch = EvictionWatch()
    assert watch.kills("n", None) == (0, [])  # scraped, no counter yet
    assert watch.kills("n", 16.0, [("a-0-0:W.f", 16.0)]) == (16, ["a-0-0:W.f"] * 16)
    assert watch.kills("n", 0.0, [("a-0-0:W.f", 0.0)]) == (0, [])
    assert watch.kills("n", 16.0, [("a-0-0:W.f", 16.0)]) == (0, [])
    assert watch.kills("n", 17.0, [("a-0-0:W.f", 16.0), ("b", 1.0)]) == (1, ["b"])


def test_a_counter_met_non_zero_at_the_first_scrape_is_a_baseline() -> None:
    watch = EvictionWatch()
    assert watch.kills("n", 4.0, [("a", 4.0)]) == (0, [])
    assert watch.kills("n", 5.0, [("a", 5.0)]) == (1, ["a"])


def test_raylens_worker_names_give_their_group_and_others_do_not() -> None:
    assert victim_from_ray_name("policy-0-1:Worker.__init__").group == "policy"
    assert victim_from_ray_name("my-policy-grp2-0:Worker.step").group == "my-policy"
    assert victim_from_ray_name("Worker.__init__").group is None
    assert victim_from_ray_name("policy:Worker.__init__").group is None
    assert victim_from_ray_name("GroupMemorySamplerActor.__init__").is_sampler
    assert not victim_from_ray_name("policy-0-0:Worker.__init__").is_sampler


def test_the_phase_is_the_one_the_job_was_in_though_it_left_it_before_the_counter_showed(
    tmp_path: Path,
) -> None:
    harness = Harness(tmp_path, KillScript([(0, 33.0, "ray", "policy-0-0:Worker.__init__")]))
    harness.phase = "train"
    harness.run(30)
    harness.phase = None  # the failed call ended the phase before the next scrape
    harness.run(5)
    (postmortem,) = harness.files()
    assert postmortem["phase"] == "train"
    assert harness.ledger.recent()[-1].as_plain()["phase"] == "train"


def test_a_kill_long_after_any_phase_has_none(tmp_path: Path) -> None:
    harness = Harness(tmp_path, KillScript([(0, 93.0, "ray")]))
    harness.phase = "train"
    harness.run(30)
    harness.phase = None
    harness.run(65)
    (postmortem,) = harness.files()
    assert postmortem["phase"] is None


def test_a_killed_sampler_is_said_and_not_asked_for_its_processes(tmp_path: Path) -> None:
    harness = Harness(tmp_path, KillScript([(0, 32.0, "ray", "GroupMemorySamplerActor.__init__")]))
    asked: list[str] = []

    def largest(node: str) -> tuple[list[LargestProcess], float]:
        asked.append(node)
        return [], 0.0

    harness.watch.largest_processes_of = largest
    harness.run(35)
    (postmortem,) = harness.files()
    assert postmortem["sampler_killed"] is True and asked == []
    assert postmortem["node"]["used_bytes"] is not None  # type: ignore[index]


def test_a_report_carries_the_phase_it_was_made_in(tmp_path: Path) -> None:
    harness = Harness(tmp_path, KillScript([(0, 33.0, "ray", "policy-0-1:Worker.__init__")]))
    phase = ["train"]
    harness.ledger.phase_of = lambda: phase[0]
    harness.phase = None  # the monitor never sees the phase itself
    harness.run(30)
    harness.ledger.report(node_id=harness.cluster.nodes[0], group="policy", worker_rank=1, pid=9)
    phase[0] = "eval"
    harness.run(5)
    (postmortem,) = harness.files()
    assert postmortem["phase"] == "train"
    assert postmortem["victim"]["pid"] == 9  # type: ignore[index]


def test_a_payload_naming_many_victims_keeps_a_bounded_number_of_names() -> None:
    lines = [
        f'{RAY_WORKER_EVICTIONS}{{Component="raylet",WorkerId="",Name="t{i:04d}"}} 1'
        for i in range(1000)
    ]
    counts = parse_oom_samples("\n".join(lines) + "\n")
    assert counts is not None and counts.ray_evictions == 1000.0
    assert len(counts.ray_victims) == MAX_EVICTION_NAMES
    assert counts.ray_victims[0] == ("", 1000.0 - (MAX_EVICTION_NAMES - 1))


def test_kill_events_past_the_cycles_cap_are_counted_and_named_in_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    nodes = MAX_POSTMORTEMS_PER_CYCLE + 3
    harness = Harness(tmp_path, KillScript([(i, 32.0, "ray") for i in range(nodes)]), nodes=nodes)
    with caplog.at_level(logging.WARNING, logger="raylens.oom"):
        harness.run(35)
    assert len(harness.files()) == MAX_POSTMORTEMS_PER_CYCLE
    assert sum(harness.ledger.counts().values()) == nodes
    (line,) = [r.getMessage() for r in caplog.records if "got no post-mortem" in r.getMessage()]
    assert "3 more kill events" in line
    assert all(node[:16] in line for node in harness.cluster.nodes[MAX_POSTMORTEMS_PER_CYCLE:])
