"""The Ray nodes to scrape, and what is read from each one's payload.

Node records come from the GCS (through a :class:`~raylens.cluster.ClusterView`)
and are treated as untrusted: a record that is not a mapping, or whose node id or
address has the wrong type, is skipped with one warning and costs no other node.
Host names are made encodable here, where they enter raylens.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass

from raylens.cluster import ClusterView, default_cluster_view
from raylens.lens import reset_warn_once, warn_once
from raylens.lens.safe_text import encodable, printable
from raylens.telemetry._names import LOGGER_NAME, SERIES_BY_RAY_NAME
from raylens.telemetry.prometheus_text import extract_samples

__all__ = ["RayNode", "parse_memory_samples", "ray_nodes"]

logger = logging.getLogger(LOGGER_NAME)

#: Most malformed-record warning keys kept at once. Records that come back under new
#: ids would otherwise add a key each; the one listed least recently is forgotten first.
MAX_REMEMBERED_MALFORMED = 256

_MALFORMED_KEYS: OrderedDict[str, None] = OrderedDict()
_MALFORMED_LOCK = threading.Lock()


@dataclass(frozen=True)
class RayNode:
    """One live Ray node: who it is, and where its raylet serves metrics.

    ``node_id`` is Ray's hex node id, the only field that tells apart two nodes
    on one host; ``ip`` is the node manager's address. ``metrics_url`` is empty
    for a node that serves no metrics (see :attr:`serves_metrics`).
    """

    node_id: str
    host: str
    metrics_url: str
    ip: str = ""

    @functools.cached_property
    def key(self) -> tuple[str, str]:
        """``(node_id, host)``: how this node's sample is filed."""
        return (self.node_id, self.host)

    @property
    def serves_metrics(self) -> bool:
        """False when the node's record has no metrics port (Ray without its ``default`` extra)."""
        return bool(self.metrics_url)


def _valid_port(port: object) -> bool:
    return isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536


def _node_from_record(entry: object, seen: set[str], unscrapeable: bool) -> RayNode | None:
    """The node ``entry`` describes, or None when it is dead or a duplicate.

    A live node without a metrics port is None too, unless ``unscrapeable``: then
    it is returned with an empty ``metrics_url``.

    Raises:
        TypeError: the record is malformed (not a mapping, or a field of the wrong type).
    """
    if not isinstance(entry, dict):
        raise TypeError(f"node record is a {type(entry).__name__}, not a dict")
    if entry.get("Alive") is not True:
        return None
    port = entry.get("MetricsExportPort")
    node_id = entry.get("NodeID")
    address = entry.get("NodeManagerAddress")
    if not node_id or not address or not (unscrapeable or _valid_port(port)):
        return None
    if not isinstance(node_id, str):
        raise TypeError(f"node id is a {type(node_id).__name__}, not a str")
    if not isinstance(address, str):
        raise TypeError(f"node address is a {type(address).__name__}, not a str")
    hostname = entry.get("NodeManagerHostname")
    if node_id in seen:
        return None
    seen.add(node_id)
    url_host = f"[{address}]" if ":" in address and not address.startswith("[") else address
    return RayNode(
        node_id=encodable(node_id),
        host=encodable(hostname if isinstance(hostname, str) and hostname else address),
        metrics_url=f"http://{url_host}:{port}/metrics" if _valid_port(port) else "",
        ip=encodable(address),
    )


def ray_nodes(
    cluster: ClusterView | None = None, *, include_unscrapeable: bool = False
) -> list[RayNode]:
    """Live nodes of ``cluster`` (default: the connected Ray) that serve metrics.

    Dead nodes are left out, and so are nodes without a metrics port (``-1`` or
    missing: Ray installed without its ``default`` extra serves none) unless
    ``include_unscrapeable``, which lists them with an empty ``metrics_url``. An empty
    list when Ray is not initialised, so a monitor started before ``ray.init``
    simply finds nothing to do yet. A malformed record is skipped with one warning.
    """
    view = cluster if cluster is not None else default_cluster_view()
    if not view.is_initialized():
        return []
    found: list[RayNode] = []
    seen: set[str] = set()
    for entry in view.nodes():
        try:
            node = _node_from_record(entry, seen, include_unscrapeable)
        except TypeError as exc:
            warn_once(
                _malformed_key(entry),
                f"skipped a malformed Ray node record ({printable(exc)}): "
                f"{printable(repr(entry))[:200]}",
                logger=logger,
            )
            continue
        if node is not None:
            found.append(node)
    return found


def _malformed_key(entry: object) -> str:
    """The warning key of a malformed record, remembered among the most recent ones only."""
    key = f"host_memory.node_record.{_record_identity(entry)}"
    with _MALFORMED_LOCK:
        _MALFORMED_KEYS[key] = None
        _MALFORMED_KEYS.move_to_end(key)
        forgotten = [
            _MALFORMED_KEYS.popitem(last=False)[0]
            for _ in range(len(_MALFORMED_KEYS) - MAX_REMEMBERED_MALFORMED)
        ]
    for old_key in forgotten:
        reset_warn_once(old_key)
    return key


def _record_identity(entry: object) -> str:
    """A short, stable key for a malformed record, so it is warned about once."""
    node_id = entry.get("NodeID") if isinstance(entry, dict) else None
    if isinstance(node_id, Hashable):
        return printable(repr(node_id))[:80]
    return type(entry).__name__


def parse_memory_samples(metrics_text: str | bytes) -> dict[str, float]:
    """``{registry key: bytes}`` for the memory series found in one raylet payload.

    Four series are read, by exact name, in one pass: Ray's own figure
    (``ray_node_mem_used``/``ray_node_mem_total``: the cgroup's usage and limit
    when the raylet runs in a container, which is what Ray's memory monitor acts
    on) and the physical machine's (``ray_node_mem_used_host``/
    ``ray_node_mem_total_host``, which only recent raylets publish). Everything
    else in the payload is skipped without being parsed. A series that is missing or has no usable
    value (NaN, infinite, negative) is absent from the result. Pure: no state,
    no telemetry.
    """
    samples = extract_samples(metrics_text, SERIES_BY_RAY_NAME)
    return {key: samples[name] for name, key in SERIES_BY_RAY_NAME.items() if name in samples}
