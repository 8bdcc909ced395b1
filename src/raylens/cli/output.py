"""Where the ``raylens`` command writes: tables or JSON lines on stdout, one-line notes, the log.

Everything shown that came from outside (titles, node records, reason phrases) has its
control characters escaped and is never read as markup.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any, TextIO

from rich.console import Console, RenderableType
from rich.live import Live
from rich.text import Text

from raylens.safe_text import printable

# What a shell reports for a writer killed by SIGPIPE: the reader of stdout went away.
PIPE_CLOSED_STATUS = 141


def printable_lines(text: str) -> str:
    """``text`` with control characters escaped line by line, its line breaks kept."""
    return "\n".join(printable(line) for line in text.splitlines())


class _Console(Console):
    """A console that reports a closed pipe to its caller instead of exiting the process."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError


_PIPE_WIDTH = 160


def default_console() -> Console:
    """The terminal; for a pipe or file, ``COLUMNS`` wide or else wide enough not to wrap."""
    console = _Console()
    if console.is_terminal:
        return console
    try:
        width = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        width = _PIPE_WIDTH
    return _Console(width=width if width > 0 else _PIPE_WIDTH)


class Output:
    """Where samples go: a live table on a terminal, tables or JSON lines otherwise.

    When the reader of stdout goes away (``raylens ... | head``), :attr:`closed`
    turns True and everything written later is dropped, so that the command can
    end, or carry on, without a broken-pipe traceback.
    """

    def __init__(self, *, as_json: bool, console: Console | None = None) -> None:
        self.as_json = as_json
        self.console = console or default_console()
        # Python leaves sys.stdout None when raylens starts with file descriptor 1 closed.
        self.closed = sys.stdout is None
        self.display_failed = False
        self._live: Live | None = None
        self._one_line = False

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
    def session(self, live: bool) -> Iterator[Output]:
        """Where a run's samples go: a table redrawn in place on a terminal.

        Outside a terminal (a pipe, a file, a log), a live session writes each
        sample as one line where the caller gives one, rather than a whole table
        per interval; a session that is not live (``--once``) writes its table.
        """
        if live and not self.as_json and self.console.is_terminal:
            with Live(console=self.console, auto_refresh=False, transient=False) as display:
                self._live = display
                try:
                    yield self
                finally:
                    self._live = None
        else:
            self._one_line = live and not self.as_json
            try:
                yield self
            finally:
                self._one_line = False

    def show(
        self,
        render: Callable[[], RenderableType],
        record: dict[str, Any],
        *,
        line: Callable[[], str] | None = None,
    ) -> None:
        """Show one sample: ``render()`` builds its table, ``record`` is its JSON form.

        ``line()`` is its one-line form, written instead of the table by a live
        session outside a terminal. A table that cannot be built or drawn is
        reported once on stderr; from then on every sample is written as its JSON
        line, and the command carries on.
        """
        if self.as_json or self.display_failed:

            def write() -> None:
                sys.stdout.write(json.dumps(record, sort_keys=True) + "\n")
                sys.stdout.flush()

            self._write(write)
            return
        try:
            if self._one_line and line is not None:
                text = Text(line())
                self._write(lambda: self.console.print(text, soft_wrap=True))
                return
            renderable = render()
            if self._live is not None:
                live = self._live
                self._write(lambda: live.update(renderable, refresh=True))
            else:
                self._write(lambda: self.console.print(renderable))
        except Exception as error:  # noqa: BLE001 rich or a value fails: JSON lines
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


def sample_loop(
    sample: Callable[[], None],
    *,
    interval: float,
    once: bool,
    stop: threading.Event,
    duration: float | None = None,
    deadline: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    wake_by: Callable[[], float | None] | None = None,
) -> None:
    """Call ``sample`` now and then every ``interval`` until ``once``, the deadline or ``stop``.

    The deadline is ``deadline`` (a reading of ``clock``) or else ``duration`` seconds
    from now. The first sample is always taken, even past the deadline. ``wake_by``,
    asked after each sample, may bring the next one forward to a reading of ``clock``.
    """
    if deadline is None and duration is not None:
        deadline = clock() + duration
    while True:
        started = clock()
        sample()
        if once:
            return
        wake = started + interval
        sooner = wake_by() if wake_by is not None else None
        if sooner is not None:
            wake = min(wake, sooner)
        if deadline is not None:
            if clock() >= deadline:
                return
            wake = min(wake, deadline)
        if stop.wait(max(0.0, wake - clock())):
            return


class PrintableFormatter(logging.Formatter):
    """Log lines whose outside text (a raylet's reason phrase...) cannot drive the terminal.

    The message is escaped whole, so it stays one line; a traceback line by line.
    """

    def formatMessage(self, record: logging.LogRecord) -> str:
        return printable(super().formatMessage(record))

    def formatException(
        self,
        ei: tuple[type[BaseException], BaseException, TracebackType | None]
        | tuple[None, None, None],
    ) -> str:
        return printable_lines(super().formatException(ei))


class _StderrHandler(logging.StreamHandler):
    """Writes each record to ``sys.stderr`` as it is when the record is emitted."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    # configure_logging knows its own handler by this mark, also one made before a reload.
    _raylens_cli = True

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        pass


def configure_logging(*, verbose: bool) -> None:
    """Tables already show failing nodes, so warnings go to stderr only with --verbose."""
    log = logging.getLogger("raylens")
    if not any(getattr(h, "_raylens_cli", False) for h in log.handlers):
        handler = _StderrHandler()
        handler.setFormatter(PrintableFormatter("raylens: %(levelname)s: %(message)s"))
        log.addHandler(handler)
    log.setLevel(logging.WARNING if verbose else logging.ERROR)
