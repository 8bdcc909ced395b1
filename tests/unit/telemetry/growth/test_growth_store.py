"""MemoryHistory: per node and per group, on simulated time, bounded, and the same in bulk."""

from __future__ import annotations

import math
import statistics
import threading

import numpy as np
import pytest

from raylens.simulation.memory_script import Jitter, Leak, MemoryScript, Sawtooth
from raylens.telemetry.growth import GrowthSettings, MemoryHistory, kill_line
from raylens.telemetry.growth._store import Key

MIB = float(1 << 20)
GIB = float(1 << 30)
MIB_MIN = MIB / 60


def cluster(leak_rate: float = 0.0) -> MemoryScript:
    """One node, two groups with allocator cycles; ``policy`` leaks from the start."""
    script = MemoryScript(seed=7)
    script.set_other(0, Jitter(8 * MIB), base=4 * GIB)
    script.set_group(
        0, "policy", Sawtooth(200 * MIB, 45.0), Leak(leak_rate), Jitter(2 * MIB), base=6 * GIB
    )
    script.set_group(0, "rollout", Sawtooth(300 * MIB, 70.0), Jitter(2 * MIB), base=3 * GIB)
    return script


def replay(history: MemoryHistory, script: MemoryScript, seconds: int, *, bulk: bool) -> None:
    t = np.arange(0.0, float(seconds))
    used, groups = script.node_values(0, t)
    if bulk:
        history.record_node_many("n0", t, used, groups)
        return
    for k in range(seconds):
        history.record_node(
            "n0", float(t[k]), float(used[k]), {g: float(v[k]) for g, v in groups.items()}
        )


def test_growth_is_absent_until_a_window_has_been_seen() -> None:
    history = MemoryHistory()
    replay(history, cluster(), 250, bulk=False)
    view = history.node("n0")
    assert view is not None
    assert view.growth is None and not view.growing
    assert set(view.groups) == {"policy", "rollout"}
    assert all(g.growth is None for g in view.groups.values())
    assert view.used == pytest.approx(view.other.used + sum(g.used for g in view.groups.values()))  # type: ignore[union-attr,misc]


def test_a_leaking_group_is_found_and_named_and_the_node_gets_a_time_to_limit() -> None:
    history = MemoryHistory()
    replay(history, cluster(leak_rate=50 * MIB_MIN), 2400, bulk=False)
    view = history.node("n0")
    assert view is not None
    policy, rollout = view.groups["policy"], view.groups["rollout"]
    assert policy.growing and policy.growth == pytest.approx(50 * MIB_MIN, rel=0.1)
    assert not rollout.growing and abs(rollout.growth or 0) < 2 * MIB_MIN
    assert view.fastest_group == "policy"
    assert view.growing and view.growth == pytest.approx(50 * MIB_MIN, rel=0.15)
    line = kill_line(64 * GIB)
    seconds = view.time_to_limit(line)
    assert view.peak is not None and view.peak >= view.used  # type: ignore[operator]
    assert seconds == pytest.approx((line - view.peak) / view.growth)  # type: ignore[operator]


def test_no_leak_no_flag() -> None:
    history = MemoryHistory()
    replay(history, cluster(), 3600, bulk=True)
    view = history.node("n0")
    assert view is not None and not view.growing and view.growth is not None
    assert abs(view.growth) < 2 * MIB_MIN
    assert view.time_to_limit(kill_line(64 * GIB)) is None
    assert all(g.spells == 0 for g in view.groups.values())


def test_bulk_and_one_by_one_give_the_same_figures() -> None:
    script = cluster(leak_rate=20 * MIB_MIN)
    one, many = MemoryHistory(), MemoryHistory()
    replay(one, script, 1500, bulk=False)
    replay(many, script, 1500, bulk=True)
    assert one.node("n0") == many.node("n0")


def test_figures_do_not_depend_on_when_they_are_read() -> None:
    script = cluster(leak_rate=20 * MIB_MIN)
    read_often, read_once = MemoryHistory(), MemoryHistory()
    t = np.arange(0.0, 1500.0)
    used, groups = script.node_values(0, t)
    for start in range(0, 1500, 100):
        part = slice(start, start + 100)
        read_often.record_node_many(
            "n0", t[part], used[part], {g: v[part] for g, v in groups.items()}
        )
        read_often.node("n0")
    read_once.record_node_many("n0", t, used, groups)
    assert read_often.node("n0") == read_once.node("n0")


