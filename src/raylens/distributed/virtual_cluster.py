"""A slice of a Ray cluster reserved for worker groups, as placement-group bundles.

:class:`RayVirtualCluster` describes how many bundles to reserve on each logical node
and reserves them on first use. Worker groups then address a bundle as
``(node index, local bundle index)`` and ask the cluster where that is
(:meth:`RayVirtualCluster.get_bundle_location`).

Ray is imported only when a placement group is actually needed, so the class can be
built, validated and inspected where Ray is not installed.
"""

from __future__ import annotations

import socket
import uuid
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from raylens.distributed.ray_seam import DEFAULT_RAY_SEAM, RaySeam
from raylens.lens import warn_once
from raylens.validation import positive_seconds

__all__ = [
    "PLACEMENT_STRATEGIES",
    "ClusterResourceError",
    "PlacementTimeoutError",
    "RayVirtualCluster",
    "reset_remote_function_cache",
]

#: Strategies a virtual cluster accepts, as Ray's placement groups take them. Unless
#: told otherwise (``use_unified_pg``), the two PACK variants reserve one placement group
#: per logical node (each node's bundles kept together) and the two SPREAD variants a
#: single group holding every bundle, spread over the cluster's nodes.
PLACEMENT_STRATEGIES = ("PACK", "STRICT_PACK", "SPREAD", "STRICT_SPREAD")
_PER_NODE_STRATEGIES = ("PACK", "STRICT_PACK")

# How many ports the port finder binds before it gives up on finding one that this
# cluster has not handed out already.
_PORT_ATTEMPTS = 64


def reset_remote_function_cache() -> None:
    """Forget the Ray remote definitions of the default seam (rebuilt on next use)."""
    DEFAULT_RAY_SEAM.reset()


class ClusterResourceError(RuntimeError):
    """The Ray cluster does not have the CPUs or GPUs a virtual cluster asks for."""


class PlacementTimeoutError(TimeoutError):
    """Placement groups were not placed in time; the groups this cluster made are removed."""


@dataclass(frozen=True)
class _GroupPlan:
    """One placement group to create: its Ray name, logical nodes, and bundle count."""

    name: str
    nodes: list[int]
    bundle_count: int
    strategy: str


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


def _free_ports(excluded: set[int], count: int) -> list[int]:
    """``count`` distinct TCP ports free on this host now, none of them in ``excluded``.

    The probing sockets stay open until all are chosen, so the kernel cannot hand out
    the same port twice.
    """
    held: list[socket.socket] = []
    ports: list[int] = []
    try:
        for _ in range(_PORT_ATTEMPTS + count):
            if len(ports) == count:
                break
            probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.append(probe)
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(("", 0))
            port = int(probe.getsockname()[1])
            if port not in excluded and port not in ports:
                ports.append(port)
    finally:
        for probe in held:
            probe.close()
    if len(ports) < count:
        raise RuntimeError(
            f"could not find {count} free port(s) outside the {len(excluded)} already handed "
            f"out after {_PORT_ATTEMPTS + count} attempts"
        )
    return ports


def _free_port(excluded: set[int]) -> int:
    """A TCP port that is free on this host now and is not in ``excluded``."""
    return _free_ports(excluded, 1)[0]


def _address_and_free_ports(excluded: list[int], count: int) -> tuple[str, list[int]]:
    """Runs on the node that holds a bundle: that node's IP and ``count`` free ports there."""
    import ray

    return ray.util.get_node_ip_address(), _free_ports(set(excluded), count)


def _remote_address_and_free_ports(seam: RaySeam) -> Any:
    return seam.remote(
        "address_and_free_ports",
        lambda ray: ray.remote(num_cpus=0, num_gpus=0)(_address_and_free_ports),
    )


