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
from raylens.telemetry.history import GrowthConfig, GrowthFigures, RecentHistory
from raylens.telemetry.names import (
    LOGGER_NAME,
)
from raylens.telemetry.raylet_payload import ERROR_INTERNAL
from raylens.telemetry.scraping import (
    BATCH_SLACK_S,
    ChannelBroken,
    DriverChannel,
    HeldFigures,
    Job,
    MalformedRows,
    Outcome,
    Row,
    ScrapeLimits,
    decode_outcomes,
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


#: Replies in a row saying the helper could not keep the growth, after which it is kept in
#: the monitor's own process instead (a failure that comes back every batch).
MAX_GROWTH_FAILURES = 3
#: How long a request for a node's history waits for the helper's answer.
_HISTORY_TIMEOUT_S = 1.0

#: The folder raylens is imported from, so the helper imports this same copy. Resolved
#: once, at import: imported through a relative ``sys.path`` entry, ``__file__`` is
#: relative, and the working directory may have changed by the time a helper starts.
_IMPORT_ROOT = str(Path(__file__).resolve().parents[3])


def _is_result_of(batch: int) -> Callable[[object], bool]:
    return lambda message: isinstance(message, tuple) and message[:2] == ("result", batch)


def _is_history_of(request: int) -> Callable[[object], bool]:
    return lambda message: isinstance(message, tuple) and message[:2] == ("history", request)


def _is_ready(message: object) -> bool:
    return message == ("ready",)


class GroupFiguresMemo:
    """The group figures the driver last received from the helper, per key.

    The helper leaves out a node's figures when their ``sampled_at`` matches what the
    driver holds (:func:`~raylens.telemetry.scraping.leave_out_known_groups`); this puts
    them back. It is the driver's own record, so a reply lost on the way never leaves the
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


class HeldGrowth:
    """The growth figures the driver last received from the helper, per key.

    The helper sends the figures that changed since the reply the driver says it applied
    (:mod:`raylens.telemetry.scraping._growth_relay`); when that is not the reply it sent
    last (one was lost), it sends every node's figures again. The mapping :attr:`figures`
    is replaced, never changed, so a reader on another thread may keep it. Not thread-safe
    otherwise; the engine uses it under its lock.
    """

    def __init__(self) -> None:
        self.config: GrowthConfig | None = None
        self.figures: dict[Hashable, GrowthFigures] = {}
        #: The batch whose figures were applied last (0: none, since the helper started).
        self.applied = 0
        #: Replies in a row that said the helper could not keep the growth.
        self.failures = 0

    def reset(self) -> None:
        """A new helper keeps a new history: nothing it sent is held, and it is tried afresh."""
        self.figures = {}
        self.applied = 0
        self.failures = 0

    def request(self, sent_at: float) -> tuple[GrowthConfig, int, float] | None:
        """What a batch sent at ``sent_at`` asks of the helper: the settings, the batch applied
        last, and that time (the helper stamps each answer with it plus the answer's age).

        None while growth is not asked for, or after :data:`MAX_GROWTH_FAILURES` replies in
        a row said the helper could not keep it.
        """
        if self.config is None or self.failures >= MAX_GROWTH_FAILURES:
            return None
        return (self.config, self.applied, sent_at)

    @property
    def kept(self) -> bool:
        """Whether the helper keeps the growth (asked for, and not given up on)."""
        return self.config is not None and self.failures < MAX_GROWTH_FAILURES

    def failed(self) -> None:
        """A reply said the helper could not keep the growth; what is held stands."""
        self.failures += 1

    def apply(self, batch: int, changes: object, keys: Sequence[Hashable]) -> None:
        """Take a reply's ``(resent, {key: figures})``; keys not in ``keys`` (the batch's) are
        dropped, here and from what is held.

        Raises:
            MalformedRows: the changes do not have that shape.
        """
        if self.config is None:
            return
        if not (type(changes) is tuple and len(changes) == 2 and type(changes[1]) is dict):
            raise MalformedRows(f"growth figures sent as {changes!r:.80}")
        resent, by_key = changes
        for node_figures in by_key.values():
            if type(node_figures) is not GrowthFigures:
                raise MalformedRows(f"a node's growth figures sent as {node_figures!r:.80}")
        held = self.figures
        live = set(keys)
        if resent or by_key or not live.issuperset(held):
            figures = {} if resent else {key: value for key, value in held.items() if key in live}
            figures.update((key, value) for key, value in by_key.items() if key in live)
            self.figures = figures
        self.applied = batch
        self.failures = 0


def _as_recent_history(found: object) -> RecentHistory | None:
    """``found`` if it has the shape of a node's recent history, else None."""
    if not isinstance(found, dict) or set(found) != set(RecentHistory.__annotations__):
        return None
    node_used, groups, outside = found["node_used"], found["worker_groups"], found["outside_groups"]
    if not isinstance(groups, dict) or not all(
        part is None or isinstance(part, dict) for part in (node_used, outside, *groups.values())
    ):
        return None
    return RecentHistory(node_used=node_used, worker_groups=groups, outside_groups=outside)


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
        self._growth = HeldGrowth()
        #: The growth settings asked for, taken up at the next batch.
        self._growth_wanted: GrowthConfig | None = None
        #: Set when a history request went unanswered; cleared by the next batch's reply.
        self._history_unanswered = False
        self._closed = False
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
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._process, self._channel, self._ready = process, DriverChannel(ours), False
        self._stalled = 0
        self._growth.reset()

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
                if self._growth_wanted != self._growth.config:
                    self._growth.config = self._growth_wanted
                    self._growth.reset()
                growth = self._growth.request(now)
                batch = self._batch
                channel.queue(("scrape", batch, list(jobs), now + seconds, known, growth))
                reply = channel.exchange(_is_result_of(batch), wait_until, self._abort, alive)
                if reply is None:
                    if not self._abort.is_set():
                        self._note_stalled()
                    return {}
                self._stalled = 0
                self._history_unanswered = False
                offset = now - started  # ages count from this call, helper start-up included
                outcomes = self._groups.decode(reply[2], keys, offset)
                if growth is not None:
                    self._apply_growth(batch, reply, keys)
                return outcomes
            except ChannelBroken:
                if not self._ready:
                    self._failed_starts += 1
                self._reap()
                self._lost = True
                return {
                    job[0]: Outcome(None, HELPER_GONE, error_type=ERROR_INTERNAL) for job in jobs
                }

    def _apply_growth(self, batch: int, reply: tuple[object, ...], keys: list[Hashable]) -> None:
        if len(reply) != 4:
            raise ChannelBroken("the helper sent a result without its growth figures")
        if reply[3] is None:  # it could not keep them this time: what is held stands
            self._growth.failed()
            warn_once(
                "host_memory.helper.growth",
                "the scrape helper failed to keep the growth history; it starts a new one, and "
                f"after {MAX_GROWTH_FAILURES} failures in a row the growth is kept in this process",
                logger=logger,
            )
            return
        try:
            self._growth.apply(batch, reply[3], keys)
        except (MalformedRows, TypeError) as exc:
            raise ChannelBroken(f"the helper sent unreadable growth figures: {exc}") from exc

    # Growth ------------------------------------------------------------------------------

    def keep_growth(self, config: GrowthConfig | None) -> None:
        """Have the helper keep each node's growth with ``config`` from the next batch on.

        Never waits: a batch in progress keeps the settings it was sent with.
        """
        self._growth_wanted = config

    def growth_figures(self) -> Mapping[Hashable, GrowthFigures] | None:
        """Every node's growth figures as the helper last sent them (empty until it has); None
        once the helper has failed to keep them :data:`MAX_GROWTH_FAILURES` times in a row.

        The mapping is never changed once returned; the next reply's figures replace it.
        """
        growth = self._growth
        return growth.figures if growth.kept else None

    def recent_history(self, node_id: str, at: float, late_by: float) -> RecentHistory | None:
        """``node_id``'s recent memory from the helper's history, samples up to ``late_by``
        seconds after ``at`` included.

        None if it keeps none, or does not answer within :data:`_HISTORY_TIMEOUT_S`; after
        one such silence, none is asked until a batch is answered again, so a cycle waits
        for it once at most.
        """
        deadline = time.monotonic() + _HISTORY_TIMEOUT_S
        with self._lock:
            channel = self._channel
            if (
                not self._growth.kept
                or channel is None
                or not self._ready
                or self._history_unanswered
            ):
                return None
            self._batch += 1
            request = self._batch
            try:
                channel.queue(("history", request, node_id, at, late_by))
                reply = channel.exchange(
                    _is_history_of(request), deadline, self._abort, self._helper_alive
                )
            except ChannelBroken:
                self._reap()
                self._lost = True
                return None
            if reply is None:
                self._history_unanswered = True
                return None
        if len(reply) != 3:
            return None
        return _as_recent_history(reply[2])

    def _helper_alive(self) -> bool:
        process = self._process
        return process is not None and process.poll() is None

    def _await_ready(self, channel: DriverChannel, started: float) -> bool:
        ready = channel.exchange(
            _is_ready, started + _START_TIMEOUT_S, self._abort, self._helper_alive
        )
        if ready is None:
            if not self._abort.is_set():
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