def test_a_node_without_groups_is_fitted_on_its_own() -> None:
    history = MemoryHistory()
    t = np.arange(0.0, 2400.0)
    for k in range(2400):
        history.record_node("solo", float(t[k]), 10 * GIB + 2 * MIB * t[k])
    view = history.node("solo")
    assert view is not None and view.groups == {} and view.other is None
    assert view.growth == pytest.approx(2 * MIB)
    assert view.growing


def test_plain_keys_and_windows() -> None:
    history = MemoryHistory(GrowthSettings(window_s=60.0, horizon_s=600.0))
    history.record_many("k", np.arange(0.0, 300.0), np.arange(0.0, 300.0) * 1000)
    history.record("k", 300.0, 300_000.0)
    t, _x = history.window("k")
    assert t[0] == 240.0 and t[-1] == 300.0
    assert history.buckets("k")
    assert history.series("k").growth == pytest.approx(1000.0)  # type: ignore[union-attr]
    assert history.series("missing") is None
    assert history.node("missing") is None
    assert history.window("missing")[0].size == 0
    with pytest.raises(ValueError, match="1-D and of one length"):
        history.record_many("k", [1.0, 2.0], [1.0])


def test_forget_drops_the_node_and_its_groups() -> None:
    history = MemoryHistory()
    replay(history, cluster(), 120, bulk=True)
    assert len(history.keys()) == 4
    history.forget("n0")
    assert history.keys() == [] and history.node("n0") is None


def test_memory_does_not_grow_with_time() -> None:
    history = MemoryHistory()
    script = cluster()
    t = np.arange(0.0, 3600.0)
    used, groups = script.node_values(0, t)
    history.record_node_many("n0", t, used, groups)
    size = history.nbytes()
    for hour in range(1, 6):
        later = t + hour * 3600.0
        used, groups = script.node_values(0, later)
        history.record_node_many("n0", later, used, groups)
    assert history.nbytes() <= size


def test_recording_and_reading_from_two_threads() -> None:
    history = MemoryHistory(GrowthSettings(window_s=30.0))
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            history.node("n0")

    reader = threading.Thread(target=read, name="raylens-test-reader", daemon=True)
    reader.start()
    try:
        for k in range(2000):
            history.record_node("n0", float(k), 1e9 + k, {"a": 1e8 + k})
    finally:
        done.set()
        reader.join(timeout=10)
    assert not reader.is_alive()
    view = history.node("n0")
    assert view is not None and view.growth == pytest.approx(1.0, abs=1e-3)


def test_the_time_to_limit_is_right_from_the_first_flag_on() -> None:
    """A leak that starts mid-run: the node's rate, hence its time to the kill line, reads
    the leak's rate at every fit from the flag on, though the windows then still hold the
    time before the leak."""
    rate = 50 * MIB_MIN
    script = MemoryScript(seed=11)
    script.set_other(0, Jitter(8 * MIB), base=4 * GIB)
    script.set_group(
        0,
        "policy",
        Sawtooth(300 * MIB, 40.0, 0.1),
        Leak(rate, start=1200.0),
        Jitter(4 * MIB),
        base=6 * GIB,
    )
    script.set_group(0, "rollout", Sawtooth(300 * MIB, 70.0, 0.1), Jitter(4 * MIB), base=3 * GIB)
    history = MemoryHistory()
    line = kill_line(64 * GIB)
    assert line is not None
    flagged_at, errors = None, []
    for start in range(0, 4800, 60):
        t = np.arange(float(start), start + 60.0)
        used, groups = script.node_values(0, t)
        history.record_node_many("n0", t, used, groups)
        view = history.node("n0")
        assert view is not None and view.used is not None
        if flagged_at is None and view.growing:
            flagged_at = t[-1]
            policy = view.groups["policy"]
            assert policy.rate is not None and policy.rate == view.groups["policy"].rate
        if flagged_at is not None:
            seconds = view.time_to_limit(line)
            assert seconds is not None
            truth = (line - max(view.peak or 0.0, view.used)) / rate
            errors.append(abs(seconds - truth) / truth)
    assert flagged_at is not None and flagged_at - 1200.0 <= 1200.0
    assert errors and statistics.median(errors) <= 0.1 and max(errors) <= 0.3


