"""The scrape helper: the engine run in a child process, so the driver only gets numbers.

The driver's Python thread is the one the whole job waits on. In helper mode
(the default) the monitor spawns one child process with :mod:`multiprocessing`'s
*spawn* context, never *fork* (a driver holds Ray and CUDA state a forked child
must not inherit). Each cycle the driver sends ``(key, url)`` pairs over a pipe
and receives ``{key: Outcome}``: connecting, reading and parsing all happen in
the child's :class:`~._scrape_engine.AsyncScrapeEngine`.

Lifetime: the child polls its parent's pid and exits as soon as the driver is
gone, SIGKILL included. The driver reaps a child that ended (no zombie), starts a
new one on the next cycle with one warning when the last one crashed, and
:meth:`HelperEngine.close` ends it within a bound, killing it if it must.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Hashable, Iterator, Sequence
from multiprocessing.connection import Connection
from typing import Any

from raylens.lens import warn_once
from raylens.telemetry._names import ERROR_INTERNAL, LOGGER_NAME
from raylens.telemetry._scrape_engine import (
    BATCH_SLACK_S,
    AsyncScrapeEngine,
    Job,
    Outcome,
    ScrapeLimits,
)

__all__ = ["HELPER_GONE", "HelperEngine"]

logger = logging.getLogger(LOGGER_NAME)

#: Error of the nodes whose answers were lost because the helper died mid-cycle.
HELPER_GONE = "the scrape helper process exited before answering"
_PARENT_POLL_S = 0.2
_POLL_SLICE_S = 0.05
#: How long past the deadline the helper waits for answers on their way; the driver
#: waits :data:`BATCH_SLACK_S` past it, which leaves the rest for the trip back.
_HELPER_SLACK_S = 0.05
#: How long the first cycle may wait for a freshly spawned helper to say it is ready.
_START_TIMEOUT_S = 20.0
#: After this many helpers in a row fail to start, scrape() raises and the monitor
#: falls back to scraping in-process.
_MAX_FAILED_STARTS = 2


def _watch_parent(parent_pid: int) -> None:
    """Exit this process as soon as its parent is gone (reparented to someone else)."""
    while True:
        if os.getppid() != parent_pid:
            os._exit(0)
        time.sleep(_PARENT_POLL_S)  # a watchdog's polling period, not synchronisation


def helper_main(conn: Connection, parent_pid: int, limits: ScrapeLimits) -> None:
    """Entry point of the helper process: answer scrape requests until told to stop.

    Messages in: ``("scrape", batch id, jobs, absolute monotonic deadline)`` and
    ``("stop",)``. Messages out: ``("ready",)`` once, then ``("result", batch id,
    results)`` per batch. The pipe closing (EOF) also ends it.
    """
    threading.Thread(
        target=_watch_parent, args=(parent_pid,), name="raylens-helper-watchdog", daemon=True
    ).start()
    engine = AsyncScrapeEngine(limits)
    try:
        conn.send(("ready",))
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                return
            if message[0] != "scrape":
                return
            _, batch, jobs, deadline = message
            seconds = deadline - time.monotonic()
            if seconds <= 0:
                results: dict[Hashable, Outcome] = {}
            else:
                results = engine.scrape(jobs, seconds, _HELPER_SLACK_S)
            try:
                conn.send(("result", batch, results))
            except (EOFError, OSError):
                return
    finally:
        engine.close(0.5)


@contextlib.contextmanager
def _main_module_hidden() -> Iterator[None]:
    """Keep the spawned child from importing the driver's ``__main__`` script.

    A spawned child normally re-imports the parent's main module, which would run
    an unguarded driver script (``ray.init``, training...) a second time inside the
    helper. The helper needs nothing from it, so the main module's path and spec
    are hidden while the child is being started.
    """
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    missing = object()
    saved = {name: getattr(main, name, missing) for name in ("__file__", "__spec__")}
    try:
        main.__spec__ = None
        if saved["__file__"] is not missing:
            del main.__file__
        yield
    finally:
        for name, value in saved.items():
            if value is not missing:
                setattr(main, name, value)


class HelperEngine:
    """The driver's side of the helper process: same ``scrape``/``close`` as the engine.

    Thread-safe; one batch at a time.
    """

    def __init__(self, limits: ScrapeLimits) -> None:
        self.limits = limits.checked()
        self._lock = threading.RLock()
        self._abort = threading.Event()
        self._process: Any = None
        self._conn: Connection | None = None
        self._ready = False
        self._lost = False
        #: Helpers in a row that died or stayed silent before saying they were ready.
        self._failed_starts = 0
        self._batch = 0
        self._closed = False

    @property
    def pid(self) -> int | None:
        """The helper's pid while one is running."""
        process = self._process
        return process.pid if process is not None and process.is_alive() else None

    def _start(self) -> None:
        context = multiprocessing.get_context("spawn")
        parent, child = context.Pipe(duplex=True)
        process = context.Process(
            target=helper_main,
            args=(child, os.getpid(), self.limits),
            name="raylens-host-memory-helper",
            daemon=True,
        )
        with _main_module_hidden():
            process.start()
        child.close()
        self._process, self._conn, self._ready = process, parent, False

    def _reap(self) -> None:
        """Forget a helper that ended, collecting its exit status (no zombie)."""
        process, conn = self._process, self._conn
        self._process = self._conn = None
        self._ready = False
        if conn is not None:
            conn.close()
        if process is not None:
            process.join(0.1)
            if process.is_alive():
                process.kill()
                process.join(1.0)

    def _ensure(self) -> Connection | None:
        if self._process is not None and not self._process.is_alive():
            self._reap()
            self._lost = True
        if self._process is None:
            if self._lost:
                warn_once(
                    "host_memory.helper.restart",
                    "the host-memory scrape helper process exited; started a new one",
                    logger=logger,
                )
                self._lost = False
            self._start()
        return self._conn

    def prestart(self) -> None:
        """Spawn the helper now, without waiting for it, so the first cycle finds it ready."""
        with self._lock:
            if not self._closed:
                self._ensure()

    def scrape(self, jobs: Sequence[Job], timeout: float | None = None) -> dict[Hashable, Outcome]:
        """Have the helper scrape ``jobs``; returns within the timeout plus a little.

        Keys missing from the result did not answer in time; when the helper dies
        mid-batch every unanswered key is reported with :data:`HELPER_GONE`.
        """
        seconds = self.limits.timeout if timeout is None else timeout
        started = time.monotonic()
        wait_until = started + seconds + BATCH_SLACK_S
        with self._lock:
            if self._closed:
                return {}
            self._abort.clear()
            try:
                conn = self._ensure()
                if conn is None:
                    return {}
                if not self._ready:
                    if self._failed_starts >= _MAX_FAILED_STARTS:
                        raise RuntimeError(
                            f"the scrape helper failed to start {self._failed_starts} times in a row"
                        )
                    if not self._wait_ready(conn, started + _START_TIMEOUT_S):
                        if not self._abort.is_set():
                            self._failed_starts += 1
                            self._reap()
                        return {}
                    self._failed_starts = 0
                self._batch += 1
                batch = self._batch
                # The child's deadline starts once it is ready: a slow first spawn
                # is not charged to the nodes.
                now = time.monotonic()
                wait_until = max(wait_until, now + seconds + BATCH_SLACK_S)
                conn.send(("scrape", batch, list(jobs), now + seconds))
                while True:
                    left = wait_until - time.monotonic()
                    if left <= 0 or self._abort.is_set():
                        return {}
                    if conn.poll(min(left, _POLL_SLICE_S)):
                        message = conn.recv()
                        if message[0] == "result" and message[1] == batch:
                            # Ages count from this call, helper start-up included.
                            offset = now - started
                            return {
                                key: outcome._replace(elapsed=outcome.elapsed + offset)
                                for key, outcome in message[2].items()
                            }
            except (EOFError, OSError):
                if not self._ready:
                    self._failed_starts += 1
                self._reap()
                self._lost = True
                return {
                    job[0]: Outcome(None, HELPER_GONE, error_type=ERROR_INTERNAL) for job in jobs
                }

    def _wait_ready(self, conn: Connection, deadline: float) -> bool:
        while not self._abort.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if conn.poll(min(left, _POLL_SLICE_S)):
                self._ready = conn.recv()[0] == "ready"
                return self._ready
            if self._process is not None and not self._process.is_alive():
                raise EOFError("helper exited while starting")
        return False

    def close(self, timeout: float = 1.0) -> None:
        """End the helper within ``timeout`` seconds (asked first, then killed)."""
        deadline = time.monotonic() + timeout
        self._abort.set()
        self._closed = True
        with self._lock:
            process, conn = self._process, self._conn
            self._process = self._conn = None
            if conn is not None:
                with contextlib.suppress(OSError, ValueError):
                    conn.send(("stop",))
                conn.close()
            if process is None:
                return
            process.join(max(0.0, min(0.5, deadline - time.monotonic() - 0.2)))
            if process.is_alive():
                process.kill()
            process.join(max(0.05, deadline - time.monotonic()))
