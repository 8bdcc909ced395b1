"""Series on a node's endpoint are believed only from samplers raylens started.

Any job on a cluster can publish series under raylens' names; these tests give one payload
the series of several publishers, as a node's agent serves them, and check which are read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from raylens.simulation.group_series import render_group_series
from raylens.telemetry import host_memory as hm
from raylens.telemetry.raylet_payload import (
    GroupFigure,
    NodeFigures,
    read_sampler_series,
)
from raylens.telemetry.scraping import outcome_of_payload

NODE = "a" * 56
NOW = 1_800_000_000.0
GIB = 1e9
RAYLET = b'ray_node_mem_total{ip="10.0.0.1"} 6.4e10\nray_node_mem_used{ip="10.0.0.1"} 3.2e10\n'


def _node(sampler: str, started_by: str, used: float = 20 * GIB) -> NodeFigures:
    return NodeFigures(used, 1000.0, 10.0, False, 50 * GIB, None, 600.0, sampler, started_by)


def _sampler(
    worker: str,
    sampler: str,
    started_by: str,
    groups: dict[str, float],
    stamp: float = NOW - 2,
    used: float = 20 * GIB,
) -> bytes:
    return render_group_series(
        [GroupFigure(name, rss, None, 1) for name, rss in groups.items()],
        sampled_at=stamp,
        worker_id=worker,
        node=_node(sampler, started_by, used),
    )


def test_a_sampler_stamped_in_the_future_does_not_replace_the_real_figures() -> None:
    real = _sampler("w1", "real", "driver/1", {"policy": 4 * GIB}, used=20 * GIB)
    forged = _sampler("w2", "forged", "driver/1", {"policy": 1.0}, stamp=1e18, used=1.0)
    outcome = outcome_of_payload(RAYLET + forged + real, 0, now=NOW)
    assert outcome.groups is not None and outcome.groups.node is not None
    assert outcome.groups.sampled_at == NOW - 2
    assert outcome.groups.groups == (GroupFigure("policy", 4 * GIB, None, 1.0),)
    assert outcome.groups.node.used == 20 * GIB
    assert outcome.refused is not None
    count, named = outcome.refused
    assert count == 1
    assert "ray_raylens_sampler_sampled_at_seconds=1e+18" in named[0]
    assert "ahead of this reader's clock" in named[0]


def test_a_stamp_within_the_clock_skew_is_believed() -> None:
    ahead = _sampler("w1", "a", "driver/1", {"policy": GIB}, stamp=NOW + 20)
    found = read_sampler_series(ahead, now=NOW)
    assert found.refused_count == 0
    assert found.figures is not None and found.figures.sampled_at == NOW + 20


def test_two_drivers_samplers_give_the_node_the_union_of_their_groups() -> None:
    one = _sampler("w1", "s1", "driver-a/1", {"trainer": 8 * GIB, "shared": 1 * GIB}, NOW - 1)
    two = _sampler("w2", "s2", "driver-b/2", {"generator": 3 * GIB, "shared": 2 * GIB}, NOW - 3)
    for payload in (one + two, two + one):
        figures = read_sampler_series(payload, now=NOW).figures
        assert figures is not None
        by_name = {group.group: group.rss_bytes for group in figures.groups}
        # Per group, the freshest sampler publishing it.
        assert by_name == {"generator": 3 * GIB, "shared": 1 * GIB, "trainer": 8 * GIB}
        assert figures.node is not None and figures.node.sampler == "s1"
        assert figures.sampled_at == NOW - 1


def test_a_replaced_samplers_lingering_series_do_not_add_groups() -> None:
    old = _sampler("w1", "old", "driver-a/1", {"moved": GIB, "policy": 9 * GIB}, NOW - 8)
    new = _sampler("w2", "new", "driver-a/1", {"policy": 5 * GIB}, NOW - 1)
    figures = read_sampler_series(old + new, now=NOW).figures
    assert figures is not None
    assert [group.group for group in figures.groups] == ["policy"]
    assert figures.groups[0].rss_bytes == 5 * GIB


def test_series_of_a_sampler_raylens_did_not_start_are_ignored_and_counted() -> None:
    ours = _sampler("w1", "ours", "driver/1", {"policy": 4 * GIB}, NOW - 2)
    theirs = _sampler("w9", "job-actor", "someone/9", {"policy": 1.0, "fake": GIB}, NOW - 1)
    anonymous = render_group_series([GroupFigure("ghost", GIB, None, 1)], sampled_at=NOW - 1)
    outcome = outcome_of_payload(
        RAYLET + theirs + anonymous + ours, 0, now=NOW, trusted={"ours": ""}
    )
    assert outcome.groups is not None
    assert outcome.groups.groups == (GroupFigure("policy", 4 * GIB, None, 1.0),)
    assert outcome.refused is not None
    count, named = outcome.refused
    assert count == 2
    assert any("'job-actor'" in name and "unknown" in name for name in named)


def test_a_job_copying_a_known_samplers_id_is_refused_once_its_worker_is_known() -> None:
    ours = _sampler("w1", "ours", "driver/1", {"policy": 4 * GIB}, NOW - 2)
    copy = _sampler("w9", "ours", "driver/1", {"policy": 1.0}, NOW - 1, used=1.0)
    believed = read_sampler_series(copy + ours, now=NOW, trusted={"ours": "w1"})
    assert believed.figures is not None and believed.figures.node is not None
    assert believed.figures.groups == (GroupFigure("policy", 4 * GIB, None, 1.0),)
    assert believed.figures.node.used == 20 * GIB
    assert believed.unknown == 1
    assert believed.refused == (
        "ray_raylens_sampler_growth_window_seconds{rl_sampler='ours'} (not its worker)",
    )


def test_with_no_known_sampler_nothing_on_the_node_is_believed() -> None:
    payload = _sampler("w1", "s1", "driver/1", {"policy": GIB})
    found = read_sampler_series(payload, now=NOW, trusted={})
    assert found.figures is None
    assert found.unknown == 1


def test_a_stale_sampler_gives_way_to_a_fresh_one_and_alone_is_marked_stale() -> None:
    stuck = _sampler("w1", "stuck", "driver-a/1", {"trainer": 8 * GIB}, NOW - 600)
    live = _sampler("w2", "live", "driver-b/2", {"generator": 3 * GIB}, NOW - 1)
    figures = read_sampler_series(stuck + live, now=NOW).figures
    assert figures is not None and [g.group for g in figures.groups] == ["generator"]
    assert figures.node is not None and figures.node.stale_for is None
    alone = read_sampler_series(stuck, now=NOW).figures
    assert alone is not None and alone.node is not None
    assert alone.node.stale_for == 600
    assert alone.sampled_at == NOW - 600


def test_a_future_stamp_and_an_unknown_publisher_are_named_in_the_nodes_one_warning(
    caplog: pytest.LogCaptureFixture, one_node_monitor: Callable[..., hm.HostMemoryMonitor]
) -> None:
    ours = _sampler("w1", "ours", "driver/1", {"policy": 4 * GIB}, NOW - 2)
    theirs = _sampler("w9", "job-actor", "someone/9", {"fake": GIB}, NOW - 1)
    ahead = _sampler("w8", "ours", "driver/1", {"policy": 1.0}, stamp=1e18)
    outcome = outcome_of_payload(RAYLET + theirs + ahead + ours, 0, now=NOW, trusted={"ours": ""})

    monitor = one_node_monitor(outcome)
    with caplog.at_level(logging.WARNING, logger="raylens"):
        for _ in range(3):
            monitor.collect_once()
    figures = monitor.group_figures()[NODE][1]
    monitor.stop()

    assert [g.group for g in figures.groups] == ["policy"] and figures.groups[
        0
    ].rss_bytes == 4 * GIB
    warnings = [r.getMessage() for r in caplog.records if "does not believe" in r.getMessage()]
    assert len(warnings) == 1
    assert "ahead of this reader's clock" in warnings[0] and "'job-actor'" in warnings[0]
