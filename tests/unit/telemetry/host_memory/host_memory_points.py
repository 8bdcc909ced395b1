"""Reading a host-memory series back by node, for the tests beside this module."""

from __future__ import annotations

from typing import Any

from raylens_fakes import MetricsProbe


def points_by_node(probe: MetricsProbe, name: str) -> dict[str, tuple[dict[str, Any], float]]:
    """A fresh collection of ``name`` as ``{node id: (attributes, value)}``, one point a node."""
    found: dict[str, tuple[dict[str, Any], float]] = {}
    for attributes, value in probe.points(name).items():
        attrs = dict(attributes)
        assert attrs["ray.node.id"] not in found, "two points for one node"
        found[attrs["ray.node.id"]] = (attrs, value)
    return found
