"""tox inline plugin: find the Python 3.10-3.13 interpreters pyenv has installed.

pyenv's ``python3.X`` shims answer only for the versions selected in pyenv, so on
a machine whose global pyenv version is a single interpreter, tox would not find
the others. When ``PYENV_VERSION`` is unset, this selects the newest installed
patch release of each supported minor version (the global one first, so plain
``python3`` is unchanged) for the tox run only.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

_SUPPORTED = re.compile(r"^3\.(10|11|12|13)\.(\d+)$")


def _pyenv(*args: str) -> list[str]:
    try:
        result = subprocess.run(
            ["pyenv", *args], capture_output=True, text=True, timeout=30, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return []
    return result.stdout.split()


def _select_pyenv_versions() -> None:
    if "PYENV_VERSION" in os.environ or shutil.which("pyenv") is None:
        return
    newest: dict[int, tuple[int, str]] = {}
    for version in _pyenv("versions", "--bare", "--skip-aliases"):
        match = _SUPPORTED.match(version)
        if match:
            minor, patch = int(match.group(1)), int(match.group(2))
            if minor not in newest or patch > newest[minor][0]:
                newest[minor] = (patch, version)
    if not newest:
        return
    selected = _pyenv("version-name")
    chosen = [v for v in selected[:1] if v != "system"]
    chosen += [version for _, (_, version) in sorted(newest.items()) if version not in chosen]
    os.environ["PYENV_VERSION"] = ":".join(chosen)


_select_pyenv_versions()
