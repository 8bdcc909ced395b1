"""The scripted cluster view, kept importable here; it lives in :mod:`raylens.simulation.scripted_cluster`."""

from raylens.simulation.scripted_cluster import (
    PLACEMENT_GROUP_STATES,
    FakeCluster,
    FakePlacementGroup,
)

__all__ = ["PLACEMENT_GROUP_STATES", "FakeCluster", "FakePlacementGroup"]
