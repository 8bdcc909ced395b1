"""A node's recent memory, as a post-mortem shows it: read from a history, as plain data.

Plain lists and dicts only, so the extract crosses from a node's sampler (where the node's
history lives) to the driver as it is, in one Ray call. Times are seconds before the
moment asked about; group names are as recorded (whoever prints them makes them safe).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypedDict

from raylens.telemetry.growth._store import Key, MemoryHistory

__all__ = ["HISTORY_S", "MAX_POINTS_PER_SERIES", "RecentHistory", "recent_history"]

#: How far back the extract reaches.
HISTORY_S = 600.0
#: Most points one series contributes (a longer window is thinned evenly).
MAX_POINTS_PER_SERIES = 600


class RecentHistory(TypedDict):
    """Per series: ``{"samples": [[s, bytes], ...], "buckets": [[start, end, min, mean, max], ...]}``."""

    node_used: dict[str, Any] | None
    worker_groups: dict[str, dict[str, Any]]
    outside_groups: dict[str, Any] | None


def _thinned(times: Sequence[float], values: Sequence[float]) -> list[list[float]]:
    count = len(times)
    step = max(1, -(-count // MAX_POINTS_PER_SERIES))
    return [[round(times[i], 3), round(values[i])] for i in range(0, count, step)]


def _series(history: MemoryHistory, key: Key, at: float, until: float) -> dict[str, Any] | None:
    """One key's last :data:`HISTORY_S` seconds: samples as ``[seconds before at, bytes]``.

    Older samples the history has folded into buckets come as ``[start, end, min, mean,
    max]`` (seconds before ``at``), so a short growth window still shows ten minutes.
    Samples up to ``until`` are kept.
    """
    since = at - HISTORY_S
    times, values = history.window(key)
    keep = [i for i, t in enumerate(times.tolist()) if since <= t <= until]
    samples = _thinned([float(times[i]) - at for i in keep], [float(values[i]) for i in keep])
    first_sample = float(times[keep[0]]) if keep else at
    buckets = [
        [
            round(b.start - at, 3),
            round(min(b.start + b.width, first_sample) - at, 3),
            round(b.minimum),
            round(b.mean),
            round(b.maximum),
        ]
        for b in history.buckets(key)
        if b.start + b.width > since and b.start < first_sample
    ]
    if not samples and not buckets:
        return None
    return {"samples": samples, "buckets": buckets[-MAX_POINTS_PER_SERIES:]}


def recent_history(
    history: MemoryHistory, node_id: str, at: float, *, late_by: float = 0.0
) -> RecentHistory:
    """``node_id``'s used memory, each group's and the rest's over :data:`HISTORY_S` before ``at``.

    ``late_by`` also keeps samples stamped up to that many seconds after ``at``, for a
    caller whose clock may run a little behind the history's.
    """
    until = at + late_by
    names = sorted(
        key[1]
        for key in history.keys()  # noqa: SIM118 (a MemoryHistory, not a dict)
        if isinstance(key, tuple) and key[0] == node_id and key[1] is not None
    )
    groups: dict[str, dict[str, Any]] = {}
    for name in names:
        series = _series(history, (node_id, name), at, until)
        if series is not None:
            groups[name] = series
    return {
        "node_used": _series(history, node_id, at, until),
        "worker_groups": groups,
        "outside_groups": _series(history, (node_id, None), at, until),
    }
