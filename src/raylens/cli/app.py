"""Parse the command line, run the chosen command, and turn its ending into an exit status."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable, Sequence

from raylens.cli.cluster_views import run_demo, run_simulate
from raylens.cli.output import configure_logging
from raylens.cli.parser import CliError, build_parser
from raylens.cli.plot import run_plot
from raylens.cli.profile import run_profile
from raylens.cli.prometheus_watch import run_watch_command
from raylens.cli.supervision import Terminated, raise_on_sigterm
from raylens.lens import shutdown_telemetry
from raylens.safe_text import printable

_HANDLERS: dict[str, Callable[[argparse.Namespace, threading.Event], int]] = {
    "demo": run_demo,
    "watch": run_watch_command,
    "simulate": run_simulate,
    "profile": run_profile,
    "plot": run_plot,
}


def run(
    argv: Sequence[str] | None = None,
    *,
    stop: threading.Event | None = None,
    interrupted: threading.Event | None = None,
) -> int:
    """Run the ``raylens`` command; returns the process exit status.

    ``stop`` ends a running command's sampling when set; ``interrupted`` says a
    Ctrl-C came even when Python lost its KeyboardInterrupt, and makes the status 130.
    """
    stop = stop or threading.Event()
    interrupted = interrupted or threading.Event()
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    configure_logging(verbose=args.verbose)
    # SIGTERM unwinds like Ctrl-C, so that clusters, monitors and commands are stopped.
    restore_sigterm = raise_on_sigterm()
    try:
        status = _HANDLERS[args.command](args, stop)
        if interrupted.is_set():
            raise KeyboardInterrupt
        return status
    except Terminated:
        stop.set()
        print("raylens: terminated", file=sys.stderr)
        return 128 + signal.SIGTERM
    except CliError as error:
        print(f"raylens: error: {printable(str(error))}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        stop.set()
        print("raylens: interrupted", file=sys.stderr)
        return 130
    finally:
        restore_sigterm()
        shutdown_telemetry()
