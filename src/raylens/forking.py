"""What a forked child does with the raylens state it inherits.

``os.fork`` copies every lock as it was at that instant, held or not, and none of
the threads that would release them. A driver that forks while a raylens thread
holds a lock (a scrape cycle runs for seconds) would leave its child waiting on
that lock forever the first time the child touches raylens, at exit included.
The rule is therefore: in a forked child, raylens objects start over from a
quiet state. Each object that owns locks, threads or a helper process registers
here and gets :meth:`ForkAware.reset_after_fork` called in the child, before the
child runs any code of its own. Nothing the parent owns (its helper process, its
pipe to it) is used, stopped or signalled from the child.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Callable
from typing import Protocol

__all__ = [
    "ForkAware",
    "call_in_child",
    "forget_in_child",
    "renew_lock_in_child",
    "reset_after_fork_in_child",
]


class ForkAware(Protocol):
    """An object whose locks, threads or processes must not carry over into a fork."""

    def reset_after_fork(self) -> None:
        """Make the child's copy usable again without touching what the parent owns."""


_REGISTERED: weakref.WeakSet[ForkAware] = weakref.WeakSet()
#: Module-level locks: ``(namespace, attribute, factory)``; renewed in every child.
_MODULE_LOCKS: list[tuple[object, str, Callable[[], object]]] = []
#: Module-level resets, run after the locks are renewed.
_MODULE_RESETS: list[Callable[[], None]] = []


def reset_after_fork_in_child(obj: ForkAware) -> None:
    """Have ``obj.reset_after_fork()`` run in every child forked from now on (held weakly)."""
    _REGISTERED.add(obj)


def forget_in_child(obj: ForkAware) -> None:
    """Stop resetting ``obj`` in forked children."""
    _REGISTERED.discard(obj)


def renew_lock_in_child(
    namespace: object, name: str, factory: Callable[[], object] = threading.Lock
) -> None:
    """Replace ``namespace.name`` with a fresh ``factory()`` in every forked child.

    For module-level locks: ``renew_lock_in_child(sys.modules[__name__], "_LOCK")``.
    """
    _MODULE_LOCKS.append((namespace, name, factory))


def call_in_child(reset: Callable[[], None]) -> None:
    """Call ``reset()`` in every child forked from now on, for module-level state."""
    _MODULE_RESETS.append(reset)


def _in_child() -> None:
    for namespace, name, factory in _MODULE_LOCKS:
        setattr(namespace, name, factory())
    for reset in _MODULE_RESETS:
        with contextlib.suppress(Exception):
            reset()
    for obj in list(_REGISTERED):
        with contextlib.suppress(Exception):  # a child must start whatever one object does
            obj.reset_after_fork()


os.register_at_fork(after_in_child=_in_child)
