"""Topology-aware placement: which nodes share an NVLink domain, and in what order.

A node says where it sits through two Ray custom resources that the cluster's start-up
script registers (NeMo-RL's ``ray.sub`` convention): ``nvlink_domain_<ClusterUUID>: 1``
names its NVLink domain (nodes with the same key share one switch fabric, such as a
GB200 NVL72 rack), and ``topo_rank: <n>`` (``n >= 1``) its position in the physical
topology. raylens also reads the same facts from Ray node labels (``nvlink_domain``
holding the UUID, ``topo_rank`` the number), which a CPU-only cluster can set without
any GPU. A node without them has :data:`NVLINK_DOMAIN_UNKNOWN` and
:data:`TOPO_RANK_UNKNOWN`.

Everything here but :func:`get_reordered_bundle` is pure or reads only the node list,
so it works on CPU-only Ray. Node records come from the GCS: one malformed record (a
rank that is not a number, a missing id) costs only that node its topology.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from raylens.distributed._placement_errors import ResourceInsufficientError
from raylens.safe_text import printable

if TYPE_CHECKING:
    from raylens.cluster import ClusterView

__all__ = [
    "NVLINK_DOMAIN_LABEL",
    "NVLINK_DOMAIN_PREFIX",
    "NVLINK_DOMAIN_UNKNOWN",
    "TOPO_RANK_KEY",
    "TOPO_RANK_UNKNOWN",
    "BundleTopology",
    "bundle_order_from_labels",
    "bundle_topology_from_labels",
    "get_ray_cluster_topology",
    "get_reordered_bundle",
    "prepare_segment_topology",
    "select_segment_nodes",
    "sort_bundle_indices_by_topology",
    "topology_of_nodes",
]

_LOGGER = logging.getLogger("raylens.distributed")

#: Prefix of the custom resource naming a node's NVLink domain.
NVLINK_DOMAIN_PREFIX = "nvlink_domain_"
#: The custom resource (and node label) holding a node's topological rank.
TOPO_RANK_KEY = "topo_rank"
#: The node label holding a node's NVLink domain id (without the prefix).
NVLINK_DOMAIN_LABEL = "nvlink_domain"
#: The domain of a node that reports none.
NVLINK_DOMAIN_UNKNOWN = "unknown"
#: The rank of a node that reports none; it sorts before every real rank.
TOPO_RANK_UNKNOWN: int = -1

#: ``node id -> (NVLink domain, topological rank)``.
Topology = dict[str, tuple[str, int]]


class BundleTopology(NamedTuple):
    """Where one bundle sits: ``(gpu_id, nvlink_domain, topo_rank, node_id)``.

    ``gpu_id`` is what Ray reports (an integer, or a string where devices are named by
    UUID); on CPU-only Ray it is the bundle's index among those on its node.
    """

    gpu_id: Any
    nvlink_domain: str
    topo_rank: int
    node_id: str


def _rank(value: object) -> int | None:
    """A topological rank from a resource or label value; None when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return int(value) if math.isfinite(value) else None
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def _node_topology(node: Mapping[str, Any]) -> tuple[str, int]:
    """``(domain, rank)`` of one node record; unknown parts where it says nothing usable."""
    domain, rank = NVLINK_DOMAIN_UNKNOWN, TOPO_RANK_UNKNOWN
    resources = node.get("Resources")
    if isinstance(resources, Mapping):
        for key, value in resources.items():
            if isinstance(key, str) and key.startswith(NVLINK_DOMAIN_PREFIX):
                domain = key
            elif key == TOPO_RANK_KEY:
                resource_rank = _rank(value)
                if resource_rank is not None:
                    rank = resource_rank
    labels = node.get("Labels")
    if isinstance(labels, Mapping):
        label_domain = labels.get(NVLINK_DOMAIN_LABEL)
        if domain == NVLINK_DOMAIN_UNKNOWN and isinstance(label_domain, str) and label_domain:
            domain = NVLINK_DOMAIN_PREFIX + label_domain
        label_rank = _rank(labels.get(TOPO_RANK_KEY))
        if rank == TOPO_RANK_UNKNOWN and label_rank is not None:
            rank = label_rank
    return domain, rank


