"""A worker group's life on real Ray: environment, restart, GPU probe, shutdown."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytestmark = pytest.mark.integration
ray = pytest.importorskip("ray")

from group_workers import is_dead, wait_for, wait_until_dead  # noqa: E402

from raylens.distributed.virtual_cluster import RayVirtualCluster  # noqa: E402
from raylens.distributed.worker_groups import RayWorkerBuilder, RayWorkerGroup  # noqa: E402
from raylens.telemetry import host_memory  # noqa: E402

WORKER = "group_workers.EnvWorker"


@pytest.fixture
def two_node_cluster(ray_cluster) -> Iterator[RayVirtualCluster]:
    cluster = RayVirtualCluster(
        [1, 1],
        use_gpus=False,
        placement_group_strategy="STRICT_SPREAD",
        placement_timeout_s=60,
    )
    try:
        yield cluster
    finally:
        cluster.shutdown()


def test_environment_precedence(two_node_cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAYLENS_IT_FROM_DRIVER", "driver")
    monkeypatch.setenv("RAYLENS_IT_SHARED", "driver")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    group_env = {"RAYLENS_IT_SHARED": "group", "OVERRIDE_ME": "group", "RANK": "99"}
    caller_copy = dict(group_env)
    group = RayWorkerGroup(
        two_node_cluster,
        RayWorkerBuilder(WORKER, tag="env"),
        name_prefix="envgrp",
        env_vars=group_env,
    )
    try:
        names = (
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "NODE_RANK",
            "MASTER_ADDR",
            "MASTER_PORT",
            "RAYLENS_IT_FROM_DRIVER",
            "RAYLENS_IT_SHARED",
            "OVERRIDE_ME",
            "FROM_CONFIGURE",
            "CUDA_VISIBLE_DEVICES",
        )
        envs = ray.get([worker.env.remote(*names) for worker in group.workers])
        nodes = ray.get([worker.node_id.remote() for worker in group.workers])
    finally:
        assert group.shutdown() is True
    assert group_env == caller_copy  # the caller's dict is never modified
    assert [(e["RANK"], e["WORLD_SIZE"], e["NODE_RANK"], e["LOCAL_RANK"]) for e in envs] == [
        ("0", "2", "0", "0"),
        ("1", "2", "1", "0"),
    ]
    for env in envs:
        assert env["RAYLENS_IT_FROM_DRIVER"] == "driver"  # driver environment, lowest
        assert env["RAYLENS_IT_SHARED"] == "group"  # group env_vars over the driver
        assert env["OVERRIDE_ME"] == "configure"  # configure_worker over everything
        assert env["FROM_CONFIGURE"] == "yes"
        assert env["CUDA_VISIBLE_DEVICES"] != "7"  # device visibility is not forwarded
    assert envs[0]["MASTER_ADDR"] == envs[1]["MASTER_ADDR"]
    assert envs[0]["MASTER_PORT"] == envs[1]["MASTER_PORT"]
    assert int(envs[0]["MASTER_PORT"]) > 0
    assert nodes[0] != nodes[1]


def test_unknown_worker_class_fails_construction(two_node_cluster) -> None:
    with pytest.raises(Exception, match=r"group_workers\.NoSuchWorker"):
        RayWorkerGroup(
            two_node_cluster,
            RayWorkerBuilder("group_workers.NoSuchWorker"),
            workers_per_node=[1, 0],
            name_prefix="missing",
        )


def test_plain_class_is_made_remote(two_node_cluster) -> None:
    group = RayWorkerGroup(
        two_node_cluster,
        RayWorkerBuilder("group_workers.PlainWorker", greeting="hello"),
        workers_per_node=[1, 0],
        name_prefix="plain",
    )
    try:
        assert ray.get(group.run_all_workers_single_data("greet")) == ["hello from 0"]
    finally:
        assert group.shutdown() is True


def test_recreate_worker_in_place(two_node_cluster) -> None:
    group = RayWorkerGroup(two_node_cluster, RayWorkerBuilder(WORKER), name_prefix="phoenix")
    try:
        old = group.workers[1]
        old_pid, old_node = ray.get([old.pid.remote(), old.node_id.remote()])
        ray.kill(old, no_restart=True)  # the shard dies
        wait_until_dead(old)

        new = group.recreate_worker(1)

        assert group.workers[1] is new
        new_pid, new_node, env = ray.get(
            [new.pid.remote(), new.node_id.remote(), new.env.remote("RANK", "NODE_RANK")]
        )
        assert new_pid != old_pid
        assert new_node == old_node  # same bundle, same node
        assert env == {"RANK": "1", "NODE_RANK": "1"}
        assert ray.get_actor("phoenix-1-0") is not None  # same name as before
        ranks = [r["rank"] for r in ray.get(group.run_all_workers_single_data("echo"))]
        assert ranks == [0, 1]
        # an unresponsive-but-alive worker is killed before its replacement starts
        newer = group.recreate_worker(1)
        assert is_dead(new, timeout=10)
        assert ray.get(newer.env.remote("RANK")) == {"RANK": "1"}
    finally:
        assert group.shutdown() is True


def test_log_worker_gpu_state_on_a_cpu_node(
    two_node_cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    group = RayWorkerGroup(
        two_node_cluster, RayWorkerBuilder(WORKER), workers_per_node=[0, 1], name_prefix="probe"
    )
    try:
        capsys.readouterr()
        group.log_worker_gpu_state(0, label="before-restart")
        seen: list[str] = []

        def probe_line() -> str | None:
            seen.append(capsys.readouterr().out)
            text = "".join(seen)
            return text if "[before-restart] node" in text else None

        # The line is printed on the worker's node and forwarded to the driver by Ray.
        text = wait_for(probe_line, 30, "the GPU probe's line to reach the driver")
        node = ray.get(group.workers[0].node_id.remote())
        assert "no GPU on this node" in text
        assert node[:12] in text
        assert "local rank 0" in text

        group.log_worker_gpu_state(0, label="impatient", timeout_s=0)
        out = capsys.readouterr().out
        assert "[impatient] worker 0 (probe-1-0)" in out
        assert "did not finish within 0s" in out

        group.log_worker_gpu_state(5, label="bad-index")
        out = capsys.readouterr().out
        assert "[bad-index] worker 5: the GPU probe could not run" in out
        assert "out of range" in out

        # the bundle is gone: not reaching it is reported, not raised
        two_node_cluster.shutdown()
        group.log_worker_gpu_state(0, label="gone", timeout_s=2)
        out = capsys.readouterr().out
        assert "[gone] worker 0 (probe-1-0)" in out
        assert "could not run" in out or "did not finish within 2s" in out
        assert group.shutdown() is True  # removing the bundles killed the worker: it is gone
    finally:
        group.shutdown()


def test_shutdown_with_a_worker_already_dead(two_node_cluster) -> None:
    group = RayWorkerGroup(two_node_cluster, RayWorkerBuilder(WORKER), name_prefix="doomed")
    workers = group.workers
    nodes = ray.get([worker.node_id.remote() for worker in workers])
    assert all("doomed" in host_memory.worker_group_names_on_node(n) for n in nodes)
    ray.kill(workers[0], no_restart=True)
    wait_until_dead(workers[0])

    assert group.shutdown() is True  # a worker already dead counts as shut down

    wait_until_dead(workers[1])  # the survivor was killed anyway (ray.kill is asynchronous)
    assert group.workers == []
    assert all("doomed" not in host_memory.worker_group_names_on_node(n) for n in nodes)
    assert group.shutdown() is True  # nothing left to stop


def test_shutdown_with_cleanup(two_node_cluster, tmp_path) -> None:
    group = RayWorkerGroup(
        two_node_cluster,
        RayWorkerBuilder(WORKER, tag="tidy", marker_dir=str(tmp_path)),
        name_prefix="tidy",
    )
    workers = group.workers
    assert group.shutdown(cleanup_method="cleanup") is True
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cleaned-0", "cleaned-1"]
    for worker in workers:
        wait_until_dead(worker)


def test_shutdown_with_a_hanging_cleanup(two_node_cluster, tmp_path) -> None:
    group = RayWorkerGroup(
        two_node_cluster,
        RayWorkerBuilder(WORKER, tag="hang-on-odd", marker_dir=str(tmp_path)),
        name_prefix="stuck",
    )
    workers = group.workers
    assert group.shutdown(cleanup_method="cleanup", timeout=2) is False
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cleaned-0", "cleaned-1"]
    for worker in workers:
        wait_until_dead(worker)
