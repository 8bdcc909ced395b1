"""Make sure ``raylens watch --address`` points at a Ray GCS before Ray is asked to connect.

``ray.init`` retries an address that is wrong for minutes, or hangs on a gRPC server
that is not a GCS; the checks here answer in seconds with one line.
"""

from __future__ import annotations

import os

from raylens.cli.parser import CliError

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
    the connection is checked. ``auto`` and ``ray://`` addresses are left to Ray,
    which answers those quickly.
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
