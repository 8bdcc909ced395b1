"""A slice of a Ray cluster reserved for worker groups, as placement-group bundles.

:class:`RayVirtualCluster` describes how many bundles to reserve on each logical node
and reserves them on first use. Worker groups then address a bundle as
``(node index, local bundle index)`` and ask the cluster where that is
(:meth:`RayVirtualCluster.get_bundle_location`) and which address and free port it has
(:meth:`RayVirtualCluster.get_available_addresses_and_ports_batch`).

It also carries the rest of NeMo-RL's ``virtual_cluster`` API: :func:`init_ray`, the
port bands and free-port helpers, and topology-aware placement (:mod:`.topology`).
Ray is imported only when needed. The module-level names ``ray``,
``PlacementGroupSchedulingStrategy`` and ``_get_node_ip_and_free_port`` stand for Ray's
and are looked up when a cluster uses them: replacing one (as NeMo-RL's tests do)
changes what every cluster calls. Left alone, a cluster reaches Ray through its seam.
"""

from __future__ import annotations

import logging
import time
import uuid
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from raylens.distributed import _ports
from raylens.distributed._placement_errors import (
    ClusterResourceError,
    PlacementArgumentError,
    PlacementGroupIndexError,
    PlacementTimeoutError,
    ResourceInsufficientError,
)
from raylens.distributed._placement_plan import (
    MAX_RETRIES_ENV,
    PLACEMENT_STRATEGIES,
    _BundleLayout,
    _checked_constraints,
    _checked_counts,
    _checked_port_range,
    _checked_segment_size,
    _checked_strategy,
    _group_plans,
    _GroupPlan,
    _max_retries,
    _missing_resources_message,
    _remove_placement_groups,
    _unified_by_default,
    _unplaced_message,
)
from raylens.distributed._placement_plan import _missing_resources as _missing_resources
from raylens.distributed._placement_plan import (
    _ranks_from_bundle_nodes as _ranks_from_bundle_nodes,
)
from raylens.distributed._port_discovery import (
    PORT_ROUNDS,
    _collect_in_batches,
    _port_finder_of,
    _PortFinderStandIn,
    _RayStandIn,
    _repeated_ports,
    _StrategyStandIn,
)
from raylens.distributed._ports import *  # noqa: F403  (NeMo-RL imports the port bands from here)
from raylens.distributed._ports import (
    DEFAULT_MASTER_PORT_RANGE_HIGH,
    DEFAULT_MASTER_PORT_RANGE_LOW,
    PortRangeError,
)
from raylens.distributed._ports import _bind_socket_in_range as _bind_socket_in_range
from raylens.distributed._ports import (
    _get_free_consecutive_ports_local as _get_free_consecutive_ports_local,
)
from raylens.distributed._ports import _get_free_port_local as _get_free_port_local
from raylens.distributed._ports import _get_node_ip_local as _get_node_ip_local
from raylens.distributed.ray_init import PY_EXECUTABLES, ClusterConfig, init_ray
from raylens.distributed.ray_seam import DEFAULT_RAY_SEAM, RaySeam
from raylens.distributed.topology import (
    NVLINK_DOMAIN_PREFIX,
    NVLINK_DOMAIN_UNKNOWN,
    TOPO_RANK_KEY,
    TOPO_RANK_UNKNOWN,
    bundle_order_from_labels,
    get_ray_cluster_topology,
    get_reordered_bundle,
    prepare_segment_topology,
    select_segment_nodes,
    sort_bundle_indices_by_topology,
)
from raylens.validation import positive_seconds

__all__ = [
    "NVLINK_DOMAIN_PREFIX",
    "NVLINK_DOMAIN_UNKNOWN",
    "PLACEMENT_STRATEGIES",
    "PY_EXECUTABLES",
    "TOPO_RANK_KEY",
    "TOPO_RANK_UNKNOWN",
    "ClusterConfig",
    "ClusterResourceError",
    "PlacementTimeoutError",
    "RayVirtualCluster",
    "ResourceInsufficientError",
    "get_ray_cluster_topology",
    "get_reordered_bundle",
    "init_ray",
    "prepare_segment_topology",
    "reset_remote_function_cache",
    "select_segment_nodes",
]
__all__ += _ports.__all__

