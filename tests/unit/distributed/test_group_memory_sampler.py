"""The per-node sampler manager, on raylens_fakes' FakeRay (no Ray installed)."""

from __future__ import annotations

import logging
import os
from typing import Any

import pytest

from raylens.distributed.group_memory_sampler import (
    GroupMemorySamplerActor,
    GroupMemorySamplers,
    SamplerError,
    collect_group_memory,
    worker_identity,
)
from raylens.telemetry.group_memory import (
    GroupMemorySnapshot,
    GroupWorkerRegistry,
    NodeGroupMemory,
)
from raylens.telemetry.process_memory import ProcFS
from raylens_fakes.clock import ManualClock
from raylens_fakes.procfs import FakeProcFS
from raylens_fakes.ray import FakeRay

MB = 2**20
NODE_A = "a" * 56
NODE_B = "b" * 56
NODE_C = "c" * 56


@pytest.fixture
def fake_ray(ray_over_nodes: FakeRay) -> FakeRay:
    return ray_over_nodes


def _worker(fake: FakeProcFS, group: str, pid: int, rss: int) -> tuple[str, int, int]:
    fake.add_process(pid, rss_bytes=rss)
    return (group, pid, fake.start_ticks(pid))


def _manager(fake_ray: FakeRay, **options: Any) -> GroupMemorySamplers:
    options.setdefault("timeout_s", 1.0)
    return GroupMemorySamplers(ray=fake_ray, **options)


def test_nothing_starts_before_the_first_sample(fake_ray: FakeRay):
    manager = _manager(fake_ray)
    assert fake_ray.actors == []
    assert manager.sample({}) == {}
    assert fake_ray.actors == []


def test_one_zero_cpu_sampler_per_node_pinned_to_it(fake_ray: FakeRay, nodes):
    a, b = nodes[NODE_A], nodes[NODE_B]
    workers = {
        NODE_A: [_worker(a, "policy", 200, 10 * MB), _worker(a, "rollout", 201, 4 * MB)],
        NODE_B: [_worker(b, "policy", 300, 7 * MB)],
    }
    manager = _manager(fake_ray)

    first = manager.sample(workers)
    second = manager.sample(workers)

    assert len(fake_ray.actors) == 2
    for actor in fake_ray.actors:
        assert actor.options["num_cpus"] == 0
        assert actor.options["num_gpus"] == 0
        assert actor.options["scheduling_strategy"].soft is False
    assert {actor.node_id for actor in fake_ray.actors} == {NODE_A, NODE_B}
    assert manager.nodes == {NODE_A, NODE_B}
    for results in (first, second):
        assert set(results) == {NODE_A, NODE_B}
        assert all(isinstance(r, NodeGroupMemory) for r in results.values())
    rss = {(node, g.group): g.rss_bytes for node, r in second.items() for g in r.groups}
    assert rss == {
        (NODE_A, "policy"): 10 * MB,
        (NODE_A, "rollout"): 4 * MB,
        (NODE_B, "policy"): 7 * MB,
    }


def test_a_sampler_goes_with_the_last_group_on_its_node(fake_ray: FakeRay, nodes):
    a, b = nodes[NODE_A], nodes[NODE_B]
    on_a = [_worker(a, "policy", 200, MB)]
    on_b = [_worker(b, "rollout", 300, MB)]
    manager = _manager(fake_ray)
    manager.sample({NODE_A: on_a, NODE_B: on_b})

    results = manager.sample({NODE_A: on_a, NODE_B: []})

    assert set(results) == {NODE_A}
    assert {actor.node_id for actor in fake_ray.live_actors()} == {NODE_A}
    assert manager.nodes == {NODE_A}


def test_an_unreachable_sampler_costs_only_its_node(fake_ray: FakeRay, nodes):
    a, b = nodes[NODE_A], nodes[NODE_B]
    workers = {NODE_A: [_worker(a, "policy", 200, MB)], NODE_B: [_worker(b, "policy", 300, MB)]}
    manager = _manager(fake_ray, timeout_s=0.5)
    manager.sample(workers)
    next(actor for actor in fake_ray.actors if actor.node_id == NODE_B).hung = True

    results = manager.sample(workers)

    assert isinstance(results[NODE_A], NodeGroupMemory)
    assert isinstance(results[NODE_B], SamplerError)
    assert NODE_B in results[NODE_B].message
    assert "0.5" in results[NODE_B].message
    assert fake_ray.wait_timeouts and all(0 < t <= 0.5 for t in fake_ray.wait_timeouts)


