"""Phase figures on a node (kernel and sampled peaks), the phase table, its gauges and its log."""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from raylens.telemetry.group_memory import GroupMemory, NodeGroupMemory
from raylens.telemetry.phases.log import PhaseLog
from raylens.telemetry.phases.memory import (
    KERNEL_SOURCE,
    MAX_PHASE_NAME_CHARS,
    PHASE_DELTA_METRIC,
    PHASE_PEAK_METRIC,
    SAMPLED_SOURCE,
    GroupPhaseMemory,
    NodePhaseMemory,
    NodePhaseTracker,
    PhaseMemoryTable,
    PhaseRecord,
    check_phase_name,
    kernel_peaks_from_env,
    phase_log_from_env,
    phase_log_line,
    register_phase_gauges,
)
from raylens_fakes import MetricsProbe
from raylens_fakes.procfs import PAGE_SIZE, FakeProcFS

MB = 256 * PAGE_SIZE  # 1 MiB with 4 KiB pages


@pytest.fixture
def proc(tmp_path: Path) -> FakeProcFS:
    return FakeProcFS(tmp_path / "proc")


def _worker(proc: FakeProcFS, group: str, pid: int, rss: int, **kw) -> tuple[str, int, int]:
    proc.add_process(pid, rss_bytes=rss, **kw)
    return (group, pid, proc.start_ticks(pid))


def _reading(**groups: int) -> NodeGroupMemory:
    return NodeGroupMemory(
        "host", tuple(GroupMemory(g, rss, None, None, 1, 1) for g, rss in sorted(groups.items()))
    )


def _by_group(node: NodePhaseMemory) -> dict[str, GroupPhaseMemory]:
    return {g.group: g for g in node.groups}


def test_a_spike_between_samples_is_the_kernel_peak_and_not_the_sampled_one(proc):
    # The worker held 500 MB before the phase: its old mark must not count.
    workers = [
        _worker(proc, "policy", 100, 100 * MB, hwm_bytes=500 * MB),
        _worker(proc, "rollout", 200, 40 * MB),
    ]
    tracker = NodePhaseTracker(proc.procfs, host_name="h")
    tracker.begin("t1", workers)
    assert proc.peak_resets(100) == 1 and proc.hwm_bytes(100) == 100 * MB
    tracker.observe(_reading(policy=110 * MB, rollout=40 * MB))
    # 300 MB allocated and freed between two samples: only the kernel's mark sees it.
    proc.set_memory(100, rss_bytes=105 * MB, hwm_bytes=410 * MB)
    tracker.observe(_reading(policy=105 * MB, rollout=40 * MB))

    figures = _by_group(tracker.end("t1"))

    assert figures["policy"] == GroupPhaseMemory("policy", 100 * MB, 105 * MB, 410 * MB, "kernel")
    assert figures["rollout"] == GroupPhaseMemory("rollout", 40 * MB, 40 * MB, 40 * MB, "kernel")
    assert figures["policy"].delta_bytes == 5 * MB
    assert tracker.active is None


def test_kernel_peaks_off_leaves_the_marks_alone_and_takes_the_largest_sample(proc):
    workers = [_worker(proc, "policy", 100, 100 * MB)]
    tracker = NodePhaseTracker(proc.procfs)
    tracker.begin("t", workers, kernel_peaks=False)
    tracker.observe(_reading(policy=180 * MB))
    proc.set_memory(100, rss_bytes=120 * MB, hwm_bytes=400 * MB)

    figures = _by_group(tracker.end("t"))["policy"]

    assert proc.peak_resets(100) == 0
    assert (figures.peak_bytes, figures.source) == (180 * MB, SAMPLED_SOURCE)


def test_a_refused_reset_falls_back_to_the_sampled_peak_for_that_group_only(proc):
    workers = [_worker(proc, "policy", 100, 100 * MB), _worker(proc, "rollout", 200, 10 * MB)]
    proc.deny(100, "clear_refs")
    tracker = NodePhaseTracker(proc.procfs)
    tracker.begin("t", workers)
    proc.set_memory(100, rss_bytes=100 * MB, hwm_bytes=300 * MB)
    proc.set_memory(200, rss_bytes=10 * MB, hwm_bytes=30 * MB)

    figures = _by_group(tracker.end("t"))

    assert (figures["policy"].peak_bytes, figures["policy"].source) == (100 * MB, SAMPLED_SOURCE)
    assert (figures["rollout"].peak_bytes, figures["rollout"].source) == (30 * MB, KERNEL_SOURCE)


