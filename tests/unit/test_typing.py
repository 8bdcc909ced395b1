"""raylens is a typed package: it says so to type checkers, and lint checks its types."""

from __future__ import annotations

import configparser
from importlib import resources
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("package", ["raylens", "raylens_fakes"])
def test_each_package_carries_the_py_typed_marker(package: str) -> None:
    # Read through the import system, so that under tox this is the installed wheel.
    assert resources.files(package).joinpath("py.typed").is_file()


def test_lint_runs_mypy_over_the_product_and_the_fakes() -> None:
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(_ROOT / "tox.ini", encoding="utf-8")
    commands = tox["testenv:lint"]["commands"].split("\n")
    deps = tox["testenv:lint"]["deps"]
    assert "mypy" in [line.strip() for line in commands]
    assert "mypy" in deps
    # mypy checks calls into the runtime dependencies, so lint installs them.
    assert tox["testenv:lint"].get("skip_install", "false").strip() != "true"


def test_mypy_settings_are_strict_enough() -> None:
    tomllib = pytest.importorskip("tomllib")
    config = tomllib.loads((_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    mypy = config["tool"]["mypy"]
    assert mypy["files"] == ["src", "fakes"]
    for flag in (
        "check_untyped_defs",
        "disallow_untyped_defs",
        "no_implicit_optional",
        "warn_unused_ignores",
        "warn_redundant_casts",
    ):
        assert mypy[flag] is True, flag
    package_data = config["tool"]["setuptools"]["package-data"]
    assert "py.typed" in package_data["raylens"]
    assert "py.typed" in package_data["raylens_fakes"]
