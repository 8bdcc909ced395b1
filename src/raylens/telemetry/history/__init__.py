"""Memory over time: bounded history, growth judged at several scales, the kill line and the time to it.

:class:`MemoryHistory` is the front: record a node (and its groups) per reading, or replay a
recorded trace with ``record_node_many``; read a :class:`NodeGrowth`, draw its time to the
line from :func:`kill_line`. :class:`GrowthEstimator` is the judgement of one series.

Invariants: memory per series is bounded whatever the run's length; figures depend on the
samples only, never on when they are read; no clock is read here (times are the caller's).

What each private module does, the fit, the decision and the kill line:
``docs/architecture.md``, *Memory over time: telemetry/history/*.
"""

from raylens.telemetry.history._estimator import GrowthEstimator, ScaleReading
from raylens.telemetry.history._keeper import (
    MAX_DEPARTED_GROUPS,
    NODE_KEY,
    NodeGrowthKeeper,
    NodeReading,
)
from raylens.telemetry.history._limit import (
    DEFAULT_MEMORY_USAGE_THRESHOLD,
    RAY_THRESHOLD_ENV,
    THRESHOLD_ENV,
    KillLineConfig,
    kill_line,
    resolve_kill_line_config,
    time_to_limit,
)
from raylens.telemetry.history._recent import (
    HISTORY_S,
    MAX_POINTS_PER_SERIES,
    RecentHistory,
    recent_history,
)
from raylens.telemetry.history._sampling import (
    DEFAULT_SAMPLE_INTERVAL_S,
    READINGS_PER_WINDOW,
    check_growth_window,
    growth_window_for_sampling,
    shortest_growth_window,
)
from raylens.telemetry.history._series import Bucket, SeriesBuffer
from raylens.telemetry.history._settings import (
    DEFAULT_GROWTH_WINDOW_S,
    DEFAULT_HORIZON_S,
    DEFAULT_LEVELS,
    GROWTH_WINDOW_ENV,
    MAX_GROWTH_WINDOW_S,
    MIN_GROWTH_WINDOW_S,
    SLICES_PER_WINDOW,
    GrowthSettings,
    growth_window_from_env,
)
from raylens.telemetry.history._store import (
    MAX_GROUPS_PER_NODE,
    Key,
    MemoryHistory,
    NodeGrowth,
    SeriesGrowth,
)

__all__ = [
    "DEFAULT_GROWTH_WINDOW_S",
    "DEFAULT_HORIZON_S",
    "DEFAULT_LEVELS",
    "DEFAULT_MEMORY_USAGE_THRESHOLD",
    "DEFAULT_SAMPLE_INTERVAL_S",
    "GROWTH_WINDOW_ENV",
    "HISTORY_S",
    "MAX_DEPARTED_GROUPS",
    "MAX_GROUPS_PER_NODE",
    "MAX_GROWTH_WINDOW_S",
    "MAX_POINTS_PER_SERIES",
    "MIN_GROWTH_WINDOW_S",
    "NODE_KEY",
    "RAY_THRESHOLD_ENV",
    "READINGS_PER_WINDOW",
    "SLICES_PER_WINDOW",
    "THRESHOLD_ENV",
    "Bucket",
    "GrowthEstimator",
    "GrowthSettings",
    "Key",
    "KillLineConfig",
    "MemoryHistory",
    "NodeGrowth",
    "NodeGrowthKeeper",
    "NodeReading",
    "RecentHistory",
    "ScaleReading",
    "SeriesBuffer",
    "SeriesGrowth",
    "check_growth_window",
    "growth_window_for_sampling",
    "growth_window_from_env",
    "kill_line",
    "recent_history",
    "resolve_kill_line_config",
    "shortest_growth_window",
    "time_to_limit",
]
