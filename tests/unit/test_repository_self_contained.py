"""The repository runs from a clone alone: nothing in it reads files from beside the checkout."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parents[2]


def _tracked_files() -> list[Path]:
    try:
        listing = subprocess.run(
            ["git", "ls-files", "-z"], cwd=_ROOT, capture_output=True, check=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError):
        pytest.skip("not a git checkout: the tracked files cannot be listed")
    return [_ROOT / name for name in listing.decode().split("\0") if name]


@pytest.mark.slow
def test_no_tracked_file_reaches_outside_the_checkout_for_data() -> None:
    # Spelled in parts so that this file does not match itself.
    outside = ("shared" + "/data", ".." + "/shared")
    offenders = []
    for path in _tracked_files():
        if path.suffix not in {".py", ".ini", ".toml", ".cfg", ".txt", ""} or not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        if any(marker in text for marker in outside):
            offenders.append(str(path.relative_to(_ROOT)))
    assert offenders == []


def test_ci_runs_the_tests_in_a_clone_that_cannot_see_a_shared_folder() -> None:
    ci_script = (_ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "git clone" in ci_script
    assert "mktemp -d" in ci_script
