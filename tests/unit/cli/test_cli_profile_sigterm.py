"""SIGTERM to `raylens profile` stops the profiled command too, instead of orphaning it."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import psutil
import pytest

# Every test here runs a real command under raylens: the slow tier.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not sys.platform.startswith("linux"), reason="process trees need Linux /proc"
    ),
]


def _wait_for_child(pid: int, timeout: float = 30.0) -> psutil.Process:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        children = psutil.Process(pid).children()
        if children:
            return children[0]
        time.sleep(0.05)
    raise AssertionError(f"raylens (pid {pid}) never started the command")


def test_sigterm_stops_the_command_and_exits_143() -> None:
    raylens = subprocess.Popen(
        [sys.executable, "-m", "raylens", "profile", "--json", "--", "sleep", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        command = _wait_for_child(raylens.pid)
        raylens.send_signal(signal.SIGTERM)
        _, err = raylens.communicate(timeout=30)
        assert raylens.returncode == 143, err
        assert "Traceback" not in err
        command.wait(timeout=10)
        assert not command.is_running()
    finally:
        if raylens.poll() is None:
            raylens.kill()
            raylens.wait()
