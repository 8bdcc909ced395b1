"""The simulated cluster is raylens' default view while it exists; raylens never starts Ray."""

from __future__ import annotations

import logging
import sys
import types
from typing import Any

import pytest

from raylens.cluster import RayClusterView, default_cluster_view
from raylens.telemetry import host_memory as hm
from raylens_fakes.pytest_plugin import simulated_clusters


def test_the_simulated_cluster_is_the_default_view_of_the_test(simulated_cluster: Any) -> None:
    sim = simulated_cluster(2)
    assert default_cluster_view() is sim.cluster
    # As a user's own worker group does: no cluster= anywhere.
    placement_group = sim.cluster.create_placement_group({0: sim.node_id(1)})
    hm.register_worker_group_placement("trainer", [(placement_group, 0)])
    assert hm.worker_group_names_on_node(sim.node_id(1)) == {"trainer"}


def test_the_latest_simulated_cluster_is_the_default(simulated_cluster: Any) -> None:
    first = simulated_cluster(1)
    second = simulated_cluster(1)
    assert default_cluster_view() is second.cluster
    assert first.cluster is not second.cluster


def test_the_default_view_comes_back_when_the_clusters_close() -> None:
    with simulated_clusters() as start:
        sim = start(1)
        assert default_cluster_view() is sim.cluster
    assert isinstance(default_cluster_view(), RayClusterView)


def _ray_that_would_start(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A stand-in ``ray`` module, not initialised, that notes every call reaching it."""
    reached: list[str] = []
    ray = types.ModuleType("ray")
    ray.is_initialized = lambda: False  # type: ignore[attr-defined]
    ray.nodes = lambda: reached.append("nodes")  # type: ignore[attr-defined]
    util = types.ModuleType("ray.util")
    util.placement_group_table = lambda pg: reached.append("placement_group_table")  # type: ignore[attr-defined]
    ray.util = util  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.setitem(sys.modules, "ray.util", util)
    return reached


@pytest.mark.parametrize(
    "call",
    [
        lambda view: view.nodes(),
        lambda view: view.placement_group_table(object()),
        lambda view: view.kv_get("raylens/placement/x"),
        lambda view: view.kv_keys("raylens/"),
        lambda view: view.job_id(),
        lambda view: view.live_job_ids(),
    ],
)
def test_the_real_view_refuses_to_start_ray(call: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    reached = _ray_that_would_start(monkeypatch)
    with pytest.raises(RuntimeError, match=r"not connected to Ray.*use_cluster_view"):
        call(RayClusterView())
    assert reached == []


def test_a_placement_registered_without_ray_is_a_warning_not_a_ray_start(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="raylens")
    reached = _ray_that_would_start(monkeypatch)
    hm.register_worker_group_placement("trainer", [(object(), 0)])
    assert reached == []
    assert "not connected to Ray" in caplog.text
