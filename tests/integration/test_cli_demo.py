"""`raylens demo` on a real local Ray cluster: the table, the groups, and a clean exit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

pytestmark = pytest.mark.integration

_RAY_DAEMONS = ("raylet", "gcs_server")


def _is_ray_daemon(process: psutil.Process) -> bool:
    try:
        name = process.name()
        cmdline = " ".join(process.cmdline())
    except psutil.Error:
        return False
    return any(daemon in name or f"/{daemon} " in cmdline for daemon in _RAY_DAEMONS)


def _daemons_started_by(pid: int) -> set[int]:
    """Ray daemons among the descendants of ``pid`` (they are re-parented once it exits)."""
    try:
        descendants = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return set()
    return {child.pid for child in descendants if _is_ray_daemon(child)}


def _run_collecting_daemons(process: subprocess.Popen, timeout: float) -> tuple[str, set[int]]:
    """Wait for ``process`` while noting every Ray daemon it starts; returns its output too."""
    seen: set[int] = set()
    seen_output: list[str] = []
    reader = threading.Thread(target=lambda: seen_output.append(process.stdout.read()))
    reader.start()
    deadline = time.monotonic() + timeout
    while process.poll() is None and time.monotonic() < deadline:
        seen |= _daemons_started_by(process.pid)
        time.sleep(0.2)
    if process.poll() is None:
        process.kill()
    process.wait()
    reader.join(30)
    return "".join(seen_output), seen


def _assert_gone(pids: set[int], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    alive = {pid for pid in pids if psutil.pid_exists(pid)}
    while alive and time.monotonic() < deadline:
        time.sleep(0.5)
        alive = {pid for pid in alive if psutil.pid_exists(pid)}
    assert not alive, f"Ray processes left behind: {sorted(alive)}"


def _demo(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "raylens", "demo", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, COLUMNS="160"),
    )


def test_demo_shows_both_groups_and_leaves_nothing_behind() -> None:
    process = _demo("--duration", "20", "--interval", "2")
    output, daemons = _run_collecting_daemons(process, timeout=300)
    assert process.returncode == 0, output
    assert daemons, "the demo never started a Ray daemon"
    table_lines = [line for line in output.splitlines() if line.startswith("│")]
    assert any("policy" in line for line in table_lines), output
    assert any("rollout" in line for line in table_lines), output
    assert "Demo finished" in output
    frames = output.split("raylens demo:")[1:]
    for frame in (frames[0], frames[-1]):  # the first frame already shows each group's memory
        columns = _columns(frame)
        assert sorted(columns["worker groups"]) == ["policy", "policy", "rollout"], frame
        assert all(cell.split()[0] in ("policy", "rollout") for cell in columns["group rss"])
    _assert_gone(daemons)


def _columns(frame: str) -> dict[str, list[str]]:
    """Each column of one frame's table, by its header, as the cells of its rows."""
    lines = frame.splitlines()
    (header,) = [line for line in lines if line.startswith("┃")]
    names = [cell.strip() for cell in header.strip("┃").split("┃")]
    rows = [line.strip("│").split("│") for line in lines if line.startswith("│")]
    return {name: [row[i].strip() for row in rows] for i, name in enumerate(names)}


def test_ctrl_c_during_start_up_leaves_no_ray_process() -> None:
    process = _demo("--duration", "60")
    deadline = time.monotonic() + 120
    daemons: set[int] = set()
    # Interrupt as soon as the cluster's own daemons exist, so Ctrl-C lands mid start-up.
    while time.monotonic() < deadline and not daemons and process.poll() is None:
        daemons = _daemons_started_by(process.pid)
        time.sleep(0.2)
    assert daemons, "the demo never started a Ray daemon"
    process.send_signal(signal.SIGINT)
    output, later = _run_collecting_daemons(process, timeout=120)
    assert process.returncode == 130, output
    assert "Traceback" not in output
    _assert_gone(daemons | later)


@pytest.mark.timeout(300)  # three Ray nodes on a busy machine can take minutes to start
def test_sigterm_once_the_table_shows_exits_143_and_leaves_no_ray_process() -> None:
    process = _demo("--duration", "120", "--interval", "1")
    shown = threading.Event()
    lines: list[str] = []

    def read() -> None:
        for line in process.stdout:
            lines.append(line)
            if "raylens demo:" in line:
                shown.set()

    reader = threading.Thread(target=read, name="raylens-test-demo-output", daemon=True)
    reader.start()
    daemons: set[int] = set()
    deadline = time.monotonic() + 180
    while not shown.is_set() and process.poll() is None and time.monotonic() < deadline:
        daemons |= _daemons_started_by(process.pid)
        shown.wait(0.2)
    try:
        assert shown.is_set(), "".join(lines)
        daemons |= _daemons_started_by(process.pid)
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        reader.join(30)
    output = "".join(lines)
    assert process.returncode == 143, output
    assert "Traceback" not in output and "raylens: terminated" in output, output
    _assert_gone(daemons)
