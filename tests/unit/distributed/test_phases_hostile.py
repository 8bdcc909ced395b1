"""Phases under Ctrl-C, in workers and forked children, held by suspended generators.

Every marker here runs on fakes: a FakeCluster for the board, a FakeProcFS for the
driver's own process, simulated clocks; no Ray is started.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raylens.distributed import phases as phases_module
from raylens.distributed.phases import PhaseError, PhaseMarker, PhaseRole
from raylens.lens import reset_warn_once
from raylens.telemetry.phases.board import read_current_phases
from raylens.telemetry.phases.memory import NodePhaseMemory, PhaseMemoryTable, check_phase_name
from raylens_fakes import FakeCluster
from raylens_fakes.procfs import PAGE_SIZE, FakeProcFS

MB = 256 * PAGE_SIZE


class InterruptingNodes:
    """Nodes whose confirmation wait is interrupted (Ctrl-C) or fails at ``begin``."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error
        self.begun: list[str] = []
        self.ended: list[str] = []

    def begin(self, token: str, kernel_peaks: bool, timeout_s: float) -> tuple[set[str], list[str]]:
        self.begun.append(token)
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        return set(), []

    def end(self, token: str, timeout_s: float) -> tuple[dict[str, NodePhaseMemory], list[str]]:
        self.ended.append(token)
        return {}, []


@pytest.fixture
def parts(tmp_path: Path) -> dict[str, Any]:
    proc = FakeProcFS(tmp_path / "driver", self_pid=None)
    proc.add_process(os.getpid(), rss_bytes=50 * MB)
    return {
        "table": PhaseMemoryTable(),
        "procfs": proc.procfs,
        "clock": lambda: 100.0,
        "wall_clock": lambda: 5000.0,
        "environ": {},
        "cluster": FakeCluster(),
        "driver_node_id": lambda: "n" * 56,
    }


def test_ctrl_c_while_nodes_confirm_leaves_no_phase_running_and_nothing_published(parts):
    nodes = InterruptingNodes(KeyboardInterrupt())
    marker = PhaseMarker(nodes=nodes, **parts)
    watcher = parts["cluster"].for_job("ffff")
    with pytest.raises(KeyboardInterrupt), marker.phase("gen"):
        pytest.fail("the body must not run when entering was interrupted")
    assert marker.current_phase() is None
    assert read_current_phases(watcher) == []
    with marker.phase("train"):  # the next phase begins as if nothing happened
        assert marker.current_phase() == "train"
    assert parts["table"].phases() == ["train"]


