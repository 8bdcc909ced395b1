"""Make sure ``raylens watch --address`` points at a Ray GCS before Ray is asked to connect.

``ray.init`` retries an address that is wrong for minutes, or hangs on a gRPC server
that is not a GCS; the checks here answer in seconds with one line.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from raylens.cli.parser import CliError
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
    and a ``ray://`` address to :func:`confirm_gcs`, which refuses it. A gRPC server
    that is not a GCS passes here; :func:`confirm_gcs` tells it apart.
    """
    import socket

    from raylens.lens.config import parse_host_port

    if address == "auto" or "://" in address:
        return
    try:
        host, port = parse_host_port(address, source="--address")
    except ValueError as error:
        raise CliError(str(error)) from None
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

# Answers that prove a GCS is there: it answered, or it wants credentials that
# ray.init, not raylens, deals with.
_GCS_ANSWERS = frozenset({"OK", "UNAUTHENTICATED", "PERMISSION_DENIED"})


def ray_gcs_probe(address: str, timeout: float) -> str:
    """Call the GCS's ``GetClusterId`` at ``address``; returns the gRPC status code's name.

    The channel is made the way Ray makes its own (TLS from ``RAY_USE_TLS``, token
    authentication when enabled), so a GCS that Ray can talk to answers ``OK``. Any
    other gRPC server (the Ray Client server, a raylet, an OTLP collector) answers
    ``UNIMPLEMENTED``.
    """
    import grpc
    from ray._private.grpc_utils import init_grpc_channel
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    channel = init_grpc_channel(address)
    try:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        stub.GetClusterId(gcs_service_pb2.GetClusterIdRequest(), timeout=timeout)
    except grpc.RpcError as error:
        code = error.code() if callable(getattr(error, "code", None)) else None
        return getattr(code, "name", None) or "UNKNOWN"
    finally:
        channel.close()
    return "OK"


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
    returns is bounded and a Ctrl-C ends the wait at once. ``ray://`` addresses are
    refused with the address to pass instead; ``auto`` is left to Ray.
    """
    if address.startswith("ray://"):
        raise CliError(printable(_ray_client_advice(address)))
    if address == "auto" or "://" in address:
        return
    answer: list[str] = []
    failure: list[BaseException] = []
    done = threading.Event()

    def ask() -> None:
        try:
            answer.append((probe or ray_gcs_probe)(address, timeout))
        except BaseException as error:  # reported in the caller's thread
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
