"""The JSON-lines log of phases (``RAYLENS_PHASE_LOG``): one line per phase, kept bounded.

:class:`PhaseLog` appends :meth:`~raylens.telemetry.phases.memory.PhaseRecord.to_json` lines.
Invariants a maintainer must keep:

- the file is created private to the user (mode 0600, never wider whatever the umask);
- it is opened once and kept open across phases; it is opened again only when the path
  no longer names the file held (moved or deleted by a log rotator) or after a failure;
- it never grows past :data:`MAX_PHASE_LOG_BYTES`: the line that would take it past is
  written to a fresh file, the full one moved to ``<path>.1`` (replacing the one before),
  so the two together hold at most twice the bound plus one line;
- appending never raises into the job: a failure is logged once per path.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import threading

from raylens.lens import warn_once
from raylens.safe_text import printable
from raylens.telemetry.phases.memory import PhaseRecord, phase_log_line

__all__ = ["MAX_PHASE_LOG_BYTES", "PHASE_LOG_MODE", "PhaseLog", "say_phase_summary"]

logger = logging.getLogger("raylens.phases")

MAX_PHASE_LOG_BYTES = 16 * 1024 * 1024
"""The size at which the log is moved to ``<path>.1`` and a fresh one begun."""
PHASE_LOG_MODE = 0o600
"""The permissions the log is created with: readable and writable by its owner only."""
_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)


class PhaseLog:
    """Appends one JSON line per phase to ``path`` (see the module docstring). Never raises.

    ``max_bytes`` bounds one file (default :data:`MAX_PHASE_LOG_BYTES`). Thread-safe.
    """

    def __init__(self, path: str | os.PathLike[str], max_bytes: int = MAX_PHASE_LOG_BYTES) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
            raise ValueError(f"max_bytes must be an int of at least 1, got {max_bytes!r:.80}")
        self.path = os.fspath(path)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._identity: tuple[int, int] | None = None
        self._size = 0

    def append(self, record: PhaseRecord) -> None:
        data = (json.dumps(record.to_json(), separators=(",", ":")) + "\n").encode()
        try:
            with self._lock:
                fd = self._held()
                if self._size and self._size + len(data) > self.max_bytes:
                    self._rotate()
                    fd = self._held()
                self._write(fd, data)
        except OSError as error:
            with self._lock:
                self._close()
            warn_once(
                f"phase_memory.log.{printable(self.path[:120])}",
                f"could not append the phase table to {printable(self.path[:200])!r} "
                f"({printable(error)}); phases are still logged and exported (warned once)",
                logger=logger,
            )

    def close(self) -> None:
        """Close the file held, if any; the next :meth:`append` opens it again."""
        with self._lock:
            self._close()

    def _held(self) -> int:
        """The open file, opened now if none is held or the path names another file."""
        if self._fd is not None:
            try:
                stat = os.stat(self.path)
                moved = (stat.st_dev, stat.st_ino) != self._identity
            except FileNotFoundError:
                moved = True
            if not moved:
                return self._fd
            self._close()
        fd = os.open(self.path, _FLAGS, PHASE_LOG_MODE)
        stat = os.fstat(fd)
        self._fd, self._identity, self._size = fd, (stat.st_dev, stat.st_ino), stat.st_size
        return fd

    def _rotate(self) -> None:
        os.replace(self.path, f"{self.path}.1")
        self._close()

    def _write(self, fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        self._size += len(data)

    def _close(self) -> None:
        fd, self._fd, self._identity = self._fd, None, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                logger.debug("could not close the phase log", exc_info=True)

    def __del__(self) -> None:
        fd = getattr(self, "_fd", None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def say_phase_summary(record: PhaseRecord) -> None:
    """Log ``record``'s one-line summary at INFO on ``raylens.phases``, or on stderr.

    A driver that configured no logging has no handler on the way up from this logger,
    and Python would drop an INFO line: such a driver sees the summary on stderr, as it
    sees raylens' warnings. A driver with logging set up decides through it.
    """
    line = phase_log_line(record)
    if logger.hasHandlers():
        logger.info("%s", line)
        return
    with contextlib.suppress(OSError, ValueError):  # a closed pipe, a closed stream
        print(f"raylens: {line}", file=sys.stderr, flush=True)
