"""`raylens profile` around the command's life: its exit status, --once, and Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raylens.cli import main
from raylens.cli import profile as cli_profile
from raylens.cli import supervision as cli_supervision

# Every test here runs a real command under raylens: the slow tier.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not sys.platform.startswith("linux"), reason="process trees need Linux /proc"
    ),
]


def _records(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def _wait_for(path: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.02)


def test_a_command_killed_by_a_signal_exits_128_plus_its_number(
    capfd: pytest.CaptureFixture[str],
) -> None:
    status = main(["profile", "--json", "--interval", "0.1", "--", "sh", "-c", "kill -9 $$"])
    assert status == 128 + signal.SIGKILL
    summary = _records(capfd.readouterr().out)[-1]
    assert summary["summary"] is True
    assert summary["exit_status"] == 128 + signal.SIGKILL
    assert summary["signal"] == "SIGKILL"


_ALLOCATES_THEN_WAITS = """
import pathlib, sys, time
ready, release = map(pathlib.Path, sys.argv[1:3])
block = bytearray(40 * 1024 * 1024)
block[::4096] = b"x" * len(block[::4096])
ready.write_text("allocated")
deadline = time.monotonic() + 60
while not release.exists() and time.monotonic() < deadline:
    time.sleep(0.01)
sys.exit(4)
"""


class _Gate:
    """Holds the started command's first wait until the command says it has allocated,
    and lets the command end only on raylens' next wait, once a sample is shown: what
    raylens reads cannot race the command, however busy the machine is."""

    def __init__(self, tmp_path: Path) -> None:
        self.ready, self.release = tmp_path / "ready", tmp_path / "release"
        self.timeouts: list[float | None] = []

    def argv(self, *flags: str) -> list[str]:
        command = (sys.executable, "-c", _ALLOCATES_THEN_WAITS, str(self.ready), str(self.release))
        return ["profile", *flags, "--", *command]

    def wrap(self, child: cli_supervision.CommandGroup) -> object:
        gate = self

        class Gated:
            def wait(self, timeout: float | None = None) -> int:
                if gate.timeouts:
                    gate.release.write_text("go")
                else:
                    _wait_for(gate.ready)
                gate.timeouts.append(timeout)
                return child.wait(timeout=timeout)

            def __getattr__(self, name: str) -> object:
                return getattr(child, name)

        return Gated()


@pytest.fixture
def gate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> _Gate:
    gate = _Gate(tmp_path)
    real_start = cli_profile.start_command
    monkeypatch.setattr(
        cli_profile, "start_command", lambda *a, **k: gate.wrap(real_start(*a, **k))
    )
    return gate


def test_once_samples_the_running_command_after_one_interval(
    gate: _Gate, capfd: pytest.CaptureFixture[str]
) -> None:
    assert main(gate.argv("--once", "--json", "--interval", "0.2")) == 4
    assert gate.timeouts == [0.2, None]  # one interval, then the command's end
    (record,) = _records(capfd.readouterr().out)
    (server,) = record["servers"]
    assert server["processes"] == 1
    assert server["rss_bytes"] >= 40 * 1024 * 1024


def test_the_command_is_shown_on_one_line(capfd: pytest.CaptureFixture[str]) -> None:
    script = "import sys\nsys.exit(0)"
    assert main(["profile", "--json", "--", sys.executable, "-c", script]) == 0
    for record in _records(capfd.readouterr().out):
        assert "\n" not in record["servers"][0]["name"]


_CLEANS_UP_ON_CTRL_C = """
import pathlib, sys, time
ready, done = map(pathlib.Path, sys.argv[1:3])
try:
    ready.write_text("up")
    time.sleep(60)
except KeyboardInterrupt:
    time.sleep(0.3)
    done.write_text("cleaned up")
    sys.exit(3)
