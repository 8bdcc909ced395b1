"""Runs a replaced per-node ``_scrape`` on a bounded set of daemon threads.

:meth:`HostMemoryMonitor._scrape` is the spec's per-node seam. When a subclass or
a test replaces it, a cycle calls the replacement for every node, in this
process, since arbitrary code cannot be sent to the helper. A replacement is
synchronous code that may block, so calls run on at most ``size`` persistent
daemon threads (``raylens-host-memory-scrape-N``); the cycle waits for them up to
its deadline, and a node whose call is still running is not called again.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Protocol, TypeVar

from raylens.safe_text import printable
from raylens.telemetry.raylet_payload import (
    ERROR_INTERNAL,
    ERROR_PARSE,
    ERROR_TIMEOUT,
)
from raylens.telemetry.scraping import BATCH_SLACK_S, NOT_ASKED_IN_FLIGHT, Outcome

__all__ = ["ThreadedScrapes"]


class _Keyed(Protocol):
    @property
    def key(self) -> Hashable: ...


#: A node as the replaced ``_scrape`` takes it; the results are keyed by its ``key``.
_Node = TypeVar("_Node", bound=_Keyed)

Task = Callable[[], None]


class ThreadedScrapes:
    """Calls ``scrape(node)`` per node on up to ``size`` daemon threads, one batch at a time."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._tasks: queue.SimpleQueue[Task | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._in_flight: set[Hashable] = set()
        self._closed = False
        self._abort = threading.Event()

    def run(
        self, scrape: Callable[[_Node], dict[str, float]], nodes: Sequence[_Node], timeout: float
    ) -> dict[Hashable, Outcome]:
        """``{node.key: Outcome}`` for the calls that returned within ``timeout``."""
        started = time.monotonic()
        results: dict[Hashable, Outcome] = {}
        done = threading.Condition()
        expected = 0
        for node in nodes:
            with self._lock:
                if node.key in self._in_flight:
                    skipped = Outcome(
                        None,
                        NOT_ASKED_IN_FLIGHT,
                        wedged=True,
                        asked=False,
                        error_type=ERROR_TIMEOUT,
                    )
                    with done:
                        results[node.key] = skipped
                    continue
                if self._closed:
                    break
                self._in_flight.add(node.key)
            expected += 1
            self._submit(_call(scrape, node, started, results, done, self._finished))
        with done:
            done.wait_for(
                lambda: len(results) >= expected + _skipped(results) or self._abort.is_set(),
                timeout + BATCH_SLACK_S,
            )
            return dict(results)

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

    def close(self) -> None:
        """Release a waiting batch and let every thread end once its call returns."""
        self._abort.set()
        with self._lock:
            self._closed = True
            threads = list(self._threads)
        for _ in threads:
            self._tasks.put(None)


def _skipped(results: dict[Hashable, Outcome]) -> int:
    return sum(1 for outcome in results.values() if outcome.error == NOT_ASKED_IN_FLIGHT)


def _call(
    scrape: Callable[[_Node], dict[str, float]],
    node: _Node,
    started: float,
    results: dict[Hashable, Outcome],
    done: threading.Condition,
    finished: Callable[[Hashable], None],
) -> Task:
    def task() -> None:
        asked_at = time.monotonic()
        try:
            values = scrape(node)
            outcome = (
                Outcome(dict(values), None)
                if values
                else Outcome(
                    None, "no sample: the node's _scrape returned nothing", error_type=ERROR_PARSE
                )
            )
        except Exception as exc:  # the node's failure, never the thread's
            outcome = Outcome(
                None, printable(f"{type(exc).__name__}: {exc}"), error_type=ERROR_INTERNAL
            )
        finished(node.key)
        now = time.monotonic()
        with done:
            results.setdefault(
                node.key, outcome._replace(elapsed=now - started, duration=now - asked_at)
            )
            done.notify_all()

    return task
