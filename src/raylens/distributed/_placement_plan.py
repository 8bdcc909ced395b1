"""The pure parts of reserving a virtual cluster: checked settings, group plans, ranks.

Nothing here talks to Ray except :func:`_remove_placement_groups`, which goes through
a seam and never raises.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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
        raise PlacementArgumentError(f"{MAX_RETRIES_ENV}={retries} must be an integer greater than 0")
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
        except Exception:
            warn_once(
                "virtual_cluster.remove_placement_group",
                f"could not remove placement group {group!r}; it is released when the Ray job ends",
            )