def test_a_refused_peak_read_and_a_process_gone_fall_back_to_sampled(proc):
    workers = [_worker(proc, "policy", 100, 10 * MB)]
    proc.add_process(101, parent=100, rss_bytes=20 * MB)
    tracker = NodePhaseTracker(proc.procfs)
    tracker.begin("a", workers)
    tracker.observe(_reading(policy=40 * MB))
    proc.remove_process(101)  # its peak went with it
    assert _by_group(tracker.end("a"))["policy"].source == SAMPLED_SOURCE

    tracker.begin("b", workers)
    proc.deny(100, "status")
    assert _by_group(tracker.end("b"))["policy"].source == SAMPLED_SOURCE


def test_a_group_sums_its_processes_marks_a_child_born_in_the_phase_included(proc):
    workers = [_worker(proc, "policy", 100, 10 * MB)]
    proc.add_process(101, parent=100, rss_bytes=20 * MB)
    tracker = NodePhaseTracker(proc.procfs)
    tracker.begin("t", workers)
    proc.set_memory(101, rss_bytes=20 * MB, hwm_bytes=50 * MB)
    proc.add_process(102, parent=100, rss_bytes=4 * MB, hwm_bytes=8 * MB)

    figures = _by_group(tracker.end("t"))["policy"]

    assert figures.start_bytes == 30 * MB and figures.end_bytes == 34 * MB
    assert (figures.peak_bytes, figures.source) == ((10 + 50 + 8) * MB, KERNEL_SOURCE)


def test_without_tree_walks_only_the_registered_process_counts(proc):
    workers = [_worker(proc, "driver", 100, 10 * MB)]
    proc.add_process(101, parent=100, rss_bytes=500 * MB)  # Ray's own processes, say
    tracker = NodePhaseTracker(proc.procfs, walk_trees=False)
    tracker.begin("t", workers)
    figures = _by_group(tracker.end("t"))["driver"]
    assert (figures.start_bytes, figures.peak_bytes) == (10 * MB, 10 * MB)
    assert proc.peak_resets(101) == 0


def test_end_of_another_phase_or_of_none_gives_nothing(proc):
    tracker = NodePhaseTracker(proc.procfs)
    assert tracker.end("x") is None
    tracker.begin("a", [_worker(proc, "policy", 100, MB)])
    assert tracker.end("b") is None
    assert tracker.active == "a"
    tracker.observe(_reading(other=5 * MB))  # a group the phase does not know: ignored
    assert tracker.end("a") is not None


def test_a_reused_pid_is_not_the_worker(proc):
    group, pid, ticks = _worker(proc, "policy", 100, 10 * MB)
    proc.reuse_pid(100, rss_bytes=80 * MB)
    tracker = NodePhaseTracker(proc.procfs)
    tracker.begin("t", [(group, pid, ticks)])
    assert tracker.end("t").groups == ()
    assert proc.peak_resets(100) == 0


def test_a_malformed_worker_is_refused_by_name(proc):
    with pytest.raises(ValueError, match="pid"):
        NodePhaseTracker(proc.procfs).begin("t", [("policy", -3, None)])


def test_reports_travel_as_builtins_and_malformed_ones_are_refused():
    node = NodePhaseMemory("h", (GroupPhaseMemory("policy", 1, 2, 3, "kernel"),))
    assert NodePhaseMemory.from_plain(node.as_plain()) == node
    for bad in (
        None,
        {"host_name": "h", "groups": "x"},
        {"host_name": 3, "groups": []},
        {"host_name": "h", "groups": [["p", 1, 2, 3, "guessed"]]},
        {"host_name": "h", "groups": [["p", -1, 2, 3, "kernel"]]},
        {"host_name": "h", "groups": [["p", 1, 2, 3]]},
        {"host_name": "h", "groups": [["", 1, 2, 3, "kernel"]]},
        {"host_name": "h", "groups": [["p", 1, True, 3, "kernel"]]},
    ):
        with pytest.raises(ValueError, match="malformed phase report"):
            NodePhaseMemory.from_plain(bad)
    # A peak below the start or the end is raised to them.
    raised = NodePhaseMemory.from_plain({"host_name": "h", "groups": [["p", 5, 9, 1, "kernel"]]})
    assert raised.groups[0].peak_bytes == 9


