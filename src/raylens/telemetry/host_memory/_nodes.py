"""The Ray nodes to scrape, and what is read from each one's payload.

Node records come from the GCS (through a :class:`~raylens.cluster.ClusterView`)
and are treated as untrusted. A record that is not a mapping, or has a field that
could not be used safely, is skipped with one warning that names the field and what
it may hold, and costs no other node: a node id that is not 1..128 ASCII letters,
digits, ``-``, ``_`` or ``.`` (so every id that reaches a label or a log line is
printable and short); an address that is not an IPv4/IPv6 literal or a DNS host name
(so nothing but a host ever reaches a URL: no ``user@``, port, path or zone id); a
metrics port that is neither an int in 1..65535 nor missing/-1. Host names are made
encodable here, where they enter raylens, and one longer than any real host's is cut
to :data:`HOST_NAME_KEPT_CHARS` characters plus its length. Warnings quote at most
about 200 printable characters of a bad value.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import reprlib
import sys
import threading
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass

from raylens import forking
from raylens.cluster import ClusterView, default_cluster_view
from raylens.lens import reset_warn_once, warn_once
from raylens.safe_text import encodable, printable
from raylens.telemetry.names import LOGGER_NAME

__all__ = ["MalformedRecord", "RayNode", "ray_nodes"]

logger = logging.getLogger(LOGGER_NAME)

#: Most malformed-record warning keys kept at once. Records that come back under new
#: ids would otherwise add a key each; the one listed least recently is forgotten first.
MAX_REMEMBERED_MALFORMED = 256

_MALFORMED_KEYS: OrderedDict[str, None] = OrderedDict()
_MALFORMED_LOCK = threading.Lock()
forking.renew_lock_in_child(sys.modules[__name__], "_MALFORMED_LOCK")

#: Longest node id accepted; Ray's are 56 hexadecimal digits.
MAX_NODE_ID_CHARS = 128
#: Longest host name kept whole. A longer one (no real host has one: Linux allows 64
#: characters, DNS 253) keeps its first :data:`HOST_NAME_KEPT_CHARS` and a length note.
MAX_HOST_NAME_CHARS = 255
HOST_NAME_KEPT_CHARS = 200
#: How much of a bad value a warning quotes.
_EXCERPT_CHARS = 200
_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")
_LABEL_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")
_MAX_DNS_NAME = 253
_MAX_DNS_LABEL = 63
_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = _EXCERPT_CHARS


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


class MalformedRecord(ValueError):
    """A node record the GCS should never send; the message names the field and what is allowed."""


def excerpt(value: object, limit: int = _EXCERPT_CHARS) -> str:
    """``repr(value)``, printable and at most ``limit`` characters, plus a length note for a
    longer str. Work is bounded too: strings inside ``value`` are cut before they are
    written out."""
    shown = printable(_REPR.repr(value))[:limit]
    if isinstance(value, str) and len(value) > limit:
        return f"{shown} ({len(value)} characters)"
    return shown


def _check_node_id(node_id: object) -> str:
    if not isinstance(node_id, str):
        raise MalformedRecord(f"NodeID is a {type(node_id).__name__}, not a str")
    if not node_id or len(node_id) > MAX_NODE_ID_CHARS or not _ID_CHARS.issuperset(node_id):
        raise MalformedRecord(
            f"NodeID is {excerpt(node_id)}; allowed: 1..{MAX_NODE_ID_CHARS} ASCII letters, "
            "digits, '-', '_' or '.' (Ray's are 56 hexadecimal digits)"
        )
    return node_id


def _is_host_name(text: str) -> bool:
    """Whether ``text`` is a DNS host name: dot-separated labels of letters, digits, '-', '_'.

    Labels are 1..63 characters and neither start nor end with '-'; the whole is at
    most 253 characters, with an optional final dot. A name whose last label is all
    digits is refused: URL parsers read such names (``1.2.3``, ``10.0.0.01``) as IPv4.
    """
    name = text[:-1] if text.endswith(".") else text
    if not name or len(name) > _MAX_DNS_NAME:
        return False
    labels = name.split(".")
    for label in labels:
        if not 0 < len(label) <= _MAX_DNS_LABEL or not _LABEL_CHARS.issuperset(label):
            return False
        if label[0] == "-" or label[-1] == "-":
            return False
    return not labels[-1].isdigit()


def _url_host(address: object) -> str:
    """How ``address`` is written as a URL's host: an IPv6 literal in brackets, else as is.

    Raises:
        MalformedRecord: ``address`` is neither an IPv4/IPv6 literal nor a host name
            (user info such as ``raylet@``, a port, a path, a zone id, a bracket).
    """
    if not isinstance(address, str):
        raise MalformedRecord(f"NodeManagerAddress is a {type(address).__name__}, not a str")
    if len(address) <= _MAX_DNS_NAME + 1:  # nothing longer is an address of either kind
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            ip = None
        if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id is None:
            return f"[{address}]"
        if isinstance(ip, ipaddress.IPv4Address) or _is_host_name(address):
            return address
    raise MalformedRecord(
        f"NodeManagerAddress is {excerpt(address)}; allowed: an IPv4 or IPv6 address "
        "(no zone id, no brackets) or a DNS host name, without user, port or path"
    )


def _metrics_port(port: object) -> int | None:
    """The node's metrics port, or None when it serves no metrics (missing or -1).

    Raises:
        MalformedRecord: anything else that is not an int in 1..65535 (a str, a bool,
            a float, 0, a number past 65535).
    """
    if port is None or (type(port) is int and port == -1):
        return None
    if type(port) is int and 0 < port < 65536:
        return port
    raise MalformedRecord(
        f"MetricsExportPort is {excerpt(port)}; allowed: an int in 1..65535, or missing "
        "or -1 for a node that serves no metrics"
    )


def _host_name(hostname: object, address: str, node_id: str) -> str:
    """The name shown for the node: its host name, cut when absurdly long, else its address."""
    if not isinstance(hostname, str) or not hostname:
        return address
    hostname = encodable(hostname)
    if len(hostname) <= MAX_HOST_NAME_CHARS:
        return hostname
    warn_once(
        _remembered_key(f"host_memory.node_record.long_host.{node_id}"),
        f"Ray node {node_id} has a host name of {len(hostname)} characters; it is shown cut "
        f"to its first {HOST_NAME_KEPT_CHARS}: {excerpt(hostname)}",
        logger=logger,
    )
    return f"{hostname[:HOST_NAME_KEPT_CHARS]}...({len(hostname)} characters)"


def _node_from_record(entry: object, seen: set[str], unscrapeable: bool) -> RayNode | None:
    """The node ``entry`` describes, or None when it is dead or a duplicate.

    A live node without a metrics port is None too, unless ``unscrapeable``: then
    it is returned with an empty ``metrics_url``. Every field is checked before
    anything of the record is used, so a value that could not be used safely in a
    URL, a label or a log line never gets that far.

    Raises:
        MalformedRecord: the record is malformed (not a mapping, or a field of the
            wrong type or form); the message names the field and what is allowed.
    """
    if not isinstance(entry, dict):
        raise MalformedRecord(f"node record is a {type(entry).__name__}, not a dict")
    if entry.get("Alive") is not True:
        return None
    node_id = _check_node_id(entry.get("NodeID"))
    url_host = _url_host(entry.get("NodeManagerAddress"))
    port = _metrics_port(entry.get("MetricsExportPort"))
    if (port is None and not unscrapeable) or node_id in seen:
        return None
    seen.add(node_id)
    address = entry["NodeManagerAddress"]
    return RayNode(
        node_id=node_id,
        host=_host_name(entry.get("NodeManagerHostname"), address, node_id),
        metrics_url="" if port is None else f"http://{url_host}:{port}/metrics",
        ip=address,
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
    known = _CHECKED.get(include_unscrapeable, {})
    checked: dict[tuple[object, ...], RayNode] = {}
    plain = _PLAIN_TYPES
    for entry in view.nodes():
        # A record already checked is looked up by its identifying fields, read inline:
        # this loop runs once per node per cycle.
        key: tuple[object, ...] | None = None
        if type(entry) is dict and entry.get("Alive") is True:
            get = entry.get
            key = (
                get("NodeID"),
                get("NodeManagerAddress"),
                get("MetricsExportPort"),
                get("NodeManagerHostname"),
            )
            if plain.issuperset(map(type, key)):
                cached = known.get(key)
                if cached is not None:
                    checked[key] = cached
                    if cached.node_id not in seen:
                        seen.add(cached.node_id)
                        found.append(cached)
                    continue
            else:
                key = None
        try:
            node = _node_from_record(entry, seen, include_unscrapeable)
        except MalformedRecord as exc:
            warn_once(
                _malformed_key(entry),
                f"skipped a malformed Ray node record ({printable(exc)}): {excerpt(entry)}",
                logger=logger,
            )
            continue
        if node is not None:
            found.append(node)
            if key is not None:
                checked[key] = node
    _CHECKED[include_unscrapeable] = checked  # only the records seen this time: bounded
    return found


#: Records already checked, by their identifying fields, for each value of
#: ``include_unscrapeable``: a node's record rarely changes, so it is checked and turned
#: into a RayNode once, not at every cycle. A key holds only plain values (str, int,
#: None; not bool, which equals an int): a str never equals an int or None, so the values
#: alone tell records apart.
_CHECKED: dict[bool, dict[tuple[object, ...], RayNode]] = {}
_PLAIN_TYPES = frozenset((str, int, type(None)))


def _malformed_key(entry: object) -> str:
    """The warning key of a malformed record, remembered among the most recent ones only."""
    return _remembered_key(f"host_memory.node_record.{_record_identity(entry)}")


def _remembered_key(key: str) -> str:
    """``key``, remembered among the most recent :data:`MAX_REMEMBERED_MALFORMED` only."""
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
        return excerpt(node_id, 80)
    return type(entry).__name__
