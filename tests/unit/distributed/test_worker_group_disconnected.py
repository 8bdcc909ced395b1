"""A worker group whose process is no longer connected to Ray never reaches for Ray again.

Ray's own entry points (``.remote()``, ``ray.kill``, ``ray.get``...) start a brand-new
local Ray cluster when the process is not connected. The ``ray`` module here is a
stand-in that records any such call instead.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest

from raylens.distributed import worker_groups as wg
from raylens.distributed.virtual_cluster import RayVirtualCluster


class _Recorder:
    """Any attribute, call or chained call on it is recorded in ``log``."""

    def __init__(self, log: list[str], path: str) -> None:
        self._log = log
        self._path = path

    def __getattr__(self, name: str) -> _Recorder:
        return _Recorder(self._log, f"{self._path}.{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> _Recorder:
        self._log.append(self._path)
        return _Recorder(self._log, f"{self._path}()")


@pytest.fixture
def disconnected_ray(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    log: list[str] = []
    ray = types.ModuleType("ray")
    ray.is_initialized = lambda: False  # type: ignore[attr-defined]
    for name in ("remote", "kill", "get", "wait", "put", "cancel"):
        setattr(ray, name, _Recorder(log, f"ray.{name}"))
    ray.exceptions = types.SimpleNamespace(  # type: ignore[attr-defined]
        RayActorError=type("RayActorError", (Exception,), {}),
        GetTimeoutError=type("GetTimeoutError", (Exception,), {}),
    )
    util = types.ModuleType("ray.util")
    strategies = types.ModuleType("ray.util.scheduling_strategies")
    strategies.PlacementGroupSchedulingStrategy = _Recorder(log, "strategy")  # type: ignore[attr-defined]
    ray.util = util  # type: ignore[attr-defined]
    util.scheduling_strategies = strategies  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.setitem(sys.modules, "ray.util", util)
    monkeypatch.setitem(sys.modules, "ray.util.scheduling_strategies", strategies)
    wg.reset_remote_function_cache()
    yield log
    wg.reset_remote_function_cache()


def _group_with_one_worker(log: list[str]) -> wg.RayWorkerGroup:
    """A group as it stands after its workers were created, without creating them."""
    group = wg.RayWorkerGroup.__new__(wg.RayWorkerGroup)
    group.cluster = RayVirtualCluster([1], use_gpus=False)
    group.name_prefix = "cut-off"
    group._builder = wg.RayWorkerBuilder("pkg.mod.Worker")
    group._workers = [_Recorder(log, "worker0")]
    group._worker_metadata = [{"name": "cut-off-0-0", "local_rank": 0}]
    group._records = [
        wg._CreationRecord(
            placement_group=_Recorder(log, "pg"),
            bundle_index=0,
            num_gpus=0,
            bundle_indices=(0, [0]),
            extra_options={},
            initializer_key=0,
        )
    ]
    group._initializer_pool = {0: _Recorder(log, "initializer")}
    group._initializer_sites = {}
    group._placement_registered = False
    group.worker_to_tied_group_index = {0: 0}
    return group


def test_gpu_probe_without_ray_prints_that_and_starts_nothing(
    disconnected_ray: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    group = _group_with_one_worker(disconnected_ray)
    group.log_worker_gpu_state(0, label="late", timeout_s=1)
    out = capsys.readouterr().out
    assert out.startswith("[late] worker 0")
    assert "not connected to Ray" in out
    assert disconnected_ray == []


def test_recreate_without_ray_raises_and_starts_nothing(disconnected_ray: list[str]) -> None:
    group = _group_with_one_worker(disconnected_ray)
    worker = group.workers[0]
    with pytest.raises(RuntimeError, match=r"'cut-off'.*not connected to Ray.*ray\.init"):
        group.recreate_worker(0)
    assert disconnected_ray == []
    assert group.workers[0] is worker
