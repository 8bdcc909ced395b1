"""Memory over time: bounded history, a robust growth rate, the kill line and the time to it.

The pieces, each in its own module:

* :mod:`._settings` - :class:`GrowthSettings` and ``RAYLENS_GROWTH_WINDOW``.
* :mod:`._series` - :class:`SeriesBuffer`: one series, its last window at full resolution
  and older samples in min/max/mean buckets up to a horizon.
* :mod:`._estimator` - :func:`fit_growth`: the slope of one window, following the floor
  memory returns to after each release, across phase steps and spikes.
* :mod:`._change_point` - the rate since the point in a window where growth started,
  which one slope through the whole window reads low.
* :mod:`._split_steps` - phase steps a spike split, which one-sample cuts miss.
* :mod:`._decision` - :class:`GrowthTracker`: the figure and the *growing* decision, with
  hysteresis, from successive fits.
* :mod:`._limit` - :func:`kill_line`, :func:`time_to_limit` and where Ray's
  ``memory_usage_threshold`` is learnt (:func:`resolve_kill_line_config`).
* :mod:`._store` - :class:`MemoryHistory`: all of it for every node and worker group.

A monitor uses it as::

    history = MemoryHistory(GrowthSettings.from_env())
    history.record_node(node_id, t, used, groups={"policy": 3.1e9, "rollout": 2.0e9})
    view = history.node(node_id)           # NodeGrowth: growth, growing, groups, fastest_group
    line = resolve_kill_line_config(system_config=...).limit(host_total, cgroup_total)
    seconds = view.time_to_limit(line)     # None unless growing
"""

from raylens.telemetry.history._decision import GrowthTracker
from raylens.telemetry.history._estimator import Fit, fit_growth
from raylens.telemetry.history._limit import (
    DEFAULT_MEMORY_USAGE_THRESHOLD,
    RAY_THRESHOLD_ENV,
    THRESHOLD_ENV,
    KillLineConfig,
    kill_line,
    resolve_kill_line_config,
    time_to_limit,
)
from raylens.telemetry.history._series import Bucket, SeriesBuffer
from raylens.telemetry.history._settings import (
    DEFAULT_GROWTH_WINDOW_S,
    DEFAULT_HORIZON_S,
    DEFAULT_STEP_BYTES,
    GROWTH_WINDOW_ENV,
    MAX_GROWTH_WINDOW_S,
    MIN_GROWTH_WINDOW_S,
    GrowthSettings,
    growth_window_from_env,
)
from raylens.telemetry.history._store import Key, MemoryHistory, NodeGrowth, SeriesGrowth

__all__ = [
    "DEFAULT_GROWTH_WINDOW_S",
    "DEFAULT_HORIZON_S",
    "DEFAULT_MEMORY_USAGE_THRESHOLD",
    "DEFAULT_STEP_BYTES",
    "GROWTH_WINDOW_ENV",
    "MAX_GROWTH_WINDOW_S",
    "MIN_GROWTH_WINDOW_S",
    "RAY_THRESHOLD_ENV",
    "THRESHOLD_ENV",
    "Bucket",
    "Fit",
    "GrowthSettings",
    "GrowthTracker",
    "Key",
    "KillLineConfig",
    "MemoryHistory",
    "NodeGrowth",
    "SeriesBuffer",
    "SeriesGrowth",
    "fit_growth",
    "growth_window_from_env",
    "kill_line",
    "resolve_kill_line_config",
    "time_to_limit",
]
