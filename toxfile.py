"""tox inline plugin: let tox find the Python 3.10-3.13 interpreters pyenv has installed.

pyenv's ``python3.X`` shims answer only for the versions pyenv has selected (and
``pyenv exec``, which runs tox through its shim, selects just one), so tox would
not find the other interpreters. This appends the ``bin`` folder of the newest
installed patch release of each supported minor version to ``PATH`` for the tox
run, after everything already there, so no interpreter the user chose is shadowed.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_SUPPORTED = re.compile(r"^3\.(10|11|12|13)\.(\d+)$")


def _pyenv_interpreter_dirs() -> list[str]:
    root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    if not root.is_dir():
        return []
    newest: dict[int, tuple[int, Path]] = {}
    for version in root.iterdir():
        match = _SUPPORTED.match(version.name)
        if match and (version / "bin").is_dir():
            minor, patch = int(match.group(1)), int(match.group(2))
            if minor not in newest or patch > newest[minor][0]:
                newest[minor] = (patch, version / "bin")
    return [str(path) for _, (_, path) in sorted(newest.items())]


def _extend_path() -> None:
    current = os.environ.get("PATH", "").split(os.pathsep)
    extra = [d for d in _pyenv_interpreter_dirs() if d not in current]
    if extra:
        os.environ["PATH"] = os.pathsep.join([*current, *extra])


_extend_path()
