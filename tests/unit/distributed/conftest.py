"""Fixtures for the distributed tests: three nodes' fake ``/proc`` and a FakeRay over them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from raylens_fakes.procfs import FakeProcFS
from raylens_fakes.ray import FakeRay

# Ray node ids are 56 hex digits.
NODE_IDS = ("a" * 56, "b" * 56, "c" * 56)


@pytest.fixture
def nodes(tmp_path: Path) -> dict[str, FakeProcFS]:
    """An empty fake ``/proc`` for each of three nodes, keyed by node id."""
    return {node: FakeProcFS(tmp_path / node[:1]) for node in NODE_IDS}


@pytest.fixture
def ray_over_nodes(nodes: dict[str, FakeProcFS]) -> Iterator[FakeRay]:
    """A FakeRay over ``nodes``: each sampler it starts reads its own node's ``/proc``.

    Whatever the test, no ``ray.get`` of it may have run out its timeout: the samplers'
    manager only collects readings that are ready, never blocking on a hung one.
    """
    fake = FakeRay.over_procfs(nodes)
    yield fake
    assert fake.timed_out_gets == []
