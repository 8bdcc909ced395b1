"""``raylens.phase``: nodes told at the start, figures at the end, the driver group, the settings.

Every node's sampler is a real :class:`GroupMemorySamplerActor` over a FakeProcFS, run by
FakeRay in this process; time is simulated.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest

import raylens
from raylens.distributed import phases as phases_module
from raylens.distributed.group_memory_sampler import GroupMemorySamplers
from raylens.distributed.phases import (
    LOCAL_NODE_ID,
    PhaseError,
    PhaseMarker,
    SamplerPhaseNodes,
)
from raylens.telemetry.group_memory import GroupWorkerRegistry
from raylens.telemetry.phases.board import read_current_phases
from raylens.telemetry.phases.memory import PhaseMemoryTable, PhaseRecord
from raylens_fakes import FakeCluster
from raylens_fakes.clock import ManualClock
from raylens_fakes.procfs import PAGE_SIZE, FakeProcFS
from raylens_fakes.ray import FakeRay

MB = 256 * PAGE_SIZE
NODE_A = "a" * 56
NODE_B = "b" * 56


class NullPublisher:
    def set_group(self, *_args: Any) -> None: ...
    def forget_group(self, *_args: Any) -> None: ...
    def set_sampled_at(self, *_args: Any) -> None: ...


@pytest.fixture
def procs(tmp_path: Path) -> dict[str, FakeProcFS]:
    return {node: FakeProcFS(tmp_path / node[:1], self_pid=None) for node in (NODE_A, NODE_B)}


@pytest.fixture
def driver_proc(tmp_path: Path) -> FakeProcFS:
    proc = FakeProcFS(tmp_path / "driver", self_pid=None)
    proc.add_process(os.getpid(), rss_bytes=50 * MB)
    return proc


@pytest.fixture
def fake_ray(procs: dict[str, FakeProcFS]) -> FakeRay:
    fake = FakeRay(list(procs))

    def setup(node: str, _cls: type, kwargs: dict[str, Any]) -> None:
        kwargs.update(procfs=procs[node].procfs, publisher=NullPublisher(), host_name=node[:1])

    fake.actor_setup = setup
    return fake


class Cluster:
    """Two nodes with ``policy`` on A and ``rollout`` on both, their samplers started."""

    def __init__(self, fake_ray: FakeRay, procs: dict[str, FakeProcFS]) -> None:
        self.ray = fake_ray
        self.procs = procs
        self.registry = GroupWorkerRegistry()
        a, b = procs[NODE_A], procs[NODE_B]
        a.add_process(100, rss_bytes=100 * MB)
        a.add_process(200, rss_bytes=40 * MB)
        b.add_process(300, rss_bytes=30 * MB)
        self.registry.register("policy", [(NODE_A, 100, a.start_ticks(100))])
        self.registry.register(
            "rollout", [(NODE_A, 200, a.start_ticks(200)), (NODE_B, 300, b.start_ticks(300))]
        )
        self.samplers = GroupMemorySamplers(ray=fake_ray, sample_interval_s=5.0)
        self.samplers.maintain(self.registry.workers_by_node())
        # FakeRay runs a call only when its result is asked for, and maintain() asks for none.
        for node, workers in self.registry.workers_by_node().items():
            self.sampler(node).set_workers(workers)
        self.nodes = SamplerPhaseNodes(self.samplers, registry=self.registry)

    def sampler(self, node: str) -> Any:
        return next(a.instance for a in self.ray.actors if a.node_id == node)


@pytest.fixture
def cluster(fake_ray: FakeRay, procs: dict[str, FakeProcFS]) -> Cluster:
    return Cluster(fake_ray, procs)


@pytest.fixture
def marker_parts(driver_proc: FakeProcFS) -> dict[str, Any]:
    return {
        "table": PhaseMemoryTable(),
        "procfs": driver_proc.procfs,
        "clock": ManualClock(100.0),
        "wall_clock": lambda: 5000.0,
        "environ": {},
        "cluster": FakeCluster(),
    }


def _marker(nodes: Any = None, **parts: Any) -> PhaseMarker:
    return PhaseMarker(nodes=nodes, driver_node_id=lambda: NODE_A, **parts)


def _figures(record: PhaseRecord) -> dict[tuple[str, str], tuple[int, int, int, str]]:
    return {
        (node[:1], g.group): (g.start_bytes, g.end_bytes, g.peak_bytes, g.source)
        for node, figures in record.nodes.items()
        for g in figures.groups
    }


def test_a_spike_inside_the_phase_is_caught_on_its_node_and_the_rest_stay_flat(
    cluster: Cluster, marker_parts: dict[str, Any], caplog
):
    marker = _marker(cluster.nodes, **marker_parts)
    clock = marker_parts["clock"]
    a = cluster.procs[NODE_A]
    with caplog.at_level(logging.INFO, logger="raylens.phases"), marker.phase("gen"):
        assert marker.current_phase() == "gen"
        # Both samplers began before the body: their marks were reset.
        assert a.peak_resets(100) == 1 and cluster.procs[NODE_B].peak_resets(300) == 1
        cluster.sampler(NODE_A).sample_and_publish_once()
        a.set_memory(100, rss_bytes=110 * MB, hwm_bytes=400 * MB)  # between two samples
        cluster.sampler(NODE_A).sample_and_publish_once()
        clock.now += 12.5
    record = marker_parts["table"].latest("gen")
    assert _figures(record) == {
        ("a", "policy"): (100 * MB, 110 * MB, 400 * MB, "kernel"),
        ("a", "rollout"): (40 * MB, 40 * MB, 40 * MB, "kernel"),
        ("a", "driver"): (50 * MB, 50 * MB, 50 * MB, "kernel"),
        ("b", "rollout"): (30 * MB, 30 * MB, 30 * MB, "kernel"),
    }
    assert record.duration_s == 12.5 and record.missing == ()
    assert marker.current_phase() is None
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("phase 'gen'")]
    assert len(lines) == 1 and "policy peak 400.0 MiB (kernel) on node aaaaaaaaaaaa" in lines[0]


def test_kernel_peaks_off_reports_sampled_peaks_and_resets_nothing(
    cluster: Cluster, marker_parts: dict[str, Any]
):
    marker = _marker(cluster.nodes, kernel_peaks=False, **marker_parts)
    a = cluster.procs[NODE_A]
    with marker.phase("train"):
        a.set_memory(100, rss_bytes=160 * MB)
        cluster.sampler(NODE_A).sample_and_publish_once()
        a.set_memory(100, rss_bytes=120 * MB, hwm_bytes=400 * MB)
    figures = _figures(marker_parts["table"].latest("train"))
    assert figures[("a", "policy")] == (100 * MB, 120 * MB, 160 * MB, "sampled")
    assert a.peak_resets(100) == 0


def test_the_environment_turns_kernel_peaks_off(cluster: Cluster, marker_parts: dict[str, Any]):
    marker_parts["environ"] = {"RAYLENS_KERNEL_PEAKS": "0"}
    marker = _marker(cluster.nodes, **marker_parts)
    with marker.phase("train"):
        pass
    assert {f[3] for f in _figures(marker_parts["table"].latest("train")).values()} == {"sampled"}


def test_a_node_that_does_not_confirm_is_named_in_one_warning_and_the_phase_goes_on(
    cluster: Cluster, marker_parts: dict[str, Any], caplog
):
    b_actor = next(a for a in cluster.ray.actors if a.node_id == NODE_B)
    b_actor.script("phase_begin", "hangs")
    b_actor.script("phase_end", "hangs")
    marker = _marker(cluster.nodes, confirm_timeout_s=0.5, **marker_parts)
    with caplog.at_level(logging.WARNING, logger="raylens.phases"), marker.phase("gen"):
        pass
    warnings = [r.getMessage() for r in caplog.records if "did not confirm" in r.getMessage()]
    assert len(warnings) == 1 and NODE_B in warnings[0] and "0.5 s" in warnings[0]
    record = marker_parts["table"].latest("gen")
    assert set(record.nodes) == {NODE_A} and record.missing == (NODE_B,)
    assert 0.5 in cluster.ray.wait_timeouts


def test_an_exception_in_the_body_propagates_unchanged_and_the_phase_is_recorded(
    cluster: Cluster, marker_parts: dict[str, Any]
):
    marker = _marker(cluster.nodes, **marker_parts)
    error = KeyError("boom")
    with pytest.raises(KeyError) as raised, marker.phase("ckpt"):
        raise error
    assert raised.value is error
    assert marker_parts["table"].latest("ckpt") is not None
    assert marker.current_phase() is None


def test_phases_do_not_nest_and_the_outer_one_survives(marker_parts: dict[str, Any]):
    marker = _marker(**marker_parts)
    with marker.phase("outer"):
        inner = marker.phase("inner")
        with pytest.raises(PhaseError, match="'inner' cannot begin inside phase 'outer'"):
            inner.__enter__()
        assert marker.current_phase() == "outer"
    assert marker_parts["table"].phases() == ["outer"]


def test_a_decorated_function_is_one_phase_per_call(marker_parts: dict[str, Any]):
    marker = _marker(**marker_parts)

    @marker.phase("step")
    def step(x: int) -> int:
        assert marker.current_phase() == "step"
        return x + 1

    assert step(1) == 2 and step(2) == 3
    assert marker_parts["table"].phases() == ["step"]


def test_without_ray_the_driver_group_is_measured_alone(
    marker_parts: dict[str, Any], driver_proc: FakeProcFS
):
    marker = PhaseMarker(
        nodes=SamplerPhaseNodes(lambda: None, registry=GroupWorkerRegistry()),
        driver_node_id=lambda: LOCAL_NODE_ID,
        **marker_parts,
    )
    with marker.phase("gen"):
        driver_proc.set_memory(os.getpid(), rss_bytes=60 * MB, hwm_bytes=90 * MB)
    record = marker_parts["table"].latest("gen")
    assert _figures(record) == {("l", "driver"): (50 * MB, 60 * MB, 90 * MB, "kernel")}
    assert driver_proc.peak_resets(os.getpid()) == 1


def test_the_phase_is_published_while_it_runs_and_withdrawn_after(
    marker_parts: dict[str, Any],
):
    cluster: FakeCluster = marker_parts["cluster"]
    marker = _marker(**marker_parts)
    watcher = cluster.for_job("ffff")
    with marker.phase("gen"):
        assert [(p.phase, p.started_at) for p in read_current_phases(watcher)] == [("gen", 5000.0)]
    assert read_current_phases(watcher) == []


def test_the_json_lines_log_gets_one_line_per_phase(marker_parts: dict[str, Any], tmp_path: Path):
    path = tmp_path / "phases.jsonl"
    marker_parts["environ"] = {"RAYLENS_PHASE_LOG": str(path)}
    marker = _marker(**marker_parts)
    for name in ("gen", "train"):
        with marker.phase(name):
            pass
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["phase"] for line in lines] == ["gen", "train"]
    assert lines[0]["nodes"][0]["groups"][0]["group"] == "driver"
    # The keyword wins over the environment.
    other = tmp_path / "other.jsonl"
    marker.configure(log_path=other)
    with marker.phase("gen"):
        pass
    assert len(other.read_text().splitlines()) == 1


def test_settings_are_checked_with_clear_errors(marker_parts: dict[str, Any]):
    marker = _marker(**marker_parts)
    with pytest.raises(TypeError, match="kernel_peaks must be a bool"):
        marker.configure(kernel_peaks="no")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="confirm_timeout_s"):
        marker.configure(confirm_timeout_s=0)
    with pytest.raises(ValueError, match="non-empty"):
        marker.phase("")


def test_an_unreadable_kernel_peaks_variable_warns_once_and_keeps_them_on(
    marker_parts: dict[str, Any], caplog, driver_proc: FakeProcFS
):
    marker_parts["environ"] = {"RAYLENS_KERNEL_PEAKS": "perhaps"}
    marker = _marker(**marker_parts)
    with caplog.at_level(logging.WARNING, logger="raylens.phases"):
        for _ in range(2):
            with marker.phase("gen"):
                pass
    assert len([r for r in caplog.records if "RAYLENS_KERNEL_PEAKS" in r.getMessage()]) == 1
    assert driver_proc.peak_resets(os.getpid()) == 2


def test_raylens_exports_phase_and_current_phase_lazily(
    monkeypatch: pytest.MonkeyPatch, marker_parts: dict[str, Any]
) -> None:
    marker = _marker(**marker_parts)
    monkeypatch.setattr(phases_module, "DEFAULT_MARKER", marker)
    from raylens import current_phase, phase

    assert raylens.current_phase() is None
    with phase("gen"):
        assert current_phase() == "gen"
    assert marker_parts["table"].phases() == ["gen"]
