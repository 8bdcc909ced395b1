"""The ``raylens`` command: a cluster's memory, live, in one command.

``demo``      a local multi-node Ray cluster with two worker groups, and its memory table
``watch``     the same table for a running cluster
``simulate``  the same table over a simulated cluster (no Ray needed)
``profile``   a command's process-tree memory (RSS, PSS, peaks) while it runs

Every command feeds the OpenTelemetry pipeline chosen with ``--exporter`` (or
``RAYLENS_EXPORTER``) at the same time. Errors a user can cause print one line
and exit with status 2; Ctrl-C exits with 130 and SIGTERM with 143, each after
cleaning up, and a reader of stdout that goes away (``| head``), or a stdout closed
from the start, ends watch, simulate and demo with 141.

This module stays small and imports nothing heavy: the parts of the command load
inside :func:`main`, so that a Ctrl-C typed while they load still ends it quietly.

``parser``         flags and their validators
``output``         tables, JSON lines, notes and the log
``pipeline``       the run's OpenTelemetry pipeline
``cluster_views``  watch, simulate and demo
``gcs_probe``      checks that an address is a Ray GCS
``profile``        the profile command and the supervision of its command
``app``            dispatch and exit statuses
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