@pytest.mark.parametrize(
    ("name", "error", "match"),
    [
        (None, TypeError, "must be a str"),
        (3, TypeError, "must be a str"),
        ("", ValueError, "non-empty"),
        ("  ", ValueError, "non-empty"),
        ("x" * (MAX_PHASE_NAME_CHARS + 1), ValueError, "at most 128"),
        ("gen\x1b[2J", ValueError, "control"),
    ],
)
def test_phase_names_are_checked_with_clear_errors(name, error, match):
    with pytest.raises(error, match=match):
        check_phase_name(name)


def test_phase_name_accepts_ordinary_names():
    assert check_phase_name("weight refit/2") == "weight refit/2"


@pytest.mark.parametrize(
    ("value", "expected"),
    [("", True), ("1", True), ("true", True), ("ON", True), ("0", False), ("off", False)],
)
def test_kernel_peaks_setting_reads_the_environment(value, expected):
    assert kernel_peaks_from_env({"RAYLENS_KERNEL_PEAKS": value}) is expected
    assert kernel_peaks_from_env({}) is True


def test_an_unreadable_kernel_peaks_setting_is_refused_by_name():
    with pytest.raises(ValueError, match="RAYLENS_KERNEL_PEAKS must be 1 or 0"):
        kernel_peaks_from_env({"RAYLENS_KERNEL_PEAKS": "maybe"})


def test_phase_log_setting():
    assert phase_log_from_env({}) is None
    assert phase_log_from_env({"RAYLENS_PHASE_LOG": " /tmp/p.jsonl "}) == "/tmp/p.jsonl"


def _record(phase: str = "gen", **nodes: NodePhaseMemory) -> PhaseRecord:
    return PhaseRecord(phase, duration_s=12.5, ended_at=1000.0, nodes=nodes)


NODE_A = NodePhaseMemory(
    "host-a",
    (
        GroupPhaseMemory("policy", 100 * MB, 110 * MB, 400 * MB, "kernel"),
        GroupPhaseMemory("rollout", 50 * MB, 40 * MB, 60 * MB, "sampled"),
    ),
)
NODE_B = NodePhaseMemory(
    "host-b", (GroupPhaseMemory("policy", 100 * MB, 90 * MB, 150 * MB, "kernel"),)
)


def test_the_gauges_carry_phase_group_node_host_and_source(metrics_probe: MetricsProbe):
    table = PhaseMemoryTable()
    register_phase_gauges(table)
    table.record(_record(a=NODE_A, b=NODE_B))

    metrics_probe.collect()
    peaks = metrics_probe.points(PHASE_PEAK_METRIC)
    deltas = metrics_probe.points(PHASE_DELTA_METRIC)

    def key(group: str, node: str, host: str, source: str) -> frozenset:
        return frozenset(
            {
                "rl.phase": "gen",
                "rl.worker_group": group,
                "ray.node.id": node,
                "host.name": host,
                "rl.peak.source": source,
            }.items()
        )

    assert peaks == {
        key("policy", "a", "host-a", "kernel"): 400 * MB,
        key("rollout", "a", "host-a", "sampled"): 60 * MB,
        key("policy", "b", "host-b", "kernel"): 150 * MB,
    }
    assert deltas[key("rollout", "a", "host-a", "sampled")] == -10 * MB
    assert metrics_probe.metric(PHASE_PEAK_METRIC).unit == "By"
    assert metrics_probe.metric(PHASE_DELTA_METRIC).unit == "By"


def test_a_phase_run_replaces_its_last_run(metrics_probe: MetricsProbe):
    table = PhaseMemoryTable()
    register_phase_gauges(table)
    table.record(_record(a=NODE_A))
    table.record(_record(b=NODE_B))
    metrics_probe.collect()
    assert set(metrics_probe.points_by(PHASE_PEAK_METRIC, "ray.node.id")) == {"b"}


