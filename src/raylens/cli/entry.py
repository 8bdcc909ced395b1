"""The ``raylens`` command's :func:`main`, re-exported by :mod:`raylens.cli`.

Invariant: this module imports nothing heavy (``signal``, ``sys``, ``collections.abc``).
The parts of the command are imported inside :func:`main`, after Ctrl-C is set to note
itself, so that a Ctrl-C typed while they load still ends the command quietly with status
130.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``raylens`` command; returns the process exit status."""
    interrupts: list[int] = []
    stops: list[Callable[[], None]] = []
    restore = _record_interrupts(interrupts, stops)
    try:
        import threading

        from raylens.cli.app import run

        stop = threading.Event()
        interrupted = threading.Event()
        stops.extend((stop.set, interrupted.set))
        if interrupts:  # a Ctrl-C whose KeyboardInterrupt was lost while loading
            raise KeyboardInterrupt
        return run(argv, stop=stop, interrupted=interrupted)
    except KeyboardInterrupt:
        print("raylens: interrupted", file=sys.stderr)
        return 130
    finally:
        restore()


def _record_interrupts(
    interrupts: list[int], stops: list[Callable[[], None]]
) -> Callable[[], None]:
    """Make Ctrl-C note itself and call ``stops`` before it raises KeyboardInterrupt.

    Python drops an exception raised while a finalizer runs (an import lock's
    clean-up, say), so a KeyboardInterrupt alone can be lost; what the handler
    notes is not. Returns the undo. Outside the main thread this changes nothing.
    Only ``signal``, ``sys`` and ``collections.abc`` load before this runs.
    """

    def handler(signum: int, frame: object) -> None:
        interrupts.append(signum)
        for stop in stops:
            stop()
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main thread: signals are not ours to handle
        return lambda: None

    def restore() -> None:
        signal.signal(
            signal.SIGINT, previous if previous is not None else signal.default_int_handler
        )

    return restore
