"""The import contracts in pyproject.toml hold for the tree, and they catch imports broken on purpose.

Each run is a ``lint-imports`` subprocess with ``PYTHONPATH`` pointing at the source
it should read, so the graph is built from those files and not from whatever
``raylens`` this interpreter already imported.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip(
    "importlinter",
    reason="import-linter is not installed (it comes with the 'test' extra)",
)


def _repo_root() -> Path:
    for parent in Path(__file__).resolve().parents:
        if (parent / "pyproject.toml").is_file() and (parent / "src" / "raylens").is_dir():
            return parent
    raise AssertionError(f"no repository root with pyproject.toml above {__file__}")


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root / "src"), str(root / "fakes")])
    code = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    return subprocess.run(
        [sys.executable, "-c", code, "--no-cache", "--no-logo"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.slow
def test_the_tree_keeps_every_import_contract() -> None:
    result = _lint_imports(_repo_root())

    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 8 kept, 0 broken." in result.stdout


def _copy_tree(root: Path, dest: Path) -> Path:
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(root / "src" / "raylens", dest / "src" / "raylens", ignore=skip)
    shutil.copytree(root / "fakes" / "raylens_fakes", dest / "fakes" / "raylens_fakes", ignore=skip)
    shutil.copy(root / "pyproject.toml", dest / "pyproject.toml")
    return dest


def _append_import(module: Path, line: str) -> None:
    module.write_text(module.read_text(encoding="utf-8") + f"\n{line}\n", encoding="utf-8")


@pytest.mark.slow
def test_the_contracts_fail_on_an_upward_import_a_fake_an_http_client_a_heavy_helper_a_private_module_or_a_cycle(
    tmp_path: Path,
) -> None:
    copy = _copy_tree(_repo_root(), tmp_path)
    telemetry = copy / "src" / "raylens" / "telemetry" / "host_memory" / "__init__.py"
    _append_import(telemetry, "import raylens.distributed.worker_groups  # noqa")
    simulation = copy / "src" / "raylens" / "simulation" / "__init__.py"
    _append_import(simulation, "import raylens_fakes.otel  # noqa")
    cluster = copy / "src" / "raylens" / "cluster.py"
    _append_import(cluster, "import requests  # noqa")
    engine = copy / "src" / "raylens" / "telemetry" / "scraping" / "_engine.py"
    _append_import(engine, "import raylens.lens  # noqa")
    payload = copy / "src" / "raylens" / "telemetry" / "raylet_payload.py"
    _append_import(payload, "import raylens.telemetry.growth_outlook  # noqa")
    seam = copy / "src" / "raylens" / "distributed" / "ray_seam.py"
    _append_import(seam, "import raylens.distributed.worker_group  # noqa")
    driver = copy / "src" / "raylens" / "driver.py"
    _append_import(driver, "import raylens.telemetry.host_memory._snapshot  # noqa")
    metrics = copy / "src" / "raylens" / "lens" / "metrics.py"
    _append_import(metrics, "import raylens.lens.runtime  # noqa")

    result = _lint_imports(copy)

    assert result.returncode == 1, result.stdout + result.stderr
    assert "Contracts: 0 kept, 8 broken." in result.stdout
    assert "raylens.telemetry.scraping._engine -> raylens.lens" in result.stdout
    assert "raylens.telemetry is not allowed to import raylens.distributed" in result.stdout
    assert "raylens.simulation -> raylens_fakes.otel" in result.stdout
    assert "raylens.cluster -> requests" in result.stdout
    assert "raylens.telemetry.raylet_payload -> raylens.telemetry.growth_outlook" in result.stdout
    assert "raylens.distributed.ray_seam -> raylens.distributed.worker_group" in result.stdout
    assert "raylens.driver -> raylens.telemetry.host_memory._snapshot" in result.stdout
    assert "No cycles are allowed in raylens.lens." in result.stdout
