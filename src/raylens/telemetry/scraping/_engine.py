"""The scrape engine: every node of a batch fetched concurrently on one event loop.

:class:`AsyncScrapeEngine` runs in the helper process and, in in-process mode, in the
driver; :func:`fetch_once` runs the same fetch once. Invariants a maintainer must keep:

- every request ends by its deadline, whatever the raylet does (one total
  ``aiohttp.ClientTimeout``, a name lookup on a thread of its own);
- a body is never held whole nor inflated: identity encoding only, a byte cap, and only
  the wanted lines kept (:class:`~raylens.telemetry.prometheus_text.WantedLines`);
- one request per node at a time: a key still in flight is not asked again;
- this module imports neither lens nor OpenTelemetry (the ``light-helper`` contract).

How the engine fetches and why: ``docs/architecture.md``, *One scrape's path* (step 3).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import os
import socket
import threading
import time
from collections.abc import Hashable, Sequence
from typing import Any, NamedTuple

import aiohttp
import aiohttp.abc

from raylens import forking
from raylens.safe_text import printable
from raylens.telemetry.physical_bounds import MAX_REFUSALS_NAMED, bound_payload
from raylens.telemetry.prometheus_text import WantedLines
from raylens.telemetry.raylet_payload import (
    ERROR_CONNECTION,
    ERROR_ENCODING,
    ERROR_HTTP_STATUS,
    ERROR_INTERNAL,
    ERROR_PARSE,
    ERROR_SERVER_ERROR,
    ERROR_TIMEOUT,
    ERROR_TOO_LARGE,
    GROUP_SERIES,
    OOM_SERIES,
    RAY_NODE_MEM_TOTAL,
    RAY_NODE_MEM_USED,
    RAY_WORKER_ID_LABEL,
    SERIES_BY_RAY_NAME,
    TOTAL_KEY,
    USED_KEY,
    NodeGroupFigures,
    NodeOomCounts,
    TrustedSamplers,
    parse_memory_samples,
    parse_oom_samples,
    read_sampler_series,
)
from raylens.validation import positive_seconds

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_CONCURRENCY",
    "NOT_ASKED_IN_FLIGHT",
    "AsyncScrapeEngine",
    "Outcome",
    "ScrapeLimits",
    "fetch_once",
    "outcome_of_payload",
]

MAX_BODY_BYTES = 16 * 1024 * 1024
MAX_CONCURRENCY = 256
#: How long past a batch's deadline its caller waits for answers already on their way.
BATCH_SLACK_S = 0.25
NOT_ASKED_IN_FLIGHT = "not asked: its previous scrape is still running"
#: A body is read this much at a time and only its wanted lines are kept (at most
#: :data:`_MAX_KEPT_BYTES`), so a request holds a few chunks' worth whatever the body's
#: size, and all requests together a bounded amount (see :class:`AsyncScrapeEngine`).
_READ_CHUNK = 64 * 1024
_MAX_KEPT_BYTES = 256 * 1024
_WANTED_SERIES = (*SERIES_BY_RAY_NAME, *GROUP_SERIES, *OOM_SERIES)
_HEADERS = {"Accept-Encoding": "identity", "Connection": "close"}

#: One node to scrape: ``(key, url, wedged)``; wedged nodes are asked in their own lane.
Job = tuple[Hashable, str, bool]


class Outcome(NamedTuple):
    """What one node's scrape produced; plain data, so it crosses to the driver as it is.

    ``values`` is ``{registry key: bytes}`` or None; ``error`` says why there is
    no sample. ``wedged`` marks a node that held its request until the deadline
    or was still waiting for a slot when the deadline came; ``asked`` is False
    when no request was sent. ``elapsed`` is seconds from the batch's start to
    this answer, so a sample's age counts from when the node answered.
    ``error_type`` is the failure's class, one of ``SCRAPE_ERROR_TYPES`` (None on
    a success), and ``duration`` the seconds the request itself took (None when
    none was sent).
    """

    values: dict[str, float] | None
    error: str | None
    wedged: bool = False
    asked: bool = True
    elapsed: float = 0.0
    error_type: str | None = None
    duration: float | None = None
    #: The per-group figures the node's sampler last published there, if any.
    groups: NodeGroupFigures | None = None
    #: The node's kill counters (Ray's memory monitor, the kernel's), if the payload has any.
    oom: NodeOomCounts | None = None
    #: Values of the payload refused as physically impossible: ``(count, (named, ...))``,
    #: None when there were none (:mod:`raylens.telemetry.physical_bounds`).
    refused: tuple[int, tuple[str, ...]] | None = None


class ScrapeLimits(NamedTuple):
    """The bounds every request runs under; :meth:`checked` is their one validator."""

    timeout: float
    max_body_bytes: int = MAX_BODY_BYTES
    max_concurrency: int = MAX_CONCURRENCY

    def checked(self) -> ScrapeLimits:
        """These limits, or ValueError naming the one out of range."""
        positive_seconds("scrape_timeout", self.timeout)
        positive_int("max_body_bytes", self.max_body_bytes)
        positive_int("max_concurrency", self.max_concurrency)
        return self


def positive_int(name: str, value: object) -> int:
    """``value`` if it is an int of at least 1, or ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int of at least 1, got {value!r}")
    return value


