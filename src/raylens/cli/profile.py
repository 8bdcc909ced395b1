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
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from raylens.cli.output import Output
from raylens.cli.parser import CliError
from raylens.cli.pipeline import start_telemetry
from raylens.cli.sample_lines import process_line
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

if TYPE_CHECKING:
    from raylens.telemetry.process_memory import MemoryProfiler, ProcFS

# How many RSS samples the trend keeps.
_HISTORY = 24
_STDERR_FD = 2


def pss_max_age(interval: float, pss_interval: float | None) -> float:
    """How old a PSS reading may be, in seconds, before it is shown as stale.

    PSS is due every ``pss_interval`` (every sample when None) but is only read
    on a sample, and a sample is shown up to one ``interval`` after it is taken:
    a reading older than its interval plus one sample interval was not renewed
    when it should have been.
    """
    return (interval if pss_interval is None else pss_interval) + interval


def children_peak_rss(before_kib: int) -> int | None:
    """The largest peak RSS, in bytes, of any one process this process has waited for.

    ``getrusage(RUSAGE_CHILDREN).ru_maxrss`` (KiB on Linux) covers every child
    reaped so far and the descendants each of them reaped. It is a peak of one
    process, never a sum. ``before_kib`` is its value before the command
    started: unless the command raised it, the figure may belong to an earlier
    child, so None (unknown) is returned.
    """
    import resource

    after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return after * 1024 if after > before_kib else None


class ProcessTable:
    """Turns a profiler's samples into table rows, with a short RSS trend.

    :meth:`take` samples the tree and returns rows stamped with that sample's own
    time, so that a record holds what the tree held when it says; :meth:`rows`
    shows the latest sample again (the summary, once the command has ended).

    Beside the profiler's sampled peaks, each row carries the kernel's own peak:
    while the command runs, the largest ``VmHWM`` read from its live processes
    (kept, so that it never falls when a process exits); once it has ended, the
    ``getrusage`` figure given to :meth:`command_ended`. A PSS older than
    ``pss_max_age_s`` at the time of showing (``clock``, the profiler's clock) is
    shown as stale instead of as a current value.
    """

    def __init__(
        self,
        profiler: MemoryProfiler,
        *,
        label: str,
        pid: int,
        procfs: ProcFS | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] | None = None,
        pss_max_age_s: float | None = None,
    ) -> None:
        self.profiler = profiler
        # Looked up at each call by default, so that a frozen clock in a test applies.
        self.wall = wall or (lambda: time.time())
        self.label = label
        self.pid = pid
        self.history: list[float] = []
        self.procfs = procfs
        self.clock = clock
        self.pss_max_age_s = pss_max_age_s
        self.kernel_peak: int | None = None
        self.kernel_peak_source: str | None = None
        self.ended = False

    def command_ended(self, *, children_peak_rss: int | None) -> None:
        """The command was reaped: stop reading its pid, report ``getrusage``'s peak if known."""
        self.ended = True
        if children_peak_rss is not None:
            self.kernel_peak = max(children_peak_rss, self.kernel_peak or 0)
            self.kernel_peak_source = "ru_maxrss"
        else:  # what the live processes showed is all that is known
            self.kernel_peak_source = None if self.kernel_peak is None else "VmHWM"

    def _read_kernel_peak(self) -> None:
        if self.ended or self.procfs is None:
            return
        peak = self.procfs.tree_peak_rss(self.pid)
        if peak is not None and (self.kernel_peak is None or peak > self.kernel_peak):
            self.kernel_peak, self.kernel_peak_source = peak, "VmHWM"

    def take(self) -> tuple[list[ProcessTreeRow], float | None]:
        """Sample the tree now; its rows and the sample's Unix time (None without a sample)."""
        self.profiler.sample_once()
        return self.rows(), self.sampled_at()

    def sampled_at(self) -> float | None:
        """The Unix time of the profiler's latest sample, or None before the first."""
        snapshot = self.profiler.latest()
        if snapshot is None:
            return None
        return self.wall() - max(0.0, self.clock() - snapshot.taken_at)

    def rows(self) -> list[ProcessTreeRow]:
        self._read_kernel_peak()
        snapshot = self.profiler.latest()
        lag = 0.0 if snapshot is None else max(0.0, self.clock() - snapshot.taken_at)
        found = []
        for server in snapshot.servers if snapshot is not None else ():
            if server.rss_bytes is not None:
                self.history.append(server.rss_bytes)
                del self.history[:-_HISTORY]
            age = None if server.pss_age_seconds is None else server.pss_age_seconds + lag
            stale = age is not None and self.pss_max_age_s is not None and age > self.pss_max_age_s
            found.append(
                ProcessTreeRow(
                    name=self.label,
                    pid=self.pid,
                    processes=server.process_count or 0,
                    rss=server.rss_bytes,
                    pss=None if stale else server.pss_bytes,
                    pss_age_s=age,
                    rss_peak=server.peak_rss_bytes,
                    pss_peak=server.peak_pss_bytes,
                    history=list(self.history),
                    kernel_peak=self.kernel_peak,
                    kernel_peak_source=self.kernel_peak_source,
                    pss_stale=stale,
                )
            )
        return found


def run_profile(args: argparse.Namespace, stop: threading.Event) -> int:
    import resource
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

    def show(title: str, extra: dict[str, Any] | None = None, *, fresh: bool = True) -> None:
        nonlocal shown
        if table is None:  # interrupted before the command could be measured
            return
        # A fresh sample, stamped with its own time: a record holds the tree as it was then.
        current, stamp = table.take() if fresh else (table.rows(), table.sampled_at())
        record: dict[str, Any] = {
            "time": time.time() if stamp is None else stamp,
            "servers": [r.to_json() for r in current],
        }
        record.update(extra or {})
        output.show(
            lambda: process_table(current, title=title),
            record,
            line=lambda: process_line(current, title=title),
        )
        shown = True

    interrupted = False
    restore_sigterm = raise_on_sigterm()
    children_peak_before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
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
        table = ProcessTable(
            profiler,
            label=label,
            pid=child.pid,
            procfs=process_memory.ProcFS(),
            pss_max_age_s=pss_max_age(args.interval, args.pss_interval),
        )
        # The profiler is not started: its samples are the ones shown, each taken when
        # it is shown, one per interval as its own thread would take them.
        profiler.sample_once()
        # Nothing is shown at the start, when the command has barely begun (often not
        # even exec'd) and its figures say nothing: --once shows a sample taken one
        # interval in, the table one within a second, then one per interval.
        wait = args.interval if args.once else min(args.interval, _FIRST_SHOWN_S)
        with output.session(live=not args.once):
            while True:
                try:
                    child.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    pass
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
    except BaseException:  # signal path: a SystemExit or a second signal mid-run included
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
    if table is not None:
        table.command_ended(children_peak_rss=children_peak_rss(children_peak_before))
    if not args.once:
        if returncode < 0:
            name = signal_name(-returncode)
            outcome = f"killed by {name}, exit status {status}"
            extra: dict[str, Any] = {"summary": True, "exit_status": status, "signal": name}
        else:
            outcome = f"exit status {status}"
            extra = {"summary": True, "exit_status": status}
        show(f"Summary: {label} ({outcome})", extra, fresh=False)
    elif not shown:
        show(f"raylens profile: {label}", fresh=False)
    if interrupted:
        raise KeyboardInterrupt
    return status


# At most this long after the start, the profile table shows its first sample.
_FIRST_SHOWN_S = 1.0
