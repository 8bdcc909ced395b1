"""Which worker groups sit on which Ray node: the placement registry.

:class:`PlacementRegistry` (:data:`DEFAULT_REGISTRY` publishes to the cluster's key-value
store) holds ``{group: node ids}`` and the ``rl.worker_groups`` labels worked out once per
``version``. Invariants: every change of the map or of what other jobs published bumps
``version``; other jobs' entries are untrusted, each bounded (:data:`MAX_ENTRY_BYTES`,
:data:`MAX_GROUPS_PER_ENTRY`, :data:`MAX_GROUP_NAME_CHARS`, the nesting) before it is
decoded, a bad one costing only itself, and a label is cut at :data:`MAX_LABEL_CHARS`;
publishing and refreshing never raise.

How placement is shared: ``docs/architecture.md``, *Worker-group placement across
processes*; the bounds: the README's *Trust boundaries*.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from raylens import forking
from raylens.cluster import (
    ClusterView,
    default_cluster_view,
    ray_call_errors,
    supports_key_value,
)
from raylens.lens import reset_warn_once, warn_once
from raylens.safe_text import encodable, printable
from raylens.telemetry.names import LOGGER_NAME, NO_WORKER_GROUPS, RL_WORKER_GROUPS_ATTR

__all__ = [
    "DEFAULT_REGISTRY",
    "MAX_ENTRY_BYTES",
    "MAX_GROUPS_PER_ENTRY",
    "MAX_GROUP_NAME_CHARS",
    "MAX_LABEL_CHARS",
    "PLACEMENT_KEY_PREFIX",
    "PlacementRegistry",
    "check_group_name",
    "format_worker_groups",
]

logger = logging.getLogger(LOGGER_NAME)

_PLACED_STATES = frozenset({"CREATED", "RESCHEDULING"})
#: Key of a job's published placement, followed by the job id.
PLACEMENT_KEY_PREFIX = "placement/"
#: A published entry larger than this, in bytes, is refused before it is decoded.
MAX_ENTRY_BYTES = 8 * 1024 * 1024
#: Most worker groups one published entry may name.
MAX_GROUPS_PER_ENTRY = 256
#: Most characters in a worker-group name, registered here or read from an entry.
MAX_GROUP_NAME_CHARS = 256
#: Most characters in one node's ``rl.worker_groups`` label; see :func:`format_worker_groups`.
MAX_LABEL_CHARS = 2048
# Most '[' and '{' bytes in an entry. Nesting N deep takes N of them, so this bounds the
# depth json decodes to, far below any recursion limit, before decoding starts.
_MAX_ENTRY_OPENINGS = 2 * MAX_GROUPS_PER_ENTRY


def check_group_name(name_prefix: object) -> str:
    """``name_prefix`` made encodable, or an error that says what a group name may be.

    Raises:
        TypeError: not a ``str``.
        ValueError: empty, longer than :data:`MAX_GROUP_NAME_CHARS`, holds a comma, or
            is :data:`NO_WORKER_GROUPS`.
    """
    if not isinstance(name_prefix, str):
        raise TypeError(
            f"worker group name must be a str, got {type(name_prefix).__name__} "
            f"{printable(repr(name_prefix)[:80])}"
        )
    if len(name_prefix) > MAX_GROUP_NAME_CHARS:
        raise ValueError(
            f"worker group name {printable(repr(name_prefix[:40]))}... has "
            f"{len(name_prefix):,} characters; a name may have at most {MAX_GROUP_NAME_CHARS}"
        )
    if not name_prefix:
        raise ValueError("worker group name must not be empty: it labels the nodes it runs on")
    if "," in name_prefix:
        raise ValueError(
            f"worker group name {printable(repr(name_prefix))} contains a comma; "
            f"{RL_WORKER_GROUPS_ATTR} joins names with commas, so a name may hold any "
            "character but ','"
        )
    if name_prefix == NO_WORKER_GROUPS:
        raise ValueError(
            f"worker group name {name_prefix!r} is the label of a node with no worker group; "
            "choose another name"
        )
    return encodable(name_prefix)


def format_worker_groups(names: Iterable[str]) -> str:
    """``names`` as :data:`RL_WORKER_GROUPS_ATTR` carries them: sorted, comma-joined, or ``none``.

    A label longer than :data:`MAX_LABEL_CHARS` is cut after the last sorted name that
    fits, and ends with ``(+N more)``, N the number of names left out; the result depends
    only on the set of names.
    """
    unique = sorted(set(names))
    if not unique:
        return NO_WORKER_GROUPS
    label = ",".join(unique)
    return label if len(label) <= MAX_LABEL_CHARS else _cut_label(unique)


def _more(count: int) -> str:
    return f"(+{count} more)"


def _cut_label(names: list[str]) -> str:
    """The most leading ``names`` that fit :data:`MAX_LABEL_CHARS` with a count of the rest."""
    kept = 0
    joined = 0  # length of ",".join(names[:count])
    for count in range(len(names)):
        if count:
            joined += len(names[count - 1]) + (1 if count > 1 else 0)
        if joined > MAX_LABEL_CHARS:
            break
        if joined + (1 if count else 0) + len(_more(len(names) - count)) <= MAX_LABEL_CHARS:
            kept = count
    return ",".join([*names[:kept], _more(len(names) - kept)])


class PlacementRegistry:
    """``{worker group name: node ids}``, safe to use from any thread.

    Names are stored encodable (lone surrogates replaced), so a label built from
    them never breaks an exporter; the same replacement is applied on lookup and
    removal, so callers keep using the names they registered with.

    With ``publish=True`` every change is also written to the cluster's shared
    key-value store (see the module docstring); publishing never raises.
    :attr:`published` holds what other jobs published, as last read.
    """

    def __init__(self, *, publish: bool = False) -> None:
        self.lock = threading.Lock()
        #: The registry's contents; read it under :attr:`lock`.
        self.nodes: dict[str, frozenset[str]] = {}
        #: ``{group name: node ids}`` published by other live jobs; read under :attr:`lock`.
        self.published: dict[str, frozenset[str]] = {}
        # What the last refresh read under each other job's key; read under `lock`.
        self._read: dict[str, _ReadEntry] = {}
        self._publish = publish
        # Held from reading the map to writing it, so writes land in the order of changes.
        self._publish_lock = threading.Lock()
        #: Bumped under :attr:`lock` at every change of :attr:`nodes` or :attr:`published`.
        self.version = 0
        # (version, label by node id) of the last :meth:`labels_by_node`.
        self._labels: tuple[int, dict[str, str]] = (-1, {})
        forking.reset_after_fork_in_child(self)

    def reset_after_fork(self) -> None:
        """In a forked child: fresh locks (the parent's refresh may have held them)."""
        self.lock = threading.Lock()
        self._publish_lock = threading.Lock()

    def register_nodes(
        self,
        name_prefix: str,
        node_ids: Iterable[str],
        *,
        cluster: ClusterView | None = None,
    ) -> None:
        """Record that ``name_prefix`` has workers on ``node_ids``, replacing its old entry.

        Raises:
            ValueError: ``name_prefix`` is empty, holds a comma, or is ``none``.
            TypeError: ``name_prefix`` or a node id is not a ``str``, or ``node_ids``
                is one string rather than an iterable of them.
        """
        name = check_group_name(name_prefix)
        if isinstance(node_ids, (str, bytes)):
            raise TypeError(
                f"node_ids must be an iterable of node id strings, not the single "
                f"{type(node_ids).__name__} {printable(repr(node_ids))}; pass "
                f"[{printable(repr(node_ids))}] for one node"
            )
        nodes = set()
        for node_id in node_ids:
            if not isinstance(node_id, str):
                raise TypeError(
                    f"node id {printable(repr(node_id))} of worker group {printable(repr(name))} "
                    f"must be a hex str, not {type(node_id).__name__}"
                )
            if node_id:
                nodes.add(encodable(node_id))
        with self._publish_lock:
            with self.lock:
                self.nodes[name] = frozenset(nodes)
                self.version += 1
            self._publish_map(cluster)

    def register_placement(
        self,
        name_prefix: object,
        bundles: Iterable[tuple[object, int]],
        cluster: ClusterView | None,
    ) -> None:
        """Resolve ``bundles`` to nodes and register them; never raises (see the facade)."""
        try:
            name = check_group_name(name_prefix)
        except (TypeError, ValueError) as exc:
            refusal = str(exc)
        else:
            refusal = ""
        if refusal:  # warned outside the except block: a caller's typo needs no traceback
            warn_once(
                f"host_memory.placement.name.{printable(repr(name_prefix))[:80]}",
                f"worker group placement ignored: {refusal}",
                logger=logger,
            )
            return
        try:
            view = cluster if cluster is not None else default_cluster_view()
            nodes = _resolve_bundles(bundles, view)
            self.register_nodes(name, nodes, cluster=view)
        except ray_call_errors(None, LookupError, AttributeError) as exc:  # and a malformed table
            warn_once(
                f"host_memory.placement.{name}",
                f"could not resolve the placement of worker group {printable(repr(name))} "
                f"({type(exc).__name__}: {printable(exc)}); its nodes stay as last registered",
                logger=logger,
            )

    def forget(self, name_prefix: str, *, cluster: ClusterView | None = None) -> None:
        """Drop ``name_prefix``'s entry and any warning remembered about its placement.

        Nothing is published for a name never registered.
        """
        name = encodable(name_prefix) if isinstance(name_prefix, str) else name_prefix
        reset_warn_once(f"host_memory.placement.{name}")  # a group gone keeps no warning key
        with self._publish_lock:
            with self.lock:
                known = self.nodes.pop(name, None) is not None
                self.version += known
            if known:
                self._publish_map(cluster)

    def names_on_node(self, node_id: str) -> set[str]:
        """Names of the groups with at least one worker on ``node_id``, here or published."""
        with self.lock:
            return {
                name
                for entries in (self.nodes, self.published)
                for name, nodes in entries.items()
                if node_id in nodes
            }

    def groups_by_node(self) -> dict[str, list[str]]:
        """Every node with a group on it (here or published), with the names of those groups."""
        inverted: dict[str, set[str]] = {}
        with self.lock:
            for entries in (self.nodes, self.published):
                for name, nodes in entries.items():
                    for node_id in nodes:
                        inverted.setdefault(node_id, set()).add(name)
        return {node_id: sorted(names) for node_id, names in inverted.items()}

    def labels_by_node(self) -> tuple[int, Mapping[str, str]]:
        """``(version, {node id: rl.worker_groups label})`` of every node with a group on it.

        Worked out (one :meth:`groups_by_node`, one :func:`format_worker_groups` per node)
        once per :attr:`version`, so every reader between two changes shares one table; a
        node missing from it carries :data:`NO_WORKER_GROUPS`. The table is never changed
        once returned.
        """
        with self.lock:
            version = self.version
            cached = self._labels
        if cached[0] == version:
            return cached
        labels = {
            node_id: format_worker_groups(names) for node_id, names in self.groups_by_node().items()
        }
        with self.lock:
            if self.version == version:
                self._labels = (version, labels)
        return version, labels

    def clear(self) -> None:
        with self.lock:
            self.nodes.clear()
            self.published.clear()
            self._read = {}
            self.version += 1

    # Sharing through the cluster ------------------------------------------------------

    def _publish_map(self, cluster: ClusterView | None) -> None:
        """Write this registry's map to the cluster's store (called under the publish lock)."""
        if not self._publish:
            return
        try:
            view = cluster if cluster is not None else default_cluster_view()
            if not supports_key_value(view) or not view.is_initialized():
                return
            job = view.job_id()
            if not job:
                return
            with self.lock:
                content = {name: sorted(nodes) for name, nodes in sorted(self.nodes.items())}
            key = f"{PLACEMENT_KEY_PREFIX}{job}"
            document = json.dumps(content).encode() if content else b""
            refusal = _over_bounds(len(content), len(document))
            if refusal:
                warn_once(
                    "host_memory.placement.publish.bounds",
                    f"worker-group placement not published: {refusal}; other processes "
                    "show this job's nodes without its worker groups",
                    logger=logger,
                )
            if content and not refusal:
                view.kv_put(key, document)
            else:
                view.kv_delete(key)
        except ray_call_errors() as exc:
            warn_once(
                "host_memory.placement.publish",
                "could not publish worker-group placement to the cluster "
                f"({type(exc).__name__}: {printable(exc)}); other processes may show nodes "
                "without their worker groups",
                logger=logger,
            )

    def refresh_published(self, cluster: ClusterView) -> None:
        """Replace :attr:`published` with the entries of every other live job. Never raises.

        Entries of jobs that have exited are skipped and deleted; this process's own
        job is skipped, its registry being the truth. An entry whose bytes are those
        read last time is not decoded again. A malformed or oversized entry is left
        out, with one warning naming its key. When the store cannot be read, the last
        map is kept.
        """
        if not supports_key_value(cluster):
            return
        try:
            if not cluster.is_initialized():
                return
            own = cluster.job_id()
            keys = cluster.kv_keys(PLACEMENT_KEY_PREFIX)
            others = [k for k in keys if k != f"{PLACEMENT_KEY_PREFIX}{own}"]
            live = cluster.live_job_ids() if others else set()
            with self.lock:
                previous = self._read
            current: dict[str, _ReadEntry] = {}
            for key in others:
                job = key[len(PLACEMENT_KEY_PREFIX) :]
                if job not in live:
                    cluster.kv_delete(key)
                    continue
                raw = cluster.kv_get(key)
                current[key] = _ReadEntry.of(key, raw, previous.get(key))
        except ray_call_errors(None, LookupError) as exc:  # and a malformed entry: ValueError
            warn_once(
                "host_memory.placement.read",
                "could not read the worker-group placement other processes published "
                f"({type(exc).__name__}: {printable(exc)}); keeping the last one read",
                logger=logger,
            )
            return
        changed = current.keys() != previous.keys() or any(
            entry is not previous[key] for key, entry in current.items()
        )
        published = _merge(current) if changed else None
        with self.lock:
            self._read = current
            if published is not None:
                self.published = published
                self.version += 1


@dataclass(frozen=True)
class _ReadEntry:
    """One key's entry as last read: a fingerprint of its bytes and what they held."""

    fingerprint: tuple[int, bytes] | None
    groups: Mapping[str, frozenset[str]]

    @classmethod
    def of(cls, key: str, raw: object, last: _ReadEntry | None) -> _ReadEntry:
        """The entry under ``key`` holding ``raw``; ``last`` itself when ``raw`` is unchanged."""
        fingerprint = _fingerprint(raw)
        if last is not None and fingerprint is not None and last.fingerprint == fingerprint:
            return last
        return cls(fingerprint, _read_entry(key, raw))


def _fingerprint(raw: object) -> tuple[int, bytes] | None:
    """Length and digest of an entry's bytes, so an unchanged entry is known without keeping it.

    An entry over :data:`MAX_ENTRY_BYTES` is refused on its length alone, so it is not
    hashed either. ``None`` (not bytes) means "always read again", which is cheap for those.
    """
    if not isinstance(raw, bytes):
        return None
    if len(raw) > MAX_ENTRY_BYTES:
        return (len(raw), b"")
    return (len(raw), hashlib.blake2b(raw, digest_size=16).digest())


def _merge(entries: Mapping[str, _ReadEntry]) -> dict[str, frozenset[str]]:
    merged: dict[str, set[str]] = {}
    for entry in entries.values():
        for name, nodes in entry.groups.items():
            merged.setdefault(name, set()).update(nodes)
    return {name: frozenset(nodes) for name, nodes in merged.items()}


def _over_bounds(groups: int, size: int) -> str:
    """Why an entry naming ``groups`` groups in ``size`` bytes is refused, or ``""``."""
    if size > MAX_ENTRY_BYTES:
        return f"it takes {size:,} bytes, more than the {MAX_ENTRY_BYTES:,} an entry may take"
    if groups > MAX_GROUPS_PER_ENTRY:
        return (
            f"it names {groups:,} worker groups, more than the {MAX_GROUPS_PER_ENTRY} "
            "an entry may name"
        )
    return ""


def _read_entry(key: str, raw: object) -> dict[str, frozenset[str]]:
    """The map published under ``key``, or ``{}`` (warned once) when it is malformed.

    Never raises for any ``raw``: the size and the nesting are bounded before the JSON
    is decoded, and a decoder that still runs out of stack costs only this entry.
    """
    if raw is None:
        return {}
    try:
        return _decode_entry(raw)
    except (ValueError, TypeError, RecursionError) as exc:
        # ValueError covers UnicodeDecodeError and JSONDecodeError.
        refusal = printable(exc)[:200]
    # Warned outside the except block: a refused entry needs no traceback in the log.
    shown = printable(repr(key))[:120]
    warn_once(
        f"host_memory.placement.entry.{shown}",
        f"ignored the worker-group placement published under key {shown}: {refusal}",
        logger=logger,
    )
    return {}


def _decode_entry(raw: object) -> dict[str, frozenset[str]]:
    """``raw`` decoded and checked, or ValueError, TypeError or RecursionError saying why not."""
    if not isinstance(raw, bytes):
        raise TypeError(f"a {type(raw).__name__}, not bytes")
    refusal = _over_bounds(0, len(raw))
    if refusal:
        raise ValueError(refusal)
    openings = raw.count(b"[") + raw.count(b"{")
    if openings > _MAX_ENTRY_OPENINGS:
        raise ValueError(
            f"it holds {openings:,} '[' and '{{', more than the {_MAX_ENTRY_OPENINGS} an "
            "entry may hold; so deep a nesting is not decoded"
        )
    document = json.loads(raw.decode("utf-8"))
    if not isinstance(document, dict):
        raise ValueError(f"a JSON {type(document).__name__}, not an object")
    refusal = _over_bounds(len(document), len(raw))
    if refusal:
        raise ValueError(refusal)
    entry: dict[str, frozenset[str]] = {}
    for name, nodes in document.items():
        checked = check_group_name(name)
        if not isinstance(nodes, list) or not all(isinstance(n, str) for n in nodes):
            raise ValueError(f"group {printable(repr(checked))[:80]} has no list of node ids")
        entry[checked] = frozenset(encodable(n) for n in nodes if n)
    return entry


def _resolve_bundles(bundles: Iterable[tuple[object, int]], cluster: ClusterView) -> set[str]:
    """The node ids under ``bundles``, reading each placement group's table once."""
    by_group: dict[tuple[str, object], tuple[object, list[int]]] = {}
    for placement_group, bundle_index in bundles:
        try:
            hash(placement_group)
            group_key: tuple[str, object] = ("handle", placement_group)
        except TypeError:  # an unhashable handle is grouped by identity
            group_key = ("id", id(placement_group))
        by_group.setdefault(group_key, (placement_group, []))[1].append(bundle_index)
    nodes: set[str] = set()
    for placement_group, indices in by_group.values():
        table = cluster.placement_group_table(placement_group) or {}
        if table.get("state") not in _PLACED_STATES:
            continue
        placed = table.get("bundles_to_node_id") or {}
        if not isinstance(placed, Mapping):
            raise TypeError(
                f"the placement group table's bundles_to_node_id is a {type(placed).__name__}, "
                "not a mapping of bundle index to node id"
            )
        for index in indices:
            if index == -1:
                candidates = list(placed.values())
            else:
                candidates = [placed.get(index, placed.get(str(index), ""))]
            nodes.update(node_id for node_id in candidates if node_id)
    return nodes


#: The process's registry: the one worker groups write and the gauges read.
DEFAULT_REGISTRY = PlacementRegistry(publish=True)
