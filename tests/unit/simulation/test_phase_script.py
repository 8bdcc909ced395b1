"""Scripted phases and spikes between samples, measured on simulated time end to end."""

from __future__ import annotations

from pathlib import Path

import pytest

from raylens.simulation import SimulatedCluster
from raylens.simulation.memory_script import MIB, Jitter, MemoryScript, Pulse
from raylens.simulation.phase_script import PhaseScript
from raylens.telemetry.group_memory import GroupMemoryReader
from raylens.telemetry.phases.board import read_current_phases
from raylens.telemetry.phases.memory import NodePhaseTracker
from raylens_fakes.procfs import FakeProcFS
from raylens_fakes.scripted_procfs import ScriptedProcesses

GIB = 1024 * MIB


def _script() -> MemoryScript:
    script = MemoryScript(seed=3)
    # 300 MiB allocated, touched and freed within 0.2 s, between the samples at 12 and 13 s.
    script.set_group(0, "policy", Jitter(2 * MIB), Pulse(12.4, 0.2, 300 * MIB), base=GIB)
    script.set_group(0, "rollout", Jitter(2 * MIB), base=2 * GIB)
    return script


def _run(tmp_path: Path, *, kernel_peaks: bool) -> dict[str, tuple[int, int, str]]:
    """Sample every second for 30 s; measure each scripted phase; figures of ``gen``."""
    proc = FakeProcFS(tmp_path / "proc")
    processes = ScriptedProcesses(proc, _script(), 0)
    reader = GroupMemoryReader(proc.procfs, clock=lambda: processes.t)
    tracker = NodePhaseTracker(proc.procfs)
    phases = PhaseScript([("gen", 10.0, 20.0), ("train", 20.0, 25.0)])
    boundaries = list(phases.boundaries(30.0))
    figures = {}
    for second in range(31):
        for t, kind, name in [b for b in boundaries if second - 1 < b[0] <= second]:
            processes.advance(t)
            if kind == "begin":
                tracker.begin(name, processes.workers(), kernel_peaks=kernel_peaks)
            else:
                figures[name] = tracker.end(name)
        processes.advance(float(second))
        tracker.observe(reader.read(processes.workers()))
    return {
        g.group: (g.peak_bytes - g.start_bytes, g.delta_bytes, g.source)
        for g in figures["gen"].groups
    }


def test_the_kernel_peak_sees_a_spike_between_samples(tmp_path: Path):
    gen = _run(tmp_path, kernel_peaks=True)
    rise, _delta, source = gen["policy"]
    assert source == "kernel" and rise >= 280 * MIB
    assert gen["rollout"][2] == "kernel" and gen["rollout"][0] < 30 * MIB


def test_the_sampled_peak_misses_it_and_says_so(tmp_path: Path):
    gen = _run(tmp_path, kernel_peaks=False)
    rise, _delta, source = gen["policy"]
    assert source == "sampled" and rise < 10 * MIB


def test_phase_at_and_boundaries_follow_the_script_and_its_repeats():
    script = PhaseScript([("gen", 0, 20), ("train", 25, 30)], repeat_s=30)
    assert [script.phase_at(t) for t in (0, 19.9, 22, 25, 31, 57)] == [
        "gen",
        "gen",
        None,
        "train",
        "gen",
        "train",
    ]
    assert list(script.boundaries(35)) == [
        (0, "begin", "gen"),
        (20, "end", "gen"),
        (25, "begin", "train"),
        (30, "end", "train"),
        (30, "begin", "gen"),
    ]


@pytest.mark.parametrize(
    ("phases", "repeat", "match"),
    [
        ([("", 0, 1)], None, "non-empty"),
        ([("a", 2, 1)], None, "end after it starts"),
        ([("a", 0, 5), ("b", 4, 6)], None, "do not overlap"),
        ([("a", 0, 5)], 4, "repeat_s"),
        ([("a", 0, float("nan"))], None, "finite"),
    ],
)
def test_a_bad_phase_script_is_refused_by_name(phases, repeat, match):
    with pytest.raises(ValueError, match=match):
        PhaseScript(phases, repeat_s=repeat)


def test_the_simulated_cluster_publishes_its_scripted_phase():
    now = [0.0]
    script = PhaseScript([("gen", 0, 10)])
    with SimulatedCluster(0, clock=lambda: now[0], phases=script) as simulated:
        assert simulated.publish_phase() == "gen"
        watcher = simulated.cluster.for_job("ffff")
        assert [p.phase for p in read_current_phases(watcher)] == ["gen"]
        now[0] = 11.0
        assert simulated.publish_phase() is None
        assert read_current_phases(watcher) == []


def test_a_pulse_is_one_transient_and_its_peak_is_found_between_samples():
    script = MemoryScript()
    script.set_group(0, "g", Pulse(1.5, 0.001, 100.0), base=10.0)
    assert list(script.group_values(0, "g", [1.0, 1.5, 1.502])) == [10.0, 110.0, 10.0]
    assert script.group_peak(0, "g", 1.0, 2.0, resolution=0.5) == 110.0
    with pytest.raises(ValueError, match="duration"):
        Pulse(1.0, 0.0, 5.0)


def test_the_simulated_cluster_publishes_each_ended_phase_with_its_groups_figures():
    from raylens.telemetry.phases.board import read_ended_phases

    now = [0.0]
    script = PhaseScript([("gen", 0, 10), ("train", 10, 20)])

    def groups(node: int, t: float) -> dict[str, float]:
        # policy grows 1 MB/s through gen and falls back at its end; rollout is flat
        return {"policy": 100e6 + (1e6 * t if t < 10 else 0.0)} if node == 0 else {"rollout": 5e6}

    with SimulatedCluster(2, clock=lambda: now[0], phases=script, groups=groups) as simulated:
        watcher = simulated.cluster.for_job("ffff")
        simulated.publish_phase()
        assert read_ended_phases(watcher) == []
        now[0] = 10.0
        assert simulated.publish_phase() == "train"
        (ended,) = read_ended_phases(watcher)
        assert (ended.phase, ended.duration_s) == ("gen", 10.0)
        by_group = {g.group: g for g in ended.groups}
        assert by_group["policy"].node_id == simulated.node_ids[0]
        assert by_group["policy"].peak_bytes == 109_000_000  # the last sample before the fall
        assert by_group["policy"].delta_bytes == 0  # back to where it began
        assert (by_group["rollout"].peak_bytes, by_group["rollout"].delta_bytes) == (5_000_000, 0)
