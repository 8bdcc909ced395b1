"""RayWorkerGroup.shutdown against a scripted Ray: who is killed, in what order, and the result.

raylens_fakes' FakeRay answers each actor method with a scripted outcome (``ok``,
``died``, ``raises`` or ``hangs``) and records every ``ray.kill``.
"""

from __future__ import annotations

import pytest

from raylens.distributed import worker_groups as wg
from raylens.lens import reset_warn_once
from raylens.telemetry import host_memory
from raylens_fakes.ray import FakeActor, FakeRay

NODE = "node-a"


def worker(ray: FakeRay, name: str, **outcomes: str) -> FakeActor:
    """An actor whose methods end as scripted (``cleanup="hangs"``...), the rest ``ok``."""
    actor = ray.actor(name)
    for method, outcome in outcomes.items():
        actor.script(method, outcome)
    return actor


@pytest.fixture
def ray(fake_ray: FakeRay) -> FakeRay:
    return fake_ray


def make_group(ray: FakeRay, *workers: FakeActor, connected: bool = True) -> wg.RayWorkerGroup:
    """A group as it stands once its workers are up and its placement is registered."""
    group = wg.RayWorkerGroup.__new__(wg.RayWorkerGroup)
    group.name_prefix = "grp"
    if not connected:
        ray.shutdown()
    group._seam = ray.seam()
    group._workers = list(workers)
    group._worker_metadata = [{"name": w.name} for w in workers]
    group._records = [None] * len(workers)
    group._initializer_pool = {0: worker(ray, "init-a"), 1: worker(ray, "init-b")}
    group._initializer_sites = {}
    group._default_name = False
    host_memory.register_worker_group_nodes("grp", [NODE])
    group._placement_registered = True
    return group


def placement_forgotten() -> bool:
    return "grp" not in host_memory.worker_group_names_on_node(NODE)


def test_clean_shutdown_kills_workers_then_initializers(ray: FakeRay) -> None:
    group = make_group(ray, worker(ray, "w0"), worker(ray, "w1"))
    assert group.shutdown() is True
    assert ray.killed == ["w0", "w1", "init-a", "init-b"]
    assert ray.submitted == []  # without a cleanup method: killed at once, nothing asked
    assert group.workers == [] and placement_forgotten()
    assert group.shutdown() is True  # nothing left
    assert ray.killed == ["w0", "w1", "init-a", "init-b"]


def test_a_worker_already_dead_counts_as_shut_down(ray: FakeRay) -> None:
    dead = worker(ray, "w0")
    dead.dead = True
    group = make_group(ray, dead, worker(ray, "w1"), worker(ray, "w2"))
    assert group.shutdown() is True
    assert ray.killed == ["w0", "w1", "w2", "init-a", "init-b"]


def test_a_worker_already_dead_at_cleanup_counts_as_shut_down(ray: FakeRay) -> None:
    dead = worker(ray, "w0")
    dead.dead = True
    group = make_group(ray, dead, worker(ray, "w1"))
    assert group.shutdown(cleanup_method="cleanup") is True
    assert ray.killed == ["w0", "w1", "init-a", "init-b"]
    assert placement_forgotten()


def test_a_worker_that_cannot_be_killed_does_not_spare_the_rest(ray: FakeRay) -> None:
    stubborn = worker(ray, "w0")
    stubborn.kill_error = True
    group = make_group(ray, stubborn, worker(ray, "w1"))
    assert group.shutdown() is False
    assert ray.killed == ["w1", "init-a", "init-b"]
    assert placement_forgotten()


def test_an_initializer_that_cannot_be_killed_is_warned_about_once_and_spares_no_other(
    ray: FakeRay, caplog: pytest.LogCaptureFixture
) -> None:
    reset_warn_once()  # another test's group may have used the same warning key
    group = make_group(ray, worker(ray, "w0"))
    group._initializer_pool[0].kill_error = True
    with caplog.at_level("WARNING", logger="raylens"):
        assert group.shutdown() is True  # the workers are gone; an initializer is not a worker
    assert ray.killed == ["w0", "init-b"]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == ["worker group 'grp': could not kill an initializer actor"]
    assert group._initializer_pool == {}


def test_cleanup_outcomes(ray: FakeRay) -> None:
    group = make_group(
        ray,
        worker(ray, "w0"),
        worker(ray, "w1", cleanup="raises"),
        worker(ray, "w2", cleanup="hangs"),
        worker(ray, "w3", cleanup="died"),
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
    group = make_group(ray, worker(ray, "w0", cleanup="hangs"), worker(ray, "w1"))
    assert group.shutdown(cleanup_method="cleanup", force=True) is True
    assert ray.submitted == []
    assert ray.wait_timeouts == []  # nothing waited on
    assert ray.killed == ["w0", "w1", "init-a", "init-b"]


def test_an_unexpected_error_still_kills_everything_and_forgets_placement(
    fake_ray: FakeRay,
) -> None:
    ray = fake_ray
    ray.wait_error = RuntimeError("GCS unreachable")
    group = make_group(ray, worker(ray, "w0"), worker(ray, "w1"))
    assert group.shutdown(cleanup_method="cleanup") is False
    assert ray.killed == ["w0", "w1", "init-a", "init-b"]
    assert group.workers == [] and placement_forgotten()


def test_without_ray_it_is_false_and_placement_is_forgotten(ray: FakeRay) -> None:
    group = make_group(ray, worker(ray, "w0"), connected=False)
    assert group.shutdown() is False
    assert ray.killed == [] and group.workers == [] and placement_forgotten()
