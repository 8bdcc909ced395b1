"""Per-group figures read back from a raylet payload, as samplers publish them through Ray."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from raylens.simulation import SimulatedCluster
from raylens.simulation.group_series import render_group_series
from raylens.simulation.raylet import load_payload
from raylens.telemetry.raylet_payload import (
    GroupFigure,
    NodeGroupFigures,
    parse_group_samples,
    parse_memory_samples,
)

# Written by Ray 2.60's own exporter for a gauge set in an actor (labels sorted, escaped).
RAY_LINE = (
    'ray_raylens_worker_group_memory_bytes{Component="core_worker",NodeAddress="192.0.2.2",'
    'SessionName="session_2026-12-01_20-50-27_391290_12532",Version="2.60.0",'
    'WorkerId="c8aad7fbd30b76415162e3abb12a54563da817ce5ed531a5483380a3",memory_type="rss",'
    'otel_scope_name="ray._private.telemetry.open_telemetry_metric_recorder",'
    'otel_scope_schema_url="",otel_scope_version="",rl_worker_group="pol\\"i\\\\cy"} 1.234567e+06\n'
    'ray_raylens_sampler_sampled_at_seconds{Component="core_worker",NodeAddress="192.0.2.2",'
    'SessionName="s",Version="2.60.0",'
    'WorkerId="c8aad7fbd30b76415162e3abb12a54563da817ce5ed531a5483380a3"} 1.7e+09\n'
)


def test_a_line_as_ray_serves_it_is_read_with_its_group_unescaped() -> None:
    payload = load_payload("head") + RAY_LINE.encode()
    figures = parse_group_samples(payload)
    assert figures == NodeGroupFigures(1.7e9, (GroupFigure('pol"i\\cy', 1234567.0, None, None),))
    assert parse_memory_samples(payload) == parse_memory_samples(load_payload("head"))


def test_a_payload_without_a_sampler_has_no_group_figures() -> None:
    assert parse_group_samples(load_payload("head")) is None


def test_only_the_freshest_samplers_series_count() -> None:
    old = render_group_series(
        [GroupFigure("policy", 9e9, None, 3), GroupFigure("gone", 1.0, None, 1)],
        sampled_at=100.0,
        worker_id="old",
    )
    new = render_group_series(
        [GroupFigure("policy", 5e9, 4e9, 2)], sampled_at=160.0, worker_id="new"
    )
    figures = parse_group_samples(old + new)
    assert figures == NodeGroupFigures(160.0, (GroupFigure("policy", 5e9, 4e9, 2.0),))
    assert parse_group_samples(new + old) == figures


def test_a_group_published_as_nan_is_absent() -> None:
    payload = render_group_series([GroupFigure("policy", 1e9, None, 1)], sampled_at=5.0)
    payload += payload.replace(b"policy", b"left").replace(b"1.000000e+09", b"NaN")
    assert parse_group_samples(payload) == NodeGroupFigures(
        5.0, (GroupFigure("policy", 1e9, None, 1.0),)
    )


def test_a_monitor_hands_on_the_group_figures_its_scrape_carried(
    simulated_cluster: Callable[..., SimulatedCluster], make_monitor: Callable[..., Any]
) -> None:
    sim = simulated_cluster(2)
    published = render_group_series(
        [GroupFigure("policy", 3e9, 2.5e9, 4), GroupFigure("rollout", 1e9, None, 1)],
        sampled_at=1.7e9,
    )
    sim.raylet(0).serve_garbage(load_payload("worker") + published)
    monitor = make_monitor(sim.cluster, scrape_mode="inprocess")

    monitor.collect_once()

    figures = monitor.group_figures()
    assert set(figures) == {sim.node_id(0)}
    _host, carried, _read_at = figures[sim.node_id(0)]
    assert carried.groups == (
        GroupFigure("policy", 3e9, 2.5e9, 4.0),
        GroupFigure("rollout", 1e9, None, 1.0),
    )
    assert all(sample.error is None for sample in monitor.latest())


def test_a_published_growth_is_read_with_its_group() -> None:
    payload = render_group_series(
        [GroupFigure("policy", 3e9, None, 2, 1.5e6), GroupFigure("rollout", 1e9, None, 1)],
        sampled_at=9.0,
    )
    figures = parse_group_samples(payload)
    assert figures is not None
    assert [(f.group, f.growth) for f in figures.groups] == [("policy", 1.5e6), ("rollout", None)]


def test_a_published_pss_age_is_read_with_its_pss_only() -> None:
    payload = render_group_series(
        [GroupFigure("policy", 3e9, 2e9, 2, None, 41.5), GroupFigure("rollout", 1e9, None, 1)],
        sampled_at=9.0,
    )
    orphan = render_group_series(
        [GroupFigure("rollout", 1e9, None, 1, None, 7.0)], sampled_at=9.0
    ).split(b"\n")
    payload += b"\n".join(line for line in orphan if b"pss_age" in line) + b"\n"
    figures = parse_group_samples(payload)
    assert figures is not None
    # An age with no PSS beside it says nothing and is dropped.
    assert [(f.group, f.pss_age_s) for f in figures.groups] == [("policy", 41.5), ("rollout", None)]