def _describe(exc: BaseException) -> str:
    """One printable line for a failed request."""
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "the raylet closed or reset the connection before answering"
    code = getattr(exc, "errno", None) or getattr(getattr(exc, "os_error", None), "errno", None)
    if isinstance(code, int) and code in errno.errorcode:
        return printable(f"{type(exc).__name__}: {os.strerror(code)}")
    return printable(f"{type(exc).__name__}: {exc}")


async def _fetch(
    session: aiohttp.ClientSession,
    url: str,
    limits: ScrapeLimits,
    seconds: float,
    trusted: TrustedSamplers | None = None,
) -> Outcome:
    """GET ``url`` within ``seconds`` and the size cap, and parse the two series."""
    received = 0
    got_headers = False
    try:
        timeout = aiohttp.ClientTimeout(total=seconds)
        async with session.get(
            url, timeout=timeout, allow_redirects=False, headers=_HEADERS
        ) as response:
            got_headers = True
            if response.status != 200:
                reason = printable(response.reason or "")
                kind = ERROR_SERVER_ERROR if 500 <= response.status <= 599 else ERROR_HTTP_STATUS
                return Outcome(None, f"HTTP {response.status} {reason}".strip(), error_type=kind)
            encoding = response.headers.get("Content-Encoding", "").strip().lower()
            if encoding not in ("", "identity"):
                return Outcome(
                    None,
                    f"refused a body with Content-Encoding {printable(encoding)!r}: raylens "
                    "asks for identity and never decodes a compressed body",
                    error_type=ERROR_ENCODING,
                )
            announced = response.content_length
            if announced is not None and announced > limits.max_body_bytes:
                return Outcome(
                    None,
                    f"payload of {announced} bytes exceeds the {limits.max_body_bytes}-byte cap",
                    error_type=ERROR_TOO_LARGE,
                )
            lines = WantedLines(
                _WANTED_SERIES, max_kept_bytes=_MAX_KEPT_BYTES, source_label=RAY_WORKER_ID_LABEL
            )
            while True:
                chunk = await response.content.read(_READ_CHUNK)
                if not chunk:
                    break
                received += len(chunk)
                if received > limits.max_body_bytes:
                    return Outcome(
                        None,
                        f"payload exceeds the {limits.max_body_bytes}-byte cap",
                        error_type=ERROR_TOO_LARGE,
                    )
                lines.feed(chunk)
    except asyncio.TimeoutError:
        if got_headers:
            return Outcome(
                None,
                f"payload not complete by the deadline ({received} bytes received)",
                wedged=True,
                error_type=ERROR_TIMEOUT,
            )
        return Outcome(
            None,
            "timed out waiting for the raylet to answer",
            wedged=True,
            error_type=ERROR_TIMEOUT,
        )
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        return Outcome(None, _describe(exc), error_type=ERROR_CONNECTION)
    return outcome_of_payload(lines.payload(), received, now=time.time(), trusted=trusted)


def outcome_of_payload(
    kept: bytes,
    received: int,
    *,
    now: float | None = None,
    trusted: TrustedSamplers | None = None,
) -> Outcome:
    """The outcome of a node whose wanted lines are ``kept`` (of ``received`` bytes): its
    series parsed by exact name and held to physical bounds
    (:func:`~raylens.telemetry.physical_bounds.bound_payload`); its samplers' series
    believed as :func:`~raylens.telemetry.raylet_payload.read_sampler_series` says, for the
    reader's Unix time ``now`` and the samplers ``trusted`` (None: any)."""
    values = parse_memory_samples(kept)
    if USED_KEY not in values and TOTAL_KEY not in values:  # the machine pair alone is no sample
        return Outcome(
            None,
            f"no valid {RAY_NODE_MEM_USED} or {RAY_NODE_MEM_TOTAL} sample "
            f"in the {received}-byte payload",
            error_type=ERROR_PARSE,
        )
    samplers = read_sampler_series(kept, now=now, trusted=trusted)
    bounded = bound_payload(values, samplers.figures, parse_oom_samples(kept))
    if USED_KEY not in bounded.values and TOTAL_KEY not in bounded.values:
        return Outcome(
            None,
            f"no {RAY_NODE_MEM_USED} or {RAY_NODE_MEM_TOTAL} sample within physical bounds "
            f"in the {received}-byte payload",
            error_type=ERROR_PARSE,
        )
    count = bounded.refused_count + samplers.refused_count
    named = (*samplers.refused, *bounded.refused)[:MAX_REFUSALS_NAMED]
    refused = (count, named) if count else None
    return Outcome(bounded.values, None, groups=bounded.groups, oom=bounded.oom, refused=refused)