def test_a_wedged_sampler_is_not_asked_again_while_its_reading_is_open(fake_ray: FakeRay, nodes):
    b = nodes[NODE_B]
    workers = {NODE_B: [_worker(b, "policy", 300, MB)]}
    manager = _manager(fake_ray, max_missed=3)
    assert isinstance(manager.sample(workers)[NODE_B], NodeGroupMemory)
    (wedged,) = fake_ray.actors
    wedged.hung = True

    for _ in range(2):
        assert isinstance(manager.sample(workers)[NODE_B], SamplerError)
    assert [name for name, *_ in wedged.calls] == ["read", "read"]

    # The third miss replaces it; the new one answers.
    manager.sample(workers)
    assert wedged.killed
    results = manager.sample(workers)
    assert isinstance(results[NODE_B], NodeGroupMemory)
    assert len(fake_ray.live_actors()) == 1


def test_a_sampler_that_has_not_answered_yet_is_left_to_start(fake_ray: FakeRay, nodes):
    # A new actor may take many cycles to start on a busy node; replacing it would
    # only start the wait again.
    b = nodes[NODE_B]
    workers = {NODE_B: [_worker(b, "policy", 300, MB)]}
    fake_ray.hang_actors_on(NODE_B)
    manager = _manager(fake_ray, max_missed=3)

    for _ in range(6):
        result = manager.sample(workers)[NODE_B]
        assert isinstance(result, SamplerError)
        assert "not answered yet" in result.message

    (starting,) = fake_ray.actors
    assert not starting.killed
    assert [name for name, *_ in starting.calls] == ["read"]


def test_a_sampler_that_never_answers_its_first_call_is_replaced_after_the_start_timeout(
    fake_ray: FakeRay, nodes, caplog
):
    a, b = nodes[NODE_A], nodes[NODE_B]
    workers = {NODE_A: [_worker(a, "policy", 200, MB)], NODE_B: [_worker(b, "policy", 300, MB)]}
    fake_ray.hang_actors_on(NODE_B)
    clock = ManualClock(1000.0)
    manager = _manager(fake_ray, clock=clock, start_timeout_s=120.0)

    with caplog.at_level(logging.WARNING, logger="raylens"):
        manager.sample(workers)
        clock.now += 119.0
        waiting = manager.sample(workers)[NODE_B]
        (first,) = [actor for actor in fake_ray.actors if actor.node_id == NODE_B]
        assert not first.killed
        assert "not answered yet" in waiting.message

        clock.now += 1.0
        given_up = manager.sample(workers)
        assert first.killed
        assert isinstance(given_up[NODE_A], NodeGroupMemory)  # costs only its own node
        assert "replaced" in given_up[NODE_B].message
        assert "120" in given_up[NODE_B].message

        manager.sample(workers)  # a new sampler starts, and hangs as well
        second = [actor for actor in fake_ray.actors if actor.node_id == NODE_B][-1]
        assert second is not first and not second.killed
        clock.now += 120.0
        manager.sample(workers)
        assert second.killed

    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert NODE_B in warnings[0] and "120" in warnings[0]


def test_a_sampler_that_answers_late_in_its_start_timeout_is_kept(fake_ray: FakeRay, nodes):
    b = nodes[NODE_B]
    workers = {NODE_B: [_worker(b, "policy", 300, MB)]}
    fake_ray.hang_actors_on(NODE_B)
    asked: list[Any] = []
    real_wait = fake_ray.wait

    def wait(refs: list[Any], **options: Any) -> Any:
        asked.extend(refs)
        return real_wait(refs, **options)

    fake_ray.wait = wait  # type: ignore[method-assign]
    clock = ManualClock(1000.0)
    manager = _manager(fake_ray, clock=clock, start_timeout_s=120.0)
    manager.sample(workers)
    (starting,) = fake_ray.actors
    clock.now += 100.0
    starting.hung = False
    for ref in asked:  # the first reading comes back, late but within the start timeout
        ref.release()

    assert isinstance(manager.sample(workers)[NODE_B], NodeGroupMemory)
    clock.now += 500.0
    assert isinstance(manager.sample(workers)[NODE_B], NodeGroupMemory)
    assert not starting.killed


