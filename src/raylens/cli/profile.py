"""``raylens profile``: run a command and show its process tree's memory while it runs.

The command is supervised so that nothing raylens does to show it (a table that
cannot be drawn, a reader that went away) ends it early, and so that whatever ends
raylens (Ctrl-C, SIGTERM, an error) stops it too instead of leaving it unwatched.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from typing import Any

from raylens.cli.output import Output
from raylens.cli.parser import CliError
from raylens.cli.pipeline import start_telemetry
from raylens.cli.supervision import (
    Terminated,
    kill_child,
    raise_on_sigterm,
    signal_name,
    start_command,
    stop_child,
    terminate_child,
)
from raylens.live_table import ProcessTreeRow, process_table

# How many RSS samples the trend keeps.
_HISTORY = 24
_STDERR_FD = 2


class ProcessTable:
    """Turns a profiler's latest sample into table rows, with a short RSS trend."""

    def __init__(self, profiler: Any, *, label: str, pid: int) -> None:
        self.profiler = profiler
        self.label = label
        self.pid = pid
        self.history: list[float] = []

    def rows(self) -> list[ProcessTreeRow]:
        snapshot = self.profiler.latest()
        found = []
        for server in snapshot.servers if snapshot is not None else ():
            if server.rss_bytes is not None:
                self.history.append(server.rss_bytes)
                del self.history[:-_HISTORY]
            found.append(
                ProcessTreeRow(
                    name=self.label[:48],
                    pid=self.pid,
                    processes=server.process_count or 0,
                    rss=server.rss_bytes,
                    pss=server.pss_bytes,
                    pss_age_s=server.pss_age_seconds,
                    rss_peak=server.peak_rss_bytes,
                    pss_peak=server.peak_pss_bytes,
                    history=list(self.history),
                )
            )
        return found


def run_profile(args: argparse.Namespace, stop: threading.Event) -> int:
    import signal
    import subprocess

    from raylens.telemetry import process_memory

    command = list(args.argv)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise CliError(
            "profile needs a command to run, for example: raylens profile -- python train.py"
        )
    if not process_memory.process_tree_memory_supported():
        raise CliError("process-tree memory needs Linux /proc, which this system does not have")
    start_telemetry(args.exporter, as_json=args.json)
    label = " ".join(" ".join(command).split())  # one line, even for a multi-line script
    output = Output(as_json=args.json)
    child = None
    profiler = None
    table = None
    shown = False

    def show(title: str, extra: dict[str, Any] | None = None) -> None:
        nonlocal shown
        if table is None:  # interrupted before the command could be measured
            return
        current = table.rows()
        record: dict[str, Any] = {"time": time.time(), "servers": [r.to_json() for r in current]}
        record.update(extra or {})
        output.show(lambda: process_table(current, title=title), record)
        shown = True

    interrupted = False
    restore_sigterm = raise_on_sigterm()
    try:
        try:
            # With --json, stdout carries samples only: the command's output goes to stderr.
            child = start_command(command, stdout=_STDERR_FD if args.json else None)
        except OSError as error:
            raise CliError(f"cannot run {command[0]!r}: {error.strerror or error}") from None
        target = process_memory.ServerMemoryTarget(
            name=os.path.basename(command[0]), server_type="command", pid=child.pid
        )
        profiler = process_memory.MemoryProfiler(
            [target], args.interval, pss_interval_seconds=args.pss_interval
        )
        table = ProcessTable(profiler, label=label, pid=child.pid)
        profiler.start()
        # Nothing is shown at the start, when the command has barely begun (often not
        # even exec'd) and its figures say nothing: --once shows a sample taken one
        # interval in, the table a fresh one within a second, then one per interval.
        wait = args.interval if args.once else min(args.interval, _FIRST_SHOWN_S)
        fresh = True
        with output.session(live=not args.once):
            while True:
                try:
                    child.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if fresh:
                    profiler.sample_once()
                    fresh = False
                show(f"raylens profile: {label}")
                if args.once:
                    break
                wait = args.interval
        # --once shows one sample; the command still runs to its end, which sets the status.
        returncode = child.wait()
    except KeyboardInterrupt:
        interrupted = True
        returncode = None
        if child is not None:
            returncode = stop_child(child)
            child.end_leftovers()
    except Terminated:
        restore_sigterm()  # a second SIGTERM now ends raylens the default way
        if child is not None:
            terminate_child(child)
        print("raylens: terminated; the profiled command was stopped too", file=sys.stderr)
        return 128 + signal.SIGTERM
    except BaseException:
        if child is not None:
            kill_child(child)  # whatever went wrong, the command is not left behind unwatched
        raise
    finally:
        restore_sigterm()
        if profiler is not None:
            profiler.stop()
    if returncode is None:
        raise KeyboardInterrupt
    status = returncode if returncode >= 0 else 128 - returncode
    if not args.once:
        if returncode < 0:
            name = signal_name(-returncode)
            outcome = f"killed by {name}, exit status {status}"
            extra: dict[str, Any] = {"summary": True, "exit_status": status, "signal": name}
        else:
            outcome = f"exit status {status}"
            extra = {"summary": True, "exit_status": status}
        show(f"Summary: {label} ({outcome})", extra)
    elif not shown:
        show(f"raylens profile: {label}")
    if interrupted:
        raise KeyboardInterrupt
    return status


# At most this long after the start, the profile table shows its first sample.
_FIRST_SHOWN_S = 1.0
