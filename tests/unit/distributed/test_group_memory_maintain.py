"""The driver keeping one publishing sampler per node, without waiting on any (FakeRay, no Ray)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from raylens.distributed.group_memory_sampler import (
    STOP_GRACE_S,
    GroupMemorySamplers,
    SamplerError,
)
from raylens_fakes.clock import ManualClock
from raylens_fakes.procfs import FakeProcFS
from raylens_fakes.ray import FakeActor, FakeRay

MB = 2**20
NODE_A = "a" * 56
NODE_B = "b" * 56
NODE_C = "c" * 56


@pytest.fixture
def fake_ray(ray_over_nodes: FakeRay) -> Iterator[FakeRay]:
    yield ray_over_nodes
    # maintain() never waits: every wait and get it makes returns at once.
    assert all(timeout == 0 for timeout in ray_over_nodes.wait_timeouts), (
        ray_over_nodes.wait_timeouts
    )
    assert all(timeout == 0 for timeout in ray_over_nodes.get_timeouts), ray_over_nodes.get_timeouts


def _worker(fake: FakeProcFS, group: str, pid: int, rss: int = MB) -> tuple[str, int, int]:
    fake.add_process(pid, rss_bytes=rss)
    return (group, pid, fake.start_ticks(pid))


def _manager(fake_ray: FakeRay, **options: Any) -> GroupMemorySamplers:
    options.setdefault("sample_interval_s", 2.5)
    options.setdefault("ping_every", 3)
    return GroupMemorySamplers(ray=fake_ray, **options)


def _on(fake_ray: FakeRay, node: str) -> list[FakeActor]:
    return [actor for actor in fake_ray.actors if actor.node_id == node]


def _names(actor: FakeActor) -> list[str]:
    return [name for name, *_ in actor.calls]


@pytest.fixture
def two_nodes(nodes) -> dict[str, list[tuple[str, int, int]]]:
    a, b = nodes[NODE_A], nodes[NODE_B]
    return {
        NODE_A: [_worker(a, "policy", 200), _worker(a, "rollout", 201)],
        NODE_B: [_worker(b, "policy", 300)],
    }


def test_a_node_that_gains_workers_gets_a_pinned_sampler_told_its_workers_and_started(
    fake_ray, two_nodes
):
    manager = _manager(fake_ray)

    assert manager.maintain(two_nodes) == {}

    assert manager.nodes == {NODE_A, NODE_B}
    for node in (NODE_A, NODE_B):
        (actor,) = _on(fake_ray, node)
        assert actor.options["num_cpus"] == 0 and actor.options["num_gpus"] == 0
        assert actor.options["scheduling_strategy"].soft is False
        assert actor.calls == [
            ("set_workers", (two_nodes[node],), {}),
            ("start", (2.5,), {}),
        ]


def test_nothing_starts_for_nodes_without_workers(fake_ray):
    manager = _manager(fake_ray)
    assert manager.maintain({}) == {}
    assert manager.maintain({NODE_A: []}) == {}
    assert fake_ray.actors == [] and fake_ray.submitted == []


def test_a_cycle_with_nothing_changed_makes_no_ray_call(fake_ray, two_nodes):
    manager = _manager(fake_ray, ping_every=100)
    manager.maintain(two_nodes)
    fake_ray.submitted.clear()

    for _ in range(20):
        # Fresh lists each cycle, as the registry hands them out: equal is unchanged.
        assert manager.maintain({node: list(ws) for node, ws in two_nodes.items()}) == {}

    assert fake_ray.submitted == []
    assert fake_ray.wait_timeouts == []


def test_only_a_node_whose_list_changed_is_told(fake_ray, nodes, two_nodes):
    manager = _manager(fake_ray, ping_every=100)
    manager.maintain(two_nodes)
    fake_ray.submitted.clear()
    changed = [*two_nodes[NODE_B], _worker(nodes[NODE_B], "reward", 301)]

    manager.maintain({**two_nodes, NODE_B: changed})
    manager.maintain({**two_nodes, NODE_B: changed})

    (b,) = _on(fake_ray, NODE_B)
    assert fake_ray.submitted == [(b.name, "set_workers")]
    assert b.calls[-1] == ("set_workers", (changed,), {})


def test_a_node_whose_last_worker_left_stops_its_sampler_and_loses_it(fake_ray, two_nodes):
    clock = ManualClock(1000.0)
    manager = _manager(fake_ray, ping_every=3, clock=clock)
    manager.maintain(two_nodes)  # cycle 1
    (b,) = _on(fake_ray, NODE_B)

    manager.maintain({NODE_A: two_nodes[NODE_A]})  # cycle 2

    assert manager.nodes == {NODE_A}
    # Told to mark its groups gone, and left alive long enough for Ray to report that.
    assert b.calls[-1] == ("stop", (), {"forget_groups": True})
    manager.maintain({NODE_A: two_nodes[NODE_A]})  # cycle 3: a liveness round, too early
    assert not b.killed
    clock.now += STOP_GRACE_S
    for _ in range(2):  # cycles 4 and 5: no round
        manager.maintain({NODE_A: two_nodes[NODE_A]})
    assert not b.killed
    manager.maintain({NODE_A: two_nodes[NODE_A]})  # cycle 6: the next round kills it
    assert b.killed
    assert "__ray_terminate__" not in _names(b)
    (a,) = _on(fake_ray, NODE_A)
    assert not a.killed


def test_a_node_that_comes_back_gets_a_new_sampler(fake_ray, two_nodes):
    manager = _manager(fake_ray, ping_every=100)
    manager.maintain(two_nodes)
    manager.maintain({NODE_A: two_nodes[NODE_A]})
    manager.maintain(two_nodes)
    assert len(_on(fake_ray, NODE_B)) == 2
    assert _names(_on(fake_ray, NODE_B)[-1]) == ["set_workers", "start"]


def test_a_dead_sampler_is_found_by_the_liveness_round_and_replaced(fake_ray, two_nodes):
    manager = _manager(fake_ray, ping_every=3)
    manager.maintain(two_nodes)  # cycle 1
    (b,) = _on(fake_ray, NODE_B)
    b.dead = True
    for _ in range(2):  # cycles 2 and 3: the round at cycle 3 sends the pings
        assert manager.maintain(two_nodes) == {}
    assert "ping" in _names(b)

    results = manager.maintain(two_nodes)  # cycle 4: the answers are read

    assert set(results) == {NODE_B}
    assert isinstance(results[NODE_B], SamplerError)
    assert "died" in results[NODE_B].message and "replaced" in results[NODE_B].message
    first, second = _on(fake_ray, NODE_B)
    assert first is b and second.calls == [
        ("set_workers", (two_nodes[NODE_B],), {}),
        ("start", (2.5,), {}),
    ]
    (a,) = _on(fake_ray, NODE_A)
    assert not a.killed and _names(a).count("start") == 1


def test_pings_go_out_once_per_round_and_not_while_one_is_unanswered(fake_ray, two_nodes):
    manager = _manager(fake_ray, ping_every=2, max_missed=10)
    manager.maintain(two_nodes)
    (b,) = _on(fake_ray, NODE_B)
    b.hung = True
    (a,) = _on(fake_ray, NODE_A)

    for _ in range(8):
        manager.maintain(two_nodes)

    assert _names(a).count("ping") == 4  # cycles 2, 4, 6 and 8 of 9
    assert _names(b).count("ping") == 1


def test_a_wedged_sampler_is_replaced_after_max_missed_rounds(fake_ray, two_nodes):
    manager = _manager(fake_ray, ping_every=1, max_missed=2)
    manager.maintain(two_nodes)  # cycle 1: started, pinged
    manager.maintain(two_nodes)  # cycle 2: both answer
    (b,) = _on(fake_ray, NODE_B)
    b.hung = True
    manager.maintain(two_nodes)  # cycle 3: the ping of cycle 2 was answered; a new one hangs

    assert isinstance(manager.maintain(two_nodes).get(NODE_B), SamplerError)  # miss 1
    assert not b.killed
    results = manager.maintain(two_nodes)  # miss 2: replaced

    assert b.killed
    assert "replaced" in results[NODE_B].message and "2" in results[NODE_B].message
    assert len(_on(fake_ray, NODE_B)) == 2


def test_a_starting_sampler_is_left_alone_until_its_start_timeout(fake_ray, two_nodes, caplog):
    fake_ray.hang_actors_on(NODE_B)
    clock = ManualClock(1000.0)
    manager = _manager(fake_ray, ping_every=1, max_missed=1, clock=clock, start_timeout_s=120)

    with caplog.at_level(logging.WARNING, logger="raylens"):
        for _ in range(5):
            result = manager.maintain(two_nodes).get(NODE_B)
            assert result is None or "not answered yet" in result.message
        (starting,) = _on(fake_ray, NODE_B)
        assert not starting.killed

        clock.now += 120
        results = manager.maintain(two_nodes)

    assert starting.killed
    assert "120" in results[NODE_B].message and "replaced" in results[NODE_B].message
    assert len(_on(fake_ray, NODE_B)) == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and NODE_B in warnings[0]


def test_a_sampler_that_cannot_start_costs_only_its_node(fake_ray, nodes, two_nodes):
    unknown = "d" * 56  # not a node of this cluster: a hard affinity to it is refused
    manager = _manager(fake_ray)

    results = manager.maintain({**two_nodes, unknown: [("policy", 400, None)]})

    assert set(results) == {unknown}
    assert "could not start" in results[unknown].message
    assert manager.nodes == {NODE_A, NODE_B}
    # Tried again next cycle, the list being unchanged.
    assert set(manager.maintain({**two_nodes, unknown: [("policy", 400, None)]})) == {unknown}


def test_a_sampler_that_cannot_be_told_is_replaced(fake_ray, nodes, two_nodes):
    manager = _manager(fake_ray)
    manager.maintain(two_nodes)
    (b,) = _on(fake_ray, NODE_B)

    def refuse(actor: FakeActor, method: str) -> None:
        if actor is b and method == "set_workers":
            raise RuntimeError("the handle is gone")

    fake_ray.on_submit.append(refuse)
    changed = [*two_nodes[NODE_B], _worker(nodes[NODE_B], "reward", 301)]

    results = manager.maintain({**two_nodes, NODE_B: changed})

    assert set(results) == {NODE_B}
    assert "the handle is gone" in results[NODE_B].message
    assert b.killed
    new = _on(fake_ray, NODE_B)[-1]
    assert new.calls == [("set_workers", (changed,), {}), ("start", (2.5,), {})]
    assert manager.maintain({**two_nodes, NODE_B: changed}) == {}


def test_malformed_input_is_refused_before_anything_starts(fake_ray, two_nodes):
    manager = _manager(fake_ray)
    with pytest.raises(ValueError, match="pid"):
        manager.maintain({**two_nodes, NODE_C: [("policy", -3, None)]})
    with pytest.raises(ValueError, match="node id"):
        manager.maintain({**two_nodes, "": [("policy", 3, None)]})
    assert fake_ray.actors == []


def test_the_new_settings_are_checked(fake_ray):
    for bad in (0, -1.0, float("nan"), True):
        with pytest.raises(ValueError, match="sample_interval_s"):
            GroupMemorySamplers(ray=fake_ray, sample_interval_s=bad)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="ping_every"):
            GroupMemorySamplers(ray=fake_ray, ping_every=bad)


def test_close_kills_live_and_stopping_samplers(fake_ray, nodes, two_nodes):
    manager = _manager(fake_ray, ping_every=100)
    manager.maintain(two_nodes)
    manager.maintain({NODE_A: two_nodes[NODE_A]})  # B's sampler is stopping

    manager.close()

    assert fake_ray.live_actors() == []
    assert manager.nodes == set()


def test_a_sampler_started_by_sample_is_started_publishing_by_maintain(fake_ray, two_nodes):
    manager = _manager(fake_ray)
    manager.sample(two_nodes)
    fake_ray.wait_timeouts.clear()  # sample() waits, by design; maintain() must not
    fake_ray.get_timeouts.clear()
    manager.maintain(two_nodes)
    assert len(fake_ray.actors) == 2
    for actor in fake_ray.actors:
        assert _names(actor) == ["read", "set_workers", "start"]


class _CountedLists(dict[str, list[tuple[str, int, int]]]):
    """Worker lists that count how often the manager went through them."""

    def __init__(self, lists: dict[str, list[tuple[str, int, int]]]) -> None:
        super().__init__(lists)
        self.walks = 0

    def items(self) -> Any:
        self.walks += 1
        return super().items()


def test_with_the_version_unchanged_no_worker_list_is_walked(fake_ray, two_nodes):
    manager = _manager(fake_ray, ping_every=100)
    lists = _CountedLists(two_nodes)
    manager.maintain(lists, version=1)
    fake_ray.submitted.clear()

    for _ in range(5):
        assert manager.maintain(lists, version=1) == {}

    assert lists.walks == 1
    assert fake_ray.submitted == []
    assert manager.nodes == {NODE_A, NODE_B}


def test_a_new_version_still_tells_the_sampler_its_new_workers(fake_ray, nodes, two_nodes):
    manager = _manager(fake_ray, ping_every=100)
    manager.maintain(two_nodes, version=1)
    manager.maintain(two_nodes, version=1)
    changed = [*two_nodes[NODE_B], _worker(nodes[NODE_B], "reward", 301)]

    manager.maintain({**two_nodes, NODE_B: changed}, version=2)
    manager.maintain({NODE_A: two_nodes[NODE_A]}, version=3)

    (b,) = _on(fake_ray, NODE_B)
    assert b.calls[-2:] == [
        ("set_workers", (changed,), {}),
        ("stop", (), {"forget_groups": True}),
    ]
    assert manager.nodes == {NODE_A}


def test_pings_still_fall_due_and_a_dead_sampler_is_replaced_with_the_version_unchanged(
    fake_ray, two_nodes
):
    manager = _manager(fake_ray, ping_every=3)
    manager.maintain(two_nodes, version=7)  # cycle 1
    (b,) = _on(fake_ray, NODE_B)
    b.dead = True
    for _ in range(2):  # cycles 2 and 3: the round at cycle 3 sends the pings
        assert manager.maintain(two_nodes, version=7) == {}
    assert "ping" in _names(b)

    results = manager.maintain(two_nodes, version=7)  # cycle 4: the answers are read

    assert "died" in results[NODE_B].message and "replaced" in results[NODE_B].message
    assert _names(_on(fake_ray, NODE_B)[-1]) == ["set_workers", "start"]


def test_a_sampler_that_could_not_start_is_tried_again_with_the_version_unchanged(
    fake_ray, two_nodes
):
    unknown = "d" * 56  # not a node of this cluster: a hard affinity to it is refused
    manager = _manager(fake_ray)
    lists = {**two_nodes, unknown: [("policy", 400, None)]}

    for _ in range(3):
        results = manager.maintain(lists, version=1)
        assert set(results) == {unknown} and "could not start" in results[unknown].message


def test_a_sampler_removed_by_a_missed_round_is_started_again_with_the_version_unchanged(
    fake_ray, two_nodes
):
    manager = _manager(fake_ray, ping_every=1, max_missed=1)
    manager.maintain(two_nodes, version=1)  # cycle 1: started, pinged
    manager.maintain(two_nodes, version=1)  # cycle 2: both answer
    (b,) = _on(fake_ray, NODE_B)
    b.hung = True
    fake_ray.hang_actors_on(NODE_B)  # its replacement cannot answer either
    manager.maintain(two_nodes, version=1)  # cycle 3: a new ping hangs
    manager.maintain(two_nodes, version=1)  # cycle 4: missed, replaced

    assert b.killed
    assert len(_on(fake_ray, NODE_B)) == 2
    assert _names(_on(fake_ray, NODE_B)[-1])[:2] == ["set_workers", "start"]


def test_close_leaves_no_version_standing(fake_ray, two_nodes):
    manager = _manager(fake_ray, ping_every=100)
    manager.maintain(two_nodes, version=1)
    manager.close()

    manager.maintain(two_nodes, version=1)

    assert manager.nodes == {NODE_A, NODE_B}
    assert len(fake_ray.actors) == 4


def test_a_sampler_whose_publishing_is_stuck_is_replaced_though_it_answers_pings(
    fake_ray, two_nodes
):
    clock = ManualClock(1000.0)
    manager = _manager(fake_ray, ping_every=1, clock=clock)
    manager.maintain(two_nodes)  # cycle 1: started, pinged
    (a,) = _on(fake_ray, NODE_A)
    (b,) = _on(fake_ray, NODE_B)
    counts = iter(range(1, 10_000))
    a.script("ping", lambda: next(counts))  # A publishes a reading between any two pings
    b.script("ping", lambda: 7)  # B answers, but its count stands still
    for _ in range(30):
        clock.now += 2.5
        assert manager.maintain(two_nodes) == {}  # 72.5 s still: under 30 intervals of 2.5 s

    clock.now += 5.0
    results = manager.maintain(two_nodes)

    assert set(results) == {NODE_B}
    assert "published no reading for 75 s; replaced" in results[NODE_B].message
    assert b.killed and not a.killed
    assert len(_on(fake_ray, NODE_B)) == 2


def test_a_samplers_worker_id_is_learned_at_the_liveness_round(fake_ray, two_nodes):
    def answer(actor: FakeActor, method: str) -> None:
        if method == "set_workers":  # scripted before the round asks
            actor.script("worker_id", lambda: f"worker-{actor.node_id[:1]}")

    fake_ray.on_submit.append(answer)
    manager = _manager(fake_ray, ping_every=1)
    manager.maintain(two_nodes)  # cycle 1: started and told; pinged, asked its worker id
    (a,) = _on(fake_ray, NODE_A)
    (b,) = _on(fake_ray, NODE_B)
    assert manager.sampler_ids() == {a._actor_id.hex(): "", b._actor_id.hex(): ""}

    manager.maintain(two_nodes)  # cycle 2: the answers are read
    manager.maintain(two_nodes)  # cycle 3: not asked again

    assert manager.sampler_ids() == {a._actor_id.hex(): "worker-a", b._actor_id.hex(): "worker-b"}
    assert _names(a).count("worker_id") == 1


def test_the_only_sampler_wedged_after_answering_is_still_replaced_after_max_missed_rounds(
    fake_ray, nodes
):
    workers = {NODE_A: [_worker(nodes[NODE_A], "policy", 200)]}
    manager = _manager(fake_ray, ping_every=1, max_missed=2)
    manager.maintain(workers)  # cycle 1: started, pinged
    manager.maintain(workers)  # cycle 2: answered; pinged again
    (a,) = _on(fake_ray, NODE_A)
    a.hung = True
    manager.maintain(workers)  # cycle 3: answered; the new ping hangs
    assert isinstance(manager.maintain(workers).get(NODE_A), SamplerError)  # miss 1

    results = manager.maintain(workers)  # miss 2: its ping, still out, is read again

    assert a.killed
    assert "replaced" in results[NODE_A].message
    assert len(_on(fake_ray, NODE_A)) == 2