_LOGGER = logging.getLogger("raylens.distributed")

#: NeMo-RL's name for :func:`~raylens.distributed.topology.sort_bundle_indices_by_topology`.
_sort_bundle_indices_by_topology = sort_bundle_indices_by_topology

_RAY_STAND_IN = _RayStandIn()
_STRATEGY_STAND_IN = _StrategyStandIn()
_PORT_FINDER_STAND_IN = _PortFinderStandIn()
ray: Any = _RAY_STAND_IN
PlacementGroupSchedulingStrategy: Any = _STRATEGY_STAND_IN
_get_node_ip_and_free_port: Any = _PORT_FINDER_STAND_IN


def reset_remote_function_cache() -> None:
    """Forget the Ray remote definitions of the default seam (rebuilt on next use)."""
    DEFAULT_RAY_SEAM.reset()


def _positive_int(label: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{label}={value!r} must be a positive integer")
    return value


class RayVirtualCluster(_BundleLayout):
    """Placement-group bundles reserved on a Ray cluster for worker groups.

    ``bundle_ct_per_node_list[i]`` is the number of bundles on logical node ``i``. Each
    bundle holds ``max_colocated_worker_groups`` CPUs, plus one GPU when ``use_gpus``
    (worker groups placed on the same bundle share it), plus node ``i``'s entry of
    ``node_resource_constraints`` (such as ``{"nvlink_domain_<uuid>": 0.001}``, which
    pins the node to one NVLink domain; see
    :func:`~raylens.distributed.topology.prepare_segment_topology`). With
    ``use_gpus=False`` the cluster runs on CPU-only Ray.

    The positional order is NeMo-RL's. ``placement_group_strategy`` is one of
    :data:`PLACEMENT_STRATEGIES`; left at None it is ``SPREAD``, NeMo-RL's default,
    and the cluster reserves one group per logical node that has bundles
    (``{name}-node{i}``, packed), whose position is the workers' ``NODE_RANK``. A
    SPREAD variant given explicitly, or ``use_unified_pg=True``, reserves a single
    group for all bundles (``{name}-all``) with that strategy; a worker's
    ``NODE_RANK`` is then the Ray node its bundle was placed on.

    ``port_range_low``/``port_range_high`` bound the ports handed out for rendezvous
    and per worker (``[low, high)``, :data:`DEFAULT_MASTER_PORT_RANGE_LOW` to
    :data:`DEFAULT_MASTER_PORT_RANGE_HIGH` by default). A unified cluster orders
    its bundles by topology once placed (``_sorted_bundle_indices``; the master port
    is found on the first): with GPUs as NeMo-RL does, on CPU-only Ray from the node
    labels alone. ``segment_size`` (nodes per NVLink segment) then keeps whole
    segments only, and an NVLink domain holding a partial segment is an error.

    Nothing is reserved until :meth:`get_placement_groups` (or anything that needs a
    bundle) is first called. Reserving is attempted up to
    ``NRL_VIRTUAL_CLUSTER_MAX_RETRIES`` times (6 by default) while the cluster lacks
    the CPUs or GPUs, sleeping ``2**attempt`` seconds after each failure (through
    ``sleep``, ``time.sleep`` by default); then :class:`ClusterResourceError`. Each
    attempt waits at most ``placement_timeout_s`` for the groups to place; on timeout
    the groups it made are removed and :class:`PlacementTimeoutError` names the ones
    that did not place.

    :meth:`shutdown` removes the groups. It is idempotent, harmless after
    ``ray.shutdown()``, and also runs when the object is garbage collected or the
    interpreter exits. ``ray_seam`` is how the cluster reaches Ray
    (:data:`DEFAULT_RAY_SEAM` when None); worker groups built on it use the same one.
    """

    def __init__(
        self,
        bundle_ct_per_node_list: Sequence[int],
        use_gpus: bool = True,
        max_colocated_worker_groups: int = 1,
        num_gpus_per_node: int = 8,
        name: str = "",
        placement_group_strategy: str | None = None,
        port_range_low: int | None = None,
        port_range_high: int | None = None,
        segment_size: int | None = None,
        node_resource_constraints: Sequence[Mapping[str, float] | None] | None = None,
        *,
        placement_timeout_s: float = 180.0,
        use_unified_pg: bool | None = None,
        ray_seam: RaySeam | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        counts = _checked_counts(bundle_ct_per_node_list)
        strategy = (
            "SPREAD"
            if placement_group_strategy is None
            else _checked_strategy("placement_group_strategy", placement_group_strategy)
        )
        if use_unified_pg not in (True, False, None):
            raise ValueError(f"use_unified_pg={use_unified_pg!r} must be True, False or None")
        _positive_int("max_colocated_worker_groups", max_colocated_worker_groups)
        if use_gpus:
            _positive_int("num_gpus_per_node", num_gpus_per_node)
            for node_idx, count in enumerate(counts):
                if count > num_gpus_per_node:
                    raise ValueError(
                        f"node {node_idx} asks for {count} bundles, but with use_gpus=True "
                        f"each bundle takes a GPU and num_gpus_per_node={num_gpus_per_node}"
                    )
        positive_seconds("placement_timeout_s", placement_timeout_s)
        self.port_range_low, self.port_range_high = _checked_port_range(
            DEFAULT_MASTER_PORT_RANGE_LOW if port_range_low is None else port_range_low,
            DEFAULT_MASTER_PORT_RANGE_HIGH if port_range_high is None else port_range_high,
        )
        self.segment_size = _checked_segment_size(segment_size)
        self.node_resource_constraints = _checked_constraints(
            node_resource_constraints, len(counts)
        )
        self._bundle_ct_per_node_list = counts
        self.use_gpus = bool(use_gpus)
        self.num_gpus_per_node = num_gpus_per_node
        self.max_colocated_worker_groups = max_colocated_worker_groups
        self.name = name or f"raylens-cluster-{uuid.uuid4().hex[:8]}"
        self.placement_group_strategy = strategy
        self.use_unified_pg = (
            _unified_by_default(placement_group_strategy)
            if use_unified_pg is None
            else bool(use_unified_pg)
        )
        self.placement_timeout_s = float(placement_timeout_s)
        self.ray_seam = ray_seam or DEFAULT_RAY_SEAM
        self._sleep = sleep
        self._node_placement_groups: list[Any] | None = None
        self._sorted_bundle_indices: list[int] | None = None
        self._nvlink_domain_per_bundle_index: tuple[str, ...] | None = None
        self._finalizer: weakref.finalize | None = None
        self._allocated_master_ports: set[int] = set()
        # Ray node id of each bundle of a unified group, read once it is placed.
        self._bundle_nodes: list[str] | None = None

    # ---- description ------------------------------------------------------------------

    def bundle_resources(self, node_idx: int | None = None) -> dict[str, float]:
        """The resources one bundle (of logical node ``node_idx``, when given) reserves."""
        resources: dict[str, float] = {"CPU": self.max_colocated_worker_groups}
        if self.use_gpus:
            resources["GPU"] = 1
        if node_idx is not None and self.node_resource_constraints:
            resources.update(self.node_resource_constraints[node_idx] or {})
        return resources

    def required_resources(self) -> dict[str, float]:
        """The CPUs and GPUs all bundles together reserve."""
        return {
            resource: amount * self.world_size()
            for resource, amount in self.bundle_resources().items()
        }

    def _group_plan(self) -> list[_GroupPlan]:
        return _group_plans(
            self.name,
            self._bundle_ct_per_node_list,
            self.placement_group_strategy,
            self.use_unified_pg,
        )

    # ---- reaching Ray -----------------------------------------------------------------

    def _require_ray(self) -> Any:
        connected = self.ray_seam.connected_ray()
        if connected is None:
            raise RuntimeError(
                f"virtual cluster {self.name!r} needs a connected Ray: call ray.init() first"
            )
        return connected

    @staticmethod
    def _patched_ray() -> Any:
        """The module-level ``ray`` when something replaced it, else None."""
        return None if ray is _RAY_STAND_IN else ray

    def _ray_api(self) -> Any:
        patched = self._patched_ray()
        return patched if patched is not None else self._require_ray()

    def _strategy(self, ray_api: Any, group: Any, bundle_index: int) -> Any:
        if PlacementGroupSchedulingStrategy is not _STRATEGY_STAND_IN:
            make = PlacementGroupSchedulingStrategy
        else:
            make = ray_api.util.scheduling_strategies.PlacementGroupSchedulingStrategy
        return make(placement_group=group, placement_group_bundle_index=bundle_index)

    def _port_finder(self) -> Any:
        if _get_node_ip_and_free_port is not _PORT_FINDER_STAND_IN:
            return _get_node_ip_and_free_port
        return _port_finder_of(self.ray_seam)

    # ---- placement --------------------------------------------------------------------

    def get_placement_groups(self) -> list[Any]:
        """The placement groups of this cluster (those with bundles), reserved on first call."""
        groups = self._node_placement_groups
        if groups is None:
            groups = self._init_placement_groups()
        return [group for group in groups if getattr(group, "bundle_specs", True)]

    def _init_placement_groups(
        self, strategy: str | None = None, use_unified_pg: bool | None = None
    ) -> list[Any]:
        """Reserve the groups, with another strategy or layout if given; retried.

        The choices apply only while nothing is reserved. Placement is attempted up
        to ``NRL_VIRTUAL_CLUSTER_MAX_RETRIES`` times while the cluster lacks
        resources, sleeping ``2**attempt`` seconds after each failed attempt.
        """
        if self._node_placement_groups is not None:
            return self._node_placement_groups
        attempts = _max_retries()
        if strategy is not None:
            self.placement_group_strategy = _checked_strategy("strategy", strategy)
        if use_unified_pg is not None:
            self.use_unified_pg = bool(use_unified_pg)
        last: ResourceInsufficientError | None = None
        for attempt in range(attempts):
            try:
                groups = self._create_placement_groups_internal(
                    self.placement_group_strategy, self.use_unified_pg
                )
            except ResourceInsufficientError as error:
                last = error
                delay = 2**attempt
                _LOGGER.warning(
                    "virtual cluster %r: placement attempt %d of %d failed (%s); next in %ds",
                    self.name,
                    attempt + 1,
                    attempts,
                    error,
                    delay,
                )
                (self._sleep or time.sleep)(delay)
                continue
            self._node_placement_groups = groups
            self._finalizer = weakref.finalize(
                self, _remove_placement_groups, list(groups), self.ray_seam
            )
            self._sorted_bundle_indices = self._get_sorted_bundle_indices()
            return groups
        kind = (
            ClusterResourceError
            if isinstance(last, ClusterResourceError)
            else ResourceInsufficientError
        )
        raise kind(
            f"virtual cluster {self.name!r}: no placement after {attempts} attempt(s) "
            f"({MAX_RETRIES_ENV} sets how many); the last failure: {last}"
        ) from last

    def _create_placement_groups_internal(
        self, strategy: str, use_unified_pg: bool = False
    ) -> list[Any]:
        """One attempt: check the resources, create the groups, wait until they place."""
        ray_api = self._ray_api()
        missing = _missing_resources(self.required_resources(), ray_api.cluster_resources())
        if missing:
            raise ClusterResourceError(self._missing_resources_message(missing))
        plan = _group_plans(self.name, self._bundle_ct_per_node_list, strategy, use_unified_pg)
        created: list[Any] = []
        placed_all = False
        try:
            for group in plan:
                bundles = [self.bundle_resources(node) for node in group.bundle_nodes]
                created.append(
                    ray_api.util.placement_group(
                        bundles=bundles, strategy=group.strategy, name=group.name
                    )
                )
            ready_refs = [group.ready() for group in created]
            ready, _ = ray_api.wait(
                ready_refs, num_returns=len(ready_refs), timeout=self.placement_timeout_s
            )
            if len(ready) < len(ready_refs):
                ready_set = set(ready)
                unplaced = [g for g, ref in zip(plan, ready_refs) if ref not in ready_set]
                raise PlacementTimeoutError(self._unplaced_message(unplaced))
            if use_unified_pg:
                placed = ray_api.util.placement_group_table(created[0])["bundles_to_node_id"]
                self._bundle_nodes = [str(placed[i]) for i in range(self.world_size())]
            placed_all = True
        finally:
            if not placed_all:  # whatever ended it (an interrupt too): no half-made groups
                _remove_placement_groups(created, self.ray_seam)
        return created

    def _get_sorted_bundle_indices(self) -> list[int] | None:
        """Bundle order by physical topology for a unified group; None otherwise.

        With GPUs, each bundle's GPU id is asked from Ray (NeMo-RL's way); on CPU-only
        Ray the order comes from the node labels alone, bundles on one node keeping
        their order. The NVLink domain of each bundle is kept beside it.
        """
        groups = self._node_placement_groups
        self._nvlink_domain_per_bundle_index = None
        if groups is None or len(groups) != 1 or not self.use_unified_pg:
            return None
        ray_api = self._ray_api()
        segment = self.segment_size
        per_node = self.num_gpus_per_node if segment else None
        if self.use_gpus:
            order, _, domains = get_reordered_bundle(groups[0], segment, per_node, ray=ray_api)
        else:
            if self._bundle_nodes is None:
                return None
            per_node = max(self._bundle_ct_per_node_list) if segment else None
            found = bundle_order_from_labels(self._bundle_nodes, ray_api.nodes(), segment, per_node)
            if found is None:
                return None  # no labels: the bundles keep Ray's order
            order, domains = found
        self._nvlink_domain_per_bundle_index = domains
        if len(order) != len(domains):
            raise PlacementArgumentError(
                f"virtual cluster {self.name!r}: ordering by topology kept {len(order)} of "
                f"{len(domains)} bundles because some NVLink domains hold an incomplete "
                f"segment of {segment} nodes; pin nodes to whole segments with "
                "node_resource_constraints (prepare_segment_topology)"
            )
        return order

    def _missing_resources_message(self, missing: dict[str, tuple[float, float]]) -> str:
        return _missing_resources_message(
            self.name, self._bundle_ct_per_node_list, self.bundle_resources(), missing
        )

    def _unplaced_message(self, unplaced: list[_GroupPlan]) -> str:
        return _unplaced_message(
            self.name, self.bundle_resources(), self.placement_timeout_s, unplaced
        )

    def get_bundle_location(self, node_idx: int, local_bundle_idx: int) -> tuple[Any, int]:
        """``(placement group, bundle index)`` of bundle ``local_bundle_idx`` on ``node_idx``.

        Reserves the groups if that has not happened yet. A local index past the end of
        its node continues on the following nodes.
        """
        group_position, bundle_index, _ = self._bundle_address(node_idx, local_bundle_idx)
        return self.get_placement_groups()[group_position], bundle_index

    # ---- addresses and ports ----------------------------------------------------------

    def get_master_address_and_port(self) -> tuple[str, int]:
        """An address and port for a distributed rendezvous, on the node of the first bundle.

        The first bundle is the first in topology order when the cluster has one. Each
        call returns a port no earlier call on this cluster returned, so two worker
        groups sharing the cluster never share a rendezvous.
        """
        self.get_placement_groups()
        bundle = self._sorted_bundle_indices[0] if self._sorted_bundle_indices else 0
        for _ in range(PORT_ROUNDS):
            address, port = self.get_available_address_and_port(0, bundle)
            if port not in self._allocated_master_ports:
                self._allocated_master_ports.add(port)
                return address, port
        raise PortRangeError(
            f"virtual cluster {self.name!r}: no master port outside the "
            f"{len(self._allocated_master_ports)} already handed out after {PORT_ROUNDS} "
            f"tries in [{self.port_range_low}, {self.port_range_high})"
        )

    def get_available_address_and_port(self, pg_idx: int, bundle_idx: int) -> tuple[str, int]:
        """The IP of the node holding bundle ``bundle_idx`` of group ``pg_idx`` and a port
        free there, in this cluster's port range (one batch of one)."""
        return self.get_available_addresses_and_ports_batch([(pg_idx, bundle_idx)])[0]

    def get_available_addresses_and_ports_batch(
        self, pg_bundle_pairs: Sequence[tuple[int, int]], batch_size: int = 256
    ) -> list[tuple[str, int]]:
        """``(node IP, free port)`` for each ``(pg_idx, bundle_idx)``, in the same order.

        One small task per pair runs on the pair's bundle (all submitted at once), and
        results are fetched ``batch_size`` at a time so that thousands of them never
        sit in the object store together. With a single (unified) group, ``pg_idx``
        is ignored. A pair whose port repeats one given to another pair on the same
        address, or a master port of this cluster, is asked again (up to 10 rounds).
        """
        _positive_int("batch_size", batch_size)
        pairs = [(int(pg_idx), int(bundle_idx)) for pg_idx, bundle_idx in pg_bundle_pairs]
        groups = self.get_placement_groups()
        ray_api = self._ray_api()
        bounded = self._patched_ray() is None
        results: list[tuple[str, int] | None] = [None] * len(pairs)
        pending = list(range(len(pairs)))
        for _ in range(PORT_ROUNDS):
            refs = [self._ask_port(ray_api, groups, *pairs[i]) for i in pending]
            for i, answer in zip(pending, self._collect(ray_api, refs, batch_size, bounded)):
                results[i] = (str(answer[0]), int(answer[1]))
            pending = _repeated_ports(results, self._allocated_master_ports)
            if not pending:
                return [result for result in results if result is not None]
        raise PortRangeError(
            f"virtual cluster {self.name!r}: {len(pending)} bundle(s) kept getting ports "
            f"already handed out after {PORT_ROUNDS} rounds in "
            f"[{self.port_range_low}, {self.port_range_high}); widen the port range"
        )

    def _ask_port(self, ray_api: Any, groups: list[Any], pg_idx: int, bundle_idx: int) -> Any:
        if len(groups) == 1:
            group = groups[0]
        elif 0 <= pg_idx < len(groups):
            group = groups[pg_idx]
        else:
            raise PlacementGroupIndexError(
                f"pg_idx={pg_idx!r} is out of range; this cluster has {len(groups)} "
                "placement groups"
            )
        if not getattr(group, "bundle_specs", True):
            raise RuntimeError("No valid placement groups found to get available address and port")
        return (
            self._port_finder()
            .options(scheduling_strategy=self._strategy(ray_api, group, bundle_idx), num_cpus=0)
            .remote(self.port_range_low, self.port_range_high)
        )

    def _collect(self, ray_api: Any, refs: list[Any], batch_size: int, bounded: bool) -> list[Any]:
        """The values of ``refs`` in order, fetched at most ``batch_size`` at a time."""
        if not bounded:  # a replaced ``ray`` gets NeMo-RL's exact calls
            return _collect_in_batches(ray_api, refs, batch_size, {})
        try:
            return _collect_in_batches(
                ray_api, refs, batch_size, {"timeout": self.placement_timeout_s}
            )
        except (TimeoutError, ray_api.exceptions.GetTimeoutError):
            raise TimeoutError(
                f"virtual cluster {self.name!r}: bundles did not report an address and port "
                f"within {self.placement_timeout_s:g}s"
            ) from None

    def _addresses_and_ports(self, bundles: Sequence[tuple[Any, int]]) -> list[tuple[str, int]]:
        """``(node IP, free port)`` for each ``(placement group, bundle index)``."""
        groups = self.get_placement_groups()
        position = {id(group): i for i, group in enumerate(groups)}
        pairs = [(position[id(group)], index) for group, index in bundles]
        return self.get_available_addresses_and_ports_batch(pairs)

    # ---- release ----------------------------------------------------------------------

    def shutdown(self) -> bool:
        """Release the placement groups. Idempotent; never needs Ray to still be up."""
        finalizer = self._finalizer
        self._finalizer = None
        if finalizer is not None:
            finalizer()
        elif self._node_placement_groups:
            _remove_placement_groups(list(self._node_placement_groups), self.ray_seam)
        self._node_placement_groups = None
        self._sorted_bundle_indices = None
        self._nvlink_domain_per_bundle_index = None
        self._bundle_nodes = None
        return True

    def __repr__(self) -> str:
        return (
            f"RayVirtualCluster(name={self.name!r}, "
            f"bundle_ct_per_node_list={self._bundle_ct_per_node_list}, "
            f"strategy={self.placement_group_strategy!r}, use_gpus={self.use_gpus}, "
            f"reserved={self._node_placement_groups is not None})"
        )
