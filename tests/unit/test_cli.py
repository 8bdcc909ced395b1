"""The raylens command: flags, errors, and the profile and simulate commands end to end."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from raylens.cli import main


def _json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_version() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "raylens", "--version"], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip().startswith("raylens ")


def test_no_command_prints_help_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "demo" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["simulate", "--interval", "0"], "--interval"),
        (["simulate", "--interval", "soon"], "--interval"),
        (["simulate", "--nodes", "0"], "--nodes"),
        (["simulate", "--hung", "-1"], "--hung"),
        (["demo", "--nodes", "1"], "--nodes"),
        (["watch", "--exporter", "jaeger"], "--exporter"),
        (["profile", "--pss-interval", "-2", "--", "true"], "--pss-interval"),
    ],
)
def test_bad_flag_values_name_the_flag(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}" in err
    assert "Traceback" not in err


def test_more_hung_than_nodes_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--nodes", "2", "--hung", "3", "--once"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "raylens: error: --hung 3 is more than --nodes 2"


def test_bad_exporter_environment_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RAYLENS_EXPORTER", "jaeger")
    assert main(["simulate", "--nodes", "1", "--once"]) == 2
    err = capsys.readouterr().err
    assert "RAYLENS_EXPORTER='jaeger'" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("command", [["watch", "--once"], ["demo", "--duration", "1"]])
def test_ray_missing_says_how_to_install(
    command: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)
    assert main(command) == 2
    err = capsys.readouterr().err
    assert err.strip() == (
        "raylens: error: Ray is not installed; install it with: pip install 'raylens[ray]'"
    )


def test_profile_needs_a_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile"]) == 2
    assert "profile needs a command" in capsys.readouterr().err


def test_profile_of_a_missing_program(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", "--", "/nonexistent/program"]) == 2
    err = capsys.readouterr().err
    assert "'/nonexistent/program'" in err and "Traceback" not in err


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process trees need Linux /proc")
def test_profile_reports_memory_and_passes_the_exit_status(
    capsys: pytest.CaptureFixture[str],
) -> None:
    script = (
        "import sys, time; block = bytearray(40 * 1024 * 1024); "
        "block[::4096] = b'x' * len(block[::4096]); time.sleep(0.6); sys.exit(3)"
    )
    status = main(["profile", "--interval", "0.2", "--json", "--", sys.executable, "-c", script])
    assert status == 3
    records = _json_lines(capsys.readouterr().out)
    summary = records[-1]
    assert summary["summary"] is True and summary["exit_status"] == 3
    assert summary["servers"][0]["rss_peak_bytes"] >= 40 * 1024 * 1024
    assert all(len(r["servers"]) == 1 for r in records)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process trees need Linux /proc")
def test_profile_once_prints_one_sample(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", "--once", "--json", "--", sys.executable, "-c", "pass"]) == 0
    records = _json_lines(capsys.readouterr().out)
    assert len(records) == 1
    assert records[0]["servers"][0]["processes"] >= 0
