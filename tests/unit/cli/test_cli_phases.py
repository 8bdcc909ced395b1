"""``watch``/``simulate``/``demo`` show the phase a job published, in the title and in --json."""

from __future__ import annotations

import json

import pytest

from raylens.cli import main
from raylens.cli.cluster_views import phase_title
from raylens.telemetry.phases.board import CurrentPhase


def test_simulate_shows_its_scripted_phase(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--nodes", "2", "--once", "--json"]) == 0
    (record,) = [
        json.loads(line) for line in capsys.readouterr().out.splitlines() if line[:1] == "{"
    ]
    assert [entry["phase"] for entry in record["phases"]] == ["generation"]
    assert main(["simulate", "--nodes", "2", "--once"]) == 0
    assert "| phase generation" in capsys.readouterr().out


def test_the_title_names_one_phase_or_each_jobs_and_escapes_them() -> None:
    assert phase_title("t", []) == "t"
    assert phase_title("t", [CurrentPhase("01", "gen", 0.0)]) == "t | phase gen"
    many = [CurrentPhase(f"0{i}", f"p{i}", 0.0) for i in range(6)]
    shown = phase_title("t", many)
    assert shown.startswith("t | phases p0 (job 00), p1 (job 01)") and shown.endswith("and 2 more")
    assert "\x1b" not in phase_title("t", [CurrentPhase("\x1b[2J", "gen", 0.0), *many[:1]])
