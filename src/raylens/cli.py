"""The ``raylens`` command: a cluster's memory, live, in one command.

``demo``      a local multi-node Ray cluster with two worker groups, and its memory table
``watch``     the same table for a running cluster
``simulate``  the same table over a simulated cluster (no Ray needed)
``profile``   a command's process-tree memory (RSS, PSS, peaks) while it runs

Every command feeds the OpenTelemetry pipeline chosen with ``--exporter`` (or
``RAYLENS_EXPORTER``) at the same time. Errors a user can cause print one line
and exit with status 2; Ctrl-C exits with 130 after cleaning up, and a reader of
stdout that goes away (``| head``) ends watch, simulate and demo with 141.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.text import Text

import raylens
from raylens.lens import (
    EXPORTERS,
    ConsoleLineExporter,
    TelemetryConfig,
    init_telemetry,
    shutdown_telemetry,
)
from raylens.lens.safe_text import printable
from raylens.live_table import NodeRow, ProcessTreeRow, node_table, process_table

_HISTORY = 24

# What a shell reports for a writer killed by SIGPIPE: the reader of stdout went away.
PIPE_CLOSED_STATUS = 141
_STDERR_FD = 2


class CliError(Exception):
    """A problem the user can fix: printed as one line, exit status 2."""

    exit_code = 2


# --------------------------------------------------------------------------- flags


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    # Waits longer than TIMEOUT_MAX overflow the platform's timers.
    if not math.isfinite(value) or value <= 0 or value > threading.TIMEOUT_MAX:
        raise argparse.ArgumentTypeError(
            f"must be a positive number of seconds up to {threading.TIMEOUT_MAX:.0f}, got {text!r}"
        )
    return value


def _count(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {text!r}")
        return value

    return parse


def _add_common(parser: argparse.ArgumentParser, *, interval: float, duration: bool = True) -> None:
    if duration:
        parser.add_argument(
            "--duration",
            type=_positive_seconds,
            default=None,
            help="stop after this many seconds (default: run until Ctrl-C)",
        )
    parser.add_argument(
        "--interval",
        type=_positive_seconds,
        default=interval,
        help=f"seconds between samples (default {interval:g})",
    )
    parser.add_argument(
        "--exporter",
        choices=EXPORTERS,
        default=None,
        help="OpenTelemetry exporter for this run (default: RAYLENS_EXPORTER, else none)",
    )


def _add_script_flags(
    parser: argparse.ArgumentParser, *, once_help: str = "take one sample, print it, exit"
) -> None:
    parser.add_argument("--once", action="store_true", help=once_help)
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object per sample instead of a table"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="raylens",
        description="See where host memory goes on a Ray cluster, and export it via OpenTelemetry.",
    )
    parser.add_argument("--version", action="version", version=f"raylens {raylens.__version__}")
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="log raylens' warnings (a node that cannot be scraped...) to stderr",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = commands.add_parser(
        "demo",
        help="start a local multi-node Ray cluster with two worker groups and watch its memory",
    )
    demo.add_argument("--nodes", type=_count(2), default=3, help="Ray nodes to start (default 3)")
    _add_common(demo, interval=2.0)
    demo.set_defaults(handler=_run_demo)

    watch = commands.add_parser("watch", help="watch the memory of a running Ray cluster")
    watch.add_argument(
        "--address",
        default=None,
        help="Ray cluster address (default: RAY_ADDRESS, else auto)",
    )
    _add_common(watch, interval=5.0)
    _add_script_flags(watch)
    watch.set_defaults(handler=_run_watch)

    simulate = commands.add_parser(
        "simulate", help="watch a simulated cluster of fake raylets (no Ray needed)"
    )
    simulate.add_argument("--nodes", type=_count(1), default=8, help="simulated nodes (default 8)")
    simulate.add_argument(
        "--hung", type=_count(0), default=0, help="how many nodes never answer (default 0)"
    )
    simulate.add_argument(
        "--scrape-timeout",
        type=_positive_seconds,
        default=None,
        help="deadline for one node's scrape (default: the interval, at most 5 s)",
    )
    _add_common(simulate, interval=1.0)
    _add_script_flags(simulate)
    simulate.set_defaults(handler=_run_simulate)

    profile = commands.add_parser(
        "profile", help="run a command and sample its process tree's memory while it runs"
    )
    _add_common(profile, interval=1.0, duration=False)
    profile.add_argument(
        "--pss-interval",
        type=_positive_seconds,
        default=None,
        help="read PSS (costly for big processes) at most this often (default: every sample)",
    )
    _add_script_flags(
        profile,
        once_help="print one sample, taken after one interval, then wait for the command "
        "to end without printing more",
    )
    profile.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARGS...]")
    profile.set_defaults(handler=_run_profile)
    return parser


# --------------------------------------------------------------------------- telemetry


def _start_telemetry(exporter: str | None, *, as_json: bool = False) -> None:
    """Start lens; with ``--json`` the console exporter writes to stderr, stdout is for samples."""
    try:
        config = TelemetryConfig.from_env()
        if exporter is not None:
            config = dataclasses.replace(config, exporter=exporter)
        reader = None
        if as_json and config.enabled and config.exporter == "console":
            from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

            reader = PeriodicExportingMetricReader(
                ConsoleLineExporter(sys.stderr),
                export_interval_millis=config.export_interval_ms,
            )
        init_telemetry(config, metric_reader=reader)
    except (ValueError, RuntimeError) as error:
        raise CliError(str(error)) from None


def _scrape_timeout_for(interval: float) -> float:
    """A node's scrape deadline: the monitor's default, but never longer than the refresh."""
    from raylens.telemetry.host_memory import _SCRAPE_TIMEOUT_S

    return min(_SCRAPE_TIMEOUT_S, interval)


def _stop_monitoring(monitor: Any) -> None:
    """Stop sampling, then flush telemetry while the cluster and its labels still exist."""
    monitor.stop()
    shutdown_telemetry()


# --------------------------------------------------------------------------- output


def printable_lines(text: str) -> str:
    """``text`` with control characters escaped line by line, its line breaks kept."""
    return "\n".join(printable(line) for line in text.splitlines())


class _Console(Console):
    """A console that reports a closed pipe to its caller instead of exiting the process."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError


