"""`raylens watch` refuses, quickly and in one line, an address that is not a Ray cluster."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from raylens.cli.gcs_probe import CliError, check_reachable

# An HTTP/2 frame header: empty payload, type SETTINGS, no flags, stream 0.
_SETTINGS_FRAME = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def _serve_once(reply: bytes) -> Iterator[int]:
    """A server on 127.0.0.1 that reads what a client sends first and answers ``reply``."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    done = threading.Event()

    def answer() -> None:
        try:
            connection, _ = server.accept()
        except OSError:
            return
        with connection:
            connection.settimeout(5)
            try:
                connection.recv(1024)
                connection.sendall(reply)
                done.wait(5)
            except OSError:
                pass

    thread = threading.Thread(target=answer, name="raylens-test-fake-server", daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        done.set()
        server.close()
        thread.join(5)


@pytest.fixture
def http1_port() -> Iterator[int]:
    yield from _serve_once(b"HTTP/1.0 400 Bad Request\r\n\r\n")


@pytest.fixture
def grpc_port() -> Iterator[int]:
    yield from _serve_once(_SETTINGS_FRAME)


def test_a_port_that_is_not_a_ray_gcs_is_refused_naming_it(http1_port: int) -> None:
    address = f"127.0.0.1:{http1_port}"
    with pytest.raises(CliError, match=rf"cannot reach a Ray cluster at '{address}': .*not"):
        check_reachable(address)


def test_a_grpc_server_passes_the_check(grpc_port: int) -> None:
    check_reachable(f"127.0.0.1:{grpc_port}")


def test_with_tls_only_the_connection_is_checked(
    http1_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAY_USE_TLS", "1")
    check_reachable(f"127.0.0.1:{http1_port}")
