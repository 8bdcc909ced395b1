"""Make sure ``raylens watch --address`` points at a Ray GCS before Ray is asked to connect.

``ray.init`` retries an address that is wrong for minutes, hangs on a gRPC server that
is not a GCS, and retries a GCS that wants an authentication token for many seconds,
logging every refusal; the checks here answer in seconds with one line.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

from raylens.cli.parser import CliError, cluster_address, split_host_port
from raylens.safe_text import printable

# A client's HTTP/2 greeting, then an empty SETTINGS frame; a gRPC server answers with
# a SETTINGS frame of its own, whose 9-byte header has type 0x04 at index 3.
_HTTP2_GREETING = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_HTTP2_FRAME_HEADER = 9
_HTTP2_SETTINGS = 0x04


def check_reachable(address: str, timeout: float = 5.0) -> None:
    """Fail fast on a ``host:port`` that is not a Ray cluster; ``ray.init`` would retry for minutes.

    A cluster's address is its GCS, a gRPC server, which answers an HTTP/2
    greeting with its settings. A port nobody listens on, one that stays silent,
    or one that speaks something else (the dashboard's HTTP, say) is refused
    here. With ``RAY_USE_TLS`` the greeting would have to be encrypted, so only
    the connection is checked. ``auto`` is left to Ray, which resolves it quickly,
    and a ``ray://`` address to :func:`confirm_gcs`, which refuses it; any other
    scheme is refused here. A gRPC server that is not a GCS passes here;
    :func:`confirm_gcs` tells it apart.
    """
    import socket

    try:
        address = cluster_address(address, source="--address")
    except ValueError as error:
        raise CliError(str(error)) from None
    if address == "auto" or address.startswith("ray://"):
        return
    host, port = split_host_port(address)
    tls = os.environ.get("RAY_USE_TLS", "0").strip().lower() in ("1", "true")
    answer = b""
    try:
        with socket.create_connection((host, port), timeout=timeout) as connection:
            if tls:
                return
            connection.sendall(_HTTP2_GREETING)
            while len(answer) < _HTTP2_FRAME_HEADER:
                chunk = connection.recv(_HTTP2_FRAME_HEADER - len(answer))
                if not chunk:
                    break
                answer += chunk
    except TimeoutError:
        raise CliError(
            f"cannot reach a Ray cluster at {address!r}: no answer within {timeout:g} s"
        ) from None
    except OSError as error:
        if not answer:  # one that answered, then hung up, is judged by its answer below
            reason = error.strerror or str(error) or type(error).__name__
            raise CliError(f"cannot reach a Ray cluster at {address!r}: {reason}") from None
    if len(answer) < _HTTP2_FRAME_HEADER or answer[3] != _HTTP2_SETTINGS:
        raise CliError(
            f"cannot reach a Ray cluster at {address!r}: something listens there, but it is "
            "not a Ray GCS (give the cluster's GCS address, port 6379 by default, not the "
            "dashboard's or the Ray Client's)"
        )


# ----------------------------------------------------------------------- a real GCS call

# Ask a gRPC server one GCS question and return the gRPC status code's name ("OK",
# "UNIMPLEMENTED", "DEADLINE_EXCEEDED"...). The default asks through Ray's own channel
# set-up; tests pass fakes.
GcsProbe = Callable[[str, float], str]

PROBE_TIMEOUT_S = 5.0

# Answers that prove a GCS is there and would talk to this process as it is.
_GCS_ANSWERS = frozenset({"OK"})
# Answers of a GCS that wants credentials this process did not send, or sent wrong.
_CREDENTIALS_REFUSED = frozenset({"UNAUTHENTICATED", "PERMISSION_DENIED"})

# The one GCS question: the cluster's id, which every Ray GCS answers and nothing else does.
_GET_CLUSTER_ID = "/ray.rpc.NodeInfoGcsService/GetClusterId"


def ask_gcs(channel: Any, timeout: float) -> str:
    """Ask ``GetClusterId`` over a gRPC ``channel``; returns the gRPC status code's name.

    The request is the empty ``GetClusterIdRequest`` (zero bytes on the wire) and the
    reply is not decoded: only whether, and how, the server answered matters.
    """
    import grpc

    call = channel.unary_unary(
        _GET_CLUSTER_ID,
        request_serializer=lambda _request: b"",
        response_deserializer=lambda reply: reply,
    )
    try:
        call(b"", timeout=timeout)
    except grpc.RpcError as error:
        code = error.code() if callable(getattr(error, "code", None)) else None
        return getattr(code, "name", None) or "UNKNOWN"
    return "OK"


def ray_gcs_probe(address: str, timeout: float) -> str:
    """Call the GCS's ``GetClusterId`` at ``address``; returns the gRPC status code's name.

    The channel is made the way Ray makes its own (TLS from ``RAY_USE_TLS``, the
    token when ``RAY_AUTH_MODE=token``), so a GCS that Ray can talk to answers
    ``OK`` and one whose token authentication this process does not satisfy
    answers ``UNAUTHENTICATED``. Any other gRPC server (the Ray Client server, a
    raylet, an OTLP collector) answers ``UNIMPLEMENTED``.
    """
    from ray._private.grpc_utils import init_grpc_channel

    channel = init_grpc_channel(address)
    try:
        return ask_gcs(channel, timeout)
    finally:
        channel.close()


# Where Ray 2.60 reads a token from, in its order (ray._private.authentication).
_TOKEN_SOURCES = "RAY_AUTH_TOKEN, a file named by RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token"


def _token_advice(address: str, environ: Mapping[str, str]) -> str:
    """One line on a GCS that refused this process for want of the right token.

    Ray sends a token only with ``RAY_AUTH_MODE=token`` (and, for an address given
    explicitly, never turns that on by itself), so without it the token is missing;
    with it, the token found was not the cluster's. The token itself is never shown.
    """
    where = f"the Ray cluster at {address!r}"
    how = (
        f"give the cluster's token in {_TOKEN_SOURCES} "
        "(`ray get-auth-token` on the head node prints it); see "
        "https://docs.ray.io/en/latest/ray-security/token-auth.html"
    )
    if environ.get("RAY_AUTH_MODE", "").strip().lower() == "token":
        return f"{where} refused the authentication token given (RAY_AUTH_MODE=token): {how}"
    return (
        f"{where} asks for an authentication token (Ray's token authentication is on): "
        f"set RAY_AUTH_MODE=token and {how}"
    )


def _ray_client_advice(address: str) -> str:
    host = address[len("ray://") :].split("/", 1)[0]
    host = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    return (
        f"{address!r} is a Ray Client address, and raylens watch connects to the cluster's "
        f"GCS instead: pass --address {host or 'HEAD'}:6379 (the GCS port, 6379 unless the "
        "head was started with another --port)"
    )


def confirm_gcs(
    address: str, *, probe: GcsProbe | None = None, timeout: float = PROBE_TIMEOUT_S
) -> None:
    """Make sure ``address`` is a Ray GCS by asking it one GCS question under ``timeout``.

    A gRPC server that is not a GCS passes :func:`check_reachable`, and ``ray.init``
    then waits on it without end; this asks first. The question runs on a daemon
    thread and this waits for it with a deadline of its own, so a probe that never
    returns is bounded and a Ctrl-C ends the wait at once. A GCS that refuses the
    question for want of a token (Ray's token authentication) is refused in one line
    saying how to give one, since ``ray.init`` would retry it for many seconds and log
    every refusal. ``ray://`` addresses are refused with the address to pass instead;
    ``auto`` is left to Ray.
    """
    if address.startswith("ray://"):
        raise CliError(printable(_ray_client_advice(address)))
    if address == "auto" or "://" in address:
        return
    answer: list[str] = []
    failure: list[Exception] = []
    done = threading.Event()

    def ask() -> None:
        try:
            answer.append((probe or ray_gcs_probe)(address, timeout))
        except Exception as error:  # noqa: BLE001 an injected probe's failure is the command's
            failure.append(error)
        finally:
            done.set()

    threading.Thread(target=ask, name="raylens-gcs-probe", daemon=True).start()
    # The probe holds the deadline itself; this bound only catches one that does not.
    finished = done.wait(timeout + _PROBE_GRACE_S)
    prefix = f"cannot reach a Ray cluster at {address!r}: "
    if failure:
        raise CliError(
            printable(f"cannot ask {address!r} whether it is a Ray GCS: {failure[0]}")
        ) from None
    code = answer[0] if finished and answer else "DEADLINE_EXCEEDED"
    if code in _GCS_ANSWERS:
        return
    if code in _CREDENTIALS_REFUSED:
        raise CliError(printable(_token_advice(address, os.environ)))
    if code == "DEADLINE_EXCEEDED":
        reason = f"no answer to a GCS request within {timeout:g} s"
    elif code == "UNIMPLEMENTED":
        reason = (
            "it speaks gRPC but is not a Ray GCS (a Ray Client port, a raylet or a "
            "collector?); give the cluster's GCS address, port 6379 by default"
        )
    else:
        reason = f"a GCS request failed with {code}"
    raise CliError(printable(prefix + reason))


# How long past its own deadline a probe may take before it counts as unanswered.
_PROBE_GRACE_S = 1.0