def _remove_placement_groups(groups: list[Any], seam: RaySeam = DEFAULT_RAY_SEAM) -> None:
    """Remove ``groups`` from Ray if this process is still connected; never raises.

    Used both by :meth:`RayVirtualCluster.shutdown` and as the cluster's finalizer,
    which may run at interpreter exit after Ray has already disconnected.
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


class RayVirtualCluster:
    """Placement-group bundles reserved on a Ray cluster for worker groups.

    ``bundle_ct_per_node_list[i]`` is the number of bundles on logical node ``i``. Each
    bundle holds ``max_colocated_worker_groups`` CPUs, plus one GPU when ``use_gpus``
    (worker groups placed on the same bundle share it). With ``use_gpus=False`` the
    cluster runs on CPU-only Ray.

    ``placement_group_strategy`` is one of :data:`PLACEMENT_STRATEGIES` (default
    ``PACK``). By default a cluster reserves one placement group per logical node that
    has bundles, named ``{name}-node{i}``, so each node's bundles land together; that
    group's position is the workers' ``NODE_RANK``. ``use_unified_pg=True`` reserves a
    single group for all bundles instead (``{name}-all``); a worker's ``NODE_RANK`` is
    then taken from the Ray node its bundle was actually placed on. Left at None, a
    single group is used for the SPREAD strategies and per-node groups otherwise.

    Bundles are addressed as ``(node index, local index)``, where nodes are counted
    among those that hold bundles: ``[2, 0, 2]`` has nodes 0 and 1.

    Nothing is reserved until :meth:`get_placement_groups` (or anything that needs a
    bundle) is first called. Reservation first checks that the cluster as a whole has
    the CPUs and GPUs asked for (:class:`ClusterResourceError` otherwise), then waits
    at most ``placement_timeout_s`` seconds for every group to be placed; on timeout
    the groups it made are removed and :class:`PlacementTimeoutError` names the ones
    that did not place.

    :meth:`shutdown` removes the groups. It is idempotent, harmless after
    ``ray.shutdown()``, and also runs when the object is garbage collected or the
    interpreter exits.

    ``ray_seam`` is how the cluster reaches Ray (:data:`DEFAULT_RAY_SEAM` when None);
    worker groups built on the cluster use the same one unless given another.
    """

    def __init__(
        self,
        bundle_ct_per_node_list: Sequence[int],
        use_gpus: bool = True,
        max_colocated_worker_groups: int = 1,
        num_gpus_per_node: int = 8,
        name: str = "",
        *,
        placement_group_strategy: str = "PACK",
        placement_timeout_s: float = 180.0,
        use_unified_pg: bool | None = None,
        ray_seam: RaySeam | None = None,
    ) -> None:
        counts = self._checked_counts(bundle_ct_per_node_list)
        if placement_group_strategy not in PLACEMENT_STRATEGIES:
            allowed = ", ".join(PLACEMENT_STRATEGIES)
            raise ValueError(
                f"placement_group_strategy={placement_group_strategy!r} is not supported; "
                f"use one of {allowed}"
            )
        if use_unified_pg not in (True, False, None):
            raise ValueError(f"use_unified_pg={use_unified_pg!r} must be True, False or None")
        if isinstance(max_colocated_worker_groups, bool) or not (
            isinstance(max_colocated_worker_groups, int) and max_colocated_worker_groups >= 1
        ):
            raise ValueError(
                f"max_colocated_worker_groups={max_colocated_worker_groups!r} must be an "
                "integer of at least 1"
            )
        if use_gpus:
            if (
                isinstance(num_gpus_per_node, bool)
                or not isinstance(num_gpus_per_node, int)
                or num_gpus_per_node < 1
            ):
                raise ValueError(
                    f"num_gpus_per_node={num_gpus_per_node!r} must be a positive integer "
                    "when use_gpus=True"
                )
            for node_idx, count in enumerate(counts):
                if count > num_gpus_per_node:
                    raise ValueError(
                        f"node {node_idx} asks for {count} bundles, but with use_gpus=True "
                        f"each bundle takes a GPU and num_gpus_per_node={num_gpus_per_node}"
                    )
        positive_seconds("placement_timeout_s", placement_timeout_s)
        self._bundle_ct_per_node_list = counts
        self.use_gpus = bool(use_gpus)
        self.num_gpus_per_node = num_gpus_per_node
        self.max_colocated_worker_groups = max_colocated_worker_groups
        self.name = name or f"raylens-cluster-{uuid.uuid4().hex[:8]}"
        self.placement_group_strategy = placement_group_strategy
        self.use_unified_pg = (
            placement_group_strategy not in _PER_NODE_STRATEGIES
            if use_unified_pg is None
            else bool(use_unified_pg)
        )
        self.placement_timeout_s = float(placement_timeout_s)
        self.ray_seam = ray_seam or DEFAULT_RAY_SEAM
        self._placement_groups: list[Any] = []
        self._finalizer: weakref.finalize | None = None
        self._handed_out_ports: set[int] = set()
        # Ray node id of each bundle of a unified group, read once it is placed.
        self._bundle_nodes: list[str] | None = None

    @staticmethod
    def _checked_counts(bundle_ct_per_node_list: Sequence[int]) -> list[int]:
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

    # ---- description ------------------------------------------------------------------

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

    def bundle_resources(self) -> dict[str, int]:
        """The resources one bundle reserves."""
        resources = {"CPU": self.max_colocated_worker_groups}
        if self.use_gpus:
            resources["GPU"] = 1
        return resources

    def required_resources(self) -> dict[str, int]:
        """The resources all bundles together reserve."""
        return {
            resource: amount * self.world_size()
            for resource, amount in self.bundle_resources().items()
        }

    def _group_plan(self) -> list[_GroupPlan]:
        strategy = self.placement_group_strategy
        if not self.use_unified_pg:
            return [
                _GroupPlan(f"{self.name}-node{node_idx}", [node_idx], count, strategy)
                for node_idx, count in enumerate(self._bundle_ct_per_node_list)
                if count > 0
            ]
        nodes = list(range(len(self._bundle_ct_per_node_list)))
        return [_GroupPlan(f"{self.name}-all", nodes, self.world_size(), strategy)]

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

    # ---- placement --------------------------------------------------------------------

    def _require_ray(self) -> Any:
        ray = self.ray_seam.connected_ray()
        if ray is None:
            raise RuntimeError(
                f"virtual cluster {self.name!r} needs a connected Ray: call ray.init() first"
            )
        return ray

    def get_placement_groups(self) -> list[Any]:
        """The placement groups of this cluster, reserved on the first call.

        Raises :class:`ClusterResourceError` when the Ray cluster lacks the CPUs or
        GPUs, and :class:`PlacementTimeoutError` when the groups do not place within
        ``placement_timeout_s``.
        """
        if self._placement_groups:
            return list(self._placement_groups)
        ray = self._require_ray()
        missing = _missing_resources(self.required_resources(), ray.cluster_resources())
        if missing:
            raise ClusterResourceError(self._missing_resources_message(missing))
        from ray.util.placement_group import placement_group

        plan = self._group_plan()
        created: list[Any] = []
        try:
            for group in plan:
                bundles = [dict(self.bundle_resources()) for _ in range(group.bundle_count)]
                created.append(
                    placement_group(bundles=bundles, strategy=group.strategy, name=group.name)
                )
            ready_refs = [group.ready() for group in created]
            ready, _ = ray.wait(
                ready_refs, num_returns=len(ready_refs), timeout=self.placement_timeout_s
            )
        except BaseException:
            _remove_placement_groups(created, self.ray_seam)
            raise
        if len(ready) < len(ready_refs):
            ready_set = set(ready)
            unplaced = [group for group, ref in zip(plan, ready_refs) if ref not in ready_set]
            _remove_placement_groups(created, self.ray_seam)
            raise PlacementTimeoutError(self._unplaced_message(unplaced))
        if self.use_unified_pg:
            try:
                placed = ray.util.placement_group_table(created[0])["bundles_to_node_id"]
                self._bundle_nodes = [str(placed[i]) for i in range(self.world_size())]
            except Exception:
                _remove_placement_groups(created, self.ray_seam)
                raise
        self._placement_groups = created
        self._finalizer = weakref.finalize(self, _remove_placement_groups, created, self.ray_seam)
        return list(created)

    def _missing_resources_message(self, missing: dict[str, tuple[float, float]]) -> str:
        lines = [
            f"the Ray cluster cannot hold virtual cluster {self.name!r} "
            f"({self._bundle_ct_per_node_list} bundles of {self.bundle_resources()}):"
        ]
        for resource, (needed, present) in missing.items():
            lines.append(f"  {resource}: needs {needed:g}, the cluster has {present:g}")
        if "GPU" in missing:
            lines.append(
                "  on a cluster without GPUs, build the virtual cluster with use_gpus=False"
            )
        return "\n".join(lines)

    def _unplaced_message(self, unplaced: list[_GroupPlan]) -> str:
        described = "; ".join(
            f"{group.name!r} ({group.bundle_count} bundles of {self.bundle_resources()}, "
            f"{group.strategy}, logical nodes {group.nodes})"
            for group in unplaced
        )
        return (
            f"virtual cluster {self.name!r}: {len(unplaced)} placement group(s) did not place "
            f"within {self.placement_timeout_s:g}s: {described}. The cluster has the "
            "resources in total, so they are probably held by others or split across "
            "nodes in a way this strategy cannot use. Every group this cluster created "
            "has been removed."
        )

    def get_bundle_location(self, node_idx: int, local_bundle_idx: int) -> tuple[Any, int]:
        """``(placement group, bundle index)`` of bundle ``local_bundle_idx`` on ``node_idx``.

        Reserves the groups if that has not happened yet. A local index past the end of
        its node continues on the following nodes.
        """
        group_position, bundle_index, _ = self._bundle_address(node_idx, local_bundle_idx)
        return self.get_placement_groups()[group_position], bundle_index

    def get_master_address_and_port(self) -> tuple[str, int]:
        """An address and port for a distributed rendezvous, on the node of bundle 0.

        The address is the IP of the node holding the first bundle; the port was free
        there when asked and has not been handed out before by this cluster, so two
        worker groups on one cluster never get the same rendezvous.
        """
        return self._addresses_and_ports([self.get_bundle_location(0, 0)])[0]

    def get_available_address_and_port(self, pg_idx: int, bundle_idx: int) -> tuple[str, int]:
        """The IP of the node holding bundle ``bundle_idx`` of placement group ``pg_idx``,
        and a port free there that this cluster has not handed out before."""
        groups = self.get_placement_groups()
        if not 0 <= pg_idx < len(groups):
            raise ValueError(
                f"pg_idx={pg_idx!r} is out of range; this cluster has {len(groups)} "
                "placement groups"
            )
        return self._addresses_and_ports([(groups[pg_idx], bundle_idx)])[0]

    def _addresses_and_ports(self, bundles: Sequence[tuple[Any, int]]) -> list[tuple[str, int]]:
        """``(node IP, free port)`` for each ``(placement group, bundle index)``.

        One task runs on each Ray node the bundles are on (found from Ray's placement
        record) and reports that node's IP and as many free ports as bundles there.
        Every port returned is distinct from the others and from those this cluster
        handed out before; a node whose answer collides is asked again.
        """
        ray = self._require_ray()
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        def ask(group: Any, bundle_index: int, count: int) -> Any:
            strategy = PlacementGroupSchedulingStrategy(
                placement_group=group, placement_group_bundle_index=bundle_index
            )
            return (
                _remote_address_and_free_ports(self.ray_seam)
                .options(scheduling_strategy=strategy)
                .remote(sorted(self._handed_out_ports), count)
            )

        def fetch(refs: list[Any]) -> list[Any]:
            try:
                return list(ray.get(refs, timeout=self.placement_timeout_s))
            except ray.exceptions.GetTimeoutError:
                for ref in refs:
                    ray.cancel(ref)
                raise TimeoutError(
                    f"virtual cluster {self.name!r}: {len(refs)} node(s) did not report an "
                    f"address and free ports within {self.placement_timeout_s:g}s"
                ) from None

        by_node: dict[Any, list[int]] = {}
        for position, node in enumerate(self._bundle_node_ids(ray, bundles)):
            by_node.setdefault(node if node else ("bundle", position), []).append(position)
        sites = list(by_node.values())
        answers = fetch([ask(*bundles[positions[0]], len(positions)) for positions in sites])
        results: list[tuple[str, int]] = [("", 0)] * len(bundles)
        for positions, (address, ports) in zip(sites, answers):
            fresh = [int(port) for port in ports if int(port) not in self._handed_out_ports]
            self._handed_out_ports.update(fresh)
            while len(fresh) < len(positions):
                missing = len(positions) - len(fresh)
                address, more = fetch([ask(*bundles[positions[0]], missing)])[0]
                more = [int(port) for port in more if int(port) not in self._handed_out_ports]
                self._handed_out_ports.update(more)
                fresh.extend(more)
            for position, port in zip(positions, fresh):
                results[position] = (str(address), port)
        return results

    @staticmethod
    def _bundle_node_ids(ray: Any, bundles: Sequence[tuple[Any, int]]) -> list[str | None]:
        """The Ray node id each bundle was placed on, or None where Ray does not say."""
        tables: dict[int, dict[Any, Any]] = {}
        node_ids: list[str | None] = []
        for group, bundle_index in bundles:
            if id(group) not in tables:
                try:
                    table = ray.util.placement_group_table(group) or {}
                    tables[id(group)] = dict(table.get("bundles_to_node_id") or {})
                except Exception:
                    tables[id(group)] = {}
            node = tables[id(group)].get(bundle_index)
            node_ids.append(str(node) if node else None)
        return node_ids

    def shutdown(self) -> None:
        """Release the placement groups. Idempotent; never needs Ray to still be up."""
        finalizer = self._finalizer
        self._finalizer = None
        if finalizer is not None:
            finalizer()
        else:
            _remove_placement_groups(self._placement_groups, self.ray_seam)
        self._placement_groups = []
        self._bundle_nodes = None

    def _init_placement_groups(
        self, strategy: str | None = None, use_unified_pg: bool | None = None
    ) -> list[Any]:
        """Reserve the groups, optionally with another strategy or layout first.

        The entry point NeMo-RL's cluster has; the choice only applies before the
        groups are reserved.
        """
        if not self._placement_groups:
            if strategy is not None:
                if strategy not in PLACEMENT_STRATEGIES:
                    raise ValueError(
                        f"strategy={strategy!r} is not supported; use one of "
                        f"{', '.join(PLACEMENT_STRATEGIES)}"
                    )
                self.placement_group_strategy = strategy
            if use_unified_pg is not None:
                self.use_unified_pg = bool(use_unified_pg)
        return self.get_placement_groups()

    def __repr__(self) -> str:
        return (
            f"RayVirtualCluster(name={self.name!r}, "
            f"bundle_ct_per_node_list={self._bundle_ct_per_node_list}, "
            f"strategy={self.placement_group_strategy!r}, use_gpus={self.use_gpus}, "
            f"reserved={bool(self._placement_groups)})"
        )
