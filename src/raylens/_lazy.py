"""The names :mod:`raylens` loads on first use, through its module ``__getattr__``.

Importing raylens stays light: ``raylens.phase`` and ``raylens.current_phase`` import the
phases module (and what it needs) only when first read.
"""

from __future__ import annotations

from typing import Any

_LAZY = frozenset({"current_phase", "phase"})


def __getattr__(name: str) -> Any:
    # Looked up on the phases module at each call, so the functions stay bound to its
    # default marker as it is then.
    if name in _LAZY:
        from raylens.distributed import phases

        return getattr(phases, name)
    raise AttributeError(f"module 'raylens' has no attribute {name!r}")
