"""`raylens demo` on a real local Ray cluster: the table, the groups, and a clean exit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

pytestmark = pytest.mark.integration

_RAY_DAEMONS = ("raylet", "gcs_server")


def _ray_daemon_pids() -> set[int]:
    found = set()
    for process in psutil.process_iter(["pid", "name", "cmdline"]):
        name = process.info["name"] or ""
        cmdline = " ".join(process.info["cmdline"] or [])
        if any(daemon in name or f"/{daemon} " in cmdline for daemon in _RAY_DAEMONS):
            found.add(process.info["pid"])
    return found


def _assert_no_new_ray_daemons(before: set[int], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    leftover = _ray_daemon_pids() - before
    while leftover and time.monotonic() < deadline:
        time.sleep(0.5)
        leftover = {pid for pid in leftover if psutil.pid_exists(pid)}
    assert not leftover, f"Ray processes left behind: {sorted(leftover)}"


def _demo(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "raylens", "demo", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, COLUMNS="160"),
    )


def test_demo_shows_both_groups_and_leaves_nothing_behind() -> None:
    before = _ray_daemon_pids()
    process = _demo("--duration", "20", "--interval", "2")
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output
    table_lines = [line for line in output.splitlines() if line.startswith("│")]
    assert any("policy" in line for line in table_lines), output
    assert any("rollout" in line for line in table_lines), output
    assert "Demo finished" in output
    last_table = output.rsplit("raylens demo:", 1)[-1]
    rows = [line for line in last_table.splitlines() if line.startswith("│")]
    assert len(rows) == 3
    assert sorted(line.split("│")[6].strip() for line in rows) == ["policy", "policy", "rollout"]
    _assert_no_new_ray_daemons(before)


def test_ctrl_c_during_start_up_leaves_no_ray_process() -> None:
    before = _ray_daemon_pids()
    process = _demo("--duration", "60")
    deadline = time.monotonic() + 120
    # Wait until the cluster's own daemons exist, so the interrupt lands mid start-up.
    while time.monotonic() < deadline and not (_ray_daemon_pids() - before):
        time.sleep(0.2)
    assert _ray_daemon_pids() - before, "the demo never started a raylet"
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 130, output
    assert "Traceback" not in output
    _assert_no_new_ray_daemons(before)
