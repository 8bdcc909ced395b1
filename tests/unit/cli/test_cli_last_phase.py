"""``watch`` shows each live job's last ended phase: its peak and delta per group, in the table and --json."""

from __future__ import annotations

import argparse
import json
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from raylens.cli.cluster_views import watch_nodes
from raylens.cli.output import Output
from raylens.cli.phase_notes import ended_phase_line
from raylens.telemetry import host_memory as hm
from raylens.telemetry.phases.board import EndedGroup, EndedPhase, publish_ended_phase
from raylens.telemetry.phases.memory import GroupPhaseMemory, NodePhaseMemory, PhaseRecord
from raylens.telemetry.scraping import Outcome
from raylens_fakes import FakeCluster

MIB = 1024 * 1024
NODE = "a" * 56
# What every node's scrape answers: 1 GB used of 4 GB.
FIGURES = Outcome({"host_memory_used": 1e9, "host_memory_total": 4e9}, None)


def _watch_once_after_a_phase(
    make_monitor: Callable[..., hm.HostMemoryMonitor], *, as_json: bool, tmp_path: Path
) -> None:
    """One watch of a one-node cluster in which job 0100 published its ended phase."""
    cluster = FakeCluster()
    cluster.add_node(port=8000)
    _published(cluster)
    watcher = cluster.for_job("ffff")
    monitor = make_monitor(watcher, answering=FIGURES)
    args = argparse.Namespace(
        interval=1.0, duration=None, once=True, record=str(tmp_path / "r.jsonl")
    )
    watch_nodes(
        monitor,
        args,
        output=Output(as_json=as_json),
        title="t",
        stop=threading.Event(),
        cluster=watcher,
    )


def _published(cluster: FakeCluster) -> None:
    groups = (
        GroupPhaseMemory("policy", 100 * MIB, 110 * MIB, 400 * MIB, "kernel"),
        GroupPhaseMemory("rollout", 40 * MIB, 30 * MIB, 45 * MIB, "sampled"),
    )
    record = PhaseRecord("train", 12.5, 5000.0, {NODE: NodePhaseMemory("gpu-1", groups)})
    publish_ended_phase(cluster.for_job("0100"), record)


def test_json_carries_the_last_phase_of_each_live_job(
    make_monitor: Callable[..., hm.HostMemoryMonitor],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    _watch_once_after_a_phase(make_monitor, as_json=True, tmp_path=tmp_path)

    (record,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    (last,) = record["last_phases"]
    assert (last["job_id"], last["phase"], last["duration_s"]) == ("0100", "train", 12.5)
    assert [(g["group"], g["peak_bytes"], g["delta_bytes"]) for g in last["groups"]] == [
        ("policy", 400 * MIB, 10 * MIB),
        ("rollout", 45 * MIB, -10 * MIB),
    ]


def test_the_table_says_the_last_phase_under_it(
    make_monitor: Callable[..., hm.HostMemoryMonitor],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    _watch_once_after_a_phase(make_monitor, as_json=False, tmp_path=tmp_path)

    out = " ".join(capsys.readouterr().out.split())  # the table wraps long lines
    assert "last phase 'train' (12.5 s, ended" in out
    assert "policy peak 400.0 MiB (+10.0 MiB) on aaaaaaaa" in out
    assert "rollout peak 45.0 MiB (-10.0 MiB)" in out


def test_the_line_names_the_largest_peaks_first_and_counts_the_rest() -> None:
    groups = tuple(EndedGroup(f"g{i}", NODE, i * MIB, 0, "kernel") for i in range(7))
    line = ended_phase_line(
        EndedPhase("01", "gen\x1b[2J", 60.0, 2.0, groups), now=63.0, several_jobs=True
    )
    assert line.startswith(
        "last phase 'gen\\x1b[2J' of job 01 (2.0 s, ended 3.0s ago): g6 peak 6.0 MiB"
    )
    assert line.endswith("; 3 more group(s)") and "g2 " not in line
    empty = ended_phase_line(EndedPhase("01", "gen", 60.0, 2.0, ()), now=60.0)
    assert empty.endswith(": no group figures")
