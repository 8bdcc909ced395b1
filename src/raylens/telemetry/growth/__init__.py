"""Memory over time: bounded history, growth judged at several scales, the kill line and the time to it.

:class:`MemoryHistory` is the front: record a node (and its groups) per reading, or replay a
recorded trace with ``record_node_many``; read a :class:`NodeGrowth`, draw its time to the
line from :func:`kill_line`. :class:`GrowthEstimator` is the judgement of one series.

Invariants: memory per series is bounded whatever the run's length; figures depend on the
samples only, never on when they are read; no clock is read here (times are the caller's).

What each private module does, the fit, the decision and the kill line:
``docs/architecture.md``, *Memory over time: telemetry/growth/*. The bounds and settings
this face leaves out (window limits, environment variable names, the series' buckets) are
importable from the module that defines them.
"""

from raylens.telemetry.growth._estimator import GrowthEstimator
from raylens.telemetry.growth._keeper import NodeGrowthKeeper, NodeReading
from raylens.telemetry.growth._limit import KillLineConfig, kill_line, resolve_kill_line_config
from raylens.telemetry.growth._recent import (
    HISTORY_S,
    MAX_POINTS_PER_SERIES,
    RecentHistory,
    recent_history,
)
from raylens.telemetry.growth._sampling import (
    DEFAULT_SAMPLE_INTERVAL_S,
    check_growth_window,
    growth_window_for_sampling,
    shortest_growth_window,
)
from raylens.telemetry.growth._settings import DEFAULT_GROWTH_WINDOW_S, GrowthSettings
from raylens.telemetry.growth._store import MemoryHistory, NodeGrowth, SeriesGrowth

__all__ = [
    "DEFAULT_GROWTH_WINDOW_S",
    "DEFAULT_SAMPLE_INTERVAL_S",
    "HISTORY_S",
    "MAX_POINTS_PER_SERIES",
    "GrowthEstimator",
    "GrowthSettings",
    "KillLineConfig",
    "MemoryHistory",
    "NodeGrowth",
    "NodeGrowthKeeper",
    "NodeReading",
    "RecentHistory",
    "SeriesGrowth",
    "check_growth_window",
    "growth_window_for_sampling",
    "kill_line",
    "recent_history",
    "resolve_kill_line_config",
    "shortest_growth_window",
]
