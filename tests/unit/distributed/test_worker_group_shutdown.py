"""RayWorkerGroup.shutdown against a scripted Ray: who is killed, in what order, and the result.

The stand-in Ray answers each actor method with a scripted outcome (``ok``, ``died``,
``raises`` or ``hangs``) and records every ``ray.kill``.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from raylens.distributed import worker_groups as wg
from raylens.distributed.ray_seam import RaySeam
from raylens.telemetry import host_memory

NODE = "node-a"


class RayActorError(Exception):
    pass


class FakeRef:
    def __init__(self, actor: FakeActor, method: str) -> None:
        self.actor = actor
        self.method = method
        self.outcome = "died" if actor.dead else actor.outcomes.get(method, "ok")


class FakeActor:
    def __init__(self, ray: FakeRay, name: str, **outcomes: str) -> None:
        self._ray = ray
        self.name = name
        self.outcomes = outcomes
        self.dead = False
        self.kill_error = False

    def __getattr__(self, method: str) -> Any:
        actor = self

        class Method:
            @staticmethod
            def remote(*args: Any, **kwargs: Any) -> FakeRef:
                actor._ray.submitted.append((actor.name, method))
                return FakeRef(actor, method)

        return Method


class FakeRay:
    def __init__(self) -> None:
        self.exceptions = SimpleNamespace(RayActorError=RayActorError)
        self.killed: list[str] = []
        self.submitted: list[tuple[str, str]] = []
        self.wait_timeouts: list[float | None] = []
        self.wait_error: Exception | None = None

    def wait(self, refs: list[FakeRef], *, num_returns: int, timeout: float | None) -> Any:
        self.wait_timeouts.append(timeout)
        if self.wait_error is not None:
            raise self.wait_error
        ready = [ref for ref in refs if ref.outcome != "hangs"]
        return ready, [ref for ref in refs if ref.outcome == "hangs"]

    def get(self, ref: FakeRef, timeout: float | None = None) -> Any:
        if ref.outcome == "died":
            raise RayActorError(ref.actor.name)
        if ref.outcome == "raises":
            raise RuntimeError(f"{ref.method} failed on {ref.actor.name}")
        return "done"

    def kill(self, actor: FakeActor, *, no_restart: bool) -> None:
        assert no_restart is True
        if actor.kill_error:
            raise RuntimeError(f"cannot kill {actor.name}")
        self.killed.append(actor.name)
        actor.dead = True


class FakeSeam(RaySeam):
    """A Ray seam whose connected ray module is the stand-in (None: disconnected)."""

    def __init__(self, ray: FakeRay | None) -> None:
        super().__init__()
        self.fake = ray

    def connected_ray(self) -> FakeRay | None:
        return self.fake


@pytest.fixture
def ray() -> FakeRay:
    return FakeRay()


def make_group(ray: FakeRay, *workers: FakeActor, connected: bool = True) -> wg.RayWorkerGroup:
    """A group as it stands once its workers are up and its placement is registered."""
    group = wg.RayWorkerGroup.__new__(wg.RayWorkerGroup)
    group.name_prefix = "grp"
    group._seam = FakeSeam(ray if connected else None)
    group._workers = list(workers)
    group._worker_metadata = [{"name": w.name} for w in workers]
    group._records = [None] * len(workers)
    group._initializers = {"pg-a": FakeActor(ray, "init-a"), "pg-b": FakeActor(ray, "init-b")}
    group._initializer_sites = {}
    group._default_name = False
    host_memory.register_worker_group_nodes("grp", [NODE])
    group._placement_registered = True
    return group


def placement_forgotten() -> bool:
    return "grp" not in host_memory.worker_group_names_on_node(NODE)


def test_clean_shutdown_kills_workers_then_initializers(ray: FakeRay) -> None:
    group = make_group(ray, FakeActor(ray, "w0"), FakeActor(ray, "w1"))
    assert group.shutdown() is True
    assert ray.killed == ["w0", "w1", "init-a", "init-b"]
    assert ray.submitted == []  # without a cleanup method: killed at once, nothing asked
    assert group.workers == [] and placement_forgotten()
    assert group.shutdown() is True  # nothing left
    assert ray.killed == ["w0", "w1", "init-a", "init-b"]


def test_a_worker_already_dead_counts_as_shut_down(ray: FakeRay) -> None:
    dead = FakeActor(ray, "w0")
    dead.dead = True
    group = make_group(ray, dead, FakeActor(ray, "w1"), FakeActor(ray, "w2"))
    assert group.shutdown() is True
    assert ray.killed == ["w0", "w1", "w2", "init-a", "init-b"]


def test_a_worker_already_dead_at_cleanup_counts_as_shut_down(ray: FakeRay) -> None:
    dead = FakeActor(ray, "w0")
    dead.dead = True
    group = make_group(ray, dead, FakeActor(ray, "w1"))
    assert group.shutdown(cleanup_method="cleanup") is True
    assert ray.killed == ["w0", "w1", "init-a", "init-b"]
    assert placement_forgotten()


def test_a_worker_that_cannot_be_killed_does_not_spare_the_rest(ray: FakeRay) -> None:
    stubborn = FakeActor(ray, "w0")
    stubborn.kill_error = True
    group = make_group(ray, stubborn, FakeActor(ray, "w1"))
    assert group.shutdown() is False
    assert ray.killed == ["w1", "init-a", "init-b"]
    assert placement_forgotten()


def test_cleanup_outcomes(ray: FakeRay) -> None:
    group = make_group(
        ray,
        FakeActor(ray, "w0"),
        FakeActor(ray, "w1", cleanup="raises"),
        FakeActor(ray, "w2", cleanup="hangs"),
        FakeActor(ray, "w3", cleanup="died"),
    )
    assert group.shutdown(cleanup_method="cleanup", timeout=2.0) is False
    assert ray.wait_timeouts[0] == 2.0
    # only the worker whose cleanup succeeded is asked to exit on its own
    assert [s for s in ray.submitted if s[1] == "__ray_terminate__"] == [
        ("w0", "__ray_terminate__")
    ]
    assert ray.wait_timeouts[1] <= 2.0
    assert ray.killed == ["w0", "w1", "w2", "w3", "init-a", "init-b"]
    assert placement_forgotten()


def test_force_kills_without_calling_the_cleanup_method(ray: FakeRay) -> None:
    group = make_group(ray, FakeActor(ray, "w0", cleanup="hangs"), FakeActor(ray, "w1"))
    assert group.shutdown(cleanup_method="cleanup", force=True) is True
    assert ray.submitted == []
    assert ray.wait_timeouts == []  # nothing waited on
    assert ray.killed == ["w0", "w1", "init-a", "init-b"]


def test_an_unexpected_error_still_kills_everything_and_forgets_placement(ray: FakeRay) -> None:
    ray.wait_error = RuntimeError("GCS unreachable")
    group = make_group(ray, FakeActor(ray, "w0"), FakeActor(ray, "w1"))
    assert group.shutdown(cleanup_method="cleanup") is False
    assert ray.killed == ["w0", "w1", "init-a", "init-b"]
    assert group.workers == [] and placement_forgotten()


def test_without_ray_it_is_false_and_placement_is_forgotten(ray: FakeRay) -> None:
    group = make_group(ray, FakeActor(ray, "w0"), connected=False)
    assert group.shutdown() is False
    assert ray.killed == [] and group.workers == [] and placement_forgotten()
