"""`raylens watch` refuses, quickly and in one line, an address that is not a Ray cluster."""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from raylens.cli.gcs_probe import CliError, check_reachable, confirm_gcs

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


# ---------------------------------------------------------------- is it a GCS?


def _answering(code: str):
    asked: list[tuple[str, float]] = []

    def probe(address: str, timeout: float) -> str:
        asked.append((address, timeout))
        return code

    probe.asked = asked  # type: ignore[attr-defined]
    return probe


@pytest.mark.parametrize("code", ["OK"])
def test_a_gcs_that_answers_passes(code: str) -> None:
    probe = _answering(code)
    confirm_gcs("127.0.0.1:6379", probe=probe, timeout=3)
    assert probe.asked == [("127.0.0.1:6379", 3)]


@pytest.mark.parametrize(
    ("code", "says"),
    [
        ("UNIMPLEMENTED", "speaks gRPC but is not a Ray GCS"),
        ("DEADLINE_EXCEEDED", "no answer to a GCS request within 3 s"),
        ("UNAVAILABLE", "UNAVAILABLE"),
        ("INTERNAL\x1b[2J", "INTERNAL\\x1b[2J"),
    ],
)
def test_a_grpc_server_that_is_not_a_gcs_is_refused_in_one_line(code: str, says: str) -> None:
    with pytest.raises(CliError) as error:
        confirm_gcs("127.0.0.1:10001", probe=_answering(code), timeout=3)
    message = str(error.value)
    assert message.startswith("cannot reach a Ray cluster at '127.0.0.1:10001': ")
    assert says in message and "\n" not in message and "\x1b" not in message


def test_a_probe_that_never_returns_is_bounded_by_the_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from raylens.cli import gcs_probe

    monkeypatch.setattr(gcs_probe, "_PROBE_GRACE_S", 0.0)  # the bound is the deadline alone
    never = threading.Event()

    def stuck(address: str, timeout: float) -> str:
        never.wait()
        return "OK"

    try:
        started = time.monotonic()
        with pytest.raises(CliError, match=r"no answer to a GCS request within 0\.2 s"):
            confirm_gcs("127.0.0.1:10001", probe=stuck, timeout=0.2)
        assert time.monotonic() - started < 30
    finally:
        never.set()


def test_a_probe_that_fails_is_one_line() -> None:
    def broken(address: str, timeout: float) -> str:
        raise RuntimeError("grpc exploded\nsecond line")

    with pytest.raises(CliError, match=r"cannot ask .* grpc exploded\\x0asecond line"):
        confirm_gcs("127.0.0.1:10001", probe=broken, timeout=3)


@pytest.mark.usefixtures("usual_ctrl_c")
def test_ctrl_c_during_the_probe_ends_it_at_once() -> None:
    release = threading.Event()

    def interrupted(address: str, timeout: float) -> str:
        os.kill(os.getpid(), signal.SIGINT)  # as a Ctrl-C typed while the probe waits
        release.wait()
        return "OK"

    try:
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            confirm_gcs("127.0.0.1:10001", probe=interrupted, timeout=600)
        assert time.monotonic() - started < 60  # far below the probe's own deadline
    finally:
        release.set()


@pytest.mark.parametrize("address", ["ray://head:10001", "ray://10.0.0.5"])
def test_a_ray_client_address_is_refused_saying_what_to_pass(address: str) -> None:
    probe = _answering("OK")
    with pytest.raises(CliError) as error:
        confirm_gcs(address, probe=probe, timeout=3)
    message = str(error.value)
    assert "Ray Client" in message and "--address" in message and ":6379" in message
    assert probe.asked == []


def test_auto_is_left_to_ray() -> None:
    probe = _answering("UNIMPLEMENTED")
    confirm_gcs("auto", probe=probe, timeout=3)
    assert probe.asked == []


def test_watch_refuses_a_server_that_is_not_a_gcs_before_ray_init(
    grpc_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    import types

    from raylens.cli import cluster_views
    from raylens.cli.parser import build_parser

    def init(**kwargs: object) -> None:
        raise AssertionError("ray.init must not be reached")

    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(init=init))
    args = build_parser().parse_args(["watch", "--address", f"127.0.0.1:{grpc_port}", "--once"])
    probe = _answering("UNIMPLEMENTED")
    with pytest.raises(CliError, match="not a Ray GCS"):
        cluster_views.run_watch(args, threading.Event(), probe=probe)
    assert probe.asked == [(f"127.0.0.1:{grpc_port}", pytest.approx(5.0))]


# ---------------------------------------------------------------- token authentication

# What a Ray 2.60 GCS with token authentication answers a call without the token.
_RAY_REFUSAL = "InvalidAuthToken: Authentication token is missing or incorrect"


@pytest.fixture
def token_gcs() -> Iterator[int]:
    """A gRPC server on 127.0.0.1 that refuses every call as an authenticating GCS does."""
    grpc = pytest.importorskip("grpc")
    from concurrent import futures

    class Refuse(grpc.GenericRpcHandler):
        def service(self, details: object) -> object:
            def refuse(request: bytes, context: object) -> bytes:
                context.abort(grpc.StatusCode.UNAUTHENTICATED, _RAY_REFUSAL)  # type: ignore[attr-defined]
                return b""

            return grpc.unary_unary_rpc_method_handler(refuse)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), handlers=[Refuse()])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield port
    finally:
        server.stop(grace=None)


def _plain_grpc_probe(address: str, timeout: float) -> str:
    """The GCS question over a plain channel: what Ray's channel sends without a token."""
    import grpc

    from raylens.cli.gcs_probe import ask_gcs

    with grpc.insecure_channel(address) as channel:
        return ask_gcs(channel, timeout)


_TOKEN_VARIABLES = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def test_a_gcs_that_asks_for_a_token_says_so_and_how_to_give_one(
    token_gcs: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in _TOKEN_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    address = f"127.0.0.1:{token_gcs}"
    started = time.monotonic()
    with pytest.raises(CliError) as error:
        confirm_gcs(address, probe=_plain_grpc_probe, timeout=5)
    assert time.monotonic() - started < 5  # a refusal is an answer: no waiting for a deadline
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"the Ray cluster at '{address}' asks for an authentication token")
    assert "RAY_AUTH_MODE=token" in message and "RAY_AUTH_TOKEN" in message
    assert "ray get-auth-token" in message


def test_a_refused_token_is_told_apart_from_a_missing_one(
    token_gcs: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN", "not-the-cluster-token")
    address = f"127.0.0.1:{token_gcs}"
    with pytest.raises(CliError) as error:
        confirm_gcs(address, probe=_plain_grpc_probe, timeout=5)
    message = str(error.value)
    assert message.startswith(f"the Ray cluster at '{address}' refused the authentication token")
    assert "RAY_AUTH_TOKEN" in message and "not-the-cluster-token" not in message


def test_watch_stops_at_the_token_refusal_before_ray_init(
    token_gcs: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    import types

    from raylens.cli import cluster_views
    from raylens.cli.parser import build_parser

    def init(**kwargs: object) -> None:
        raise AssertionError("ray.init must not be reached")

    for name in _TOKEN_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(init=init))
    args = build_parser().parse_args(["watch", "--address", f"127.0.0.1:{token_gcs}", "--once"])
    with pytest.raises(CliError, match="asks for an authentication token"):
        cluster_views.run_watch(args, threading.Event(), probe=_plain_grpc_probe)
