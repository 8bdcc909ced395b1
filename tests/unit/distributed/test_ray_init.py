"""init_ray joins or starts Ray keyed on the visible devices; PY_EXECUTABLES and ClusterConfig."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from raylens.distributed.virtual_cluster import PY_EXECUTABLES, ClusterConfig, init_ray


class RayStub:
    """Stands for the ``ray`` module: records ``init``/``shutdown``; scripted resources."""

    def __init__(self, resources: dict[str, float] | None, *, running: bool = True) -> None:
        self.resources = resources or {}
        self.running = running
        self.inits: list[dict[str, Any]] = []
        self.shutdowns = 0

    def init(self, **kwargs: Any) -> None:
        self.inits.append(kwargs)
        if kwargs.get("address") == "auto" and not self.running:
            raise ConnectionError("no cluster")

    def cluster_resources(self) -> dict[str, float]:
        return dict(self.resources)

    def shutdown(self) -> None:
        self.shutdowns += 1


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for key in ("CUDA_VISIBLE_DEVICES", "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(key, raising=False)
    return monkeypatch


def install(monkeypatch: pytest.MonkeyPatch, stub: RayStub) -> RayStub:
    monkeypatch.setitem(sys.modules, "ray", stub)
    return stub


def test_an_external_cluster_is_always_joined(clean_env: pytest.MonkeyPatch) -> None:
    stub = install(clean_env, RayStub({"CPU": 4.0}))
    clean_env.setenv("CUDA_VISIBLE_DEVICES", "3")
    init_ray(log_dir="logs")
    assert len(stub.inits) == 1
    joined = stub.inits[0]
    assert joined["address"] == "auto" and joined["include_dashboard"] is False
    assert joined["_temp_dir"].endswith("/logs") and joined["_temp_dir"].startswith("/")
    assert joined["runtime_env"]["env_vars"]["CUDA_VISIBLE_DEVICES"] == "3"
    assert stub.shutdowns == 0


def test_own_local_cluster_is_reused_for_the_same_devices_in_any_order(
    clean_env: pytest.MonkeyPatch,
) -> None:
    stub = install(clean_env, RayStub({"GPU": 2.0, "nrl_tag_0_2": 1.0}))
    clean_env.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    init_ray()
    assert [call["address"] for call in stub.inits] == ["auto"]
    assert stub.shutdowns == 0


def test_other_devices_start_a_fresh_tagged_cluster(clean_env: pytest.MonkeyPatch) -> None:
    stub = install(clean_env, RayStub({"GPU": 1.0, "nrl_tag_0": 1.0}))
    clean_env.setenv("CUDA_VISIBLE_DEVICES", "1")
    init_ray()
    assert stub.shutdowns == 1
    assert len(stub.inits) == 2
    started = stub.inits[1]
    assert "address" not in started
    assert started["resources"] == {"nrl_tag_1": 1}
    assert started["include_dashboard"] is True


def test_no_cluster_starts_one_tagged_all(clean_env: pytest.MonkeyPatch) -> None:
    stub = install(clean_env, RayStub(None, running=False))
    init_ray()
    assert stub.inits[-1]["resources"] == {"nrl_tag_ALL": 1}
    assert stub.inits[-1]["_temp_dir"] is None


def test_launcher_variables_are_removed_before_ray_sees_the_environment(
    clean_env: pytest.MonkeyPatch,
) -> None:
    import os

    stub = install(clean_env, RayStub({"CPU": 1.0}))
    clean_env.setenv("SLURM_JOB_ID", "7")
    clean_env.setenv("OMPI_COMM_WORLD_RANK", "0")
    clean_env.setenv("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES", "1")
    clean_env.setenv("KEEP_ME", "yes")
    init_ray()
    env = stub.inits[0]["runtime_env"]["env_vars"]
    assert "SLURM_JOB_ID" not in env and "OMPI_COMM_WORLD_RANK" not in env
    assert "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES" not in env
    assert env["KEEP_ME"] == "yes"
    assert "SLURM_JOB_ID" not in os.environ  # gone for every later runtime_env too


def test_every_dependency_set_runs_on_this_interpreter() -> None:
    names = ["SYSTEM", "BASE", "VLLM", "FSDP", "AUTOMODEL", "MCORE", "NEMO_GYM", "SGLANG"]
    assert {getattr(PY_EXECUTABLES, name) for name in [*names, "TRTLLM"]} == {sys.executable}


def test_cluster_config_keys() -> None:
    config: ClusterConfig = {"gpus_per_node": 8, "num_nodes": 2, "segment_size": None}
    assert ClusterConfig.__required_keys__ == frozenset({"gpus_per_node", "num_nodes"})
    assert {"master_port_range_low", "master_port_range_high", "segment_size"} <= set(
        ClusterConfig.__optional_keys__
    )
    assert config["num_nodes"] == 2
