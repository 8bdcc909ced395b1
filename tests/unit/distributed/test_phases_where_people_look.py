"""A phase's figures where people look: the cluster's board for ``watch``, stderr for a bare driver."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from raylens.distributed.phases import PhaseMarker
from raylens.telemetry.phases import log as phase_log
from raylens.telemetry.phases.board import (
    ENDED_PHASE_KEY_PREFIX,
    MAX_ENDED_GROUPS,
    MAX_ENDED_PHASE_BYTES,
    EndedGroup,
    publish_ended_phase,
    read_ended_phases,
)
from raylens.telemetry.phases.memory import (
    GroupPhaseMemory,
    NodePhaseMemory,
    PhaseMemoryTable,
    PhaseRecord,
)
from raylens_fakes import FakeCluster
from raylens_fakes.procfs import PAGE_SIZE, FakeProcFS

MB = 256 * PAGE_SIZE
NODE_A, NODE_B = "a" * 56, "b" * 56


def _record(groups_a: list[tuple[str, int, int, int]], groups_b: list[Any] = ()) -> PhaseRecord:
    def node(rows: Any) -> NodePhaseMemory:
        return NodePhaseMemory(
            "h", tuple(GroupPhaseMemory(g, s, e, p, "kernel") for g, s, e, p in rows)
        )

    return PhaseRecord(
        "train",
        duration_s=12.5,
        ended_at=5000.0,
        nodes={NODE_A: node(groups_a), NODE_B: node(groups_b)},
    )


def test_the_ended_phase_reaches_another_process_with_each_groups_largest_peak() -> None:
    cluster = FakeCluster()
    record = _record(
        [("policy", 100 * MB, 110 * MB, 400 * MB), ("rollout", 40 * MB, 40 * MB, 40 * MB)],
        [("rollout", 30 * MB, 90 * MB, 95 * MB)],
    )
    assert publish_ended_phase(cluster.for_job("01"), record)

    (ended,) = read_ended_phases(cluster.for_job("02"))
    assert (ended.job_id, ended.phase, ended.ended_at, ended.duration_s) == (
        "01",
        "train",
        5000.0,
        12.5,
    )
    assert ended.groups == (
        EndedGroup("policy", NODE_A, 400 * MB, 10 * MB, "kernel"),
        EndedGroup("rollout", NODE_B, 95 * MB, 60 * MB, "kernel"),
    )
    cluster.end_job("01")
    assert read_ended_phases(cluster.for_job("02")) == []
    assert cluster.for_job("02").kv_keys(ENDED_PHASE_KEY_PREFIX) == []


def test_many_or_long_named_groups_keep_the_entry_bounded_with_the_largest_peaks() -> None:
    cluster = FakeCluster()
    rows = [("é" * 128 + str(i), 0, 0, i * MB) for i in range(200)]
    publish_ended_phase(cluster.for_job("01"), _record(rows))

    raw = cluster.for_job("02").kv_get(f"{ENDED_PHASE_KEY_PREFIX}01")
    assert raw is not None and len(raw) <= MAX_ENDED_PHASE_BYTES
    (ended,) = read_ended_phases(cluster.for_job("02"))
    assert 0 < len(ended.groups) <= MAX_ENDED_GROUPS
    assert min(g.peak_bytes for g in ended.groups) >= (200 - MAX_ENDED_GROUPS) * MB


def test_hostile_ended_entries_cost_only_themselves(caplog: pytest.LogCaptureFixture) -> None:
    cluster = FakeCluster()
    publish_ended_phase(cluster.for_job("0a"), _record([("policy", 0, 1, 2)]))
    good_row = ["g", NODE_A, 5, -1, "kernel"]
    hostile = {
        "0b": b"x" * (MAX_ENDED_PHASE_BYTES + 1),
        "0c": json.dumps(
            {"phase": "\x1b[2J", "ended_at": 1, "duration_s": 1, "groups": []}
        ).encode(),
        "0d": json.dumps(
            {"phase": "t", "ended_at": "soon", "duration_s": 1, "groups": []}
        ).encode(),
        "0e": json.dumps(
            {"phase": "t", "ended_at": 1, "duration_s": 1, "groups": [good_row] * 99}
        ).encode(),
    }
    for job, raw in hostile.items():
        cluster.for_job(job).kv_put(f"{ENDED_PHASE_KEY_PREFIX}{job}", raw)
    bad_rows = [
        good_row,
        ["g", NODE_A, True, 0, "kernel"],
        ["g", NODE_A, -5, 0, "k"],
        "x",
        ["", "n", 1, 1, "k"],
    ]
    cluster.for_job("0f").kv_put(
        f"{ENDED_PHASE_KEY_PREFIX}0f",
        json.dumps({"phase": "t", "ended_at": 1, "duration_s": 1, "groups": bad_rows}).encode(),
    )
    with caplog.at_level(logging.WARNING, logger="raylens.phases"):
        ended = read_ended_phases(cluster.for_job("99"))
    assert [(e.job_id, len(e.groups)) for e in ended] == [("0a", 1), ("0f", 1)]
    ignored = [r.getMessage() for r in caplog.records if "ignored the phase" in r.getMessage()]
    assert len(ignored) == len(hostile) and not any("\x1b" in m for m in ignored)


def _marker(tmp_path: Path, cluster: FakeCluster) -> PhaseMarker:
    proc = FakeProcFS(tmp_path / "driver", self_pid=None)
    proc.add_process(os.getpid(), rss_bytes=50 * MB)
    return PhaseMarker(
        nodes=None,
        cluster=cluster,
        table=PhaseMemoryTable(),
        procfs=proc.procfs,
        clock=lambda: 1.0,
        wall_clock=lambda: 5000.0,
        environ={},
        driver_node_id=lambda: NODE_A,
    )


def test_the_driver_publishes_each_phase_it_ends(tmp_path: Path) -> None:
    cluster = FakeCluster()
    marker = _marker(tmp_path, cluster)
    with marker.phase("gen"):
        pass
    (ended,) = read_ended_phases(cluster.for_job("ffff"))
    assert ended.phase == "gen" and [g.group for g in ended.groups] == ["driver"]


def test_a_driver_without_logging_sees_the_summary_on_stderr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A logger outside the hierarchy has no handler above it: a driver that set up nothing.
    monkeypatch.setattr(phase_log, "logger", logging.Logger("raylens.phases.bare"))
    with _marker(tmp_path, FakeCluster()).phase("gen"):
        pass
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("raylens: phase 'gen' ended after") and "driver peak 50.0 MiB" in line


def test_a_driver_with_logging_gets_the_summary_there_and_not_on_stderr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A logger with a handler of the driver's own, and nothing else above it.
    configured = logging.Logger("raylens.phases.configured")
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    configured.addHandler(handler)
    monkeypatch.setattr(phase_log, "logger", configured)
    with _marker(tmp_path, FakeCluster()).phase("gen"):
        pass
    assert len(seen) == 1 and seen[0].startswith("phase 'gen' ended")
    assert capsys.readouterr().err == ""