@pytest.mark.parametrize("stage", ["publish", "tracker", "kernel_peaks"])
def test_ctrl_c_at_any_step_of_entering_leaves_no_phase_running(parts, stage, monkeypatch):
    marker = PhaseMarker(nodes=InterruptingNodes(), **parts)
    method = {"publish": "_publish", "tracker": "_driver_tracker", "kernel_peaks": "_kernel_peaks"}
    calls = {"n": 0}
    original = getattr(marker, method[stage])

    def interrupted(*args: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise KeyboardInterrupt
        return original(*args)

    monkeypatch.setattr(marker, method[stage], interrupted)
    with pytest.raises(KeyboardInterrupt):
        marker.enter("gen")
    assert marker.current_phase() is None
    with marker.phase("gen"):
        pass
    assert parts["table"].phases() == ["gen"]


def test_ctrl_c_while_a_phase_ends_still_ends_it(parts):
    class SlowEnd(InterruptingNodes):
        def end(self, token: str, timeout_s: float) -> Any:
            raise KeyboardInterrupt

    marker = PhaseMarker(nodes=SlowEnd(), **parts)
    watcher = parts["cluster"].for_job("ffff")
    with pytest.raises(KeyboardInterrupt), marker.phase("gen"):
        pass
    assert marker.current_phase() is None
    assert read_current_phases(watcher) == []


def test_a_phase_in_a_ray_worker_never_touches_the_drivers_board_key(parts):
    cluster: FakeCluster = parts["cluster"]
    driver = PhaseMarker(nodes=InterruptingNodes(), **parts)
    worker_nodes = InterruptingNodes()
    worker = PhaseMarker(nodes=worker_nodes, role=lambda: PhaseRole.RAY_WORKER, **parts)
    watcher = cluster.for_job("ffff")
    with driver.phase("train"):
        with worker.phase("rollout"):
            assert worker.current_phase() == "rollout"
            assert [p.phase for p in read_current_phases(watcher)] == ["train"]
        # The worker's phase ended: the driver's entry is still there.
        assert [p.phase for p in read_current_phases(watcher)] == ["train"]
    assert worker_nodes.begun == []  # the samplers are the driver's to tell
    assert "rollout" in parts["table"].phases()  # measured locally all the same


def test_a_forked_child_enters_phases_without_the_parents_cluster_or_samplers(parts, monkeypatch):
    class Untouchable(FakeCluster):
        def kv_put(self, key: str, value: bytes) -> None:
            raise AssertionError("a forked child must not reach the parent's GCS client")

        kv_delete = kv_put  # type: ignore[assignment]

    parts["cluster"] = Untouchable()
    nodes = InterruptingNodes()
    marker = PhaseMarker(nodes=nodes, **parts)
    monkeypatch.setattr(phases_module, "_ray_connected", lambda: True)  # the parent's Ray
    marker.reset_after_fork()  # what the fork hook runs in the child
    assert marker.role() is PhaseRole.FORKED_CHILD
    with marker.phase("child-work"):
        assert marker.current_phase() == "child-work"
    assert nodes.begun == [] and nodes.ended == []
    assert parts["table"].latest("child-work") is not None


def test_a_child_forked_before_ray_connected_owns_its_marker(parts, monkeypatch):
    nodes = InterruptingNodes()
    marker = PhaseMarker(nodes=nodes, **parts)
    monkeypatch.setattr(phases_module, "_ray_connected", lambda: False)
    marker.reset_after_fork()
    assert marker.role() is PhaseRole.DRIVER
    with marker.phase("own-job"):
        pass
    assert len(nodes.begun) == 1


def test_a_process_other_than_the_one_that_made_the_marker_is_local_only(parts, monkeypatch):
    parts["cluster"] = FakeCluster()
    nodes = InterruptingNodes()
    marker = PhaseMarker(nodes=nodes, **parts)
    monkeypatch.setattr(os, "getpid", lambda: -12345)  # as if this were a child
    assert marker.role() is PhaseRole.FORKED_CHILD
    with marker.phase("gen"):
        pass
    assert nodes.begun == []


def test_a_phase_held_by_a_suspended_generator_does_not_keep_the_marker_busy(parts, caplog):
    reset_warn_once("phases.suspended")
    marker = PhaseMarker(nodes=InterruptingNodes(), **parts)

    def batches() -> Iterator[int]:
        with marker.phase("load"):
            yield 1
            yield 2

    held = batches()
    assert next(held) == 1  # suspended inside "load", never resumed
    assert marker.current_phase() == "load"
    with caplog.at_level(logging.WARNING, logger="raylens.phases"), marker.phase("train"):
        assert marker.current_phase() == "train"
    assert set(parts["table"].phases()) == {"load", "train"}
    held.close()  # its exit now ends nothing: "load" was already ended
    assert marker.current_phase() is None
    assert any("suspended" in r.getMessage() for r in caplog.records)


def test_a_phase_running_in_another_live_frame_still_refuses_nesting(parts):
    marker = PhaseMarker(nodes=InterruptingNodes(), **parts)
    with marker.phase("outer"):

        def inner() -> None:
            with marker.phase("inner"):
                pass

        with pytest.raises(PhaseError):
            inner()
        assert marker.current_phase() == "outer"


def test_an_old_phase_exit_does_not_end_a_newer_phase_of_the_same_name(parts):
    marker = PhaseMarker(nodes=InterruptingNodes(), **parts)

    def batches() -> Iterator[int]:
        with marker.phase("load"):
            yield 1

    held = batches()
    next(held)
    with marker.phase("load"):  # ends the suspended one, begins a new "load"
        held.close()
        assert marker.current_phase() == "load"


@pytest.mark.parametrize("name", ["\u3164", "\u115f", "\u2800", "\u034f", "gen\u3164", "gen\u2003"])
def test_invisible_phase_names_are_refused(name):
    with pytest.raises(ValueError, match="invisible"):
        check_phase_name(name)


@pytest.mark.parametrize("name", ["gen", "génération", "生成", "step 1", "rl/train"])
def test_visible_phase_names_are_kept(name):
    assert check_phase_name(name) == name