_PIPE_WIDTH = 160


def _default_console() -> Console:
    """The terminal; for a pipe or file, ``COLUMNS`` wide or else wide enough not to wrap."""
    console = _Console()
    if console.is_terminal:
        return console
    try:
        width = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        width = _PIPE_WIDTH
    return _Console(width=width if width > 0 else _PIPE_WIDTH)


class _Output:
    """Where samples go: a live table on a terminal, tables or JSON lines otherwise.

    When the reader of stdout goes away (``raylens ... | head``), :attr:`closed`
    turns True and everything written later is dropped, so that the command can
    end, or carry on, without a broken-pipe traceback.
    """

    def __init__(self, *, as_json: bool, console: Console | None = None) -> None:
        self.as_json = as_json
        self.console = console or _default_console()
        self.closed = False
        self.display_failed = False
        self._live: Live | None = None

    def _write(self, action: Callable[[], None]) -> None:
        if self.closed:
            return
        try:
            action()
        except BrokenPipeError:
            self.closed = True
            # Point stdout at /dev/null so that the flush at exit does not fail as well.
            try:
                devnull = os.open(os.devnull, os.O_WRONLY)
                try:
                    os.dup2(devnull, sys.stdout.fileno())
                finally:
                    os.close(devnull)
            except (OSError, ValueError):
                pass

    @contextmanager
    def session(self, live: bool) -> Iterator[_Output]:
        if live and not self.as_json and self.console.is_terminal:
            with Live(console=self.console, auto_refresh=False, transient=False) as display:
                self._live = display
                try:
                    yield self
                finally:
                    self._live = None
        else:
            yield self

    def show(self, render: Callable[[], Any], record: dict[str, Any]) -> None:
        """Show one sample: ``render()`` builds its table, ``record`` is its JSON form.

        A table that cannot be built or drawn is reported once on stderr; from then
        on every sample is written as its JSON line, and the command carries on.
        """
        if self.as_json or self.display_failed:

            def write() -> None:
                sys.stdout.write(json.dumps(record, sort_keys=True) + "\n")
                sys.stdout.flush()

            self._write(write)
            return
        try:
            renderable = render()
            if self._live is not None:
                live = self._live
                self._write(lambda: live.update(renderable, refresh=True))
            else:
                self._write(lambda: self.console.print(renderable))
        except Exception as error:
            self._display_failed(error)
            self.show(render, record)

    def _display_failed(self, error: Exception) -> None:
        self.display_failed = True
        if self._live is not None:
            # So that leaving the live display does not draw the failing table again.
            with contextlib.suppress(Exception):
                self._live.update(Text(""), refresh=False)
        print(
            f"raylens: cannot draw the table ({printable(error)}); "
            "writing each sample as a JSON line instead",
            file=sys.stderr,
        )

    def note(self, message: str) -> None:
        if self.as_json:
            print(printable_lines(message), file=sys.stderr)
        else:
            self._write(lambda: self.console.print(Text(printable_lines(message))))

    def exit_status(self) -> int:
        """0, or :data:`PIPE_CLOSED_STATUS` when the reader of stdout went away."""
        return PIPE_CLOSED_STATUS if self.closed else 0


