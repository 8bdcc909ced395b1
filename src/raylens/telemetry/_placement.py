"""Which worker groups sit on which Ray node: the placement registry.

Worker groups register the nodes their workers were placed on; the host-memory
gauges read the registry when they export, so a node's ``rl.worker_groups`` label
always reflects the groups alive at that moment. The registry is an object
(:class:`PlacementRegistry`) with one process-wide default instance
(:data:`DEFAULT_REGISTRY`) that the module-level functions of
:mod:`raylens.telemetry.host_memory` are bound to; tests may build their own.

The registry lives in the process that built the groups, normally the driver. So
that other processes connected to the cluster (``raylens watch``, say) label nodes
the same way, a publishing registry writes its whole map to the cluster's shared
key-value store after every change, under ``placement/<job id>`` (Ray's internal KV,
namespace ``raylens``), and deletes the key once no group is left. A monitor reads
every other job's entry each cycle (:meth:`PlacementRegistry.refresh_published`),
ignores, and removes, the entries of jobs whose driver has exited, and merges the
rest into the labels. Entries are untrusted JSON: a malformed one is skipped with
one warning.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable, Mapping

from raylens.cluster import ClusterView, default_cluster_view, supports_key_value
from raylens.lens import reset_warn_once, warn_once
from raylens.lens.safe_text import encodable, printable
from raylens.telemetry._names import LOGGER_NAME, NO_WORKER_GROUPS, RL_WORKER_GROUPS_ATTR

__all__ = [
    "DEFAULT_REGISTRY",
    "PLACEMENT_KEY_PREFIX",
    "PlacementRegistry",
    "check_group_name",
    "format_worker_groups",
]

logger = logging.getLogger(LOGGER_NAME)

_PLACED_STATES = frozenset({"CREATED", "RESCHEDULING"})
#: Key of a job's published placement, followed by the job id.
PLACEMENT_KEY_PREFIX = "placement/"
#: A published entry larger than this is not read (a thousand groups on a thousand nodes fit).
_MAX_ENTRY_BYTES = 64 * 1024 * 1024


def check_group_name(name_prefix: object) -> str:
    """``name_prefix`` made encodable, or an error that says what a group name may be.

    Raises:
        TypeError: not a ``str``.
        ValueError: empty, holds a comma, or is :data:`NO_WORKER_GROUPS`.
    """
    if not isinstance(name_prefix, str):
        raise TypeError(
            f"worker group name must be a str, got {type(name_prefix).__name__} "
            f"{printable(repr(name_prefix))}"
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
    """``names`` as :data:`RL_WORKER_GROUPS_ATTR` carries them: sorted, comma-joined, or ``none``."""
    unique = sorted(set(names))
    return ",".join(unique) if unique else NO_WORKER_GROUPS


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
        self._publish = publish
        # Held from reading the map to writing it, so writes land in the order of changes.
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
        except Exception as exc:
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

    def clear(self) -> None:
        with self.lock:
            self.nodes.clear()
            self.published.clear()

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
            if content:
                view.kv_put(key, json.dumps(content).encode())
            else:
                view.kv_delete(key)
        except Exception as exc:
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
        job is skipped, its registry being the truth. When the store cannot be read,
        the last map is kept.
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
            merged: dict[str, set[str]] = {}
            for key in others:
                job = key[len(PLACEMENT_KEY_PREFIX) :]
                if job not in live:
                    cluster.kv_delete(key)
                    continue
                raw = cluster.kv_get(key)
                for name, nodes in _read_entry(job, raw).items():
                    merged.setdefault(name, set()).update(nodes)
        except Exception as exc:
            warn_once(
                "host_memory.placement.read",
                "could not read the worker-group placement other processes published "
                f"({type(exc).__name__}: {printable(exc)}); keeping the last one read",
                logger=logger,
            )
            return
        with self.lock:
            self.published = {name: frozenset(nodes) for name, nodes in merged.items()}


def _read_entry(job: str, raw: object) -> dict[str, frozenset[str]]:
    """The map job ``job`` published, or ``{}`` (warned once) when it is malformed."""
    if raw is None:
        return {}
    try:
        if not isinstance(raw, bytes) or len(raw) > _MAX_ENTRY_BYTES:
            raise ValueError("not a JSON document of a sensible size")
        document = json.loads(raw.decode("utf-8"))
        if not isinstance(document, dict):
            raise ValueError(f"a JSON {type(document).__name__}, not an object")
        entry: dict[str, frozenset[str]] = {}
        for name, nodes in document.items():
            checked = check_group_name(name)
            if not isinstance(nodes, list) or not all(isinstance(n, str) for n in nodes):
                raise ValueError(f"group {printable(repr(checked))[:80]} has no list of node ids")
            entry[checked] = frozenset(encodable(n) for n in nodes if n)
        return entry
    except (ValueError, TypeError) as exc:  # UnicodeDecodeError and JSONDecodeError included
        warn_once(
            f"host_memory.placement.entry.{printable(job)[:80]}",
            f"ignored the worker-group placement published by job {printable(repr(job))[:80]}: "
            f"{printable(exc)[:200]}",
            logger=logger,
        )
        return {}


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
