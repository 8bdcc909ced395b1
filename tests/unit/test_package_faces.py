"""Every package's face is small and holds no code.

A package's ``__init__.py`` names what users and other packages need (at most
:data:`MAX_FACE_NAMES` names in ``__all__``) and re-exports it; the functions and classes
themselves live in the package's modules. Read from the files with ``ast``: nothing is
imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

MAX_FACE_NAMES = 30

_SOURCE = Path(__file__).resolve().parents[2] / "src" / "raylens"
_FACES = sorted(_SOURCE.rglob("__init__.py"))


def _face_id(path: Path) -> str:
    return str(path.parent.relative_to(_SOURCE.parent)).replace("/", ".")


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _all_names(tree: ast.Module) -> list[str]:
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if isinstance(target, ast.Name) and target.id == "__all__":
            assert isinstance(node.value, (ast.List, ast.Tuple)), "__all__ is a literal list"
            return [ast.literal_eval(element) for element in node.value.elts]
    return []


def test_the_source_tree_has_package_faces() -> None:
    assert {"raylens.telemetry.host_memory", "raylens.lens"} <= {_face_id(p) for p in _FACES}


@pytest.mark.parametrize("path", _FACES, ids=_face_id)
def test_a_package_face_names_at_most_thirty(path: Path) -> None:
    names = _all_names(_tree(path))
    assert len(names) <= MAX_FACE_NAMES, f"{_face_id(path)} exports {len(names)} names"
    assert len(set(names)) == len(names), f"{_face_id(path)} lists a name twice"


@pytest.mark.parametrize("path", _FACES, ids=_face_id)
def test_a_package_face_defines_no_function_or_class(path: Path) -> None:
    definitions = [
        f"{node.name} (line {node.lineno})"
        for node in ast.walk(_tree(path))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    ]
    assert definitions == [], f"{_face_id(path)} defines {definitions}"
