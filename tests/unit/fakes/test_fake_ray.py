"""FakeRay: the in-process stand-in for ``ray`` that raylens' distributed tests run on."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from raylens.distributed.ray_seam import RaySeam, _await_calls
from raylens_fakes import FakeRay
from raylens_fakes.ray import (
    DEFAULT_NODE_IDS,
    FakeObjectRef,
    GetTimeoutError,
    NodeAffinitySchedulingStrategy,
    PlacementGroupSchedulingStrategy,
    RayActorError,
    TaskCancelledError,
    WouldBlockForever,
)


class Counter:
    def __init__(self, start: int = 0, *, step: int = 1) -> None:
        self.value = start
        self.step = step

    def bump(self, times: int = 1) -> int:
        self.value += self.step * times
        return self.value


def test_the_fixture_is_a_connected_fake_over_two_nodes(fake_ray: FakeRay) -> None:
    assert isinstance(fake_ray, FakeRay)
    assert fake_ray.is_initialized()
    assert fake_ray.node_ids == list(DEFAULT_NODE_IDS)
    assert [node["NodeID"] for node in fake_ray.nodes()] == list(DEFAULT_NODE_IDS)
    assert fake_ray.get_runtime_context().get_node_id() == DEFAULT_NODE_IDS[0]
    assert "ray" not in sys.modules or sys.modules["ray"] is not fake_ray


def test_an_actor_class_runs_its_methods_when_asked(fake_ray: FakeRay) -> None:
    remote_class = fake_ray.remote(num_cpus=0)(Counter)
    actor = remote_class.options(name="counter", num_gpus=0).remote(10, step=2)

    ref = actor.bump.remote(3)

    assert fake_ray.get(ref, timeout=1.0) == 16
    assert fake_ray.get([actor.bump.remote(), fake_ray.put("x")]) == [18, "x"]
    assert actor.name == "counter"
    assert actor.options == {"num_cpus": 0, "name": "counter", "num_gpus": 0}
    assert actor.calls == [("bump", (3,), {}), ("bump", (), {})]
    assert fake_ray.submitted == [("counter", "bump"), ("counter", "bump")]
    assert fake_ray.actors == [actor]
    assert fake_ray.get_timeouts == [1.0, None]


def test_a_result_is_computed_once(fake_ray: FakeRay) -> None:
    actor = fake_ray.remote(Counter).remote()
    ref = actor.bump.remote()
    assert fake_ray.get(ref) == 1
    assert fake_ray.get(ref) == 1
    assert actor.instance.value == 1


def test_remote_functions_run_as_tasks(fake_ray: FakeRay) -> None:
    def double(x: int) -> int:
        return 2 * x

    task = fake_ray.remote(double)
    assert fake_ray.get(task.options(num_cpus=1).remote(21)) == 42
    assert fake_ray.tasks == [("double", (21,), {"num_cpus": 1})]
    fake_ray.hung_tasks.add("double")
    stuck = task.remote(1)
    assert fake_ray.wait([stuck], timeout=0.5) == ([], [stuck])


def test_builtin_actor_methods(fake_ray: FakeRay) -> None:
    actor = fake_ray.remote(Counter).remote(5)
    assert fake_ray.get(actor.__ray_ready__.remote()) is True
    assert fake_ray.get(actor.__ray_call__.remote(lambda counter, n: counter.value + n, 1)) == 6
    fake_ray.get(actor.__ray_terminate__.remote())
    assert actor.dead
    with pytest.raises(RayActorError):
        fake_ray.get(actor.bump.remote())
    with pytest.raises(AttributeError):
        _ = actor._private
    with pytest.raises(AttributeError, match="has no method 'missing'"):
        _ = actor.missing
    assert getattr(actor, "pid", None) is None


def test_scripted_outcomes(fake_ray: FakeRay) -> None:
    actor = fake_ray.actor("w0", Counter())
    actor.script("bump", "raises")
    with pytest.raises(RuntimeError, match="bump failed on w0"):
        fake_ray.get(actor.bump.remote())
    actor.script("bump", "died")
    with pytest.raises(fake_ray.exceptions.RayActorError):
        fake_ray.get(actor.bump.remote())
    actor.script("bump", KeyError("scripted"))
    with pytest.raises(KeyError, match="scripted"):
        fake_ray.get(actor.bump.remote())
    actor.script("bump", lambda times=1: f"bumped {times}")
    assert fake_ray.get(actor.bump.remote(4)) == "bumped 4"
    actor.script("bump", "ok")
    assert fake_ray.get(actor.bump.remote()) == 1
    with pytest.raises(ValueError, match=r"unknown outcome 'explodes'.*ok, hangs, died, raises"):
        actor.script("bump", "explodes")


def test_a_hanging_call_is_never_ready_until_released(fake_ray: FakeRay) -> None:
    actor = fake_ray.actor("w0", Counter()).script("bump", "hangs")
    quick = fake_ray.put(1)
    stuck = actor.bump.remote()

    ready, pending = fake_ray.wait([stuck, quick], num_returns=2, timeout=0.25)

    assert (ready, pending) == ([quick], [stuck])
    assert fake_ray.wait_timeouts == [0.25]
    with pytest.raises(GetTimeoutError):
        fake_ray.get(stuck, timeout=0.1)
    assert fake_ray.timed_out_gets == [stuck]
    with pytest.raises(WouldBlockForever):
        fake_ray.get(stuck)
    stuck.release()
    assert fake_ray.get(stuck) == 1


def test_a_hung_actor_hangs_every_later_call(fake_ray: FakeRay) -> None:
    actor = fake_ray.actor("w0", Counter())
    before = actor.bump.remote()
    actor.hung = True
    assert fake_ray.wait([before, actor.bump.remote()], num_returns=2)[0] == [before]
    actor.dead = True
    with pytest.raises(RayActorError):
        fake_ray.get(actor.bump.remote(), timeout=0)


def test_actors_on_a_hanging_node_hang_from_the_start(fake_ray: FakeRay) -> None:
    node_a, node_b = fake_ray.node_ids
    fake_ray.hang_actors_on(node_b)
    remote_class = fake_ray.remote(Counter)
    on_a = remote_class.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_a)).remote()
    on_b = remote_class.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_b)).remote()
    assert (on_a.node_id, on_b.node_id) == (node_a, node_b)
    assert not on_a.hung and on_b.hung


def test_actor_setup_sees_the_node_and_may_change_the_arguments(fake_ray: FakeRay) -> None:
    starts = {node: index * 100 for index, node in enumerate(fake_ray.node_ids)}
    fake_ray.actor_setup = lambda node, cls, kwargs: kwargs.update(start=starts[node])
    strategy = fake_ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(
        node_id=fake_ray.node_ids[1], soft=False
    )
    actor = fake_ray.remote(Counter).options(scheduling_strategy=strategy).remote()
    assert actor.instance.value == 100


def test_over_procfs_starts_each_actor_on_its_own_nodes_fake_proc(tmp_path: Path) -> None:
    class ReadsProc:
        def __init__(self, procfs_root: str) -> None:
            self.procfs_root = procfs_root

    trees = {node: SimpleNamespace(root=tmp_path / node[:1]) for node in ("a" * 56, "b" * 56)}
    fake = FakeRay.over_procfs(trees)
    strategy = NodeAffinitySchedulingStrategy("b" * 56)

    actor = fake.remote(ReadsProc).options(scheduling_strategy=strategy).remote()

    assert fake.node_ids == list(trees)
    assert actor.instance.procfs_root == str(tmp_path / "b")


def test_an_unknown_node_is_refused_by_name(fake_ray: FakeRay) -> None:
    strategy = NodeAffinitySchedulingStrategy("f" * 56)
    with pytest.raises(ValueError, match=r"no node 'f+'"):
        fake_ray.remote(Counter).options(scheduling_strategy=strategy).remote()
    with pytest.raises(ValueError, match="at least one node"):
        FakeRay([])


def test_kill_records_and_kills(fake_ray: FakeRay) -> None:
    seen: list[str] = []
    fake_ray.on_kill.append(lambda actor: seen.append(actor.name))
    first, second, stubborn = (fake_ray.actor(name) for name in ("w0", "w1", "w2"))
    stubborn.kill_error = True

    fake_ray.kill(first, no_restart=True)
    with pytest.raises(RuntimeError, match="cannot kill w2"):
        fake_ray.kill(stubborn)
    with pytest.raises(AssertionError, match="restart"):
        fake_ray.kill(second, no_restart=False)

    assert fake_ray.killed == ["w0"] == seen
    assert first.killed and first.dead
    assert fake_ray.live_actors() == [second, stubborn]
    with pytest.raises(RayActorError, match="w0"):
        fake_ray.get(first.__ray_ready__.remote())


def test_on_submit_runs_before_the_call(fake_ray: FakeRay) -> None:
    victim = fake_ray.actor("w0", Counter())
    fake_ray.on_submit.append(lambda actor, method: method == "bump" and fake_ray.kill(actor))
    with pytest.raises(RayActorError):
        fake_ray.get(victim.bump.remote())


def test_cancel_ends_a_hanging_call(fake_ray: FakeRay) -> None:
    stuck = fake_ray.actor("w0").script("slow", "hangs").slow.remote()
    fake_ray.cancel(stuck, force=True)
    assert fake_ray.cancelled == [stuck]
    with pytest.raises(TaskCancelledError):
        fake_ray.get(stuck, timeout=1.0)


def test_wait_error_is_raised(fake_ray: FakeRay) -> None:
    fake_ray.wait_error = RuntimeError("GCS unreachable")
    with pytest.raises(RuntimeError, match="GCS unreachable"):
        fake_ray.wait([fake_ray.put(1)])


def test_get_refuses_what_is_not_a_ref(fake_ray: FakeRay) -> None:
    with pytest.raises(TypeError, match="object refs, not int"):
        fake_ray.get(3)


def test_refs_are_hashable_and_distinct() -> None:
    first, second = FakeObjectRef(lambda: 1), FakeObjectRef(lambda: 1)
    assert first != second and len({first, second, first}) == 2


def test_placement_groups_place_bundles_and_report_them(fake_ray: FakeRay) -> None:
    node_a, node_b = fake_ray.node_ids
    packed = fake_ray.util.placement_group([{"CPU": 1}, {"CPU": 1}], strategy="PACK", name="p")
    spread = fake_ray.util.placement_group([{"CPU": 1}] * 3, strategy="SPREAD")

    assert fake_ray.get(packed.ready(), timeout=1.0) is packed
    table = fake_ray.util.placement_group_table(packed)
    assert table["bundles_to_node_id"] == {0: node_a, 1: node_a}
    assert table["state"] == "CREATED" and table["name"] == "p"
    assert spread.bundle_nodes == [node_a, node_b, node_a]
    assert set(fake_ray.util.placement_group_table()) == {packed.id.hex(), spread.id.hex()}

    strategy = PlacementGroupSchedulingStrategy(spread, placement_group_bundle_index=1)
    actor = fake_ray.remote(Counter).options(scheduling_strategy=strategy).remote()
    assert actor.node_id == node_b

    fake_ray.util.remove_placement_group(packed)
    assert fake_ray.util.placement_group_table(packed)["state"] == "REMOVED"


def test_a_pending_placement_group_is_never_ready(fake_ray: FakeRay) -> None:
    fake_ray.pending_placement = True
    group = fake_ray.util.placement_group([{"GPU": 8}])
    ready = group.ready()
    assert fake_ray.wait([ready], timeout=0.5) == ([], [ready])
    assert group.table()["state"] == "PENDING"
    assert fake_ray.util.placement_group_table(group)["bundles_to_node_id"] == {}


def test_the_seam_follows_the_fake_connection(fake_ray: FakeRay) -> None:
    seam = fake_ray.seam()
    assert isinstance(seam, RaySeam)
    assert seam.connected_ray() is fake_ray
    built: list[Any] = []
    definition = seam.remote("probe", lambda ray: built.append(ray) or object())
    assert seam.remote("probe", lambda ray: object()) is definition
    assert built == [fake_ray]
    fake_ray.shutdown()
    assert seam.connected_ray() is None
    assert seam.ray() is fake_ray


def test_the_seam_helpers_read_outcomes_through_the_fake(fake_ray: FakeRay) -> None:
    actors = [fake_ray.actor(f"w{i}") for i in range(4)]
    actors[1].script("cleanup", "died")
    actors[2].script("cleanup", "raises")
    actors[3].script("cleanup", "hangs")
    refs = [actor.cleanup.remote() for actor in actors]
    assert _await_calls(fake_ray, refs, timeout=0.5) == ["ok", "died", "failed", "timed out"]


def test_install_makes_imports_of_ray_find_the_fake(
    fake_ray: FakeRay, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_ray.install(monkeypatch)
    import ray  # type: ignore[import-not-found]
    from ray.util.placement_group import placement_group  # type: ignore[import-not-found]
    from ray.util.scheduling_strategies import (  # type: ignore[import-not-found]
        NodeAffinitySchedulingStrategy as Affinity,
    )

    assert ray is fake_ray
    assert placement_group([{"CPU": 1}]) in fake_ray.placement_groups
    assert Affinity is NodeAffinitySchedulingStrategy
    assert importlib.import_module("ray.exceptions").RayActorError is RayActorError
