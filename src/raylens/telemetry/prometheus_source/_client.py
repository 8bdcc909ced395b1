"""Sending one cycle's queries: all at once on one event loop, each bounded.

Each request runs under a hard total deadline held by aiohttp (so a body trickled one
byte at a time still ends) and its body is read up to a cap, uncompressed only (a
compressed one is refused, never inflated); a query that fails costs only its own
figures. TLS is verified; credentials go in headers, never in the URL, and no redirect
is followed.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable, Mapping
from typing import NamedTuple

import aiohttp

from raylens.safe_text import printable
from raylens.telemetry.prometheus_source._queries import Query, query_text
from raylens.telemetry.prometheus_source._settings import PrometheusSettings

__all__ = ["Answer", "fetch_answers"]

_READ_CHUNK = 256 * 1024


class Answer(NamedTuple):
    """One query's outcome: the body, or a printable line saying why there is none."""

    body: bytes | None
    error: str | None
    seconds: float


def _ssl_context(settings: PrometheusSettings) -> ssl.SSLContext | None:
    if not settings.url.startswith("https:"):
        return None
    return ssl.create_default_context(cafile=settings.ca_file)


def _headers(settings: PrometheusSettings) -> dict[str, str]:
    # A compressed body is refused rather than inflated: the cap is on what is read.
    headers = {"Accept": "application/json", "Accept-Encoding": "identity"}
    if settings.token is not None:
        headers["Authorization"] = f"Bearer {settings.token}"
    elif settings.user is not None and settings.password is not None:
        headers["Authorization"] = aiohttp.BasicAuth(settings.user, settings.password).encode()
    return headers


async def _one(
    session: aiohttp.ClientSession, settings: PrometheusSettings, query: Query
) -> Answer:
    started = time.perf_counter()
    try:
        # No redirects: one would carry the credentials to wherever it points.
        async with session.post(
            settings.query_url,
            data={"query": query_text(query, settings.job)},
            allow_redirects=False,
        ) as response:
            if response.status != 200 and response.status != 400 and response.status != 422:
                return Answer(None, f"HTTP status {response.status}", time.perf_counter() - started)
            encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
            if encoding not in ("", "identity"):
                return Answer(
                    None,
                    f"a compressed answer ({printable(encoding)[:40]}) is refused",
                    time.perf_counter() - started,
                )
            chunks: list[bytes] = []
            size = 0
            while True:
                chunk = await response.content.read(_READ_CHUNK)
                if not chunk:
                    break
                size += len(chunk)
                if size > settings.max_body_bytes:
                    return Answer(
                        None,
                        f"answer larger than {settings.max_body_bytes} bytes",
                        time.perf_counter() - started,
                    )
                chunks.append(chunk)
            return Answer(b"".join(chunks), None, time.perf_counter() - started)
    except asyncio.TimeoutError:
        return Answer(
            None, f"no answer within {settings.timeout_s:g} s", time.perf_counter() - started
        )
    except (aiohttp.ClientError, OSError, ValueError) as error:
        said = printable(str(error))[:160] or type(error).__name__
        return Answer(None, f"{type(error).__name__}: {said}", time.perf_counter() - started)


async def _all(settings: PrometheusSettings, queries: tuple[Query, ...]) -> dict[Query, Answer]:
    timeout = aiohttp.ClientTimeout(total=settings.timeout_s)
    context = _ssl_context(settings)
    connector = aiohttp.TCPConnector(ssl=context if context is not None else True)
    async with aiohttp.ClientSession(
        timeout=timeout,
        connector=connector,
        headers=_headers(settings),
        trust_env=False,
        auto_decompress=False,
    ) as session:
        answers = await asyncio.gather(*(_one(session, settings, query) for query in queries))
    return dict(zip(queries, answers))


#: ``(settings, queries) -> answers``: how a source sends its queries; tests replace it.
Fetcher = Callable[[PrometheusSettings, tuple[Query, ...]], Mapping[Query, Answer]]


def fetch_answers(settings: PrometheusSettings, queries: tuple[Query, ...]) -> dict[Query, Answer]:
    """Send ``queries`` concurrently and wait for every answer (each within the deadline)."""
    return asyncio.run(_all(settings, queries))