class _PerNameResolver(aiohttp.abc.AbstractResolver):
    """Name lookups that cannot starve each other, each bounded by its request's deadline.

    ``getaddrinfo`` blocks, so each host name being looked up gets one daemon
    thread (``raylens-host-memory-resolve``) for as long as its lookup takes; a
    name whose lookup is still running is not looked up again, its callers wait
    on the same result. A slow or failing name therefore holds one thread and
    never delays another name, and the request waiting on it still ends at its
    deadline. Raylets are normally addressed by IP, which needs no lookup at all.
    """

    def __init__(self) -> None:
        self._pending: dict[tuple[str, int, int], asyncio.Future[list[Any]]] = {}

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[Any]:
        key = (host, port, int(family))
        future = self._pending.get(key)
        if future is None:
            loop = asyncio.get_running_loop()
            future = self._pending[key] = loop.create_future()
            threading.Thread(
                target=self._lookup,
                args=(loop, key, future),
                name="raylens-host-memory-resolve",
                daemon=True,
            ).start()
        infos = await asyncio.shield(future)
        # aiohttp's ResolveResult is a TypedDict: plain dicts, so older releases work too.
        return [
            {
                "hostname": host,
                "host": address[0],
                "port": address[1],
                "family": found_family,
                "proto": proto,
                "flags": socket.AI_NUMERICHOST | socket.AI_NUMERICSERV,
            }
            for found_family, _, proto, _, address in infos
            if found_family in (socket.AF_INET, socket.AF_INET6)
        ]

    def _lookup(
        self,
        loop: asyncio.AbstractEventLoop,
        key: tuple[str, int, int],
        future: asyncio.Future[list[Any]],
    ) -> None:
        host, port, family = key
        try:
            infos: Any = socket.getaddrinfo(
                host, port, family=family, type=socket.SOCK_STREAM, flags=socket.AI_ADDRCONFIG
            )
            error: BaseException | None = None
        except OSError as exc:
            infos, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(self._settle, key, future, infos, error)

    def _settle(
        self,
        key: tuple[str, int, int],
        future: asyncio.Future[list[Any]],
        infos: list[Any] | None,
        error: BaseException | None,
    ) -> None:
        if self._pending.get(key) is future:
            del self._pending[key]
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(infos or [])

    async def close(self) -> None:
        for future in self._pending.values():
            future.cancel()
        self._pending.clear()


