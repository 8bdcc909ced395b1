"""Port bands per service and the helpers that find free ports inside a band.

Every band here sits below 9000, the lowest ephemeral-port floor seen on GPU nodes
(stock Linux starts at 32768): a port the kernel hands out as a connection's source
port can then never collide with a service port chosen here between our check and the
service's bind. Ranges are half-open, ``[low, high)``.

The helpers bind real sockets on this host (or, through the remote function, on the
node that holds a bundle). Random choices go through the ``random`` module at call
time, so a test may replace ``random.shuffle`` or ``random.randint``.
"""

from __future__ import annotations

import random
import socket
from typing import Any

__all__ = [
    "DEFAULT_DYNAMO_CONTROL_PORT_RANGE_HIGH",
    "DEFAULT_DYNAMO_CONTROL_PORT_RANGE_LOW",
    "DEFAULT_DYNAMO_HTTP_PORT_RANGE_HIGH",
    "DEFAULT_DYNAMO_HTTP_PORT_RANGE_LOW",
    "DEFAULT_DYNAMO_SYSTEM_PORT_RANGE_HIGH",
    "DEFAULT_DYNAMO_SYSTEM_PORT_RANGE_LOW",
    "DEFAULT_GENERATION_PORT_RANGE_HIGH",
    "DEFAULT_GENERATION_PORT_RANGE_LOW",
    "DEFAULT_GYM_PORT_RANGE_HIGH",
    "DEFAULT_GYM_PORT_RANGE_LOW",
    "DEFAULT_MASTER_PORT_RANGE_HIGH",
    "DEFAULT_MASTER_PORT_RANGE_LOW",
    "DEFAULT_SGLANG_PROMETHEUS_PORT_RANGE_HIGH",
    "DEFAULT_SGLANG_PROMETHEUS_PORT_RANGE_LOW",
    "DEFAULT_SGLANG_ROUTER_PORT_RANGE_HIGH",
    "DEFAULT_SGLANG_ROUTER_PORT_RANGE_LOW",
    "DEFAULT_VLLM_PORTS_PER_ENGINE",
    "DEFAULT_VLLM_PORT_RANGE_LOW",
    "PortRangeError",
]

#: Dynamo's etcd/NATS control plane, allocated on the driver.
DEFAULT_DYNAMO_CONTROL_PORT_RANGE_LOW = 1313
DEFAULT_DYNAMO_CONTROL_PORT_RANGE_HIGH = 1400
#: Rendezvous (TCPStore, NCCL) master ports and the per-worker ports a virtual
#: cluster hands out; kept under Ray's worker gRPC ports, which start at 2000.
DEFAULT_MASTER_PORT_RANGE_LOW = 1400
DEFAULT_MASTER_PORT_RANGE_HIGH = 1999
#: The band shared by generation servers; Dynamo's HTTP and system endpoints live in it.
DEFAULT_GENERATION_PORT_RANGE_LOW = 3000
DEFAULT_GENERATION_PORT_RANGE_HIGH = 4999
DEFAULT_DYNAMO_HTTP_PORT_RANGE_LOW = 3000
DEFAULT_DYNAMO_HTTP_PORT_RANGE_HIGH = 4000
DEFAULT_DYNAMO_SYSTEM_PORT_RANGE_LOW = 4000
DEFAULT_DYNAMO_SYSTEM_PORT_RANGE_HIGH = 4100
#: NeMo-Gym's HTTP servers.
DEFAULT_GYM_PORT_RANGE_LOW = 5000
DEFAULT_GYM_PORT_RANGE_HIGH = 5999
#: vLLM engine rendezvous: engine ``i`` on a node starts at ``LOW + i * PER_ENGINE``.
DEFAULT_VLLM_PORT_RANGE_LOW = 7000
DEFAULT_VLLM_PORTS_PER_ENGINE = 100
#: SGLang's router and metrics, carved from the top of the vLLM band (one rollout
#: backend runs at a time) and above Ray's dashboard port, 8265.
DEFAULT_SGLANG_ROUTER_PORT_RANGE_LOW = 8600
DEFAULT_SGLANG_ROUTER_PORT_RANGE_HIGH = 8799
DEFAULT_SGLANG_PROMETHEUS_PORT_RANGE_LOW = 8800
DEFAULT_SGLANG_PROMETHEUS_PORT_RANGE_HIGH = 8999


