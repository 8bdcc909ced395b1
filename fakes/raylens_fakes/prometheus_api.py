"""A fake Prometheus HTTP API answering the queries of raylens' Prometheus source.

:class:`FakePrometheus` holds one :class:`FakeTarget` per scrape target and answers each
of :class:`raylens.telemetry.prometheus_source.Query` as Prometheus would, aggregated
the same way: in process (:meth:`FakePrometheus.fetch`, a ``Fetcher``), or over HTTP on
127.0.0.1 (:meth:`FakePrometheus.serve`, an aiohttp application answering
``/api/v1/query``). Answers are JSON bytes, so the source's parser reads what a real
server would send; :attr:`FakePrometheus.calls` logs every query asked.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gzip
import json
import math
import socket
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from aiohttp import web

from raylens.telemetry.prometheus_source import (
    GROUP_KINDS,
    NODE_KINDS,
    Answer,
    PrometheusSettings,
    Query,
    query_text,
)

__all__ = ["FakePrometheus", "FakeTarget"]


@dataclasses.dataclass
class FakeTarget:
    """One scrape target: a node's metrics agent as Prometheus last scraped it.

    ``groups`` maps a group name to ``(rss, pss, processes, growth)``, any of the last
    three None when unpublished. ``node`` holds the sampler's node figures in
    ``NODE_KINDS`` order, then its window; None publishes none. The fake answers as
    if the node had one sampler (the queries' freshest-sampler filter is Prometheus'). ``series`` False means
    the target's series are gone (staleness markers after failed scrapes).
    """

    ip: str = "10.0.0.1"
    used: float = 8 * 1024**3
    total: float = 64 * 1024**3
    up: float = 1.0
    #: Unix time of the latest sample of the node's series.
    scraped_at: float = 1_000.0
    series: bool = True
    sampled_at: float | None = None
    groups: dict[str, tuple[float, float | None, float | None, float | None]] = dataclasses.field(
        default_factory=dict
    )
    node: tuple[float | None, ...] | None = None
    #: Per group, how old its PSS was at the sampler's reading (published only where set).
    pss_ages: dict[str, float] = dataclasses.field(default_factory=dict)
    sampler: str = "actor-1"
    started_by: str = "driver/1"
    evictions: dict[str, float] = dataclasses.field(default_factory=dict)
    kernel_kills: float | None = None


def _number(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


class FakePrometheus:
    """Targets by instance, answering at ``now`` (Unix seconds, the evaluation time)."""

    def __init__(self, job: str = "ray", now: float = 1_000.0) -> None:
        self.job = job
        self.now = now
        self.targets: dict[str, FakeTarget] = {}
        self.calls: list[str] = []
        #: The ``Authorization`` header of every HTTP request ("" when absent).
        self.authorizations: list[str] = []
        #: Seconds the HTTP server waits between body bytes (0: sends at once).
        self.trickle_s = 0.0
        #: When True, the HTTP server sends its answers gzip-compressed, whatever was asked.
        self.gzip = False
        #: Where the HTTP server redirects every query instead of answering (None: it answers).
        self.redirect_to: str | None = None
        #: Per query, an answer body to send instead (a broken or hostile server).
        self.override: dict[Query, bytes] = {}
        self._by_text = {query_text(query, job): query for query in Query}

    def series(self, query: Query) -> list[tuple[dict[str, str], float | None]]:
        """``(labels, value)`` of every series ``query`` returns now."""
        out: list[tuple[dict[str, str], float | None]] = []
        for instance, target in sorted(self.targets.items()):
            out.extend(self._of(query, instance, target))
        return out

    def _of(
        self, query: Query, instance: str, t: FakeTarget
    ) -> list[tuple[dict[str, str], float | None]]:
        me = {"instance": instance}
        if query is Query.DOWN:
            return [(me, t.up)] if t.up == 0 else []
        if not t.series:
            return []
        if query is Query.FRESH:
            return [(me, t.scraped_at)]
        if query is Query.NODE_USED:
            return [({**me, "ip": t.ip}, t.used)]
        if query is Query.NODE_TOTAL:
            return [(me, t.total)]
        if query is Query.EVICTIONS:
            return [({**me, "Name": name}, count) for name, count in t.evictions.items()]
        if query is Query.KERNEL_KILLS:
            return [] if t.kernel_kills is None else [(me, t.kernel_kills)]
        if t.sampled_at is None:
            return []
        if query is Query.SAMPLED_AT:
            return [(me, t.sampled_at)]
        rows: list[tuple[dict[str, str], float | None]] = []
        memory, processes_kind, growth_kind, pss_age_kind = GROUP_KINDS
        for group, (rss, pss, processes, growth) in t.groups.items():
            named = {**me, "rl_worker_group": group}
            if query is Query.GROUPS:
                rows.append(({**named, "k": memory}, rss))
                if processes is not None:
                    rows.append(({**named, "k": processes_kind}, processes))
                if growth is not None:
                    rows.append(({**named, "k": growth_kind}, growth))
                if group in t.pss_ages:
                    rows.append(({**named, "k": pss_age_kind}, t.pss_ages[group]))
            elif query is Query.GROUP_PSS and pss is not None:
                rows.append((named, pss))
        if t.node is not None:
            used, growth, outside, growing, limit, left, window = t.node
            if query is Query.NODE_FIGURES:
                values = (used, growth, outside, limit, left)
                rows.extend(
                    ({**me, "k": kind}, value)
                    for kind, value in zip(NODE_KINDS, values)
                    if value is not None
                )
            elif query is Query.GROWING and growing == 1:
                rows.append((me, 1.0))
            elif query is Query.WINDOW:
                identity = {**me, "rl_sampler": t.sampler, "rl_started_by": t.started_by}
                rows.append((identity, window))
        return rows

    def answer(self, query: Query) -> bytes:
        """The JSON body Prometheus would send for ``query``."""
        if query in self.override:
            return self.override[query]
        result = [
            {"metric": labels, "value": [self.now, _number(value)]}
            for labels, value in self.series(query)
        ]
        document = {"status": "success", "data": {"resultType": "vector", "result": result}}
        return json.dumps(document, separators=(",", ":")).encode()

    def fetch(
        self, settings: PrometheusSettings, queries: tuple[Query, ...]
    ) -> Mapping[Query, Answer]:
        """A ``Fetcher``: every query answered in process."""
        answers = {}
        for query in queries:
            self.calls.append(query_text(query, settings.job))
            answers[query] = Answer(self.answer(query), None, 0.0)
        return answers

    def serve(self) -> web.Application:
        """An aiohttp application serving ``/api/v1/query`` (GET or form POST)."""

        async def handle(request: web.Request) -> web.StreamResponse:
            form: Any = await request.post() if request.method == "POST" else request.query
            text = str(form.get("query", ""))
            self.calls.append(text)
            self.authorizations.append(request.headers.get("Authorization", ""))
            if self.redirect_to is not None:
                raise web.HTTPTemporaryRedirect(self.redirect_to)
            query = self._by_text.get(text)
            if query is None:
                body = {"status": "error", "errorType": "bad_data", "error": "unknown query"}
                return web.json_response(body, status=400)
            if self.gzip:
                return web.Response(
                    body=gzip.compress(self.answer(query)),
                    content_type="application/json",
                    headers={"Content-Encoding": "gzip"},
                )
            if self.trickle_s <= 0:
                return web.Response(body=self.answer(query), content_type="application/json")
            response = web.StreamResponse(headers={"Content-Type": "application/json"})
            await response.prepare(request)
            for byte in self.answer(query):
                await response.write(bytes([byte]))
                await asyncio.sleep(self.trickle_s)
            return response

        app = web.Application()
        app.router.add_route("GET", "/api/v1/query", handle)
        app.router.add_route("POST", "/api/v1/query", handle)
        return app

    @contextlib.contextmanager
    def running(self) -> Iterator[str]:
        """Serve :meth:`serve` on 127.0.0.1 (a free port) from a thread; yields the base URL."""
        loop = asyncio.new_event_loop()
        runner = web.AppRunner(self.serve())
        loop.run_until_complete(runner.setup())
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
        loop.run_until_complete(web.SockSite(runner, sock).start())
        thread = threading.Thread(target=loop.run_forever, name="fake-prometheus", daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            loop.run_until_complete(runner.cleanup())
            loop.close()
