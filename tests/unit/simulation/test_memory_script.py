"""Scripted memory: leaks, sawtooth, steps, spikes and jitter, deterministic on simulated time."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raylens.simulation.memory_script import (
    GIB,
    MIB,
    Jitter,
    Leak,
    MemoryScript,
    Sawtooth,
    Spikes,
    Steps,
    realistic_script,
)
from raylens.simulation.simulated_cluster import SimulatedCluster


def test_a_leak_rises_at_its_rate_between_start_and_stop() -> None:
    script = MemoryScript()
    script.set_group(0, "g", Leak(1000.0, start=10.0, stop=20.0), base=5.0)
    values = script.group_values(0, "g", [0.0, 10.0, 15.0, 20.0, 99.0])
    assert list(values) == [5.0, 5.0, 5005.0, 10005.0, 10005.0]


def test_a_sawtooth_rises_over_its_period_and_drops_at_once() -> None:
    script = MemoryScript(seed=1)
    script.set_group(0, "g", Sawtooth(100.0, 10.0))
    t = np.arange(0.0, 100.0, 0.5)
    values = script.group_values(0, "g", t)
    assert values.min() >= -100.0 and values.max() <= 100.0
    drops = np.flatnonzero(np.diff(values) < -150.0)
    assert len(drops) in (9, 10)
    assert np.allclose(np.diff(drops), 20)  # every 10 s at two samples a second


def test_steps_alternate_between_the_base_and_a_raised_level() -> None:
    script = MemoryScript(seed=2)
    script.set_group(0, "g", Steps(2 * GIB, (60.0, 120.0), spread=0.1))
    values = script.group_values(0, "g", np.arange(0.0, 3600.0))
    levels = values[np.concatenate([[True], np.diff(values) != 0])]
    assert set(np.round(levels[::2] / GIB, 6)) == {0.0}
    assert all(1.8 <= level / GIB <= 2.2 for level in levels[1::2])
    lengths = np.diff(np.flatnonzero(np.diff(values) != 0))
    assert lengths.min() >= 59 and lengths.max() <= 121


def test_spikes_are_short_and_about_as_frequent_as_asked() -> None:
    script = MemoryScript(seed=3)
    script.set_group(0, "g", Spikes(1 / 600, (1 * GIB, 2 * GIB), (1.0, 3.0)))
    values = script.group_values(0, "g", np.arange(0.0, 86_400.0))
    starts = np.flatnonzero(np.diff((values > 0).astype(int)) == 1)
    assert 100 <= len(starts) <= 190  # 144 expected
    assert values.max() <= 4 * GIB


def test_jitter_is_bounded_and_fixed_for_each_time() -> None:
    script = MemoryScript(seed=4)
    script.set_group(0, "g", Jitter(MIB))
    t = np.arange(0.0, 1000.0)
    values = script.group_values(0, "g", t)
    assert np.abs(values).max() <= MIB and values.std() > MIB / 4
    assert np.array_equal(values[::-1], script.group_values(0, "g", t[::-1]))


@settings(max_examples=20)
@given(seed=st.integers(0, 2**31), cuts=st.lists(st.integers(1, 7199), max_size=6, unique=True))
def test_the_same_seed_gives_the_same_bytes_however_time_is_asked_for(
    seed: int, cuts: list[int]
) -> None:
    t = np.arange(0.0, 7200.0)
    whole = realistic_script(2, seed=seed).group_values(1, "policy", t)
    pieces = realistic_script(2, seed=seed)
    bounds = [0, *sorted(cuts), len(t)]
    parts = [pieces.group_values(1, "policy", t[a:b]) for a, b in itertools.pairwise(bounds)]
    assert np.array_equal(whole, np.concatenate(parts))
    later_first = realistic_script(2, seed=seed)
    later_first.group_values(1, "policy", t[-10:])
    assert np.array_equal(whole, later_first.group_values(1, "policy", t))


def test_seeds_nodes_and_groups_differ() -> None:
    t = np.arange(0.0, 600.0)
    a = realistic_script(2, seed=1)
    b = realistic_script(2, seed=2)
    assert not np.array_equal(a.group_values(0, "policy", t), b.group_values(0, "policy", t))
    assert not np.array_equal(a.group_values(0, "policy", t), a.group_values(1, "policy", t))
    assert not np.array_equal(a.group_values(0, "policy", t), a.group_values(0, "rollout", t))


def test_the_node_holds_its_groups_and_what_lies_outside_them() -> None:
    script = realistic_script(1, ("a", "b"), seed=5, leaks={(0, "a"): Leak(1e6)})
    t = np.arange(0.0, 100.0)
    used, groups = script.node_values(0, t)
    assert set(groups) == {"a", "b"}
    other = script.group_values(0, None, t)
    assert np.allclose(used, other + groups["a"] + groups["b"])
    assert script.groups(0, 50.0) == {"a": groups["a"][50], "b": groups["b"][50]}
    assert script.schedule(0, 50.0) == (pytest.approx(used[50]), 64 * GIB)
    with pytest.raises(ValueError, match="not scripted"):
        realistic_script(1, ("a",), leaks={(3, "a"): Leak(1.0)})


def test_a_restarting_cycle_starts_again_at_each_step() -> None:
    script = MemoryScript(seed=6)
    script.set_group(
        0,
        "g",
        Steps(2 * GIB, (100.0, 100.0), spread=0.0),
        Sawtooth(100 * MIB, 1000.0, restart_at_steps=True),
    )
    values = script.group_values(0, "g", np.arange(0.0, 1000.0))
    steps = np.flatnonzero(np.abs(np.diff(values)) > GIB) + 1
    assert len(steps) >= 8
    for at in steps:
        assert values[at] - (2 * GIB if values[at] > GIB else 0.0) == pytest.approx(
            -100 * MIB, abs=3 * MIB
        )


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda: Leak(float("nan")), "rate"),
        (lambda: Leak(1.0, start=5.0, stop=1.0), "stop"),
        (lambda: Sawtooth(1.0, 0.0), "period"),
        (lambda: Sawtooth(1.0, 1.0, jitter=1.0), "jitter"),
        (lambda: Steps(1.0, (0.0, 5.0)), "every"),
        (lambda: Steps(1.0, (5.0, 1.0)), "every"),
        (lambda: Spikes(-1.0, (1.0, 2.0), (1.0, 2.0)), "rate"),
        (lambda: Jitter(-1.0), "amplitude"),
        (lambda: MemoryScript(total=0), "total"),
    ],
)
def test_bad_components_are_refused_by_name(make, named: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=named):
        make()


def test_a_script_drives_a_simulated_cluster_on_an_injected_clock() -> None:
    now = [1000.0]
    script = realistic_script(2, ("policy",), seed=9)
    with SimulatedCluster(
        2, schedule=script.schedule, groups=script.groups, clock=lambda: now[0]
    ) as sim:
        now[0] += 30.0
        assert sim.expected(1) == script.schedule(1, 30.0)
        assert sim.expected_groups(1) == script.groups(1, 30.0)
    assert SimulatedCluster(0).expected_groups(0) == {}
