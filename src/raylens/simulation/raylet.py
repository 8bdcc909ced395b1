"""FakeRaylet: a real HTTP server on 127.0.0.1 that answers like a raylet's metrics endpoint.

The body is a real Ray 2.60 worker capture (``payloads/worker.prom``) with the two
host-memory samples set to whatever the test asks for, and the machine's pair
(``*_host``) raised to match where the capture's machine would be smaller. At run time a raylet can be
switched to misbehave in the ways a scraper has to survive: answer late, never
answer, trickle its body one byte at a time, answer with any status, reset the
connection, send garbage, send an enormous body, or leave the memory series out.

Each server is a :class:`http.server.ThreadingHTTPServer` whose requests run on
daemon threads (``raylens-fake-raylet-request``). Accepting is shared: one daemon
thread (``raylens-fake-raylet-acceptor``) multiplexes the listening sockets of every
open raylet with a selector, so a thousand raylets cost one idle thread, not a
thousand. It exits by itself
when the last raylet closes, so no state outlives the raylets.

:meth:`FakeRaylet.close` never waits for a request in flight: hung, delayed and
trickling requests notice the close (or the client going away) within
:data:`_POLL_S` and end.
"""

from __future__ import annotations

import contextlib
import random
import selectors
import socket
import socketserver
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any

__all__ = [
    "RECORDED_PAYLOADS",
    "FakeRaylet",
    "RayletCall",
    "format_sample_value",
    "load_payload",
    "load_recorded_payload",
]

_POLL_S = 0.1
_USED_SERIES = b"ray_node_mem_used"
_TOTAL_SERIES = b"ray_node_mem_total"
_MACHINE_USED_SERIES = b"ray_node_mem_used_host"
_MACHINE_TOTAL_SERIES = b"ray_node_mem_total_host"
_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

MemorySource = Callable[[], tuple[float, float]]


#: The Ray 2.60 raylet captures bundled with the fakes, by file name: two Prometheus text
#: scrapes (a head node and a worker node) and the head node's OpenMetrics scrape.
RECORDED_PAYLOADS = ("head.prom", "worker.prom", "head.openmetrics")


def load_recorded_payload(filename: str) -> bytes:
    """The raw bytes of the bundled capture ``filename``, one of :data:`RECORDED_PAYLOADS`."""
    if filename not in RECORDED_PAYLOADS:
        raise ValueError(
            f"recorded payload {filename!r} is not bundled; choose one of {RECORDED_PAYLOADS}"
        )
    # One name per joinpath: Python 3.10's reader for a zipped package takes no more.
    return (
        resources.files("raylens.simulation").joinpath("payloads").joinpath(filename).read_bytes()
    )


def load_payload(name: str = "worker") -> bytes:
    """The bundled Ray 2.60 capture ``name`` (``"worker"``: ~97 KB, ``"head"``: ~340 KB)."""
    if name not in ("worker", "head"):
        raise ValueError(f"payload {name!r} is not bundled; choose 'worker' or 'head'")
    return load_recorded_payload(f"{name}.prom")


def format_sample_value(value: float) -> str:
    """Render ``value`` the way Ray's exporter does: large numbers in scientific notation.

    ``1194815488.0`` becomes ``1.194815488e+09``; the shortest mantissa that reads
    back to the same float is used.
    """
    value = float(value)
    if value != value or value in (float("inf"), float("-inf")):
        return {"inf": "+Inf", "-inf": "-Inf"}.get(repr(value), "NaN")
    if value == 0 or 1e-4 <= abs(value) < 1e6:
        return repr(value)
    for precision in range(17):
        text = f"{value:.{precision}e}"
        if float(text) == value:
            return text
    return repr(value)


def _sample_line_bounds(payload: bytes, series: bytes) -> tuple[int, int]:
    """Start and end offsets of the value of ``series``' one sample line in ``payload``."""
    for prefix in (b"\n" + series + b"{", b"\n" + series + b" "):
        start = payload.find(prefix)
        if start >= 0:
            end = payload.index(b"\n", start + 1)
            value_start = payload.rindex(b" ", start, end) + 1
            return value_start, end
    raise ValueError(f"payload has no {series.decode()!r} sample line")


