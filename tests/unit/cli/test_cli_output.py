"""What the raylens command writes: JSON lines alone on stdout, and a quiet end when the
reader of a pipe goes away."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from raylens.cli import main

linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="process trees need Linux /proc"
)


def _every_line_is_json(text: str) -> list[dict]:
    lines = text.splitlines()
    assert lines, "nothing on stdout"
    return [json.loads(line) for line in lines]


@linux_only
@pytest.mark.slow
def test_profile_json_keeps_the_command_output_off_stdout(
    capfd: pytest.CaptureFixture[str],
) -> None:
    script = "print('hello from the command', flush=True)"
    status = main(["profile", "--json", "--interval", "0.1", "--", sys.executable, "-c", script])
    assert status == 0
    out, err = capfd.readouterr()
    records = _every_line_is_json(out)
    assert records[-1]["summary"] is True
    assert "hello from the command" in err


def test_json_with_the_console_exporter_sends_points_to_stderr(
    capfd: pytest.CaptureFixture[str],
) -> None:
    assert main(["simulate", "--nodes", "1", "--once", "--json", "--exporter", "console"]) == 0
    out, err = capfd.readouterr()
    (record,) = _every_line_is_json(out)
    assert len(record["nodes"]) == 1
    assert 'rl.host.memory.used{host.name="sim-node-0"' in err


def _raylens(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "raylens", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _read_one_line_then_close_stdout(
    process: subprocess.Popen, then: Callable[[], object] = lambda: None
) -> str:
    """Read one line, close our end of the pipe, call ``then``, wait for raylens;
    returns its stderr."""
    assert process.stdout.readline()
    process.stdout.close()
    then()
    try:
        process.wait(timeout=60)
    finally:
        process.kill()
    err = process.stderr.read()
    process.stderr.close()
    return err


@pytest.mark.parametrize("flags", [["--json"], []], ids=["json", "table"])
@pytest.mark.slow
def test_a_closed_pipe_ends_simulate_quietly(flags: list[str]) -> None:
    process = _raylens("simulate", "--nodes", "1", "--interval", "0.1", *flags)
    err = _read_one_line_then_close_stdout(process)
    assert process.returncode == 141, err
    assert "Traceback" not in err and "Exception ignored" not in err, err


_RUNS_UNTIL_RELEASED = """
import pathlib, sys, time
release = pathlib.Path(sys.argv[1])
deadline = time.monotonic() + 60
while not release.exists() and time.monotonic() < deadline:
    time.sleep(0.01)
sys.exit(5 if release.exists() else 1)
"""


@linux_only
@pytest.mark.slow
def test_a_closed_pipe_lets_the_profiled_command_finish(tmp_path: Path) -> None:
    release = tmp_path / "release"
    process = _raylens(
        *("profile", "--json", "--interval", "0.1", "--"),
        *(sys.executable, "-c", _RUNS_UNTIL_RELEASED, str(release)),
    )
    # The command is still running when the reader goes away, and ends only after.
    err = _read_one_line_then_close_stdout(process, then=lambda: release.write_text("go"))
    assert process.returncode == 5, err
    assert "Traceback" not in err and "Exception ignored" not in err, err


@pytest.mark.parametrize("columns", ["", "wide", "-5"])
def test_a_meaningless_columns_variable_falls_back_to_a_wide_table(
    columns: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", columns)
    assert main(["simulate", "--nodes", "1", "--once"]) == 0
    assert "sim-node-0" in capsys.readouterr().out


def test_the_verbose_log_escapes_control_characters_from_the_network() -> None:
    import logging

    from raylens.cli.output import PrintableFormatter

    formatter = PrintableFormatter("raylens: %(levelname)s: %(message)s")
    reason = "500 \x1b]0;PWNED\x07\x1b[2J\nraylens: ERROR: forged"
    record = logging.LogRecord(
        "raylens", logging.WARNING, __file__, 1, "node failed: %s", (reason,), None
    )
    line = formatter.format(record)
    assert "\x1b" not in line and "\x07" not in line and "\n" not in line
    assert line.startswith("raylens: WARNING: node failed: 500 \\x1b]0;PWNED\\x07")


def test_an_error_line_escapes_control_characters(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RAYLENS_EXPORTER", "jaeger\x1b[2J")
    assert main(["simulate", "--nodes", "1", "--once"]) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err and "jaeger" in err


@pytest.mark.slow
def test_a_hostile_reason_phrase_is_escaped_in_the_table_and_the_verbose_log(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import argparse
    import io
    import threading

    from rich.console import Console

    from raylens.cli.cluster_views import watch_nodes
    from raylens.cli.output import Output, configure_logging
    from raylens.telemetry import host_memory
    from raylens_fakes.simulated import SimulatedCluster

    console = Console(file=io.StringIO(), width=300, force_terminal=False, color_system=None)
    configure_logging(verbose=True)
    try:
        with SimulatedCluster(2) as simulated:
            simulated.raylet(1).respond_status(500, reason="boom \x1b]0;PWNED\x07\x1b[2J")
            monitor = host_memory.HostMemoryMonitor(
                1.0, cluster=simulated.cluster, scrape_timeout=2.0
            )
            args = argparse.Namespace(interval=1.0, duration=None, once=True)
            try:
                watch_nodes(
                    monitor,
                    args,
                    output=Output(as_json=False, console=console),
                    title="hostile",
                    stop=threading.Event(),
                )
            finally:
                monitor.stop()
    finally:
        configure_logging(verbose=False)
    table = console.file.getvalue()
    err = capsys.readouterr().err
    assert "PWNED" in table and "\x1b" not in table and "\x07" not in table, table
    assert "PWNED" in err and "\x1b" not in err and "\x07" not in err, err
