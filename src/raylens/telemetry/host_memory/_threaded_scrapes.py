"""The scrape engine that runs a replaced per-node ``_scrape`` on a bounded set of daemon threads.

:meth:`HostMemoryMonitor._scrape` is the spec's per-node seam. When a subclass or
a test replaces it, a cycle calls the replacement for every node, in this
process, since arbitrary code cannot be sent to the helper. A replacement is
synchronous code that may block, so calls run on at most ``size`` persistent
daemon threads (``raylens-host-memory-scrape-N``); the cycle waits for them up to
its deadline, and a node whose call is still running is not called again. It is a
:class:`~raylens.telemetry.scraping.ScrapeEngine` like the others, so the monitor
has one way to scrape whichever engine runs.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Generic, TypeVar

from raylens.safe_text import printable
from raylens.telemetry.raylet_payload import (
    ERROR_INTERNAL,
    ERROR_PARSE,
    ERROR_TIMEOUT,
)
from raylens.telemetry.scraping import BATCH_SLACK_S, NOT_ASKED_IN_FLIGHT, Job, Outcome

__all__ = ["ThreadedScrapes"]


#: A node as the replaced ``_scrape`` takes it.
_Node = TypeVar("_Node")

Task = Callable[[], None]


class ThreadedScrapes(Generic[_Node]):
    """Calls ``scrape(node_of(key))`` per job on up to ``size`` daemon threads, a batch at a time.

    ``node_of`` turns a job's key into what ``scrape`` takes, on the caller's thread when
    the batch is handed over; a key it does not know is that node's failure.
    """

    def __init__(
        self,
        size: int,
        node_of: Callable[[Hashable], _Node],
        scrape: Callable[[_Node], dict[str, float]],
    ) -> None:
        self._size = size
        self._node_of = node_of
        self._scrape = scrape
        self._tasks: queue.SimpleQueue[Task | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._in_flight: set[Hashable] = set()
        self._closed = False
        self._abort = threading.Event()

    def scrape(
        self, jobs: Sequence[Job], timeout: float | None = None, /
    ) -> dict[Hashable, Outcome]:
        """``{key: Outcome}`` for the calls that returned within ``timeout`` (default 5 s)."""
        seconds = 5.0 if timeout is None else timeout
        started = time.monotonic()
        results: dict[Hashable, Outcome] = {}
        done = threading.Condition()
        expected = 0
        for key, _url, _wedged in jobs:
            with self._lock:
                if key in self._in_flight:
                    skipped = Outcome(
                        None,
                        NOT_ASKED_IN_FLIGHT,
                        wedged=True,
                        asked=False,
                        error_type=ERROR_TIMEOUT,
                    )
                    with done:
                        results[key] = skipped
                    continue
                if self._closed:
                    break
                self._in_flight.add(key)
            expected += 1
            self._submit(_call(self._call_for(key), key, started, results, done, self._finished))
        with done:
            done.wait_for(
                lambda: len(results) >= expected + _skipped(results) or self._abort.is_set(),
                seconds + BATCH_SLACK_S,
            )
            return dict(results)

    def _call_for(self, key: Hashable) -> Callable[[], dict[str, float]]:
        try:
            node = self._node_of(key)
        except LookupError as exc:  # an unknown key is its node's failure

            def failing(error: Exception = exc) -> dict[str, float]:
                raise error

            return failing
        return lambda: self._scrape(node)

    def _finished(self, key: Hashable) -> None:
        with self._lock:
            self._in_flight.discard(key)

    def _submit(self, task: Task) -> None:
        with self._lock:
            if self._idle == 0 and len(self._threads) < self._size:
                thread = threading.Thread(
                    target=self._work,
                    name=f"raylens-host-memory-scrape-{len(self._threads)}",
                    daemon=True,
                )
                self._threads.append(thread)
                self._idle += 1
                thread.start()
            self._idle -= 1 if self._idle else 0
        self._tasks.put(task)

    def _work(self) -> None:
        while True:
            task = self._tasks.get()
            if task is None:
                return
            task()
            with self._lock:
                self._idle += 1

    def close(self, timeout: float = 1.0, /) -> None:
        """Release a waiting batch and let every thread end once its call returns.

        Returns at once: a replaced ``_scrape`` may block, and its thread is a daemon.
        """
        self._abort.set()
        with self._lock:
            self._closed = True
            threads = list(self._threads)
        for _ in threads:
            self._tasks.put(None)


def _skipped(results: dict[Hashable, Outcome]) -> int:
    return sum(1 for outcome in results.values() if outcome.error == NOT_ASKED_IN_FLIGHT)


def _call(
    scrape: Callable[[], dict[str, float]],
    key: Hashable,
    started: float,
    results: dict[Hashable, Outcome],
    done: threading.Condition,
    finished: Callable[[Hashable], None],
) -> Task:
    def task() -> None:
        asked_at = time.monotonic()
        try:
            values = scrape()
            outcome = (
                Outcome(dict(values), None)
                if values
                else Outcome(
                    None, "no sample: the node's _scrape returned nothing", error_type=ERROR_PARSE
                )
            )
        except Exception as exc:  # noqa: BLE001 a user's _scrape: the node's failure
            outcome = Outcome(
                None, printable(f"{type(exc).__name__}: {exc}"), error_type=ERROR_INTERNAL
            )
        finished(key)
        now = time.monotonic()
        with done:
            results.setdefault(
                key, outcome._replace(elapsed=now - started, duration=now - asked_at)
            )
            done.notify_all()

    return task
