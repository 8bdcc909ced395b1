"""FakeRaylet behaviours a scraper's deadline has to survive, beyond the basic ones."""

from __future__ import annotations

import socket
import threading

from raylens_fakes import FakeRaylet


def _first_bytes(raylet: FakeRaylet) -> bytes:
    with socket.create_connection(("127.0.0.1", raylet.port), timeout=5) as client:
        client.sendall(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        return client.recv(4096)


def test_trickle_can_hold_back_the_status_line_and_headers_too() -> None:
    with FakeRaylet() as raylet:
        # A long interval: the second byte cannot arrive before the client reads the first.
        raylet.trickle(2.0, headers=True)
        assert _first_bytes(raylet) == b"H"
        assert raylet.wait_idle(timeout=5)  # the client left; the handler noticed

        raylet.trickle(2.0)
        first = _first_bytes(raylet)
        assert first.startswith(b"HTTP/1.0 200 OK\r\n")
        assert b"Content-Length:" in first


def test_request_threads_are_named_daemons() -> None:
    with FakeRaylet() as raylet:
        raylet.hang()
        with socket.create_connection(("127.0.0.1", raylet.port), timeout=5) as client:
            client.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            assert raylet.wait_for_requests(1)
            # Other tests' hung handlers may still be winding down, so count only their names.
            handlers = [t for t in threading.enumerate() if t.name == "raylens-fake-raylet-request"]
            assert handlers and all(t.daemon for t in handlers)
        assert raylet.wait_idle(timeout=5)