def test_a_growing_group_gives_its_node_a_figure_though_a_new_part_has_none() -> None:
    """A group that joined the node less than a window ago has no figure yet; a node whose
    other group grows still has a growth and a time to its kill line."""
    rate = 50 * MIB_MIN
    script = MemoryScript(seed=5)
    script.set_other(0, Jitter(8 * MIB), base=4 * GIB)
    script.set_group(
        0, "policy", Sawtooth(300 * MIB, 40.0, 0.1), Leak(rate), Jitter(4 * MIB), base=6 * GIB
    )
    script.set_group(0, "rollout", Sawtooth(300 * MIB, 70.0), Jitter(4 * MIB), base=3 * GIB)
    history = MemoryHistory()
    t = np.arange(0.0, 1800.0)
    used, groups = script.node_values(0, t)
    early, late = slice(0, 1500), slice(1500, 1800)
    history.record_node_many(
        "n0", t[early], used[early] - groups["rollout"][early], {"policy": groups["policy"][early]}
    )
    history.record_node_many("n0", t[late], used[late], {g: v[late] for g, v in groups.items()})
    view = history.node("n0")
    assert view is not None and view.groups["rollout"].growth is None
    assert view.groups["policy"].growing
    assert view.growing and view.growth == pytest.approx(rate, rel=0.1)
    assert view.time_to_limit(kill_line(64 * GIB)) is not None


def _samples_equal(history: MemoryHistory, reference: MemoryHistory, key: Key) -> None:
    for mine, theirs in zip(history.window(key), reference.window(key)):
        np.testing.assert_array_equal(mine, theirs)
    assert history.buckets(key) == reference.buckets(key), key


def test_a_node_s_parts_are_recorded_as_recording_each_alone_would() -> None:
    """Groups that come and go, a bad value, a time repeated or not finite, a forget."""
    script = cluster(leak_rate=50 * MIB_MIN)
    t = np.arange(0.0, 3600.0)
    used, groups = script.node_values(0, t)
    by_node, by_key = MemoryHistory(), MemoryHistory()

    def parts(k: int) -> dict[str, float]:
        held = {g: float(v[k]) for g, v in groups.items()}
        if 300 <= k < 400:
            del held["rollout"]  # a group that left for a while
        if k == 500:
            held["policy"] = math.nan
        if 600 <= k < 700:
            held["critic"] = 1 * GIB + 5e3 * k  # one that came for a while
        return held

    for k in range(len(t)):
        at = float(t[k]) if k != 800 else math.inf
        if k == 650:
            by_node.forget("n0")
            by_key.forget("n0")
        for _ in range(2 if k == 900 else 1):  # the same instant recorded twice
            held = parts(k)
            by_node.record_node("n0", at, float(used[k]), held)
            inside = math.fsum(v for v in held.values() if math.isfinite(v))
            by_key.record_node("n0", at, float(used[k]))  # the node's own samples
            for name in sorted(held):
                by_key.record(("n0", name), at, held[name])
            by_key.record(("n0", None), at, float(used[k]) - inside)

    keys = by_key.keys()
    assert by_node.keys() == keys
    for key in keys:
        _samples_equal(by_node, by_key, key)
        if key != "n0":  # with groups the node's own series is not fitted, alone it is
            assert by_node.series(key) == by_key.series(key), key
    node = by_node.node("n0")
    assert node is not None and node.growing and node.fastest_group == "policy"


def test_a_node_near_its_kill_line_gets_its_fast_growth_flagged_on_the_shortest_scale() -> None:
    """The sampler's case: a fresh worker growing 10 MB/s on a node with 24 GB, window 120 s."""
    settings = GrowthSettings(window_s=120.0)
    near, unknown = MemoryHistory(settings), MemoryHistory(settings)
    line = kill_line(24e9)
    rng = np.random.default_rng(3)
    flagged: dict[str, float] = {}
    for second in range(400):
        t = float(second)
        leak = max(0.0, t - 60.0) * 10e6
        policy, rollout = 2e9 + leak + rng.normal(0, 2e6), 1.5e9 + rng.normal(0, 2e6)
        used = 8e9 + leak + rng.normal(0, 5e6)
        near.set_limit("n0", line)
        for name, history in (("near", near), ("unknown", unknown)):
            history.record_node("n0", t, used, {"policy": policy, "rollout": rollout})
            view = history.node("n0")
            assert view is not None
            if view.groups["policy"].growing:
                flagged.setdefault(name, t - 60.0)
    view = near.node("n0")
    assert view is not None and view.time_to_limit(line) is not None
    assert flagged["near"] <= 200.0
    assert view.groups["policy"].rate == pytest.approx(10e6, rel=0.2)
    assert not view.groups["rollout"].growing
    assert flagged.get("unknown", math.inf) > flagged["near"]
    near.set_limit("n0", None)
    near.forget("n0")