def test_names_past_the_bound_evict_the_oldest_with_one_warning(caplog):
    table = PhaseMemoryTable(max_names=3)
    with caplog.at_level(logging.WARNING, logger="raylens.phases"):
        for name in ("a", "b", "c", "a", "d", "e"):
            table.record(_record(name, n=NODE_B))
    assert table.phases() == ["a", "d", "e"]
    warnings = [r for r in caplog.records if "distinct phase names" in r.getMessage()]
    assert len(warnings) == 1 and "'b'" in warnings[0].getMessage()
    with pytest.raises(ValueError, match="max_names"):
        PhaseMemoryTable(max_names=0)


def test_the_log_line_names_each_groups_largest_peak_its_node_and_delta():
    line = phase_log_line(_record(a=NODE_A, b=NODE_B))
    assert line.startswith("phase 'gen' ended after 12.50 s: ")
    assert "policy peak 400.0 MiB (kernel) on node a (host-a), delta +10.0 MiB" in line
    assert "rollout peak 60.0 MiB (sampled) on node a (host-a), delta -10.0 MiB" in line
    missing = PhaseRecord("x", 1.0, 0.0, {}, missing=("c" * 56,))
    assert "no group figures (no figures from node(s) cccccccccccc)" in phase_log_line(missing)


def test_the_json_lines_log_appends_the_whole_table(tmp_path: Path):
    log = PhaseLog(tmp_path / "phases.jsonl")
    log.append(_record(a=NODE_A))
    log.append(_record("train", b=NODE_B))
    lines = [json.loads(line) for line in (tmp_path / "phases.jsonl").read_text().splitlines()]
    assert [line["phase"] for line in lines] == ["gen", "train"]
    assert lines[0]["nodes"][0]["groups"][0] == {
        "group": "policy",
        "start_bytes": 100 * MB,
        "end_bytes": 110 * MB,
        "peak_bytes": 400 * MB,
        "delta_bytes": 10 * MB,
        "source": "kernel",
    }


def test_a_log_that_cannot_be_written_warns_once_and_never_raises(tmp_path: Path, caplog):
    log = PhaseLog(tmp_path / "missing-dir" / "phases.jsonl")
    with caplog.at_level(logging.WARNING, logger="raylens.phases"):
        log.append(_record(a=NODE_A))
        log.append(_record(a=NODE_A))
    assert len([r for r in caplog.records if "could not append" in r.getMessage()]) == 1


def test_the_phase_log_is_created_private_to_its_owner(tmp_path: Path):
    old = os.umask(0o022)
    try:
        log = PhaseLog(tmp_path / "phases.jsonl")
        log.append(_record(a=NODE_A))
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "phases.jsonl").stat().st_mode) == 0o600


def test_the_phase_log_is_opened_once_not_at_every_phase(tmp_path: Path, monkeypatch):
    opened: list[str] = []
    real_open = os.open

    def counting(path: Any, flags: int, mode: int = 0o777, *args: Any, **kwargs: Any) -> int:
        opened.append(os.fspath(path))
        return real_open(path, flags, mode, *args, **kwargs)

    log = PhaseLog(tmp_path / "phases.jsonl")
    monkeypatch.setattr(os, "open", counting)
    for _ in range(5):
        log.append(_record(a=NODE_A))
    assert opened == [str(tmp_path / "phases.jsonl")]
    # Moved away by a log rotator: the next line goes to a new file at the path.
    os.replace(tmp_path / "phases.jsonl", tmp_path / "rotated.jsonl")
    log.append(_record("train", a=NODE_A))
    assert len(opened) == 2
    assert json.loads((tmp_path / "phases.jsonl").read_text())["phase"] == "train"
    log.close()


def test_the_phase_log_is_bounded_and_rotated(tmp_path: Path):
    path = tmp_path / "phases.jsonl"
    line = len(json.dumps(_record(a=NODE_A).to_json(), separators=(",", ":"))) + 1
    log = PhaseLog(path, max_bytes=3 * line)
    for _ in range(10):
        log.append(_record(a=NODE_A))
    assert path.stat().st_size <= 3 * line
    assert (tmp_path / "phases.jsonl.1").stat().st_size <= 3 * line
    assert len(path.read_text().splitlines()) == 1  # 10 lines: 3 + 3 + 3 moved on, 1 kept
    log.close()
