"""The pure parts of reserving a virtual cluster: checked settings, group plans, ranks.

Nothing here talks to Ray except :func:`_remove_placement_groups`, which goes through
a seam and never raises.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from raylens.cluster import ray_call_errors
from raylens.distributed._placement_errors import PlacementArgumentError
from raylens.distributed.ray_seam import DEFAULT_RAY_SEAM, RaySeam
from raylens.lens import warn_once
from raylens.safe_text import printable

#: Strategies a virtual cluster accepts, as Ray's placement groups take them.
PLACEMENT_STRATEGIES = ("PACK", "STRICT_PACK", "SPREAD", "STRICT_SPREAD")
_PACK_STRATEGIES = ("PACK", "STRICT_PACK")
_SPREAD_STRATEGIES = ("SPREAD", "STRICT_SPREAD")

#: The environment variable holding how many times placement is attempted.
MAX_RETRIES_ENV = "NRL_VIRTUAL_CLUSTER_MAX_RETRIES"
_DEFAULT_MAX_RETRIES = 6


@dataclass(frozen=True)
class _GroupPlan:
    """One placement group to create: its Ray name, logical nodes, bundles and strategy."""

    name: str
    nodes: list[int]
    bundle_count: int
    strategy: str
    #: The logical node of each bundle, in bundle order.
    bundle_nodes: tuple[int, ...] = ()


def _group_plans(
    name: str, counts: Sequence[int], strategy: str, unified: bool
) -> list[_GroupPlan]:
    """The groups to reserve: one per logical node with bundles, or one for all.

    Per-node groups keep a node's bundles together, so they use ``strategy`` when it
    is a PACK variant and ``PACK`` otherwise; a unified group uses ``strategy`` as is.
    """
    if not unified:
        per_node = strategy if strategy in _PACK_STRATEGIES else "PACK"
        return [
            _GroupPlan(f"{name}-node{node}", [node], count, per_node, (node,) * count)
            for node, count in enumerate(counts)
            if count > 0
        ]
    owners = tuple(node for node, count in enumerate(counts) for _ in range(count))
    return [_GroupPlan(f"{name}-all", list(range(len(counts))), len(owners), strategy, owners)]


def _checked_strategy(label: str, strategy: object) -> str:
    if strategy not in PLACEMENT_STRATEGIES:
        raise ValueError(
            f"{label}={strategy!r} is not supported; use one of {', '.join(PLACEMENT_STRATEGIES)}"
        )
    return str(strategy)


def _unified_by_default(strategy: str | None) -> bool:
    """A strategy given as a SPREAD variant asks for one group of all bundles."""
    return strategy in _SPREAD_STRATEGIES


def _checked_counts(bundle_ct_per_node_list: object) -> list[int]:
    if not isinstance(bundle_ct_per_node_list, (list, tuple)):
        raise ValueError(
            "bundle_ct_per_node_list must be a list of bundle counts per node, such as "
            f"[2, 2], got {bundle_ct_per_node_list!r}"
        )
    for count in bundle_ct_per_node_list:
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(
                f"bundle_ct_per_node_list holds {count!r}; every entry must be a "
                "non-negative integer"
            )
    if sum(bundle_ct_per_node_list) < 1:
        raise ValueError(
            f"bundle_ct_per_node_list={list(bundle_ct_per_node_list)} must ask for at "
            "least one bundle"
        )
    return list(bundle_ct_per_node_list)


def _checked_port_range(low: object, high: object) -> tuple[int, int]:
    for label, value in (("port_range_low", low), ("port_range_high", high)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= 65536:
            raise ValueError(f"{label}={value!r} must be an integer port between 1 and 65535")
    assert isinstance(low, int) and isinstance(high, int)
    if low >= high:
        raise ValueError(
            f"port_range_low={low} must be below port_range_high={high} (the range is [low, high))"
        )
    return low, high


def _checked_segment_size(segment_size: object) -> int | None:
    if segment_size is None:
        return None
    if isinstance(segment_size, bool) or not isinstance(segment_size, int) or segment_size < 1:
        raise ValueError(f"segment_size={segment_size!r} must be a positive integer or None")
    return segment_size


def _checked_constraints(
    constraints: object, node_count: int
) -> list[dict[str, float] | None] | None:
    """Per-node extra resources, one entry (a mapping or None) per logical node."""
    if constraints is None:
        return None
    if not isinstance(constraints, (list, tuple)):
        raise ValueError(
            f"node_resource_constraints={constraints!r} must be a list with one dict per node"
        )
    if len(constraints) != node_count:
        raise PlacementArgumentError(
            f"node_resource_constraints length ({len(constraints)}) must match "
            f"bundle_ct_per_node_list length ({node_count})"
        )
    checked: list[dict[str, float] | None] = []
    for node, entry in enumerate(constraints):
        if entry is None:
            checked.append(None)
            continue
        if not isinstance(entry, Mapping):
            raise ValueError(
                f"node_resource_constraints[{node}]={entry!r} must be a dict of resource "
                "name to amount, or None"
            )
        resources: dict[str, float] = {}
        for key, amount in entry.items():
            if (
                not isinstance(key, str)
                or isinstance(amount, bool)
                or not isinstance(amount, (int, float))
                or not amount > 0
            ):
                raise ValueError(
                    f"node_resource_constraints[{node}] holds {key!r}: {amount!r}; each entry "
                    "must map a resource name to a positive amount"
                )
            resources[key] = amount
        checked.append(resources)
    return checked


def _max_retries() -> int:
    """Placement attempts from ``NRL_VIRTUAL_CLUSTER_MAX_RETRIES`` (6 when unset)."""
    raw = os.environ.get(MAX_RETRIES_ENV)
    if raw is None:
        return _DEFAULT_MAX_RETRIES
    try:
        retries = int(raw)
    except ValueError:
        raise PlacementArgumentError(
            f"{MAX_RETRIES_ENV}={printable(raw)!r} must be an integer greater than 0"
        ) from None
    if retries < 1:
        raise PlacementArgumentError(
            f"{MAX_RETRIES_ENV}={retries} must be an integer greater than 0"
        )
    return retries


def _ranks_from_bundle_nodes(bundle_nodes: Sequence[str]) -> list[tuple[int, int]]:
    """``(node rank, local rank)`` of each bundle, from the Ray node id it was placed on.

    Nodes are numbered in the order their first bundle appears; a bundle's local rank
    counts the earlier bundles on the same node. So bundles that share a node rank
    share a machine, whatever order Ray placed them in.
    """
    node_rank: dict[str, int] = {}
    used: dict[str, int] = {}
    ranks = []
    for node_id in bundle_nodes:
        rank = node_rank.setdefault(node_id, len(node_rank))
        ranks.append((rank, used.get(node_id, 0)))
        used[node_id] = used.get(node_id, 0) + 1
    return ranks


def _missing_resources(
    required: Mapping[str, float], available: Mapping[str, float]
) -> dict[str, tuple[float, float]]:
    """``{resource: (needed, present)}`` for each resource the cluster has too little of."""
    missing: dict[str, tuple[float, float]] = {}
    for resource, needed in required.items():
        present = float(available.get(resource, 0.0))
        if present < needed:
            missing[resource] = (needed, present)
    return missing


def _remove_placement_groups(groups: list[Any], seam: RaySeam = DEFAULT_RAY_SEAM) -> None:
    """Remove ``groups`` from Ray if this process is still connected; never raises.

    Used both by ``RayVirtualCluster.shutdown`` and as the cluster's finalizer, which
    may run at interpreter exit after Ray has already disconnected.
    """
    pending = list(groups)
    groups.clear()
    ray = seam.connected_ray() if pending else None
    if ray is None:
        return
    for group in pending:
        try:
            ray.util.remove_placement_group(group)
        except ray_call_errors(ray, AttributeError, ImportError):  # Ray torn down at exit
            warn_once(
                "virtual_cluster.remove_placement_group",
                f"could not remove placement group {group!r}; it is released when the Ray job ends",
            )


def _missing_resources_message(
    name: str,
    counts: Sequence[int],
    bundle: Mapping[str, float],
    missing: Mapping[str, tuple[float, float]],
) -> str:
    lines = [
        f"the Ray cluster cannot hold virtual cluster {name!r} ({list(counts)} bundles of {dict(bundle)}):"
    ]
    for resource, (needed, present) in missing.items():
        lines.append(f"  {resource}: needs {needed:g}, the cluster has {present:g}")
    if "GPU" in missing:
        lines.append("  on a cluster without GPUs, build the virtual cluster with use_gpus=False")
    return "\n".join(lines)


def _unplaced_message(
    name: str, bundle: Mapping[str, float], timeout_s: float, unplaced: Sequence[_GroupPlan]
) -> str:
    described = "; ".join(
        f"{group.name!r} ({group.bundle_count} bundles of {dict(bundle)}, "
        f"{group.strategy}, logical nodes {group.nodes})"
        for group in unplaced
    )
    return (
        f"virtual cluster {name!r}: {len(unplaced)} placement group(s) did not place "
        f"within {timeout_s:g}s: {described}. The cluster has the resources in total, so "
        "they are probably held by others or split across nodes in a way this strategy "
        "cannot use. Every group this cluster created has been removed."
    )


class _BundleLayout:
    """Where each bundle of a virtual cluster is, by arithmetic on its per-node counts.

    Bundles are addressed as ``(node index, local index)``, where nodes are counted
    among those that hold bundles: ``[2, 0, 2]`` has nodes 0 and 1. Once a unified
    group is placed, ``_bundle_nodes`` holds the Ray node id of each of its bundles.
    """

    _bundle_ct_per_node_list: list[int]
    use_unified_pg: bool
    _bundle_nodes: list[str] | None

    @property
    def bundle_ct_per_node_list(self) -> list[int]:
        """Bundles per logical node (a copy)."""
        return list(self._bundle_ct_per_node_list)

    def world_size(self) -> int:
        """Total number of bundles."""
        return sum(self._bundle_ct_per_node_list)

    def node_count(self) -> int:
        """Number of logical nodes that hold at least one bundle."""
        return sum(1 for count in self._bundle_ct_per_node_list if count > 0)

    def node_and_local_index(self, node_idx: int, local_bundle_idx: int) -> tuple[int, int]:
        """``(NODE_RANK, LOCAL_RANK)`` of bundle ``(node_idx, local_bundle_idx)``.

        A local index past the end of its node continues on the following nodes, which
        is how a tied group that spans nodes is addressed from its first node. With
        per-node groups this is the group's position and the bundle's index in it;
        with a unified group that has been placed, the rank of the Ray node holding
        the bundle and the bundle's index among those on that node.
        """
        global_idx, node, local = self._resolve(node_idx, local_bundle_idx)
        if self.use_unified_pg and self._bundle_nodes is not None:
            return _ranks_from_bundle_nodes(self._bundle_nodes)[global_idx]
        return node, local

    def _resolve(self, node_idx: int, local_bundle_idx: int) -> tuple[int, int, int]:
        """``(global bundle index, node, index on that node)``; ValueError if absent.

        Nodes are counted among those that hold bundles.
        """
        counts = [count for count in self._bundle_ct_per_node_list if count > 0]
        if not (0 <= node_idx < len(counts)) or local_bundle_idx < 0:
            raise ValueError(self._bad_bundle_message(node_idx, local_bundle_idx))
        global_idx = sum(counts[:node_idx]) + local_bundle_idx
        if global_idx >= self.world_size():
            raise ValueError(self._bad_bundle_message(node_idx, local_bundle_idx))
        remaining = global_idx
        for node, count in enumerate(counts):
            if remaining < count:
                return global_idx, node, remaining
            remaining -= count
        raise AssertionError("unreachable: the global index was range-checked")

    def _bundle_address(self, node_idx: int, local_bundle_idx: int) -> tuple[int, int, int]:
        """``(placement group position, bundle index in that group, logical node)``."""
        global_idx, node, local = self._resolve(node_idx, local_bundle_idx)
        if self.use_unified_pg:
            return 0, global_idx, node
        return node, local, node

    def _bad_bundle_message(self, node_idx: int, local_bundle_idx: int) -> str:
        return (
            f"bundle ({node_idx}, {local_bundle_idx}) is not in this virtual cluster: it has "
            f"{self.node_count()} nodes with bundles ({self._bundle_ct_per_node_list} "
            "bundles per node; empty nodes are not counted)"
        )
