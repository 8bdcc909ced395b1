"""Phases entered outside the driver's process, on real Ray.

A Ray task shares its driver's job id, so a phase it entered used to overwrite, then
delete, the driver's published phase; a child forked from a Ray-connected driver used to
wait forever in the parent's GCS client. Both now measure themselves and reach nothing.
"""

from __future__ import annotations

import json
import multiprocessing
from typing import Any

import pytest

pytestmark = pytest.mark.integration
ray = pytest.importorskip("ray")

import raylens  # noqa: E402
from raylens.cluster import default_cluster_view  # noqa: E402
from raylens.distributed.phases import PhaseRole, current_phase  # noqa: E402
from raylens.telemetry.phases.board import PHASE_KEY_PREFIX  # noqa: E402


def _published() -> Any:
    view = default_cluster_view()
    raw = view.kv_get(f"{PHASE_KEY_PREFIX}{view.job_id()}")
    return None if raw is None else json.loads(raw)["phase"]


@ray.remote(num_cpus=0)
def _phase_in_a_task() -> tuple[str, str | None]:
    from raylens.distributed.phases import DEFAULT_MARKER

    with raylens.phase("rollout"):
        inside = current_phase()
    return DEFAULT_MARKER.role().value, inside


def _phase_in_a_forked_child(results: Any) -> None:
    with raylens.phase("child-work"):
        results.put(current_phase())


@pytest.mark.timeout(180)
def test_a_phase_in_a_ray_task_never_touches_the_drivers_phase_key(ray_cluster) -> None:
    with raylens.phase("train"):
        assert _published() == "train"
        role, inside = ray.get(_phase_in_a_task.remote(), timeout=120)
        assert (role, inside) == (PhaseRole.RAY_WORKER.value, "rollout")
        assert _published() == "train"
    assert _published() is None


@pytest.mark.timeout(180)
def test_a_forked_child_enters_a_phase_without_the_parents_gcs_client(ray_cluster) -> None:
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    with raylens.phase("train"):
        child = context.Process(target=_phase_in_a_forked_child, args=(results,))
        child.start()
        child.join(60)
        hung = child.is_alive()
        if hung:
            child.kill()
            child.join(10)
        assert not hung, "the forked child's phase waited on the parent's GCS client"
        assert child.exitcode == 0
        assert results.get(timeout=5) == "child-work"
        assert _published() == "train"
