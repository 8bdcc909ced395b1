"""The source tree's module boundaries, read from the files with ``ast``.

Two rules that import-linter's contracts do not express (the ``acyclic`` contract sees
cycles between siblings only, and no contract looks at the names an import binds):

* no import cycle between modules, whether the import sits at the top of a module or
  inside a function, a module importing its own package's facade included (imports under
  ``if TYPE_CHECKING:`` never run and are left out);
* a private name (``_name``) is imported only from a module of the importer's package.

The tree is parsed once for the whole file.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest


def _source_root() -> Path:
    for parent in Path(__file__).resolve().parents:
        if (parent / "src" / "raylens").is_dir():
            return parent / "src"
    raise AssertionError(f"no src/raylens above {__file__}")


@dataclass(frozen=True)
class _Module:
    name: str
    package: str
    tree: ast.Module


def _modules(root: Path) -> dict[str, _Module]:
    modules: dict[str, _Module] = {}
    for path in sorted((root / "raylens").rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        name = ".".join(parts)
        package = name if is_package else ".".join(parts[:-1])
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        modules[name] = _Module(name, package, tree)
    return modules


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child):
            for other in child.orelse:
                yield from _runtime_imports(other)
            continue
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child
        yield from _runtime_imports(child)


@dataclass(frozen=True)
class _Edge:
    target: str
    names: tuple[str, ...]
    line: int


def _edges(module: _Module, known: dict[str, _Module]) -> Iterator[_Edge]:
    for node in _runtime_imports(module.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "raylens":
                    yield _Edge(alias.name, (), node.lineno)
            continue
        base = node.module or ""
        if node.level:
            anchor = module.package.split(".")
            anchor = anchor[: len(anchor) - node.level + 1]
            base = ".".join([*anchor, base]) if base else ".".join(anchor)
        if base.split(".")[0] != "raylens":
            continue
        plain: list[str] = []
        for alias in node.names:
            submodule = f"{base}.{alias.name}"
            if submodule in known:
                yield _Edge(submodule, (), node.lineno)
            else:
                plain.append(alias.name)
        if plain:
            yield _Edge(base, tuple(plain), node.lineno)


def _graph(modules: dict[str, _Module]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for module in modules.values():
        for edge in _edges(module, modules):
            if edge.target in modules and edge.target != module.name:
                graph[module.name].add(edge.target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(start: str) -> None:
        nonlocal counter
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            advanced = False
            for target in targets:
                if target not in index:
                    index[target] = low[target] = counter
                    counter += 1
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    advanced = True
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return found


def _is_private(part: str) -> bool:
    return part.startswith("_") and not part.startswith("__")


@pytest.fixture(scope="module")
def modules() -> dict[str, _Module]:
    return _modules(_source_root())


def test_no_module_imports_itself_back_through_a_cycle(modules: dict[str, _Module]) -> None:
    assert _cycles(_graph(modules)) == []


def test_private_names_are_imported_only_within_a_package(modules: dict[str, _Module]) -> None:
    offences: list[str] = []
    for module in modules.values():
        for edge in _edges(module, modules):
            source = modules.get(edge.target)
            source_package = source.package if source else edge.target
            for name in edge.names:
                if _is_private(name) and source_package != module.package:
                    offences.append(f"{module.name}:{edge.line} imports {name} from {edge.target}")

    assert offences == []


def test_the_checks_see_a_cycle_and_a_private_name() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}

    assert _cycles(graph) == [["a", "b", "c"]]
    assert _is_private("_monitor") and not _is_private("__init__")
