"""What raylens reads from a Ray cluster, behind one small interface.

raylens needs three answers from Ray: is this process connected, which nodes
exist, and where the bundles of a placement group were scheduled. :class:`ClusterView`
names exactly those three calls, with the shapes Ray itself returns, so that the
code which uses them can be handed :class:`RayClusterView` (the real cluster) or
``raylens_fakes.FakeCluster`` (a scripted one) without knowing which.

Ray is imported lazily: ``import raylens`` works where Ray is not installed, and
asking whether Ray is initialised never imports it as a side effect.
"""

from __future__ import annotations

import sys
from typing import Any, Protocol, runtime_checkable

__all__ = ["ClusterView", "RayClusterView", "default_cluster_view"]


@runtime_checkable
class ClusterView(Protocol):
    """The cluster as raylens sees it.

    ``nodes()`` returns one dict per node with Ray's keys, among them ``"NodeID"``
    (hex), ``"Alive"``, ``"NodeManagerAddress"``, ``"NodeManagerHostname"`` and
    ``"MetricsExportPort"``. ``placement_group_table(pg)`` returns Ray's record of
    one placement group, among them ``"state"`` (``"PENDING"``, ``"CREATED"``,
    ``"RESCHEDULING"``, ``"REMOVED"``...) and ``"bundles_to_node_id"``, which maps
    each bundle index to the hex id of the node it was placed on (``""`` when it
    has not been placed).
    """

    def is_initialized(self) -> bool:
        """True when this process is connected to a cluster."""
        ...

    def nodes(self) -> list[dict[str, Any]]:
        """Every node the cluster knows of, dead ones included."""
        ...

    def placement_group_table(self, placement_group: Any) -> dict[str, Any]:
        """Ray's record of ``placement_group``."""
        ...


class RayClusterView:
    """:class:`ClusterView` over the Ray this process is connected to.

    Stateless: every call goes to Ray. ``is_initialized`` answers False without
    importing Ray when nothing else has imported it yet, since a process that has
    never imported Ray cannot have called ``ray.init``.
    """

    def is_initialized(self) -> bool:
        ray = sys.modules.get("ray")
        if ray is None:
            return False
        try:
            return bool(ray.is_initialized())
        except AttributeError:  # a partially imported or stub module
            return False

    def nodes(self) -> list[dict[str, Any]]:
        import ray

        return list(ray.nodes())

    def placement_group_table(self, placement_group: Any) -> dict[str, Any]:
        from ray.util import placement_group_table

        return dict(placement_group_table(placement_group))

    def __repr__(self) -> str:
        return "RayClusterView()"


_DEFAULT_VIEW = RayClusterView()


def default_cluster_view() -> ClusterView:
    """The view raylens uses when none is passed: the Ray this process is connected to."""
    return _DEFAULT_VIEW
