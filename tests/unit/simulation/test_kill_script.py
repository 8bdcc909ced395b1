"""Scripted OOM kills: both counters over simulated time, served as a raylet serves them."""

from __future__ import annotations

import pytest

from raylens.simulation.kill_script import KillScript
from raylens.telemetry.oom import Killer
from raylens.telemetry.raylet_payload import NodeOomCounts, parse_oom_samples


def test_counts_follow_the_script_and_parse_back() -> None:
    script = KillScript([(0, 10.0, "ray"), (0, 20.0, Killer.KERNEL), (1, 15.0, "kernel")])
    assert script.counts(0, 9.0) == (0, 0)
    assert script.counts(0, 25.0) == (1, 1)
    assert parse_oom_samples(script.series(0, 25.0)) == NodeOomCounts(
        1.0, 1.0, (("MemoryWorker", 1.0),)
    )
    # Like Ray's raylet, a node without a kill serves no eviction counter at all.
    assert parse_oom_samples(script.series(1, 25.0)) == NodeOomCounts(None, 1.0)


def test_scripted_victims_are_named_on_the_counter() -> None:
    script = KillScript([(0, 1.0, "ray", "policy-0-0:W.f"), (0, 2.0, "ray", "policy-0-0:W.f")])
    counts = parse_oom_samples(script.series(0, 5.0))
    assert counts is not None and counts.ray_victims == (("policy-0-0:W.f", 2.0),)


def test_nodes_of_one_machine_share_the_kernel_count() -> None:
    script = KillScript([(0, 5.0, "kernel")], same_machine=[(0, 1)])
    assert script.counts(1, 6.0) == (0, 1)


def test_a_bad_kill_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="killer must be 'ray' or 'kernel', got 'oom'"):
        KillScript([(0, 1.0, "oom")])
    with pytest.raises(ValueError, match="node must be an index"):
        KillScript([(-1, 1.0, "ray")])


def test_the_raylets_eviction_series_are_summed_and_the_freshest_kernel_count_wins() -> None:
    raylet = 'Component="raylet",WorkerId=""'
    payload = (
        f'ray_memory_manager_worker_eviction_total{{{raylet},Name="A",Type="Actor"}} 2\n'
        f'ray_memory_manager_worker_eviction_total{{{raylet},Name="f",Type="Task"}} 3\n'
        'ray_memory_manager_worker_eviction_total{Component="core_worker",Name="A"} 9\n'
        'ray_memory_manager_worker_eviction_total{Name="A",Type="Actor"} 9\n'
        'ray_raylens_node_oom_kills{WorkerId="old",oom_source="vmstat"} 4\n'
        'ray_raylens_node_oom_kills{WorkerId="new",oom_source="vmstat"} 6\n'
        "ray_node_mem_used 1\n"
    )
    assert parse_oom_samples(payload) == NodeOomCounts(5.0, 6.0, (("A", 2.0), ("f", 3.0)))
    assert parse_oom_samples("ray_node_mem_used 1\n") is None
