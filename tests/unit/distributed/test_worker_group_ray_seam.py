"""One Ray seam: the connection check and the remote definitions, shared by clusters and groups."""

from __future__ import annotations

from typing import Any

import pytest

from raylens.distributed.ray_seam import DEFAULT_RAY_SEAM, RaySeam
from raylens.distributed.virtual_cluster import RayVirtualCluster
from raylens.distributed.worker_groups import RayWorkerBuilder, RayWorkerGroup
from raylens_fakes.pytest_plugin import BlockedImports
from raylens_fakes.ray import FakeRay


class Disconnected:
    def is_initialized(self) -> bool:
        return False


def test_remote_definitions_are_built_once_per_seam_until_reset(fake_ray: FakeRay) -> None:
    seam = fake_ray.seam()
    built: list[Any] = []

    def build(module: FakeRay) -> object:
        built.append(module)
        return object()

    first = seam.remote("probe", build)
    assert seam.remote("probe", build) is first
    assert built == [fake_ray]
    assert fake_ray.seam().remote("probe", build) is not first  # another seam, its own cache
    seam.reset()
    assert seam.remote("probe", build) is not first


def test_connected_ray_follows_the_cluster_view(ray_absent: BlockedImports) -> None:
    assert RaySeam(cluster_view=Disconnected()).connected_ray() is None  # type: ignore[arg-type]
    assert ray_absent.attempts == []


def test_cluster_and_group_use_the_seam_they_are_given(ray_absent: BlockedImports) -> None:
    seam = RaySeam(cluster_view=Disconnected())  # type: ignore[arg-type]
    cluster = RayVirtualCluster([1], use_gpus=False, ray_seam=seam)
    assert cluster.ray_seam is seam
    with pytest.raises(RuntimeError, match=r"ray\.init"):
        cluster.get_placement_groups()
    assert RayVirtualCluster([1], use_gpus=False).ray_seam is DEFAULT_RAY_SEAM
    with pytest.raises(RuntimeError, match=r"ray\.init"):
        RayWorkerGroup(cluster, RayWorkerBuilder("pkg.mod.Worker"), name_prefix="g")
    assert ray_absent.attempts == []