class _Template:
    """A payload split around its memory values, so rendering is one join.

    The node's pair (``ray_node_mem_used``, ``ray_node_mem_total``) must be there.
    The machine's pair (``*_host``), where the payload has it, is rendered as the
    recorded figure raised to the node's own when that is larger: a raylet's machine
    is never smaller than the container it reports, nor uses less than it.
    """

    def __init__(self, payload: bytes) -> None:
        used = _sample_line_bounds(payload, _USED_SERIES)
        total = _sample_line_bounds(payload, _TOTAL_SERIES)
        if used[0] > total[0]:
            raise ValueError("expected ray_node_mem_used before ray_node_mem_total")
        # (start, end, which node figure it follows, the recorded value or None)
        slots: list[tuple[int, int, int, float | None]] = [(*used, 0, None), (*total, 1, None)]
        for index, series in ((0, _MACHINE_USED_SERIES), (1, _MACHINE_TOTAL_SERIES)):
            try:
                start, end = _sample_line_bounds(payload, series)
                recorded = float(payload[start:end])
            except ValueError:  # a payload of the caller's own without the machine's pair
                continue
            slots.append((start, end, index, recorded))
        slots.sort()
        self._parts: list[bytes] = []
        self._slots = [(index, recorded) for _start, _end, index, recorded in slots]
        position = 0
        for start, end, _index, _recorded in slots:
            self._parts.append(payload[position:start])
            position = end
        self._parts.append(payload[position:])
        self.without_memory = _drop_series(payload, (_USED_SERIES, _TOTAL_SERIES))

    def render(self, used: float, total: float) -> bytes:
        node = (used, total)
        pieces = [self._parts[0]]
        for (index, recorded), part in zip(self._slots, self._parts[1:]):
            value = node[index] if recorded is None else max(recorded, node[index])
            pieces.append(format_sample_value(value).encode())
            pieces.append(part)
        return b"".join(pieces)


def _drop_series(payload: bytes, names: tuple[bytes, ...]) -> bytes:
    """``payload`` without the HELP, TYPE and sample lines of exactly ``names``."""
    kept = []
    for line in payload.split(b"\n"):
        if line.startswith(b"#"):
            words = line.split(b" ", 3)
            if len(words) >= 3 and words[2] in names:
                continue
        else:
            end = len(line)
            for stop in (b"{", b" "):
                index = line.find(stop)
                if 0 <= index < end:
                    end = index
            if line[:end] in names:
                continue
        kept.append(line)
    return b"\n".join(kept)


def _garbage() -> bytes:
    rng = random.Random(20260)
    noise = bytes(rng.randrange(256) for _ in range(4096))
    return (
        b"<html><body>not prometheus</body></html>\n"
        b'ray_node_mem_used{ip="10.0.0.1" 12abc\n'
        b"ray_node_mem_total oops\n" + noise
    )


@dataclass(frozen=True)
class RayletCall:
    """One request a :class:`FakeRaylet` received: what :attr:`FakeRaylet.calls` lists."""

    method: str
    path: str
    #: The request headers, names as the client sent them.
    headers: dict[str, str]


