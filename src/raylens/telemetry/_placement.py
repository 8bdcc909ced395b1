"""Which worker groups sit on which Ray node: the placement registry.

Worker groups register the nodes their workers were placed on; the host-memory
gauges read the registry when they export, so a node's ``rl.worker_groups`` label
always reflects the groups alive at that moment. The registry is an object
(:class:`PlacementRegistry`) with one process-wide default instance
(:data:`DEFAULT_REGISTRY`) that the module-level functions of
:mod:`raylens.telemetry.host_memory` are bound to; tests may build their own.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any

from raylens.cluster import ClusterView, default_cluster_view
from raylens.lens import warn_once
from raylens.lens.safe_text import encodable, printable
from raylens.telemetry._names import LOGGER_NAME, NO_WORKER_GROUPS, RL_WORKER_GROUPS_ATTR

__all__ = ["DEFAULT_REGISTRY", "PlacementRegistry", "check_group_name", "format_worker_groups"]

logger = logging.getLogger(LOGGER_NAME)

_PLACED_STATES = frozenset({"CREATED", "RESCHEDULING"})


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
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        #: The registry's contents; read it under :attr:`lock`.
        self.nodes: dict[str, frozenset[str]] = {}

    def register_nodes(self, name_prefix: str, node_ids: Iterable[str]) -> None:
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
        with self.lock:
            self.nodes[name] = frozenset(nodes)

    def register_placement(
        self, name_prefix: object, bundles: Iterable[tuple[Any, int]], cluster: ClusterView | None
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
            self.register_nodes(name, nodes)
        except Exception as exc:
            warn_once(
                f"host_memory.placement.{name}",
                f"could not resolve the placement of worker group {printable(repr(name))} "
                f"({type(exc).__name__}: {printable(exc)}); its nodes stay as last registered",
                logger=logger,
            )

    def forget(self, name_prefix: str) -> None:
        """Drop ``name_prefix``'s entry; a no-op for a name never registered."""
        name = encodable(name_prefix) if isinstance(name_prefix, str) else name_prefix
        with self.lock:
            self.nodes.pop(name, None)  # type: ignore[arg-type]

    def names_on_node(self, node_id: str) -> set[str]:
        """Names of the groups with at least one worker on ``node_id``."""
        with self.lock:
            return {name for name, nodes in self.nodes.items() if node_id in nodes}

    def groups_by_node(self) -> dict[str, list[str]]:
        """Every node with a group on it, with the names of those groups."""
        inverted: dict[str, list[str]] = {}
        with self.lock:
            for name, nodes in self.nodes.items():
                for node_id in nodes:
                    inverted.setdefault(node_id, []).append(name)
        return inverted

    def clear(self) -> None:
        with self.lock:
            self.nodes.clear()


def _resolve_bundles(bundles: Iterable[tuple[Any, int]], cluster: ClusterView) -> set[str]:
    """The node ids under ``bundles``, reading each placement group's table once."""
    by_group: dict[tuple[str, Any], tuple[Any, list[int]]] = {}
    for placement_group, bundle_index in bundles:
        try:
            hash(placement_group)
            group_key: tuple[str, Any] = ("handle", placement_group)
        except TypeError:  # an unhashable handle is grouped by identity
            group_key = ("id", id(placement_group))
        by_group.setdefault(group_key, (placement_group, []))[1].append(bundle_index)
    nodes: set[str] = set()
    for placement_group, indices in by_group.values():
        table = cluster.placement_group_table(placement_group) or {}
        if table.get("state") not in _PLACED_STATES:
            continue
        placed = table.get("bundles_to_node_id") or {}
        for index in indices:
            if index == -1:
                candidates = list(placed.values())
            else:
                candidates = [placed.get(index, placed.get(str(index), ""))]
            nodes.update(node_id for node_id in candidates if node_id)
    return nodes


#: The process's registry: the one worker groups write and the gauges read.
DEFAULT_REGISTRY = PlacementRegistry()
