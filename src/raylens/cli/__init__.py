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
import threading
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``raylens`` command; returns the process exit status."""
    stop = threading.Event()
    interrupted = threading.Event()
    restore = _record_interrupts(stop, interrupted)
    try:
        from raylens.cli.app import run

        return run(argv, stop=stop, interrupted=interrupted)
    except KeyboardInterrupt:
        print("raylens: interrupted", file=sys.stderr)
        return 130
    finally:
        restore()


def _record_interrupts(stop: threading.Event, interrupted: threading.Event) -> Callable[[], None]:
    """Make Ctrl-C set ``stop`` and ``interrupted`` before it raises KeyboardInterrupt.

    Python drops an exception raised while a finalizer runs (an import lock's
    clean-up, say), so a KeyboardInterrupt alone can be lost; the events are not.
    Returns the undo. Outside the main thread this changes nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum: int, frame: Any) -> None:
        interrupted.set()
        stop.set()
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, handler)
    return lambda: signal.signal(
        signal.SIGINT, previous if previous is not None else signal.default_int_handler
    )