class AsyncScrapeEngine:
    """Runs batches of scrapes on its own event loop thread; see the module docstring.

    A key whose last request is still open when a new batch asks for it again is
    not asked (:data:`NOT_ASKED_IN_FLIGHT`). :meth:`close` ends every request at
    once and the loop thread within a bound.
    """

    def __init__(self, limits: ScrapeLimits) -> None:
        self.limits = limits.checked()
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._session: aiohttp.ClientSession | None = None
        #: Request slots of the two lanes: nodes in good standing, and wedged ones.
        self._slots: tuple[asyncio.Semaphore, asyncio.Semaphore] | None = None
        self._in_flight: set[Hashable] = set()
        self._closed = False
        #: Sampler ids whose series are believed; None: any sampler's.
        self.trusted: TrustedSamplers | None = None
        #: What a forked child inherited: its loop thread does not exist there.
        self._inherited: list[object] = []
        forking.reset_after_fork_in_child(self)

    def trust_samplers(self, ids: TrustedSamplers | None) -> None:
        """Believe from now on only the series of the samplers in ``ids`` (None: any)."""
        self.trusted = ids

    def reset_after_fork(self) -> None:
        """In a forked child: forget the parent's loop, session and requests; start afresh."""
        self._lock = threading.Lock()
        self._inherited.append((self._loop, self._thread, self._session))
        self._loop = self._thread = self._session = None
        self._slots = None
        self._in_flight = set()

    # Lifetime ------------------------------------------------------------------------

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._closed:
                raise RuntimeError("the scrape engine is closed")
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="raylens-host-memory-engine", daemon=True
                )
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def _session_in_loop(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                resolver=_PerNameResolver(),
                limit=2 * self.limits.max_concurrency,
                force_close=True,
                ttl_dns_cache=60,
                timeout_ceil_threshold=1e9,  # never round a deadline up to whole seconds
            )
            self._session = aiohttp.ClientSession(
                connector=connector, auto_decompress=False, trust_env=False
            )
            self._slots = (
                asyncio.Semaphore(self.limits.max_concurrency),
                asyncio.Semaphore(self.limits.max_concurrency),
            )
        return self._session

    def close(self, timeout: float = 1.0) -> None:
        """Cancel every request, close the session and stop the loop, waiting at most ``timeout``."""
        with self._lock:
            self._closed = True
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        deadline = time.monotonic() + timeout
        try:
            future = asyncio.run_coroutine_threadsafe(self._shutdown(), loop)
            future.result(max(0.0, deadline - time.monotonic()))
        except (
            concurrent.futures.TimeoutError,
            concurrent.futures.CancelledError,
            RuntimeError,  # the loop already closed
            OSError,
            aiohttp.ClientError,
        ):
            pass  # the loop is stopped below whatever happened here
        loop.call_soon_threadsafe(loop.stop)
        thread.join(max(0.0, deadline - time.monotonic()))
        if not thread.is_alive():
            loop.close()

    async def _shutdown(self) -> None:
        current = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None

    # Batches -------------------------------------------------------------------------

    def scrape(
        self,
        jobs: Sequence[Job],
        timeout: float | None = None,
        slack: float = BATCH_SLACK_S,
    ) -> dict[Hashable, Outcome]:
        """Scrape every ``(key, url, wedged)`` of ``jobs`` once, in order; return what came back.

        Nodes marked wedged get a lane of their own, with its own
        ``max_concurrency`` request slots: however many of them hold their
        request until the deadline, the others never wait for a slot behind them,
        and a wedged node is still asked once per cycle. Returns within ``timeout`` (default the engine's) plus ``slack``; keys
        missing from the result did not answer in time, and stay in flight until
        their request ends.
        """
        seconds = self.limits.timeout if timeout is None else timeout
        results: dict[Hashable, Outcome] = {}
        try:
            loop = self._ensure_loop()
        except RuntimeError:
            return results
        future = asyncio.run_coroutine_threadsafe(self._batch(jobs, seconds, results), loop)
        with contextlib.suppress(
            concurrent.futures.TimeoutError, concurrent.futures.CancelledError
        ):
            future.result(seconds + slack)
        return dict(results)

    async def _batch(self, jobs: Sequence[Job], seconds: float, results: dict) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + seconds
        session = self._session_in_loop()
        slots = self._slots
        if slots is None:  # made together with the session
            return
        tasks = []
        for key, url, wedged in jobs:
            if key in self._in_flight:
                results[key] = Outcome(
                    None, NOT_ASKED_IN_FLIGHT, wedged=True, asked=False, error_type=ERROR_TIMEOUT
                )
                continue
            self._in_flight.add(key)
            lane = slots[1] if wedged else slots[0]
            tasks.append(self._one(session, lane, key, url, started, deadline, results))
        await asyncio.gather(*tasks)

    async def _one(
        self,
        session: aiohttp.ClientSession,
        semaphore: asyncio.Semaphore,
        key: Hashable,
        url: str,
        started: float,
        deadline: float,
        results: dict,
    ) -> None:
        loop = asyncio.get_running_loop()
        try:
            try:
                await asyncio.wait_for(semaphore.acquire(), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                results[key] = Outcome(
                    None,
                    "not asked: no request slot was free before the deadline",
                    wedged=True,
                    asked=False,
                    elapsed=loop.time() - started,
                    error_type=ERROR_TIMEOUT,
                )
                return
            asked_at = loop.time()
            try:
                left = deadline - asked_at
                if left <= 0:
                    outcome = Outcome(
                        None,
                        "not asked: the deadline passed first",
                        wedged=True,
                        asked=False,
                        error_type=ERROR_TIMEOUT,
                    )
                else:
                    outcome = await _fetch(session, url, self.limits, left, self.trusted)
                    outcome = outcome._replace(duration=loop.time() - asked_at)
            finally:
                semaphore.release()
            results[key] = outcome._replace(elapsed=loop.time() - started)
        except Exception as exc:  # noqa: BLE001 this node's failure, never the batch's
            results[key] = Outcome(
                None, _describe(exc), elapsed=loop.time() - started, error_type=ERROR_INTERNAL
            )
        finally:
            self._in_flight.discard(key)


def fetch_once(url: str, limits: ScrapeLimits) -> Outcome:
    """One scrape of ``url`` on a private, short-lived loop (for a direct ``_scrape`` call)."""

    async def run() -> Outcome:
        connector = aiohttp.TCPConnector(
            resolver=_PerNameResolver(), force_close=True, timeout_ceil_threshold=1e9
        )
        async with aiohttp.ClientSession(
            connector=connector, auto_decompress=False, trust_env=False
        ) as session:
            return await _fetch(session, url, limits, limits.timeout)

    return asyncio.run(run())
