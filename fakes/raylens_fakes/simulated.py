"""The simulated cluster, kept importable here; it lives in :mod:`raylens.simulation.simulated_cluster`."""

from raylens.simulation.simulated_cluster import (
    GroupSchedule,
    Schedule,
    SimulatedCluster,
    constant_schedule,
    ensure_open_file_limit,
)

__all__ = [
    "GroupSchedule",
    "Schedule",
    "SimulatedCluster",
    "constant_schedule",
    "ensure_open_file_limit",
]