@dataclass(frozen=True)
class _Behaviour:
    """How the raylet answers the next request."""

    mode: str = "ok"
    seconds: float = 0.0
    status: int = 200
    body: bytes | None = None
    size: int = 0
    announce_length: bool = False
    trickle_headers: bool = False
    reason: str | None = None
    headers: tuple[tuple[str, str], ...] = ()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    # Bounds how long a connection that never sends its request line holds a thread.
    timeout = 10.0
    server: _RayletHTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        raylet = self.server.raylet
        raylet._request_started(RayletCall(self.command, self.path, dict(self.headers.items())))
        try:
            self._answer(raylet, raylet._behaviour)
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            pass  # the client gave up: exactly what a scraper under test may do
        finally:
            raylet._request_finished()

    def _answer(self, raylet: FakeRaylet, behaviour: _Behaviour) -> None:
        mode = behaviour.mode
        if mode == "hang":
            raylet._wait(self.connection, None)
            self.close_connection = True
            return
        if mode == "delay" and not raylet._wait(self.connection, behaviour.seconds):
            return
        if mode == "reset":
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
            return
        if mode == "status":
            body = behaviour.body if behaviour.body is not None else b""
            self.send_response_only(behaviour.status, behaviour.reason)
            self.send_header("Content-Type", _CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            for name, value in behaviour.headers:
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)
            return
        if mode == "garbage":
            self._send(200, behaviour.body if behaviour.body is not None else _garbage())
            return
        if mode == "huge":
            self._send_huge(behaviour.size, behaviour.announce_length)
            return
        body = raylet._render(omit_memory=mode == "omit")
        if mode == "trickle":
            self._trickle(raylet, body, behaviour.seconds, headers=behaviour.trickle_headers)
            return
        self._send(200, body)

    def _send_headers(self, status: int, length: int | None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", _CONTENT_TYPE)
        if length is not None:
            self.send_header("Content-Length", str(length))
        self.end_headers()

    def _send(self, status: int, body: bytes) -> None:
        self._send_headers(status, len(body))
        self.wfile.write(body)

    def _trickle(self, raylet: FakeRaylet, body: bytes, interval: float, *, headers: bool) -> None:
        if headers:
            # Written by hand: the status line and headers go out a byte at a time too.
            head = (
                f"{self.protocol_version} 200 OK\r\n"
                f"Content-Type: {_CONTENT_TYPE}\r\n"
                f"Content-Length: {len(body)}\r\n\r\n"
            )
            data = head.encode("latin-1") + body
        else:
            self._send_headers(200, len(body))
            self.wfile.flush()
            data = body
        for index in range(len(data)):
            self.wfile.write(data[index : index + 1])
            self.wfile.flush()
            if not raylet._wait(self.connection, interval):
                return

    def _send_huge(self, size: int, announce_length: bool) -> None:
        self._send_headers(200, size if announce_length else None)
        block = b"# filler line to make a very large metrics payload\n" * 1300
        sent = 0
        while sent < size and not self.server.raylet.closed:
            chunk = block[: size - sent]
            self.wfile.write(chunk)
            sent += len(chunk)


class _RayletHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    request_queue_size = 128
    timeout = 0  # handle_request() is only called once the socket is readable

    def __init__(self, address: tuple[str, int], raylet: FakeRaylet) -> None:
        self.raylet = raylet
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the host's FQDN, which is slow and pointless here.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a misbehaving raylet is the point; tests read its counters, not stderr

    def process_request(self, request: Any, client_address: Any) -> None:
        # ThreadingMixIn's own thread, with a name that says whose it is.
        threading.Thread(
            target=self.process_request_thread,
            args=(request, client_address),
            name="raylens-fake-raylet-request",
            daemon=True,
        ).start()


class _Acceptor:
    """One daemon thread accepting connections for every open :class:`FakeRaylet`.

    The thread starts with the first raylet and exits soon after the last one
    closes, so nothing here needs resetting between tests.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._selector = selectors.DefaultSelector()
        self._servers: dict[int, _RayletHTTPServer] = {}
        self._thread: threading.Thread | None = None

    def add(self, server: _RayletHTTPServer) -> None:
        server.socket.setblocking(False)
        with self._lock:
            self._selector.register(server.socket, selectors.EVENT_READ, server)
            self._servers[id(server)] = server
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="raylens-fake-raylet-acceptor", daemon=True
                )
                self._thread.start()

    def remove(self, server: _RayletHTTPServer) -> None:
        with self._lock:
            if self._servers.pop(id(server), None) is None:
                return
            with contextlib.suppress(KeyError, ValueError, OSError):
                self._selector.unregister(server.socket)

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._servers:
                    self._thread = None
                    return
            try:
                ready = self._selector.select(timeout=_POLL_S)
            except OSError:
                continue
            for key, _events in ready:
                server = key.data
                with contextlib.suppress(Exception):  # a raylet closing mid-accept
                    server.handle_request()


_ACCEPTOR = _Acceptor()


class FakeRaylet:
    """A raylet metrics endpoint on ``127.0.0.1`` with scriptable memory and failures.

    ``used`` and ``total`` are the bytes reported by ``ray_node_mem_used`` and
    ``ray_node_mem_total``; ``memory`` (a callable returning ``(used, total)``)
    replaces them and is read on every request. ``template`` is ``"worker"``,
    ``"head"`` or a payload of your own that contains both series.

    Use as a context manager or call :meth:`close`. :attr:`requests` counts the
    requests received and :attr:`calls` lists them (method, path, headers), like
    ``responses.calls``; :meth:`wait_for_requests` waits for a count without sleeping.
    """

    def __init__(
        self,
        used: float = 1.2e9,
        total: float = 2.5e10,
        *,
        memory: MemorySource | None = None,
        template: str | bytes = "worker",
        host: str = "127.0.0.1",
        extra: Callable[[], bytes] | None = None,
    ) -> None:
        payload = load_payload(template) if isinstance(template, str) else bytes(template)
        #: Lines appended to every healthy payload, read on every request (for example
        #: the per-group series a node's sampler publishes).
        self._extra = extra
        self._template = _Template(payload)
        self._memory_lock = threading.Lock()
        self._used = float(used)
        self._total = float(total)
        self._memory = memory
        self._behaviour = _Behaviour()
        self._closed = threading.Event()
        self._counter = threading.Condition()
        self._requests = 0
        self._in_flight = 0
        self._calls: list[RayletCall] = []
        self._server = _RayletHTTPServer((host, 0), self)
        self.host = host
        self.port: int = self._server.server_port
        _ACCEPTOR.add(self._server)

    # Where it is -------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The metrics URL, ``http://127.0.0.1:<port>/metrics``."""
        return f"http://{self.host}:{self.port}/metrics"

    @property
    def requests(self) -> int:
        """Requests received so far (every mode counts)."""
        with self._counter:
            return self._requests

    @property
    def calls(self) -> list[RayletCall]:
        """Every request received so far, oldest first (a copy)."""
        with self._counter:
            return list(self._calls)

    @property
    def in_flight(self) -> int:
        """Requests being answered right now (hung ones included)."""
        with self._counter:
            return self._in_flight

    def wait_for_requests(self, count: int, timeout: float = 5.0) -> bool:
        """Block until :attr:`requests` reaches ``count``; False if ``timeout`` passes first."""
        with self._counter:
            return self._counter.wait_for(lambda: self._requests >= count, timeout)

    def wait_idle(self, timeout: float = 5.0) -> bool:
        """Block until no request is in flight; False if ``timeout`` passes first."""
        with self._counter:
            return self._counter.wait_for(lambda: self._in_flight == 0, timeout)

    # What it serves ----------------------------------------------------------------

    def set_memory(self, used: float, total: float) -> None:
        """Report ``used`` and ``total`` bytes from the next request on."""
        with self._memory_lock:
            self._used, self._total, self._memory = float(used), float(total), None

    def payload(self) -> bytes:
        """The body a healthy request would get right now."""
        return self._render(omit_memory=False)

    def serve_normally(self) -> None:
        """Answer every request at once with the payload (the initial behaviour)."""
        self._behaviour = _Behaviour()

    def delay(self, seconds: float) -> None:
        """Wait ``seconds`` before answering normally."""
        self._behaviour = _Behaviour("delay", seconds=float(seconds))

    def hang(self) -> None:
        """Accept requests and never answer until the client leaves or the raylet closes."""
        self._behaviour = _Behaviour("hang")

    def trickle(self, interval: float = 0.05, *, headers: bool = False) -> None:
        """Send the headers, then the body one byte every ``interval`` seconds.

        With ``headers`` the status line and headers are sent a byte at a time as
        well, so a client is kept waiting before it even has a response.
        """
        self._behaviour = _Behaviour(
            "trickle", seconds=float(interval), trickle_headers=bool(headers)
        )

    def respond_status(
        self,
        status: int,
        body: bytes = b"",
        *,
        reason: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        """Answer with HTTP ``status`` and ``body``.

        ``reason`` replaces the standard reason phrase (written as given, control
        characters included, as a hostile server could); ``headers`` are added to
        the response (``{"Content-Encoding": "gzip"}``, say).
        """
        self._behaviour = _Behaviour(
            "status",
            status=int(status),
            body=body,
            reason=reason,
            headers=tuple((headers or {}).items()),
        )

    def reset_connections(self) -> None:
        """Read the request, then reset the connection (RST, no response)."""
        self._behaviour = _Behaviour("reset")

    def serve_garbage(self, body: bytes | None = None) -> None:
        """Answer 200 with ``body`` (default: binary noise and malformed sample lines)."""
        self._behaviour = _Behaviour("garbage", body=body)

    def serve_huge(self, size: int = 64 * 1024 * 1024, *, announce_length: bool = False) -> None:
        """Answer 200 with ``size`` bytes of filler; ``Content-Length`` only if ``announce_length``."""
        self._behaviour = _Behaviour("huge", size=int(size), announce_length=announce_length)

    def omit_memory_series(self) -> None:
        """Serve the payload without ``ray_node_mem_used`` and ``ray_node_mem_total``.

        The ``*_host`` and ``ray_node_mem_shared_bytes`` series stay, as they would
        on a raylet that does not publish the two wanted ones.
        """
        self._behaviour = _Behaviour("omit")

    @property
    def mode(self) -> str:
        """The current behaviour's name: ``ok``, ``delay``, ``hang``, ``trickle``, ..."""
        return self._behaviour.mode

    # Lifetime ----------------------------------------------------------------------

    def close(self) -> None:
        """Stop listening and release every request in flight. Idempotent, never blocks long."""
        if self._closed.is_set():
            return
        self._closed.set()
        _ACCEPTOR.remove(self._server)
        self._server.server_close()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def __enter__(self) -> FakeRaylet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else self.mode
        return f"FakeRaylet({self.url}, {state}, requests={self.requests})"

    # Used by the request handler ---------------------------------------------------

    def _render(self, *, omit_memory: bool) -> bytes:
        if omit_memory:
            return self._template.without_memory
        with self._memory_lock:
            source, used, total = self._memory, self._used, self._total
        if source is not None:
            used, total = source()
        body = self._template.render(used, total)
        return body + self._extra() if self._extra is not None else body

    def _request_started(self, call: RayletCall) -> None:
        with self._counter:
            self._calls.append(call)
            self._requests += 1
            self._in_flight += 1
            self._counter.notify_all()

    def _request_finished(self) -> None:
        with self._counter:
            self._in_flight -= 1
            self._counter.notify_all()

    def _wait(self, conn: socket.socket, seconds: float | None) -> bool:
        """Wait ``seconds`` (forever if None) while the raylet is open and the client connected.

        True when the time ran out normally; False when the raylet closed or the
        client hung up, in which case the request should end without answering.
        """
        deadline = None if seconds is None else time.monotonic() + seconds
        selector = selectors.DefaultSelector()
        try:
            selector.register(conn, selectors.EVENT_READ)
            while True:
                if self._closed.is_set():
                    return False
                step = _POLL_S
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return True
                    step = min(step, left)
                if selector.select(step):
                    try:
                        data = conn.recv(4096)
                    except BlockingIOError:
                        continue
                    except OSError:
                        return False
                    if not data:
                        return False
        finally:
            selector.close()
