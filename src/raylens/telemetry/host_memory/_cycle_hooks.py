"""Hooks that a cluster reader runs after each of its cycles, and once when it stops.

A host-memory monitor and a Prometheus source both let a layer above (the driver, the worker
groups) act at their pace without knowing it: each holds a :class:`CycleHooks`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from raylens.lens import warn_once
from raylens.safe_text import printable

__all__ = ["CycleHook", "CycleHooks"]

#: Called with the reader after each of its cycles.
CycleHook = Callable[[Any], None]


class CycleHooks:
    """An ordered set of ``(hook, on_stop)``; running them never raises.

    ``what`` names the reader in the warning a failing hook gives (once per hook), and
    ``key`` prefixes that warning's once-key. Thread-safe: hooks are run from a copy, so a
    hook may add or remove hooks.
    """

    def __init__(self, what: str, key: str, logger: logging.Logger) -> None:
        self._what = what
        self._key = key
        self._logger = logger
        self._lock = threading.Lock()
        self._hooks: list[tuple[CycleHook, Callable[[], None] | None]] = []

    def add(self, hook: CycleHook, on_stop: Callable[[], None] | None = None) -> None:
        """Run ``hook`` after every cycle and ``on_stop`` at stop; a hook added twice runs once."""
        with self._lock:
            if all(existing != hook for existing, _ in self._hooks):
                self._hooks.append((hook, on_stop))

    def remove(self, hook: CycleHook) -> None:
        """Stop running ``hook`` (its ``on_stop`` is not called); an unknown one is ignored."""
        with self._lock:
            self._hooks = [entry for entry in self._hooks if entry[0] != hook]

    def clear(self) -> None:
        """Forget every hook (a forked child: they belong to the parent's wiring)."""
        self._lock = threading.Lock()
        self._hooks = []

    def run(self, reader: Any, *, stopping: bool) -> None:
        """Call each hook with ``reader``, or each ``on_stop`` when ``stopping``. Never raises."""
        with self._lock:
            hooks = list(self._hooks)
        for hook, on_stop in hooks:
            try:
                if not stopping:
                    hook(reader)
                elif on_stop is not None:
                    on_stop()
            except Exception:  # noqa: BLE001 a hook is another layer's code, not the cycle's
                name = getattr(hook, "__qualname__", type(hook).__name__)
                warn_once(
                    f"{self._key}.{name}",
                    f"a {self._what} cycle hook ({printable(repr(hook))[:120]}) failed",
                    logger=self._logger,
                )