"""


def test_ctrl_c_lets_the_command_clean_up_then_exits_130(tmp_path: Path) -> None:
    ready, done = tmp_path / "ready", tmp_path / "done"
    raylens = subprocess.Popen(
        [
            *(sys.executable, "-m", "raylens", "profile", "--json", "--interval", "0.2", "--"),
            *(sys.executable, "-c", _CLEANS_UP_ON_CTRL_C, str(ready), str(done)),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # no terminal: the SIGINT below reaches raylens alone
    )
    try:
        _wait_for(ready)
        os.kill(raylens.pid, signal.SIGINT)
        out, err = raylens.communicate(timeout=60)
    finally:
        raylens.kill()
    assert raylens.returncode == 130, err
    assert "Traceback" not in err, err
    assert done.read_text() == "cleaned up"
    assert _records(out)[-1]["exit_status"] == 3


def test_a_command_that_ignores_ctrl_c_is_terminated(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    script = (
        "import pathlib, signal, sys, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
        "pathlib.Path(sys.argv[1]).write_text('up'); time.sleep(60)"
    )
    child = subprocess.Popen([sys.executable, "-c", script, str(ready)])
    try:
        _wait_for(ready)
        status = cli_supervision.stop_child(
            child, forward=True, interrupt_grace_s=0.2, terminate_grace_s=30
        )
    finally:
        child.kill()
        child.wait()
    assert status == -signal.SIGTERM


def test_an_interrupt_the_command_already_got_is_not_sent_twice(tmp_path: Path) -> None:
    ready, done = tmp_path / "ready", tmp_path / "done"
    child = subprocess.Popen([sys.executable, "-c", _CLEANS_UP_ON_CTRL_C, str(ready), str(done)])
    try:
        _wait_for(ready)
        child.send_signal(signal.SIGINT)  # as a terminal's Ctrl-C reaches its whole group
        status = cli_supervision.stop_child(
            child, forward=False, interrupt_grace_s=30, terminate_grace_s=30
        )
    finally:
        child.kill()
        child.wait()
    assert status == 3
    assert done.read_text() == "cleaned up"


_COUNTS_INTERRUPTS = """
import os, pathlib, signal, sys, time
ready, done = map(pathlib.Path, sys.argv[1:3])
if sys.argv[3] == "own-group":
    os.setpgrp()  # as some launchers do: the terminal's Ctrl-C no longer reaches it
interrupts = []
signal.signal(signal.SIGINT, lambda *_: interrupts.append(1))
ready.write_text("up")
deadline = time.monotonic() + 60
while not interrupts and time.monotonic() < deadline:
    time.sleep(0.02)
time.sleep(0.5)  # winding down; a second interrupt would land here
done.write_text(str(len(interrupts)))
sys.exit(3)
"""


def _drain(fd: int) -> None:
    while True:
        try:
            if not os.read(fd, 65536):
                return
        except OSError:
            return


@pytest.mark.parametrize("group", ["same-group", "own-group"])
def test_ctrl_c_typed_in_a_terminal_reaches_the_command_exactly_once(
    group: str, tmp_path: Path
) -> None:
    import fcntl
    import pty
    import termios
    import threading

    ready, done = tmp_path / "ready", tmp_path / "done"
    master, terminal = pty.openpty()
    raylens = subprocess.Popen(
        [
            *(sys.executable, "-m", "raylens", "profile", "--json", "--interval", "0.2", "--"),
            *(sys.executable, "-c", _COUNTS_INTERRUPTS, str(ready), str(done), group),
        ],
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        start_new_session=True,
        # Make the pty raylens' controlling terminal, with raylens in its foreground group.
        preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
    )
    os.close(terminal)
    reader = threading.Thread(target=_drain, args=(master,), name="raylens-test-pty", daemon=True)
    reader.start()
    try:
        _wait_for(ready)
        os.write(master, b"\x03")  # Ctrl-C, as typed
        assert raylens.wait(timeout=60) == 130
    finally:
        raylens.kill()
        raylens.wait()
        os.close(master)
        reader.join(5)
    assert done.read_text() == "1"


def test_a_long_interval_still_shows_the_command_within_a_second(
    gate: _Gate, capfd: pytest.CaptureFixture[str]
) -> None:
    assert main(gate.argv("--json", "--interval", "30")) == 4
    assert gate.timeouts[0] == pytest.approx(1.0)  # the first sample is not an interval away
    first, summary = _records(capfd.readouterr().out)
    assert "summary" not in first and first["servers"][0]["processes"] == 1
    assert summary["summary"] is True


def test_markup_in_the_command_line_is_shown_and_the_command_runs_to_its_end(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    done = tmp_path / "done"
    script = f"sleep 0.3; echo ran > {done}; exit 6"
    argv = ["profile", "--interval", "0.1", "--", "sh", "-c", script, "data[/train]"]
    assert main(argv) == 6
    out, err = capfd.readouterr()
    assert done.read_text() == "ran\n"
    assert "data[/train]" in out and "Traceback" not in err, err


def test_a_display_that_fails_never_touches_the_command(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the table cannot be drawn")

    monkeypatch.setattr(cli_profile, "process_table", broken)
    monkeypatch.setattr(cli_profile, "process_line", broken)
    done = tmp_path / "done"
    script = f"sleep 0.5; echo ran > {done}; exit 7"
    assert main(["profile", "--interval", "0.1", "--", "sh", "-c", script]) == 7
    out, err = capfd.readouterr()
    assert done.read_text() == "ran\n"
    assert err.count("the table cannot be drawn") == 1, err
    assert "Traceback" not in err, err
    assert _records(out)[-1]["exit_status"] == 7  # samples carry on as plain JSON lines
