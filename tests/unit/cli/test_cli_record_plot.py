"""Memory after the fact: ``--record`` writes a bounded file, ``raylens plot`` draws it or a post-mortem.

The run recorded here is ten simulated minutes of a two-node cluster at a 2 s
interval: ``policy`` leaking on one node, ``rollout`` flat on the other, a training
loop's phases, and one OOM kill. The pictures are read back from matplotlib's figure
(its lines, shaded spans and markers), not only checked to exist.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from raylens.cli import main
from raylens.cli.plot import INSTALL_HINT, build_figure, load_run
from raylens.telemetry.growth import MemoryHistory, recent_history
from raylens.telemetry.memory_record import (
    RECORD_VERSION,
    Frame,
    MemoryRecorder,
    NodeFrame,
    read_record,
)
from raylens.telemetry.oom import Killer, Victim, build_postmortem

# Loaded at collection: a first load may list the system's fonts (fc-list) once, which is
# matplotlib finding its fonts, not the code under test starting a process.
pytest.importorskip("matplotlib.font_manager")

GIB = 1024.0**3
T0 = 1_800_000_000.0
KILL_AT = T0 + 500.0
PHASES = [("generation", 0.0, 40.0), ("training", 40.0, 55.0), ("weight refit", 55.0, 60.0)]


def _phase_at(offset: float) -> tuple[str, float] | None:
    minute = offset // 60 * 60
    for name, start, end in PHASES:
        if start <= offset - minute < end:
            return name, T0 + minute + start
    return None


def _frames(minutes: float = 10.0) -> list[Frame]:
    frames = []
    for step in range(int(minutes * 60 / 2)):
        offset = step * 2.0
        policy = 4 * GIB + offset * 10 * 1024 * 1024  # 10 MiB/s leak
        rollout = 2 * GIB
        current = _phase_at(offset)
        kill = {
            "node_id": "aa" * 28,
            "host": "gpu-1",
            "killer": "ray",
            "unix_time": KILL_AT,
            "worker_group": "policy",
        }
        frames.append(
            Frame(
                time=T0 + offset,
                nodes=(
                    NodeFrame(
                        "aa" * 28, "gpu-1", policy + 1e9, 64 * GIB, 60 * GIB, {"policy": policy}
                    ),
                    NodeFrame(
                        "bb" * 28, "gpu-2", rollout + 1e9, 64 * GIB, 60 * GIB, {"rollout": rollout}
                    ),
                ),
                phases=() if current is None else (("01000000", current[0], current[1]),),
                kills=(kill,) if T0 + offset >= KILL_AT else (),
            )
        )
    return frames


def _record(path: Path, **options: Any) -> MemoryRecorder:
    recorder = MemoryRecorder(path, **options)
    for frame in _frames():
        recorder.append(frame)
    return recorder


def _artists(figure: Any, prefix: str) -> list[Any]:
    found = []
    for axes in figure.axes:
        for artist in [*axes.lines, *axes.patches]:
            gid = artist.get_gid()
            if gid and gid.startswith(prefix):
                found.append((axes, artist))
    return found


# ----------------------------------------------------------------------------- the record


def test_a_record_holds_every_cycle_once_privately_and_reads_back_as_tracks(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    _record(path)

    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    lines = path.read_text().splitlines()
    assert len(lines) == 300 and all(json.loads(line)["v"] == RECORD_VERSION for line in lines)
    assert sum(len(json.loads(line)["kills"]) for line in lines) == 1  # written once
    assert len(lines[0]) < 600  # compact: whole bytes, short keys

    run = read_record(path)
    assert sorted(run.nodes) == ["aa" * 28, "bb" * 28]
    policy_times, policy = run.nodes["aa" * 28].groups["policy"]
    assert len(policy_times) == 300 and policy[-1] - policy[0] == pytest.approx(598 * 10 * 2**20)
    assert run.nodes["aa" * 28].limit == 60 * GIB
    # Ten minutes of a three-phase minute: 30 spans, each between its start and the first
    # frame that no longer shows it.
    assert len(run.phases) == 30
    first = run.phases[0]
    assert (first.name, first.start, first.end) == ("generation", T0, T0 + 40.0)
    assert [(k.node_id, k.time, k.group) for k in run.kills] == [("aa" * 28, KILL_AT, "policy")]


def test_a_full_record_moves_to_dot_1_and_both_are_read(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    _record(path, max_bytes=20_000)

    assert os.path.getsize(path) <= 20_000 and os.path.getsize(f"{path}.1") <= 20_000
    run = read_record(path)
    times = run.nodes["aa" * 28].times
    assert times == sorted(times) and times[-1] == T0 + 598.0
    assert len(times) * 2 * 220 > 20_000  # more than one file's worth came back


def test_a_bad_line_costs_only_itself(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    recorder = MemoryRecorder(path)
    recorder.append(_frames(0.1)[0])
    with open(path, "a") as handle:
        handle.write(
            '{"v": 1, "t": 1, "nodes": [{"id": 5}, "x"]}\n{"v": 99, "t": 2}\nnot json\n{"v":1,"t"'
        )
    recorder.append(_frames(0.1)[1])

    run = read_record(path)
    assert len(run.nodes["aa" * 28].times) == 2 and run.skipped == 3


def test_a_record_path_that_cannot_be_written_is_refused_before_the_watch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    where = tmp_path / "missing" / "run.jsonl"
    assert main(["simulate", "--nodes", "1", "--once", "--record", str(where)]) == 2
    error = capsys.readouterr().err
    assert "--record" in error and "missing" in error and error.count("\n") == 1


# ----------------------------------------------------------------------------- the plot


def test_the_plot_of_a_record_has_one_curve_per_group_and_the_phases_shaded(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    _record(path)
    figure = build_figure(load_run(str(path)))

    assert len(figure.axes) == 2  # one panel per node
    curves = _artists(figure, "group:")
    assert sorted((a.get_title(loc="left")[:9], line.get_gid()) for a, line in curves) == [
        ("node aaaa", "group:policy"),
        ("node bbbb", "group:rollout"),
    ]
    ((_, policy),) = [c for c in curves if c[1].get_gid() == "group:policy"]
    xs, ys = policy.get_data()
    assert xs[0] == 0.0 and xs[-1] == 598.0
    assert ys[-1] - ys[0] == pytest.approx(598 * 10 / 1024, rel=1e-6)  # GiB
    spans = _artists(figure, "phase:")
    assert len(spans) == 2 * 30
    assert {artist.get_gid() for _, artist in spans} == {
        "phase:generation",
        "phase:training",
        "phase:weight refit",
    }
    kills = _artists(figure, "kill")
    assert [
        (a.get_title(loc="left")[:9], k.get_gid()) for a, k in kills if k.get_gid() == "kill"
    ] == [("node aaaa", "kill")]
    assert len([k for _, k in kills if k.get_gid() == "kill-line"]) == 2


def test_raylens_plot_writes_a_png_and_says_what_it_drew(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "run.jsonl"
    _record(path)
    out = tmp_path / "run.png"

    assert main(["plot", str(path), "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert capsys.readouterr().out.strip() == (
        f"wrote {out}: 2 node(s), 2 group(s), 30 phase(s), 1 kill(s)"
    )


def test_a_post_mortem_plots_its_groups_its_kill_line_and_its_phase(tmp_path: Path) -> None:
    history = MemoryHistory()
    node = "cc" * 28
    for step in range(300):
        t = T0 + step
        history.record_node(
            node, t, 50 * GIB + step * 2**25, {"policy": 40 * GIB + step * 2**25, "ref": 5 * GIB}
        )
    document = build_postmortem(
        node_id=node,
        host="gpu-9",
        killer=Killer.RAY,
        wall_time=T0 + 299.5,
        victims=[Victim("policy", 3, 1234)],
        phase="training",
        limit_bytes=60 * GIB,
        used_bytes=59 * GIB,
        total_bytes=64 * GIB,
        history=recent_history(history, node, T0 + 299.5),
    )
    path = tmp_path / "oom.json"
    path.write_text(json.dumps(document))

    figure = build_figure(load_run(str(path)))
    (axes,) = figure.axes
    assert sorted(line.get_gid() for _, line in _artists(figure, "group:")) == [
        "group:policy",
        "group:ref",
    ]
    ((_, span),) = _artists(figure, "phase:")
    assert span.get_gid() == "phase:training"
    kill_x = [
        line.get_xdata()[0] for _, line in _artists(figure, "kill") if line.get_gid() == "kill"
    ]
    ((_, policy),) = [c for c in _artists(figure, "group:policy")]
    assert kill_x == [pytest.approx(policy.get_xdata()[-1] + 0.5)]
    assert any("phase training at the kill" in text.get_text() for text in axes.texts)
    assert main(["plot", str(path), "-o", str(tmp_path / "oom.png")]) == 0


def test_text_from_the_file_is_not_read_as_math_or_markup(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    frame = _frames(0.1)[0]
    hostile = NodeFrame("dd" * 28, "h$\\frac{1}{0}$\x1b[2J", 1.0, 2.0, None, {"$x^2$": 1.0})
    MemoryRecorder(path).append(Frame(frame.time, (hostile,)))

    figure = build_figure(load_run(str(path)))
    figure.canvas.draw()  # a mathtext parse of "$\frac{1}{0}$" would render, not fail; look at text
    ((axes, line),) = _artists(figure, "group:")
    assert line.get_label() == r"\$x^2\$" and "\x1b" not in axes.get_title(loc="left")


def test_a_file_with_nothing_to_draw_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("hello\n")
    assert main(["plot", str(empty)]) == 2
    assert "holds no memory to draw" in capsys.readouterr().err
    assert main(["plot", str(tmp_path / "nope.jsonl")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_without_matplotlib_the_command_says_how_to_install_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    path = tmp_path / "run.jsonl"
    _record(path)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    assert main(["plot", str(path)]) == 2
    assert capsys.readouterr().err.strip() == f"raylens: error: {INSTALL_HINT}"


def test_simulate_records_its_nodes_groups_and_phase_and_the_record_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "sim.jsonl"
    assert main(["simulate", "--nodes", "2", "--once", "--record", str(path)]) == 0
    run = read_record(path)
    assert len(run.nodes) == 2
    assert [span.name for span in run.phases] == ["generation"]
    figure = build_figure(run)
    assert len(_artists(figure, "phase:")) == 2


def test_a_recorded_simulated_run_plots_one_curve_per_group_with_its_phases_shaded(
    tmp_path: Path, make_monitor: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ten simulated minutes of a three-node cluster, recorded by the watch loop, then drawn."""
    import argparse
    import threading

    from raylens.cli.cluster_views import watch_nodes
    from raylens.cli.output import Output
    from raylens.simulation.phase_script import PhaseScript
    from raylens.simulation.simulated_cluster import SimulatedCluster
    from raylens.telemetry import host_memory

    now = [1000.0]

    class ClockedStop(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            assert timeout is not None
            now[0] += timeout
            return self.is_set()

    def memory(node: int, t: float) -> tuple[float, float]:
        return 8 * GIB + 2**20 * t * (node == 0), 64 * GIB

    def groups(node: int, t: float) -> dict[str, float]:
        return {"policy" if node < 2 else "rollout": 4 * GIB + 2**20 * t * (node == 0)}

    phases = PhaseScript([("generation", 0, 40), ("training", 40, 60)], repeat_s=60)
    path = tmp_path / "sim.jsonl"
    with SimulatedCluster(
        3, clock=lambda: now[0], schedule=memory, groups=groups, phases=phases
    ) as sim:
        host_memory.register_worker_group_nodes("policy", sim.node_ids[:2])
        host_memory.register_worker_group_nodes("rollout", sim.node_ids[2:])
        monitor = make_monitor(sim.cluster, clock=lambda: now[0], interval=5.0)
        args = argparse.Namespace(interval=5.0, duration=600.0, once=False, record=str(path))
        watch_nodes(
            monitor,
            args,
            output=Output(as_json=True),
            title="sim",
            stop=ClockedStop(),
            cluster=sim.cluster,
            before_sample=sim.publish_phase,
            clock=lambda: now[0],
            wall=lambda: T0 + now[0],
        )
    capsys.readouterr()

    run = read_record(path)
    assert len(run.nodes) == 3 and len(next(iter(run.nodes.values())).times) == 121
    figure = build_figure(run)
    curves = sorted(line.get_gid() for _, line in _artists(figure, "group:"))
    assert curves == ["group:policy", "group:policy", "group:rollout"]  # one per group per node
    colours = {line.get_gid(): set() for _, line in _artists(figure, "group:")}
    for _, line in _artists(figure, "group:"):
        colours[line.get_gid()].add(line.get_color())
    assert len(colours["group:policy"]) == 1 and colours["group:policy"] != colours["group:rollout"]
    spans = {(a.get_title(loc="left"), s.get_gid()) for a, s in _artists(figure, "phase:")}
    assert {gid for _, gid in spans} == {"phase:generation", "phase:training"}
    # Per panel: ten minutes of two phases, and the generation begun at the last frame.
    assert len(_artists(figure, "phase:")) == 3 * 21
    generation = next(span for span in run.phases if span.name == "generation")  # sorted
    assert (generation.start, generation.end) == (T0 + 1000.0, T0 + 1040.0)