def topology_of_nodes(nodes: Iterable[Mapping[str, Any]]) -> Topology:
    """``{node id: (domain, rank)}`` of the alive nodes among Ray node records.

    A record without a string ``NodeID`` is skipped with a warning; the others count.
    """
    topology: Topology = {}
    for node in nodes:
        if not isinstance(node, Mapping) or not node.get("Alive", False):
            continue
        node_id = node.get("NodeID")
        if not isinstance(node_id, str) or not node_id:
            _LOGGER.warning(
                "topology: skipping a node record without a node id: %s",
                printable(repr(node)[:200]),
            )
            continue
        topology[node_id] = _node_topology(node)
    return topology


def get_ray_cluster_topology(cluster: ClusterView | None = None) -> Topology:
    """``{node id: (domain, rank)}`` for every alive node of the connected cluster.

    ``cluster`` is the view to read (raylens' default cluster view when None).
    """
    from raylens.cluster import default_cluster_view

    view = cluster or default_cluster_view()
    return topology_of_nodes(view.nodes())


def _positive_int(label: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{label}={value!r} must be a positive integer")
    return value


def select_segment_nodes(
    topology: Mapping[str, tuple[str, int]], segment_size: int, num_nodes: int
) -> tuple[list[str], list[str]]:
    """Pick ``num_nodes`` nodes as whole segments of ``segment_size`` nodes of one domain.

    Domains are taken in the order of their lowest rank and nodes within one in rank
    order; each domain gives as many whole segments as it holds, until enough are
    taken. Nodes of unknown domain are never picked: a placement pinned to the
    ``unknown`` domain could never be scheduled. Returns ``(selected, remaining)``,
    the selected in topological order and the remaining in the topology's order.

    ValueError when ``segment_size`` does not divide ``num_nodes``;
    :class:`ResourceInsufficientError` when there are not enough whole segments.
    """
    _positive_int("segment_size", segment_size)
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 0:
        raise ValueError(f"num_nodes={num_nodes!r} must be a non-negative integer")
    if num_nodes % segment_size != 0:
        raise ValueError(
            f"num_nodes ({num_nodes}) must be divisible by segment_size ({segment_size})"
        )
    by_domain: dict[str, list[tuple[int, str]]] = {}
    for node_id, (domain, rank) in topology.items():
        if domain != NVLINK_DOMAIN_UNKNOWN:
            by_domain.setdefault(domain, []).append((rank, node_id))
    for members in by_domain.values():
        members.sort(key=lambda member: member[0])
    domains = sorted(by_domain.items(), key=lambda item: item[1][0][0])
    wanted = num_nodes // segment_size
    selected: list[str] = []
    taken = 0
    for _, members in domains:
        if taken == wanted:
            break
        take = min(len(members) // segment_size, wanted - taken)
        selected.extend(node_id for _, node_id in members[: take * segment_size])
        taken += take
    if taken < wanted:
        sizes = {printable(domain): len(members) for domain, members in domains}
        raise ResourceInsufficientError(
            f"Cannot form {wanted} complete segments of {segment_size} nodes "
            f"({num_nodes} nodes) from the nodes of known NVLink domain; nodes per "
            f"domain: {sizes}"
        )
    chosen = set(selected)
    remaining = [node_id for node_id in topology if node_id not in chosen]
    _LOGGER.info(
        "topology: %d segment(s) of %d node(s) from %d NVLink domain(s); %d node(s) left",
        taken,
        segment_size,
        len({topology[node_id][0] for node_id in selected}),
        len(remaining),
    )
    return selected, remaining


def prepare_segment_topology(
    segment_size: int | None,
    num_nodes: int,
    *,
    topology: Mapping[str, tuple[str, int]] | None = None,
    role: str = "training",
    cluster: ClusterView | None = None,
) -> tuple[list[dict[str, float]] | None, list[str], Topology]:
    """Per-node constraints that pin a virtual cluster's nodes to whole segments.

    Returns ``(node_resource_constraints, remaining_node_ids, topology)``: the first
    is for :class:`~raylens.distributed.virtual_cluster.RayVirtualCluster`'s
    ``node_resource_constraints`` (one ``{domain: 0.001}`` per node), or None when
    ``segment_size`` is None or no node reports a domain; the second lists the nodes
    left for another role (pass their slice of ``topology`` to the next call). The
    topology is read from ``cluster`` when not given; with ``segment_size=None``
    nothing is read and ``({}, [])`` parts are returned.
    """
    if segment_size is None:
        return None, [], {}
    known: Topology = dict(topology) if topology is not None else get_ray_cluster_topology(cluster)
    if not any(domain != NVLINK_DOMAIN_UNKNOWN for domain, _ in known.values()):
        _LOGGER.warning(
            "topology: segment_size=%s is set for %s but no node reports an NVLink domain; "
            "placing without topology",
            segment_size,
            printable(role),
        )
        return None, list(known), known
    selected, remaining = select_segment_nodes(known, segment_size, num_nodes)
    constraints = [{known[node_id][0]: 0.001} for node_id in selected]
    _LOGGER.info(
        "topology: %d %s node(s) in %d NVLink domain(s) (segment_size=%d)",
        num_nodes,
        printable(role),
        len({known[node_id][0] for node_id in selected}),
        segment_size,
    )
    return constraints, remaining, known


def sort_bundle_indices_by_topology(
    bundle_data: Sequence[tuple[int, str, int, str]],
    segment_size: int | None = None,
    gpus_per_node: int | None = None,
) -> list[int]:
    """Bundle indices in the order ranks should follow the physical topology.

    ``bundle_data[i]`` is :class:`BundleTopology` of bundle ``i``. Without any
    topology (every domain and rank unknown) bundles go by ``(node id, gpu id)``.
    Otherwise by the lowest rank of their domain, then their node's rank, then gpu
    id; the bundles of one domain stay together even when two domains share their
    lowest rank. With ``segment_size`` (which needs ``gpus_per_node``), each domain keeps the
    bundles of its whole segments only, its lowest-ranked ones, and the rest are left
    out of the result.
    """
    if segment_size is not None and gpus_per_node is None:
        raise ValueError("gpus_per_node is required when segment_size is set")
    bundles = [BundleTopology(*entry) for entry in bundle_data]
    if not bundles:
        return []
    if all(
        b.nvlink_domain == NVLINK_DOMAIN_UNKNOWN and b.topo_rank == TOPO_RANK_UNKNOWN
        for b in bundles
    ):
        return sorted(range(len(bundles)), key=lambda i: (bundles[i].node_id, bundles[i].gpu_id))
    indices = list(range(len(bundles)))
    if segment_size is not None and gpus_per_node is not None:
        _positive_int("segment_size", segment_size)
        _positive_int("gpus_per_node", gpus_per_node)
        per_domain: dict[str, list[int]] = {}
        for i in indices:
            per_domain.setdefault(bundles[i].nvlink_domain, []).append(i)
        kept: list[int] = []
        for domain, members in per_domain.items():
            nodes = len({bundles[i].node_id for i in members})
            usable = (nodes // segment_size) * segment_size * gpus_per_node
            members.sort(key=lambda i: (bundles[i].topo_rank, bundles[i].gpu_id))
            if len(members) > usable:
                _LOGGER.info(
                    "topology: domain %s keeps %d of its %d bundles (whole segments only)",
                    printable(domain),
                    usable,
                    len(members),
                )
            kept.extend(members[:usable])
        indices = kept
    lowest: dict[str, int] = {}
    for i in indices:
        domain = bundles[i].nvlink_domain
        lowest[domain] = min(lowest.get(domain, bundles[i].topo_rank), bundles[i].topo_rank)
    # The domain itself breaks a tie between domains with the same lowest rank, so the
    # bundles of one domain always stay together.
    return sorted(
        indices,
        key=lambda i: (
            lowest[bundles[i].nvlink_domain],
            bundles[i].nvlink_domain,
            bundles[i].topo_rank,
            bundles[i].gpu_id,
        ),
    )


def bundle_topology_from_labels(
    bundle_nodes: Sequence[str], topology: Mapping[str, tuple[str, int]]
) -> list[BundleTopology]:
    """Each bundle's topology from the node it was placed on, without running anything.

    The ``gpu_id`` field is the bundle's index among the bundles on its node, which
    is what orders bundles within a node on CPU-only Ray.
    """
    seen: dict[str, int] = {}
    data = []
    for node_id in bundle_nodes:
        local = seen.get(node_id, 0)
        seen[node_id] = local + 1
        domain, rank = topology.get(node_id, (NVLINK_DOMAIN_UNKNOWN, TOPO_RANK_UNKNOWN))
        data.append(BundleTopology(local, domain, rank, node_id))
    return data


def bundle_order_from_labels(
    bundle_nodes: Sequence[str],
    nodes: Iterable[Mapping[str, Any]],
    segment_size: int | None = None,
    bundles_per_node: int | None = None,
) -> tuple[list[int], tuple[str, ...]] | None:
    """``(bundle order, domain per bundle)`` from node records alone; None without labels.

    For CPU-only Ray, where no GPU ids exist: bundles on one node keep their order.
    """
    data = bundle_topology_from_labels(bundle_nodes, topology_of_nodes(nodes))
    if all(
        b.nvlink_domain == NVLINK_DOMAIN_UNKNOWN and b.topo_rank == TOPO_RANK_UNKNOWN for b in data
    ):
        return None
    order = sort_bundle_indices_by_topology(data, segment_size, bundles_per_node)
    return order, tuple(b.nvlink_domain for b in data)


def get_reordered_bundle(
    pg: Any,
    segment_size: int | None = None,
    gpus_per_node: int | None = None,
    *,
    ray: Any = None,
) -> tuple[list[int], list[Any], tuple[str, ...]]:
    """``(bundle order, GPU id per ordered bundle, domain per original bundle)`` of ``pg``.

    Needs GPUs: one short task per bundle asks Ray for the GPU it was given. The
    domain and rank come from the node each bundle was placed on (read from the node
    list here, not inside the tasks). ``ray`` is the connected module (imported when
    None).
    """
    if ray is None:
        import ray as ray_module

        ray = ray_module
    table = ray.util.placement_group_table(pg)
    placed = table["bundles_to_node_id"]
    count = len(table["bundles"])
    bundle_nodes = [str(placed[i]) for i in range(count)]
    topology = topology_of_nodes(ray.nodes())
    strategies = ray.util.scheduling_strategies
    gpu_id_task = ray.remote(num_gpus=1)(_first_gpu_id)
    refs = [
        gpu_id_task.options(
            num_cpus=0.01,
            num_gpus=0.01,
            scheduling_strategy=strategies.PlacementGroupSchedulingStrategy(
                placement_group=pg, placement_group_bundle_index=i
            ),
        ).remote()
        for i in range(count)
    ]
    # Kept as Ray gives them: integers, or strings where devices are named by UUID.
    gpu_ids = list(ray.get(refs))
    data = [
        BundleTopology(
            gpu_ids[i], *topology.get(node, (NVLINK_DOMAIN_UNKNOWN, TOPO_RANK_UNKNOWN)), node
        )
        for i, node in enumerate(bundle_nodes)
    ]
    order = sort_bundle_indices_by_topology(data, segment_size, gpus_per_node)
    return order, [gpu_ids[i] for i in order], tuple(b.nvlink_domain for b in data)


def _first_gpu_id() -> Any:
    """Runs in a bundle: the first GPU Ray gave this task."""
    import ray

    return ray.get_gpu_ids()[0]