class PortRangeError(RuntimeError):
    """No free port (or block of ports) was found in the range asked for."""


class ConsecutivePortsError(AssertionError, ValueError):
    """A block of consecutive ports was asked for with a size below 1.

    Both an AssertionError (what NeMo-RL raises) and a ValueError.
    """


def _check_range(port_range_low: int, port_range_high: int) -> None:
    for label, value in (("port_range_low", port_range_low), ("port_range_high", port_range_high)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= 65536:
            raise ValueError(f"{label}={value!r} must be an integer port between 1 and 65535")


def _bind_socket_in_range(
    sock: Any,
    port_range_low: int,
    port_range_high: int,
    max_retries: int | None = 50,
    excluded_ports: set[int] | None = None,
) -> int:
    """Bind ``sock`` to a port in ``[port_range_low, port_range_high)`` and return it.

    With ``max_retries`` set, up to that many random ports are tried (an excluded one
    counts as a try). With ``max_retries=None`` every port of the range that is not
    excluded is tried once, in random order. :class:`PortRangeError` (a RuntimeError)
    says how many were tried when none could be bound.
    """
    _check_range(port_range_low, port_range_high)
    excluded = excluded_ports or set()
    if max_retries is None:
        candidates = [p for p in range(port_range_low, port_range_high) if p not in excluded]
        random.shuffle(candidates)
        for port in candidates:
            try:
                sock.bind(("", port))
            except OSError:
                continue
            return port
        tried = f"all {len(candidates)} ports not excluded"
    else:
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 1:
            raise ValueError(f"max_retries={max_retries!r} must be a positive integer or None")
        for _ in range(max_retries):
            port = random.randint(port_range_low, port_range_high - 1)
            if port in excluded:
                continue
            try:
                sock.bind(("", port))
            except OSError:
                continue
            return port
        tried = f"{max_retries} attempts"
    raise PortRangeError(
        f"Could not find a free port in range [{port_range_low}, {port_range_high}) after {tried}"
    )


def _get_free_port_local(
    port_range_low: int = DEFAULT_MASTER_PORT_RANGE_LOW,
    port_range_high: int = DEFAULT_MASTER_PORT_RANGE_HIGH,
    *,
    max_retries: int | None = 50,
    excluded_ports: set[int] | None = None,
) -> int:
    """A port in ``[port_range_low, port_range_high)`` that could be bound on this host.

    The probing socket is closed before returning, so the caller can bind the port.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        port = _bind_socket_in_range(
            probe,
            port_range_low,
            port_range_high,
            max_retries=max_retries,
            excluded_ports=excluded_ports,
        )
        probe.listen(1)
    return port


def _get_free_consecutive_ports_local(
    port_range_low: int,
    port_range_high: int,
    consecutive: int = 1,
    start_port: int | None = None,
) -> int:
    """The first port of ``consecutive`` adjacent ports all bindable now on this host.

    The search walks upwards from ``start_port`` (clamped to ``port_range_low``) and
    the whole block stays below ``port_range_high``; a caller keeping a cursor passes
    the port after its last block to get a block that does not overlap it.
    """
    if isinstance(consecutive, bool) or not isinstance(consecutive, int) or consecutive < 1:
        raise ConsecutivePortsError(f"consecutive must be >= 1, got {consecutive!r}")
    _check_range(port_range_low, port_range_high)
    base = port_range_low if start_port is None else max(int(start_port), port_range_low)
    while base + consecutive <= port_range_high:
        held: list[socket.socket] = []
        try:
            for offset in range(consecutive):
                probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                held.append(probe)
                probe.bind(("", base + offset))
                probe.listen(1)
            return base
        except OSError:
            base += 1
        finally:
            for probe in held:
                probe.close()
    raise PortRangeError(
        f"Could not find {consecutive} consecutive free ports in "
        f"[{port_range_low}, {port_range_high})"
    )


def _get_node_ip_local() -> str:
    """This node's IP address as Ray reports it (never a hostname read as a number)."""
    import ray

    return str(ray.util.get_node_ip_address())


def _node_ip_and_free_port(
    port_range_low: int = DEFAULT_MASTER_PORT_RANGE_LOW,
    port_range_high: int = DEFAULT_MASTER_PORT_RANGE_HIGH,
) -> tuple[str, int]:
    """Runs on the node holding a bundle: its IP and a port free there in the range."""
    return _get_node_ip_local(), _get_free_port_local(port_range_low, port_range_high)