def _sample_loop(
    sample: Callable[[], None],
    *,
    interval: float,
    once: bool,
    duration: float | None,
    stop: threading.Event,
) -> None:
    """Call ``sample`` now and then every ``interval`` until ``once``, ``duration`` or ``stop``."""
    deadline = None if duration is None else time.monotonic() + duration
    while True:
        started = time.monotonic()
        sample()
        if once:
            return
        wake = started + interval
        if deadline is not None:
            if time.monotonic() >= deadline:
                return
            wake = min(wake, deadline)
        if stop.wait(max(0.0, wake - time.monotonic())):
            return


# --------------------------------------------------------------------------- host memory


class _NodeTable:
    """Turns the monitor's latest samples into table rows, with a short trend per node."""

    def __init__(self, monitor: Any, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.monitor = monitor
        self.clock = clock
        self.history: dict[str, list[float]] = {}

    def rows(self) -> list[NodeRow]:
        now = self.clock()
        rows = []
        seen = set()
        for sample in self.monitor.latest():
            seen.add(sample.node_id)
            history = self.history.setdefault(sample.node_id, [])
            if sample.error is None and sample.used is not None:
                history.append(sample.used)
                del history[:-_HISTORY]
            rows.append(
                NodeRow(
                    node_id=sample.node_id,
                    host=sample.host,
                    used=sample.used,
                    total=sample.total,
                    worker_groups=sample.worker_groups,
                    age_s=None if sample.sampled_at is None else max(0.0, now - sample.sampled_at),
                    error=sample.error,
                    history=list(history),
                )
            )
        for gone in set(self.history) - seen:
            del self.history[gone]
        return rows


def _watch_nodes(
    monitor: Any,
    args: argparse.Namespace,
    *,
    output: _Output,
    title: str,
    stop: threading.Event,
) -> None:
    """Sample and show the node table every ``args.interval`` until --once, --duration or stop."""
    table = _NodeTable(monitor)
    interval, duration = args.interval, args.duration
    once = getattr(args, "once", False)

    def sample() -> None:
        monitor.collect_once()
        rows = table.rows()
        record = {"time": time.time(), "nodes": [row.to_json() for row in rows]}
        output.show(lambda: node_table(rows, title=title), record)
        if output.closed:
            stop.set()

    with output.session(live=not once):
        _sample_loop(sample, interval=interval, once=once, duration=duration, stop=stop)


_GIB = 1024**3


def _simulated_memory(node_index: int, t: float) -> tuple[float, float]:
    """A gentle, node-specific wave: 64 GiB hosts between 20% and 80% used."""
    total = 64 * _GIB
    phase = node_index * 0.7
    used = total * (0.5 + 0.3 * math.sin(t / 6.0 + phase))
    return used, total


def _run_simulate(args: argparse.Namespace, stop: threading.Event) -> int:
    if args.hung > args.nodes:
        raise CliError(f"--hung {args.hung} is more than --nodes {args.nodes}")
    from raylens.telemetry import host_memory
    from raylens_fakes.simulated import SimulatedCluster

    _start_telemetry(args.exporter, as_json=args.json)
    scrape_timeout = args.scrape_timeout or _scrape_timeout_for(args.interval)
    output = _Output(as_json=args.json)
    with SimulatedCluster(args.nodes, schedule=_simulated_memory) as simulated:
        for index in range(args.hung):
            simulated.raylet(args.nodes - 1 - index).hang()
        node_ids = simulated.node_ids
        host_memory.register_worker_group_nodes("policy", node_ids[: max(1, len(node_ids) // 2)])
        host_memory.register_worker_group_nodes("rollout", node_ids[len(node_ids) // 2 :])
        monitor = host_memory.HostMemoryMonitor(
            args.interval, cluster=simulated.cluster, scrape_timeout=scrape_timeout
        )
        try:
            _watch_nodes(
                monitor,
                args,
                output=output,
                title=f"Simulated cluster: {args.nodes} nodes, {args.hung} hung",
                stop=stop,
            )
        finally:
            _stop_monitoring(monitor)
            host_memory.forget_worker_group_nodes("policy")
            host_memory.forget_worker_group_nodes("rollout")
    return output.exit_status()


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise CliError(
            "Ray is not installed; install it with: pip install 'raylens[ray]'"
        ) from None
    return ray


# A client's HTTP/2 greeting, then an empty SETTINGS frame; a gRPC server answers with
# a SETTINGS frame of its own, whose 9-byte header has type 0x04 at index 3.
_HTTP2_GREETING = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_HTTP2_FRAME_HEADER = 9
_HTTP2_SETTINGS = 0x04


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    """Fail fast on a ``host:port`` that is not a Ray cluster; ``ray.init`` would retry for minutes.

    A cluster's address is its GCS, a gRPC server, which answers an HTTP/2
    greeting with its settings. A port nobody listens on, one that stays silent,
    or one that speaks something else (the dashboard's HTTP, say) is refused
    here. With ``RAY_USE_TLS`` the greeting would have to be encrypted, so only
    the connection is checked. ``auto`` and ``ray://`` addresses are left to Ray,
    which answers those quickly.
    """
    import socket

    from raylens.lens.config import parse_host_port

    if address == "auto" or "://" in address:
        return
    try:
        host, port = parse_host_port(address, source="--address")
    except ValueError as error:
        raise CliError(str(error)) from None
    tls = os.environ.get("RAY_USE_TLS", "0").strip().lower() in ("1", "true")
    answer = b""
    try:
        with socket.create_connection((host, port), timeout=timeout) as connection:
            if tls:
                return
            connection.sendall(_HTTP2_GREETING)
            while len(answer) < _HTTP2_FRAME_HEADER:
                chunk = connection.recv(_HTTP2_FRAME_HEADER - len(answer))
                if not chunk:
                    break
                answer += chunk
    except TimeoutError:
        raise CliError(
            f"cannot reach a Ray cluster at {address!r}: no answer within {timeout:g} s"
        ) from None
    except OSError as error:
        if not answer:  # one that answered, then hung up, is judged by its answer below
            reason = error.strerror or str(error) or type(error).__name__
            raise CliError(f"cannot reach a Ray cluster at {address!r}: {reason}") from None
    if len(answer) < _HTTP2_FRAME_HEADER or answer[3] != _HTTP2_SETTINGS:
        raise CliError(
            f"cannot reach a Ray cluster at {address!r}: something listens there, but it is "
            "not a Ray GCS (give the cluster's GCS address, port 6379 by default, not the "
            "dashboard's or the Ray Client's)"
        )


def _run_watch(args: argparse.Namespace, stop: threading.Event) -> int:
    ray = _import_ray()
    address = args.address or os.environ.get("RAY_ADDRESS") or "auto"
    from raylens.telemetry import host_memory

    _check_reachable(address)
    _start_telemetry(args.exporter, as_json=args.json)
    try:
        ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    except Exception as error:  # Ray raises ConnectionError, RuntimeError, ValueError...
        first_line = (
            str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        )
        raise CliError(f"cannot reach a Ray cluster at {address!r}: {first_line}") from None
    monitor = host_memory.HostMemoryMonitor(
        args.interval, scrape_timeout=_scrape_timeout_for(args.interval)
    )
    output = _Output(as_json=args.json)
    try:
        _watch_nodes(
            monitor,
            args,
            output=output,
            title=f"Ray host memory at {address}",
            stop=stop,
        )
    finally:
        _stop_monitoring(monitor)
        ray.shutdown()
    return output.exit_status()


def _run_demo(args: argparse.Namespace, stop: threading.Event) -> int:
    _import_ray()
    from raylens import demo

    _start_telemetry(args.exporter)
    output = _Output(as_json=False)
    output.note(f"Starting a local Ray cluster of {args.nodes} nodes (about 15 s)...")
    with demo.DemoCluster(args.nodes) as cluster:
        output.note(cluster.describe())
        from raylens.telemetry import host_memory

        monitor = host_memory.HostMemoryMonitor(
            args.interval, scrape_timeout=_scrape_timeout_for(args.interval)
        )
        try:
            _watch_nodes(
                monitor,
                args,
                output=output,
                title=f"raylens demo: {args.nodes} Ray nodes, worker groups policy and rollout",
                stop=stop,
            )
        finally:
            _stop_monitoring(monitor)
    output.note("Demo finished; the Ray cluster is shut down.")
    return output.exit_status()


# --------------------------------------------------------------------------- profile


class _ProcessTable:
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


def _run_profile(args: argparse.Namespace, stop: threading.Event) -> int:
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
    _start_telemetry(args.exporter, as_json=args.json)
    label = " ".join(" ".join(command).split())  # one line, even for a multi-line script
    output = _Output(as_json=args.json)
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
    restore_sigterm = _raise_on_sigterm()
    try:
        try:
            # With --json, stdout carries samples only: the command's output goes to stderr.
            child = subprocess.Popen(command, stdout=_STDERR_FD if args.json else None)
        except OSError as error:
            raise CliError(f"cannot run {command[0]!r}: {error.strerror or error}") from None
        target = process_memory.ServerMemoryTarget(
            name=os.path.basename(command[0]), server_type="command", pid=child.pid
        )
        profiler = process_memory.MemoryProfiler(
            [target], args.interval, pss_interval_seconds=args.pss_interval
        )
        table = _ProcessTable(profiler, label=label, pid=child.pid)
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
        returncode = None if child is None else _stop_child(child)
    except _Terminated:
        restore_sigterm()  # a second SIGTERM now ends raylens the default way
        if child is not None and child.poll() is None:
            child.terminate()
            try:
                child.wait(timeout=_TERMINATE_GRACE_S)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        print("raylens: terminated; the profiled command was stopped too", file=sys.stderr)
        return 128 + signal.SIGTERM
    except BaseException:
        if child is not None and child.poll() is None:
            child.kill()  # whatever went wrong, the command is not left behind unwatched
            child.wait()
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
            name = _signal_name(-returncode)
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


class _Terminated(Exception):
    """SIGTERM arrived while a command was being profiled."""


def _raise_on_sigterm() -> Callable[[], None]:
    """Turn SIGTERM into :class:`_Terminated` so profile can stop its command; returns the undo.

    Without it, ``timeout 60 raylens profile -- cmd`` would end raylens and leave
    ``cmd`` running, unwatched. Signal handlers belong to the main thread; elsewhere
    this does nothing.
    """
    import signal

    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum: int, frame: Any) -> None:
        raise _Terminated

    previous = signal.signal(signal.SIGTERM, handler)
    return lambda: signal.signal(signal.SIGTERM, previous)


def _signal_name(number: int) -> str:
    import signal

    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


# At most this long after the start, the profile table shows its first sample.
_FIRST_SHOWN_S = 1.0

# How long the command has to end by itself after Ctrl-C, then after SIGTERM.
_INTERRUPT_GRACE_S = 10.0
_TERMINATE_GRACE_S = 5.0


def _terminal_interrupted(child: Any) -> bool:
    """True when a Ctrl-C typed in our terminal has reached ``child`` as well.

    The terminal interrupts its whole foreground process group: that covers the
    command when this process is in that group and the command has not moved to
    a group of its own.
    """
    try:
        tty = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:
        return False
    try:
        group = os.getpgrp()
        return os.tcgetpgrp(tty) == group and os.getpgid(child.pid) == group
    except OSError:
        return False
    finally:
        os.close(tty)


def _stop_child(
    child: Any,
    *,
    forward: bool | None = None,
    interrupt_grace_s: float = _INTERRUPT_GRACE_S,
    terminate_grace_s: float = _TERMINATE_GRACE_S,
) -> int:
    """Stop the profiled command after Ctrl-C; returns its ``returncode``.

    The command gets the interrupt (forwarded unless ``forward`` is False; by
    default only when the terminal did not already deliver it) and
    ``interrupt_grace_s`` to wind down as it would without raylens, then SIGTERM
    and ``terminate_grace_s``, then SIGKILL. Another Ctrl-C kills it at once.
    """
    import signal
    import subprocess

    if child.poll() is not None:
        return child.returncode
    try:
        if forward is None:
            forward = not _terminal_interrupted(child)
        if forward:
            child.send_signal(signal.SIGINT)
        print(
            f"raylens: waiting up to {interrupt_grace_s:g} s for the command to end "
            "(Ctrl-C again to kill it)",
            file=sys.stderr,
        )
        try:
            return child.wait(timeout=interrupt_grace_s)
        except subprocess.TimeoutExpired:
            child.terminate()
        try:
            return child.wait(timeout=terminate_grace_s)
        except subprocess.TimeoutExpired:
            pass
    except KeyboardInterrupt:
        pass
    child.kill()
    return child.wait()


# --------------------------------------------------------------------------- main


class _PrintableFormatter(logging.Formatter):
    """Log lines whose outside text (a raylet's reason phrase...) cannot drive the terminal.

    The message is escaped whole, so it stays one line; a traceback line by line.
    """

    def formatMessage(self, record: logging.LogRecord) -> str:
        return printable(super().formatMessage(record))

    def formatException(self, ei: Any) -> str:
        return printable_lines(super().formatException(ei))


def _configure_logging(*, verbose: bool) -> None:
    """Tables already show failing nodes, so warnings go to stderr only with --verbose."""
    log = logging.getLogger("raylens")
    if not any(getattr(h, "_raylens_cli", False) for h in log.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_PrintableFormatter("raylens: %(levelname)s: %(message)s"))
        handler._raylens_cli = True  # type: ignore[attr-defined]
        log.addHandler(handler)
    log.setLevel(logging.WARNING if verbose else logging.ERROR)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``raylens`` command; returns the process exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    _configure_logging(verbose=args.verbose)
    stop = threading.Event()
    try:
        return args.handler(args, stop)
    except CliError as error:
        print(f"raylens: error: {printable(str(error))}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        stop.set()
        print("raylens: interrupted", file=sys.stderr)
        return 130
    finally:
        shutdown_telemetry()


if __name__ == "__main__":
    sys.exit(main())
