"""The README's promises: its example test passes, its commands are the ones CI runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

_ROOT = Path(__file__).resolve().parents[2]
_README = (_ROOT / "README.md").read_text(encoding="utf-8")


def _code_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", _README, flags=re.DOTALL)


def test_the_example_test_in_the_readme_passes(pytester: pytest.Pytester) -> None:
    (example,) = [block for block in _code_blocks("python") if "def test_" in block]
    pytester.makepyfile(test_readme_example=example)
    result = pytester.runpytest_inprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    run_command, test_command = (block.strip() for block in _code_blocks("bash")[:2])
    assert "raylens demo" in run_command
    ci_script = (_ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert test_command in ci_script.splitlines()
