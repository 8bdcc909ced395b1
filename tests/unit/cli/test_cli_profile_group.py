"""`raylens profile` stops the command's whole process group, not only the command itself."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from raylens.cli import main
from raylens.cli import profile as cli_profile

# Every test here runs a real command under raylens: the slow tier.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not sys.platform.startswith("linux"), reason="process trees need Linux /proc"
    ),
]

# Two background sleeps, their pids written down, then a wait: what `timeout` users expect
# to be stopped as one.
_TWO_SLEEPS = "sleep 301 & echo $! >> {pids}; sleep 302 & echo $! >> {pids}; wait"


def _pids(path: Path, timeout: float = 30.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while True:
        lines = path.read_text().split() if path.exists() else []
        if len(lines) == 2:
            return [int(line) for line in lines]
        assert time.monotonic() < deadline, "the sleeps never started"
        time.sleep(0.02)


def _assert_gone(pids: list[int], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    left = pids
    while left and time.monotonic() < deadline:
        left = [pid for pid in left if psutil.pid_exists(pid) and not _is_zombie(pid)]
        time.sleep(0.02)
    if left:
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        raise AssertionError(f"left running: {left}")


def _is_zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize(("sig", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_to_raylens_stops_every_process_of_the_command(
    sig: signal.Signals, status: int, tmp_path: Path
) -> None:
    pids_file = tmp_path / "pids"
    raylens = subprocess.Popen(
        [
            *(sys.executable, "-m", "raylens", "profile", "--json", "--interval", "0.2", "--"),
            *("sh", "-c", _TWO_SLEEPS.format(pids=pids_file)),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the signal below reaches raylens alone
    )
    try:
        sleeps = _pids(pids_file)
        raylens.send_signal(sig)
        _, err = raylens.communicate(timeout=60)
    finally:
        if raylens.poll() is None:
            raylens.kill()
            raylens.wait()
    assert raylens.returncode == status, err
    assert "Traceback" not in err, err
    _assert_gone(sleeps)


def test_raylens_failing_stops_every_process_of_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pids_file = tmp_path / "pids"
    seen: list[int] = []

    def crash(self: object) -> list[object]:
        seen.extend(_pids(pids_file))
        raise RuntimeError("raylens broke")

    monkeypatch.setattr(cli_profile.ProcessTable, "rows", crash)
    with pytest.raises(RuntimeError, match="raylens broke"):
        main(["profile", "--interval", "0.1", "--", "sh", "-c", _TWO_SLEEPS.format(pids=pids_file)])
    _assert_gone(seen)


def test_the_command_runs_in_a_process_group_of_its_own(tmp_path: Path) -> None:
    out = tmp_path / "group"
    script = f"ps -o pgid= -p $$ > {out}"
    assert main(["profile", "--json", "--interval", "0.1", "--", "sh", "-c", script]) == 0
    assert int(out.read_text()) != os.getpgrp()
