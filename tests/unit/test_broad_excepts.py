"""Catch-all handlers in ``src/`` are few, and each says why it must catch everything.

A catch-all is ``except:``, ``except Exception`` or ``except BaseException`` (alone or in a
tuple). Each one carries a comment on its ``except`` line or the line after, naming whose
code it guards (a user's hook, an exporter, a background loop that never raises); a bare
``# noqa: BLE001`` says nothing, so it does not count. ruff's BLE001 flags the handlers
that swallow (``# noqa: BLE001 <why>`` keeps one); this test also holds those that raise
again, and adds what ruff cannot count: the cap, and ``except BaseException`` only where
it is raised again on a signal path or in another thread.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

_SRC = Path(__file__).resolve().parents[2] / "src"

#: The most catch-all handlers ``src/`` may hold.
MAX_CATCH_ALLS = 30

#: Modules where ``except BaseException`` may stand, and why.
_BASE_EXCEPTION_ALLOWED = {
    "raylens/cli/profile.py": "the signal path: the profiled command is killed, then it goes on",
    "raylens/cli/reachability.py": "a bounded call's thread hands any exception to its caller",
}

_NOQA = re.compile(r"#\s*noqa(?::\s*[A-Z]+[0-9]+(?:[,\s]+[A-Z]+[0-9]+)*)?")


def _caught_names(handler: ast.ExceptHandler) -> set[str]:
    if handler.type is None:
        return {"(bare)"}
    kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    names = set()
    for kind in kinds:
        if isinstance(kind, ast.Name):
            names.add(kind.id)
        elif isinstance(kind, ast.Attribute):
            names.add(kind.attr)
    return names & {"(bare)", "Exception", "BaseException"}


def _comment_lines(text: str) -> set[int]:
    """Lines with a comment that says something besides a ``noqa`` directive."""
    tokens = tokenize.generate_tokens(io.StringIO(text).readline)
    return {
        token.start[0]
        for token in tokens
        if token.type == tokenize.COMMENT and _NOQA.sub("", token.string).strip(" #-")
    }


def _catch_alls() -> list[tuple[str, int, set[str], bool]]:
    """``(module, line, names caught, commented)`` for every catch-all handler in src/."""
    found = []
    for path in sorted(_SRC.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if "except" not in text:
            continue
        module = path.relative_to(_SRC).as_posix()
        handlers = [
            (node, names)
            for node in ast.walk(ast.parse(text, filename=str(path)))
            if isinstance(node, ast.ExceptHandler) and (names := _caught_names(node))
        ]
        if not handlers:
            continue
        comments = _comment_lines(text)
        for node, names in handlers:
            commented = node.lineno in comments or node.lineno + 1 in comments
            found.append((module, node.lineno, names, commented))
    return found


_FOUND = _catch_alls()


def test_every_catch_all_says_why_it_catches_everything() -> None:
    silent = [f"src/{module}:{line}" for module, line, _, commented in _FOUND if not commented]
    assert not silent, (
        "these handlers catch everything without a comment (on the except line or the next) "
        f"saying why; name the exceptions instead, or say whose code they guard: {silent}"
    )


def test_catch_alls_stay_within_the_cap() -> None:
    where = [f"src/{module}:{line}" for module, line, _, _ in _FOUND]
    assert len(where) <= MAX_CATCH_ALLS, (
        f"{len(where)} catch-all handlers in src/, more than {MAX_CATCH_ALLS}: {where}"
    )


def test_base_exception_is_caught_only_on_fork_and_signal_paths() -> None:
    elsewhere = [
        f"src/{module}:{line}"
        for module, line, names, _ in _FOUND
        if names & {"BaseException", "(bare)"} and module not in _BASE_EXCEPTION_ALLOWED
    ]
    assert not elsewhere, (
        "except BaseException (or a bare except) outside the signal and thread hand-off paths; use "
        f"try/finally for cleanup that lets the exception go on: {elsewhere}"
    )