def test_the_start_timeout_is_checked(fake_ray: FakeRay):
    for bad in (0, -1.0, float("inf"), float("nan"), True):
        with pytest.raises(ValueError, match="start_timeout_s"):
            GroupMemorySamplers(ray=fake_ray, start_timeout_s=bad)


def test_a_dead_sampler_is_replaced_at_the_next_cycle(fake_ray: FakeRay, nodes):
    a, b = nodes[NODE_A], nodes[NODE_B]
    workers = {NODE_A: [_worker(a, "policy", 200, MB)], NODE_B: [_worker(b, "policy", 300, MB)]}
    manager = _manager(fake_ray)
    manager.sample(workers)
    dead = next(actor for actor in fake_ray.actors if actor.node_id == NODE_B)
    dead.dead = True

    results = manager.sample(workers)
    assert isinstance(results[NODE_A], NodeGroupMemory)
    assert isinstance(results[NODE_B], SamplerError)
    assert "actor died" in results[NODE_B].message

    results = manager.sample(workers)
    assert isinstance(results[NODE_B], NodeGroupMemory)
    assert len([actor for actor in fake_ray.actors if actor.node_id == NODE_B]) == 2


def test_a_malformed_answer_costs_only_its_node(fake_ray: FakeRay, nodes, monkeypatch):
    a, b = nodes[NODE_A], nodes[NODE_B]
    workers = {NODE_A: [_worker(a, "policy", 200, MB)], NODE_B: [_worker(b, "policy", 300, MB)]}
    manager = _manager(fake_ray)
    manager.sample(workers)
    odd = next(actor for actor in fake_ray.actors if actor.node_id == NODE_B)
    monkeypatch.setattr(odd.instance, "read", lambda _workers: {"host_name": 5})

    results = manager.sample(workers)

    assert isinstance(results[NODE_A], NodeGroupMemory)
    assert "malformed group-memory reading" in results[NODE_B].message


def test_a_worker_killed_between_cycles_is_reported_by_its_sampler(fake_ray: FakeRay, nodes):
    a = nodes[NODE_A]
    workers = {NODE_A: [_worker(a, "policy", 200, MB), _worker(a, "policy", 201, 2 * MB)]}
    manager = _manager(fake_ray)
    manager.sample(workers)
    a.remove_process(201)

    reading = manager.sample(workers)[NODE_A]

    assert [(g.group, g.rss_bytes) for g in reading.groups] == [("policy", MB)]
    assert [(w.pid, w.fate.value) for w in reading.gone] == [(201, "exited")]


def test_results_feed_the_snapshot_so_a_gone_sampler_drops_its_node(fake_ray: FakeRay, nodes):
    a, b = nodes[NODE_A], nodes[NODE_B]
    workers = {NODE_A: [_worker(a, "policy", 200, MB)], NODE_B: [_worker(b, "policy", 300, MB)]}
    manager = _manager(fake_ray)
    snapshot = GroupMemorySnapshot(clock=lambda: 0.0)
    snapshot.publish(manager.sample(workers))
    next(actor for actor in fake_ray.actors if actor.node_id == NODE_B).dead = True

    snapshot.publish(manager.sample(workers))

    assert {dict(o.attributes)["ray.node.id"] for o in snapshot.observe_processes()} == {NODE_A}


def test_close_removes_every_sampler(fake_ray: FakeRay, nodes):
    a, b = nodes[NODE_A], nodes[NODE_B]
    manager = _manager(fake_ray)
    manager.sample(
        {NODE_A: [_worker(a, "policy", 200, MB)], NODE_B: [_worker(b, "policy", 300, MB)]}
    )
    manager.close()
    assert fake_ray.live_actors() == []
    assert manager.nodes == set()


def test_bad_arguments_are_refused_by_name(fake_ray: FakeRay):
    with pytest.raises(ValueError, match="timeout_s"):
        GroupMemorySamplers(ray=fake_ray, timeout_s=0)
    with pytest.raises(ValueError, match="tree_interval_seconds"):
        GroupMemorySamplers(ray=fake_ray, tree_interval_seconds=-1)
    with pytest.raises(ValueError, match="max_missed"):
        GroupMemorySamplers(ray=fake_ray, max_missed=0)
    with pytest.raises(ValueError, match="pid"):
        GroupMemorySamplers(ray=fake_ray).sample({NODE_A: [("policy", -3, None)]})
    with pytest.raises(ValueError, match="node id"):
        GroupMemorySamplers(ray=fake_ray).sample({"": [("policy", 3, None)]})
    assert fake_ray.actors == []


