"""The driver's side of the scrape helper: start it, hand it batches, end it.

The helper is a separate interpreter started with :mod:`subprocess` (a fresh
``python``, never a fork of the driver, and no :mod:`multiprocessing` machinery,
so nothing process-wide such as ``__main__`` is touched while it starts). It runs
:mod:`raylens.telemetry.scraping._helper_program`; the two talk through
:mod:`raylens.telemetry.scraping._channel`, whose driver end never blocks: whatever
the helper does (stalls, dies, floods its answers), :meth:`HelperEngine.scrape`
returns within its deadline and :meth:`HelperEngine.close` within its bound.

Lifetime: the driver reaps a helper that ended (no zombie) and starts a new one
on the next cycle, with one warning when the last one crashed. A helper that has
taken or answered no batch for :data:`STALLED_CYCLES` cycles in a row (stopped, or
wedged) is killed and replaced. In a forked child the parent's helper is
forgotten, never used or stopped (:mod:`raylens.forking`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from pathlib import Path

from raylens import forking
from raylens.lens import warn_once
from raylens.safe_text import printable
from raylens.telemetry.names import (
    LOGGER_NAME,
)
from raylens.telemetry.raylet_payload import ERROR_INTERNAL
from raylens.telemetry.scraping import (
    BATCH_SLACK_S,
    READY_MESSAGE,
    WIRE_VERSION,
    ChannelBroken,
    DriverChannel,
    HeldFigures,
    Job,
    MalformedRows,
    Outcome,
    Row,
    ScrapeLimits,
    decode_outcomes,
    is_ready_message,
    is_result_of,
    scrape_message,
    trust_message,
)

__all__ = ["HELPER_GONE", "STALLED_CYCLES", "GroupFiguresMemo", "HelperEngine"]

logger = logging.getLogger(LOGGER_NAME)

#: Error of the nodes whose answers were lost because the helper died mid-cycle.
HELPER_GONE = "the scrape helper process exited before answering"
#: Cycles in a row a helper may leave a batch untaken before it is replaced.
STALLED_CYCLES = 3
#: How long the first cycle may wait for a freshly started helper to say it is ready.
_START_TIMEOUT_S = 20.0
#: After this many helpers in a row fail to start, scrape() raises and the monitor
#: falls back to scraping in-process.
_MAX_FAILED_STARTS = 2
# ``python -c`` puts the working directory first on the path: it is taken off, so
# the helper imports raylens and the standard library from where the driver does.
_PROGRAM = (
    "import sys; del sys.path[0]; "
    "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    "from raylens.telemetry.scraping._helper_program import main; main()"
)


#: The folder raylens is imported from, so the helper imports this same copy. Resolved
#: once, at import: imported through a relative ``sys.path`` entry, ``__file__`` is
#: relative, and the working directory may have changed by the time a helper starts.
_IMPORT_ROOT = str(Path(__file__).resolve().parents[3])


def _is_result_of(batch: int) -> Callable[[object], bool]:
    return lambda message: is_result_of(message, batch)


class GroupFiguresMemo:
    """The group figures the driver last received from the helper, per key.

    The helper leaves out a node's figures when their ``sampled_at`` matches what the
    driver holds (:func:`~raylens.telemetry.scraping._helper_program.leave_out_known_groups`);
    this puts them back. It is the driver's own record, so a reply lost on the way never leaves the
    two sides disagreeing: the helper compares against what the driver says it holds.
    Not thread-safe; the engine uses it under its lock.
    """

    def __init__(self) -> None:
        self._held = HeldFigures()

    def known(self, keys: Iterable[Hashable]) -> dict[Hashable, float]:
        """``{key: sampled_at}`` held for ``keys``; figures of every other key are dropped."""
        held = self._held
        held.keep_only(keys)
        return {key: figures.sampled_at for key, figures in held.figures.items()}

    def decode(
        self, rows: Sequence[Row], keys: Sequence[Hashable], offset: float
    ) -> dict[Hashable, Outcome]:
        """The outcomes of the helper's ``rows`` (``keys`` in the order sent), figures put back.

        Raises:
            ChannelBroken: the rows are not what the helper writes (the helper is broken).
        """
        try:
            return decode_outcomes(rows, keys, offset, self._held)
        except MalformedRows as exc:
            raise ChannelBroken(f"the helper sent an unreadable result: {exc}") from exc


class HelperEngine:
    """Same ``scrape``/``close`` as the in-process engine, run by a helper process.

    Thread-safe; one batch at a time.
    """

    def __init__(self, limits: ScrapeLimits) -> None:
        self.limits = limits.checked()
        self._lock = threading.RLock()
        self._abort = threading.Event()
        self._process: subprocess.Popen[bytes] | None = None
        self._channel: DriverChannel | None = None
        self._ready = False
        self._lost = False
        #: Helpers in a row that died or stayed silent before saying they were ready.
        self._failed_starts = 0
        #: Cycles in a row whose batch the helper did not take whole.
        self._stalled = 0
        self._batch = 0
        self._groups = GroupFiguresMemo()
        self._closed = False
        #: Sampler ids the helper is to believe (None: any), and whether the helper
        #: running now has been told them.
        self._trusted: Mapping[str, str] | None = None
        self._trust_told = True
        #: What a forked child inherited from its parent: kept, never used or closed.
        self._inherited: list[object] = []
        forking.reset_after_fork_in_child(self)

    @property
    def pid(self) -> int | None:
        """The helper's pid while one is running."""
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    def reset_after_fork(self) -> None:
        """In a forked child: forget the parent's helper without a word to it."""
        self._lock = threading.RLock()
        self._abort = threading.Event()
        if self._channel is not None:
            with contextlib.suppress(OSError):
                self._channel.abandon()
        self._inherited.append((self._process, self._channel))
        self._process = self._channel = None
        self._ready = self._lost = False
        self._failed_starts = self._stalled = 0

    # Starting and ending a helper -----------------------------------------------------

    def _start(self) -> None:
        ours, theirs = socket.socketpair()
        started = False
        try:
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join(
                part for part in (_IMPORT_ROOT, env.get("PYTHONPATH", "")) if part
            )
            limits = self.limits
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    _PROGRAM,
                    str(theirs.fileno()),
                    str(os.getpid()),
                    repr(limits.timeout),
                    str(limits.max_body_bytes),
                    str(limits.max_concurrency),
                ],
                stdin=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                env=env,
                # Its own session: a Ctrl-C in the driver's terminal, which goes to the
                # whole foreground group, never reaches it, even while it starts up. It
                # ends with the driver all the same (end-of-file, or its parent gone).
                start_new_session=True,
            )
            started = True
        finally:
            theirs.close()
            if not started:
                ours.close()
        self._process, self._channel, self._ready = process, DriverChannel(ours), False
        self._stalled = 0
        self._trust_told = self._trusted is None  # a new helper believes any sampler

    def _reap(self, grace: float = 0.1) -> None:
        """Forget the current helper, collecting its exit status (no zombie)."""
        process, channel = self._process, self._channel
        self._process = self._channel = None
        self._ready = False
        if channel is not None:
            channel.close()
        if process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(grace)
            if process.poll() is None:
                process.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(1.0)

    def _ensure(self) -> DriverChannel | None:
        process = self._process
        if process is not None and process.poll() is not None:
            self._reap()
            self._lost = True
        if self._process is None:
            if self._closed:
                return None
            if self._failed_starts >= _MAX_FAILED_STARTS:
                raise RuntimeError(
                    f"the scrape helper failed to start {self._failed_starts} times in a row"
                )
            if self._lost:
                warn_once(
                    "host_memory.helper.restart",
                    "the host-memory scrape helper process exited; started a new one",
                    logger=logger,
                )
                self._lost = False
            self._start()
        return self._channel

    def prestart(self) -> None:
        """Start the helper now, without waiting for it, so the first cycle finds it ready."""
        with self._lock:
            if not self._closed:
                self._ensure()

    def trust_samplers(self, ids: Mapping[str, str] | None) -> None:
        """Have the helper believe only the series of the samplers in ``ids`` (None: any),
        from the next batch on."""
        with self._lock:
            if ids != self._trusted:
                self._trusted = ids
                self._trust_told = False

    # Batches ---------------------------------------------------------------------------

    def scrape(self, jobs: Sequence[Job], timeout: float | None = None) -> dict[Hashable, Outcome]:
        """Have the helper scrape ``jobs``; returns within the timeout plus a little.

        Keys missing from the result did not answer in time; when the helper dies
        mid-batch every unanswered key is reported with :data:`HELPER_GONE`.
        """
        seconds = self.limits.timeout if timeout is None else timeout
        started = time.monotonic()
        with self._lock:
            self._abort.clear()
            if self._closed:  # checked after the clear: a close() in between still aborts
                return {}
            try:
                channel = self._ensure()
                if channel is None:
                    return {}
                if not self._ready and not self._await_ready(channel, started):
                    return {}
                # The deadline starts once the helper is ready: a slow first start is
                # not charged to the nodes.
                now = time.monotonic()
                wait_until = now + seconds + BATCH_SLACK_S
                alive = self._helper_alive
                if channel.sending and not channel.flush(wait_until, self._abort, alive):
                    self._note_stalled()
                    return {}
                self._batch += 1
                keys = [job[0] for job in jobs]
                known = self._groups.known(keys)
                if not self._trust_told:
                    channel.queue(trust_message(self._trusted))
                    self._trust_told = True
                channel.queue(scrape_message(self._batch, list(jobs), now + seconds, known))
                reply = channel.exchange(_is_result_of(self._batch), wait_until, self._abort, alive)
                if reply is None:
                    if not self._abort.is_set():
                        self._note_stalled()
                    return {}
                self._stalled = 0
                offset = now - started  # ages count from this call, helper start-up included
                return self._groups.decode(reply[2], keys, offset)
            except ChannelBroken:
                if not self._ready:
                    self._failed_starts += 1
                self._reap()
                self._lost = True
                return {
                    job[0]: Outcome(None, HELPER_GONE, error_type=ERROR_INTERNAL) for job in jobs
                }

    def _helper_alive(self) -> bool:
        process = self._process
        return process is not None and process.poll() is None

    def _await_ready(self, channel: DriverChannel, started: float) -> bool:
        ready = channel.exchange(
            is_ready_message, started + _START_TIMEOUT_S, self._abort, self._helper_alive
        )
        if ready is None:
            if not self._abort.is_set():
                self._failed_starts += 1
                self._reap()
            return False
        if ready != READY_MESSAGE:
            warn_once(
                "host_memory.helper.version",
                f"the host-memory scrape helper speaks wire version {printable(ready[1])[:40]}, "
                f"this driver {WIRE_VERSION} (raylens changed under a running job?); replaced it",
                logger=logger,
            )
            self._failed_starts += 1
            self._reap()
            return False
        self._ready, self._failed_starts = True, 0
        return True

    def _note_stalled(self) -> None:
        """The helper took or answered no batch again: replace it after a few cycles."""
        self._stalled += 1
        if self._stalled >= STALLED_CYCLES:
            warn_once(
                "host_memory.helper.stalled",
                f"the host-memory scrape helper answered no batch for {self._stalled} cycles; "
                "replaced it",
                logger=logger,
            )
            self._reap(grace=0.0)

    def close(self, timeout: float = 1.0) -> None:
        """End the helper within ``timeout`` seconds: its channel closed, then killed if need be."""
        deadline = time.monotonic() + timeout
        self._closed = True  # before the abort: a scrape clears the abort, then checks this
        self._abort.set()
        forking.forget_in_child(self)
        # A batch in progress notices the abort within a slice and lets go of the lock.
        locked = self._lock.acquire(timeout=max(0.0, min(0.5, deadline - time.monotonic())))
        try:
            process, channel = self._process, self._channel
            if locked:
                self._process = self._channel = None
                if channel is not None:
                    channel.close()  # the helper reads end-of-file and exits
            # Unlocked, a batch still holds the channel: the helper is killed below, and
            # that batch then finds the channel broken and reaps it.
            if process is None:
                return
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(max(0.0, min(0.5, deadline - time.monotonic() - 0.2)))
            if process.poll() is None:
                process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(max(0.05, deadline - time.monotonic()))
        finally:
            if locked:
                self._lock.release()