def test_a_day_long_window_holds_no_more_samples_than_fifteen_minutes() -> None:
    """At the longest window and one sample a second, a series stays small (H3-20)."""
    day, short = (
        MemoryHistory(GrowthSettings(window_s=86_400.0, horizon_s=86_400.0)),
        MemoryHistory(GrowthSettings(window_s=900.0, horizon_s=86_400.0)),
    )
    t = np.arange(0.0, 4 * 3600.0)
    values = 8 * GIB + np.random.default_rng(1).normal(0.0, 8 * MIB, len(t))
    for history in (day, short):
        history.record_many("k", t, values)
    assert day.nbytes() == short.nbytes()
    assert day.nbytes() < 64 * 1024


def test_groups_absent_for_a_window_are_forgotten_and_a_node_keeps_at_most_its_cap() -> None:
    """Groups renamed at every step cannot grow what a node holds (H3-11)."""
    from raylens.telemetry.growth._store import MAX_GROUPS_PER_NODE

    history = MemoryHistory(GrowthSettings(window_s=60.0))
    for step in range(40):
        t = np.arange(step * 60.0, (step + 1) * 60.0)
        groups = {f"step-{step}": np.full(len(t), 1 * GIB)}
        history.record_node_many("n0", t, np.full(len(t), 8 * GIB), groups)
    recorded = history.keys()
    held = [key for key in recorded if isinstance(key, tuple) and key[1]]
    assert len(held) <= 2
    many = {f"g{k}": np.full(10, float(k + 1) * MIB) for k in range(MAX_GROUPS_PER_NODE + 40)}
    history.record_node_many("n1", np.arange(10.0), np.full(10, 8 * GIB), many)
    view = history.node("n1")
    assert view is not None and len(view.groups) == MAX_GROUPS_PER_NODE
    assert "g0" not in view.groups  # the smallest count as memory outside the groups


def test_phase_boundaries_marked_on_a_node_reach_every_series_on_it_old_and_new() -> None:
    # Twelve-minute phases; an hour in, the memory outside the groups fills for the last
    # eleven minutes of a generation phase (the object store, at 512 MiB/min), is held for
    # half the training phase after it and freed.
    t = np.arange(0.0, 3 * 3600.0)
    filling = np.clip(t - 3660.0, 0.0, 660.0) * 512 * MIB_MIN
    store = np.where(t < 4680.0, filling, 0.0)
    policy = 6 * GIB + np.random.default_rng(3).normal(0.0, 4 * MIB, len(t))
    used = 8 * GIB + store + policy

    def replay(marked: bool, first_mark: float) -> int:
        history = MemoryHistory()
        for start in range(0, len(t), 60):
            chunk = slice(start, start + 60)
            if marked and start % 720 == 0 and start >= first_mark:
                history.mark_phase("n", float(start))
            history.record_node_many("n", t[chunk], used[chunk], {"policy": policy[chunk]})
        view = history.node("n")
        assert view is not None and view.other is not None
        return view.other.spells

    assert replay(marked=False, first_mark=0.0) > 0  # on its shape alone, a fill reads as a leak
    assert replay(marked=True, first_mark=0.0) == 0  # marked before any series exists
    assert replay(marked=True, first_mark=720.0) == 0  # and after
    history = MemoryHistory()
    history.mark_phase("n", 5.0)
    history.mark_phase("n", 5.5)  # a phase's end and the next one's beginning: one boundary
    with pytest.raises(ValueError, match=r"time order: 4\.0 is before the newest, 5\.0"):
        history.mark_phase("n", 4.0)
    with pytest.raises(ValueError, match="finite time"):
        history.mark_phase("m", float("nan"))
    assert history.phase_boundaries("n") == (5.0,) and history.phase_boundaries("m") == ()
    history.forget("n")
    assert history.phase_boundaries("n") == ()