def test_the_actor_class_answers_in_builtins(nodes):
    a = nodes[NODE_A]
    worker = _worker(a, "policy", 200, MB)
    actor = GroupMemorySamplerActor(procfs_root=str(a.root), host_name="node-a")

    plain = actor.read([worker])

    assert NodeGroupMemory.from_plain(plain).groups[0].rss_bytes == MB
    assert plain["host_name"] == "node-a"


def test_reader_settings_reach_every_sampler(fake_ray: FakeRay, nodes, monkeypatch):
    made: list[dict[str, Any]] = []
    original = GroupMemorySamplerActor.__init__

    def recording_init(self: Any, **kwargs: Any) -> None:
        made.append(kwargs)
        original(self, **kwargs)

    monkeypatch.setattr(GroupMemorySamplerActor, "__init__", recording_init)
    a = nodes[NODE_A]
    manager = _manager(fake_ray, pss_interval_seconds=45.0, tree_interval_seconds=15.0)
    manager.sample({NODE_A: [_worker(a, "policy", 200, MB)]})

    assert [(m["pss_interval_seconds"], m["tree_interval_seconds"]) for m in made] == [(45.0, 15.0)]


def test_one_cycle_samples_the_registry_and_publishes(fake_ray: FakeRay, nodes):
    a, b = nodes[NODE_A], nodes[NODE_B]
    registry = GroupWorkerRegistry()
    _, pid_a, ticks_a = _worker(a, "policy", 200, 3 * MB)
    _, pid_b, ticks_b = _worker(b, "rollout", 300, 5 * MB)
    registry.register("policy", [(NODE_A, pid_a, ticks_a)])
    registry.register("rollout", [(NODE_B, pid_b, ticks_b)])
    snapshot = GroupMemorySnapshot(clock=lambda: 0.0)
    manager = _manager(fake_ray)

    results = collect_group_memory(manager, registry=registry, snapshot=snapshot, max_age=15.0)

    assert set(results) == {NODE_A, NODE_B}
    points = {
        (dict(o.attributes)["rl.worker_group"], dict(o.attributes)["ray.node.id"]): o.value
        for o in snapshot.observe_usage()
        if dict(o.attributes)["memory.type"] == "rss"
    }
    assert points == {("policy", NODE_A): 3 * MB, ("rollout", NODE_B): 5 * MB}

    registry.forget("rollout")
    collect_group_memory(manager, registry=registry, snapshot=snapshot)
    assert manager.nodes == {NODE_A}
    assert {dict(o.attributes)["ray.node.id"] for o in snapshot.observe_processes()} == {NODE_A}


def test_groups_left_out_by_the_process_cap_are_named_in_one_warning(
    fake_ray: FakeRay, nodes, caplog
):
    a = nodes[NODE_A]
    a.add_process(400, rss_bytes=MB)
    for pid in range(401, 405):
        a.add_process(pid, parent=400, rss_bytes=MB)
    registry = GroupWorkerRegistry()
    registry.register("policy", [(NODE_A, 200, _worker(a, "policy", 200, MB)[2])])
    registry.register("a-big\x1b[2J", [(NODE_A, 400, a.start_ticks(400))])
    manager = _manager(fake_ray, max_processes=3)
    snapshot = GroupMemorySnapshot(clock=lambda: 0.0)

    with caplog.at_level(logging.WARNING, logger="raylens"):
        for _ in range(3):
            results = collect_group_memory(manager, registry=registry, snapshot=snapshot)

    assert [g.group for g in results[NODE_A].groups] == ["policy"]
    assert results[NODE_A].skipped_groups == ("a-big\x1b[2J",)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "a-big\\x1b[2J" in warnings[0] and NODE_A in warnings[0] and "3" in warnings[0]
    assert "\x1b" not in warnings[0]


def test_worker_identity_reports_node_pid_and_start(monkeypatch):
    FakeRay([NODE_C]).install(monkeypatch)

    node_id, pid, ticks = worker_identity(object())

    assert (node_id, pid) == (NODE_C, os.getpid())
    assert ticks == ProcFS().start_ticks(os.getpid())
