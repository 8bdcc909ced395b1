"""A node's sampler started before any worker there, so Ray's memory monitor kills it last (FakeRay)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from raylens.distributed.group_memory_sampler import GroupMemorySamplers
from raylens_fakes.procfs import FakeProcFS
from raylens_fakes.ray import FakeActor, FakeRay

MB = 2**20
NODE_A = "a" * 56
NODE_B = "b" * 56


@pytest.fixture
def nodes(tmp_path: Path) -> dict[str, FakeProcFS]:
    return {node: FakeProcFS(tmp_path / node[:1]) for node in (NODE_A, NODE_B)}


@pytest.fixture
def fake_ray(nodes: dict[str, FakeProcFS]) -> Iterator[FakeRay]:
    yield FakeRay.over_procfs(nodes)


def _on(fake_ray: FakeRay, node: str) -> list[FakeActor]:
    return [actor for actor in fake_ray.actors if actor.node_id == node]


def _workers(nodes: dict[str, FakeProcFS]) -> dict[str, list[tuple[str, int, int]]]:
    a = nodes[NODE_A]
    a.add_process(200, rss_bytes=MB)
    return {NODE_A: [("policy", 200, a.start_ticks(200))]}


def test_an_early_sampler_waits_idle_and_serves_its_nodes_first_workers(fake_ray, nodes):
    manager = GroupMemorySamplers(ray=fake_ray, ping_every=100)
    assert manager.start_early([NODE_A, NODE_B]) == [NODE_A, NODE_B]
    assert manager.start_early([NODE_A]) == []  # one per node
    (early_a,) = _on(fake_ray, NODE_A)
    assert early_a.calls == [] and early_a.options["max_restarts"] == 0

    workers = _workers(nodes)
    for _ in range(3):  # workers register on A only: B's sampler is kept, idle
        assert manager.maintain(workers) == {}

    assert _on(fake_ray, NODE_A) == [early_a]  # no second sampler: the early one serves
    assert [name for name, *_ in early_a.calls] == ["set_workers", "start"]
    (early_b,) = _on(fake_ray, NODE_B)
    assert not early_b.killed and early_b.calls == []
    assert manager.nodes == {NODE_A, NODE_B}


def test_a_sampler_killed_anyway_is_started_again_with_one_line_and_no_traceback(
    fake_ray, nodes, caplog: pytest.LogCaptureFixture
):
    manager = GroupMemorySamplers(ray=fake_ray, ping_every=1)
    workers = _workers(nodes)
    manager.maintain(workers)
    (first,) = _on(fake_ray, NODE_A)
    first.dead = True
    with caplog.at_level(logging.DEBUG, logger="raylens"):
        for _ in range(3):
            manager.maintain(workers)
    lines = [r for r in caplog.records if "was killed" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    assert not any(r.exc_info for r in caplog.records)
    assert len(_on(fake_ray, NODE_A)) == 2


def test_a_dead_sampler_asked_for_its_largest_processes_logs_no_traceback(
    fake_ray, nodes, caplog: pytest.LogCaptureFixture
):
    manager = GroupMemorySamplers(ray=fake_ray, ping_every=100)
    manager.maintain(_workers(nodes))
    (sampler,) = _on(fake_ray, NODE_A)
    sampler.dead = True
    with caplog.at_level(logging.WARNING, logger="raylens"):
        assert manager.largest_processes(NODE_A) is None
    (line,) = caplog.records
    assert not line.exc_info and "largest processes" in line.getMessage()


@pytest.mark.parametrize(
    "answer",
    [
        {"processes": [(201, "policy")]},  # a row one field short: ValueError
        {"processes": [None]},  # a row that is not one: TypeError
        {"processes": [("pid", "policy", 1)]},  # a pid that is not a number: ValueError
    ],
)
def test_a_wrong_shaped_largest_processes_answer_is_none_and_warned(
    fake_ray, nodes, caplog: pytest.LogCaptureFixture, answer
):
    manager = GroupMemorySamplers(ray=fake_ray, ping_every=100)
    manager.maintain(_workers(nodes))
    (sampler,) = _on(fake_ray, NODE_A)
    sampler.script("largest_processes", lambda: answer)
    with caplog.at_level(logging.WARNING, logger="raylens"):
        assert manager.largest_processes(NODE_A) is None
    assert any("largest processes" in r.getMessage() for r in caplog.records)
