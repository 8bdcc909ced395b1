"""Physical bounds on what one node's payload says, applied before anything else uses it.

Any job on a cluster can publish series under raylens' names on any node's endpoint
(``ray.util.metrics`` names are free), so a figure read there is believed only when it
could be true of a machine: memory from 0 to the node's total (at most
:data:`MAX_NODE_MEMORY_BYTES`), a process count a whole number up to Linux's largest pid
(:data:`MAX_PROCESSES`), a kill counter a whole number up to :data:`MAX_KILL_COUNT`, a
growth rate no faster than the node's total per second, a PSS age from 0 to a week
(:data:`MAX_PSS_AGE_S`). What falls outside is refused
here, before it is rounded, recorded in a history, exported or printed: a memory figure
is left out (a group without its RSS is left out whole, as a group without an RSS figure
always is), the rest become unknown (None). Each refusal is named in :attr:`Bounded.refused`
so that the driver can warn once per node.

Pure and light, like :mod:`raylens.telemetry.raylet_payload`: the scrape helper applies it
where it parses, and imports neither lens nor OpenTelemetry through it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import NamedTuple

from raylens.telemetry.raylet_payload import (
    GROUP_LABEL,
    MACHINE_TOTAL_KEY,
    RAY_GROUP_GROWTH,
    RAY_GROUP_MEMORY,
    RAY_GROUP_PROCESSES,
    RAY_GROUP_PSS_AGE,
    RAY_NODE_OOM_KILLS,
    RAY_WORKER_EVICTIONS,
    SERIES_BY_RAY_NAME,
    TOTAL_KEY,
    NodeGroupFigures,
    NodeOomCounts,
)

__all__ = [
    "MAX_KILL_COUNT",
    "MAX_NODE_MEMORY_BYTES",
    "MAX_PROCESSES",
    "MAX_PSS_AGE_S",
    "MAX_REFUSALS_NAMED",
    "Bounded",
    "bound_payload",
    "node_total",
]

MAX_NODE_MEMORY_BYTES = float(2**50)
"""1 PiB: more memory than any one machine has; also far below an int64's range."""
MAX_PROCESSES = 4_194_304
"""Linux's largest possible pid (``PID_MAX_LIMIT`` on 64-bit kernels)."""
MAX_PSS_AGE_S = 7 * 86400.0
"""A week: far longer than any PSS interval a sampler is given; older ages are refused."""
MAX_KILL_COUNT = float(2**32)
"""More kills than a node can see in its life; kill counters above it are refused."""
MAX_REFUSALS_NAMED = 8
"""A payload's refusals are all counted, and this many are named."""

_KEY_BY_SERIES = {key: name for name, key in SERIES_BY_RAY_NAME.items()}


class Bounded(NamedTuple):
    """A payload's figures within bounds, and what was refused.

    ``refused`` names at most :data:`MAX_REFUSALS_NAMED` refused values (series, group,
    value, as plain text still to be escaped for display); ``refused_count`` counts all.
    """

    values: dict[str, float]
    groups: NodeGroupFigures | None
    oom: NodeOomCounts | None
    refused: tuple[str, ...] = ()
    refused_count: int = 0


class _Refusals:
    __slots__ = ("count", "named")

    def __init__(self) -> None:
        self.named: list[str] = []
        self.count = 0

    def add(self, series: str, value: float, group: str | None = None) -> None:
        self.count += 1
        if len(self.named) < MAX_REFUSALS_NAMED:
            where = "" if group is None else f"{{{GROUP_LABEL}={group[:80]!r}}}"
            self.named.append(f"{series}{where}={value:.6g}")


def _memory_ok(value: float, ceiling: float) -> bool:
    return math.isfinite(value) and 0.0 <= value <= ceiling


def _count_ok(value: float, ceiling: float) -> bool:
    return math.isfinite(value) and 0.0 <= value <= ceiling and value == int(value)


def node_total(values: Mapping[str, float]) -> float:
    """The node's memory as the payload says (the larger of Ray's and the machine's total,
    each already within bounds), else :data:`MAX_NODE_MEMORY_BYTES`."""
    totals = [values[key] for key in (TOTAL_KEY, MACHINE_TOTAL_KEY) if key in values]
    return max(totals) if totals else MAX_NODE_MEMORY_BYTES


def bound_payload(
    values: Mapping[str, float],
    groups: NodeGroupFigures | None,
    oom: NodeOomCounts | None,
) -> Bounded:
    """``values``, ``groups`` and ``oom`` of one payload within physical bounds (see the
    module docstring); the node's total is the one ``values`` carries."""
    refusals = _Refusals()
    kept: dict[str, float] = {}
    for key, value in values.items():
        if _memory_ok(value, MAX_NODE_MEMORY_BYTES):
            kept[key] = value
        else:
            refusals.add(_KEY_BY_SERIES.get(key, key), value)
    total = node_total(kept)
    bounded_groups = None if groups is None else _bound_groups(groups, total, refusals)
    bounded_oom = None if oom is None else _bound_oom(oom, refusals)
    return Bounded(kept, bounded_groups, bounded_oom, tuple(refusals.named), refusals.count)


def _bound_groups(figures: NodeGroupFigures, total: float, refusals: _Refusals) -> NodeGroupFigures:
    rows = []
    changed = False
    for row in figures.rows:
        name, rss, pss, processes, growth, pss_age = row
        fine = True
        if not _memory_ok(rss, total):
            refusals.add(f"{RAY_GROUP_MEMORY}[rss]", rss, name)
            changed = True
            continue  # no RSS figure: the group is left out, as one without it always is
        if pss is not None and not _memory_ok(pss, total):
            refusals.add(f"{RAY_GROUP_MEMORY}[pss]", pss, name)
            pss, pss_age, fine = None, None, False  # the age of a refused PSS says nothing
        if processes is not None and not _count_ok(processes, MAX_PROCESSES):
            refusals.add(RAY_GROUP_PROCESSES, processes, name)
            processes, fine = None, False
        if growth is not None and not (math.isfinite(growth) and abs(growth) <= total):
            refusals.add(RAY_GROUP_GROWTH, growth, name)
            growth, fine = None, False
        if pss_age is not None and not (0.0 <= pss_age <= MAX_PSS_AGE_S):
            refusals.add(RAY_GROUP_PSS_AGE, pss_age, name)
            pss_age, fine = None, False
        if fine:
            rows.append(row)
        else:
            rows.append((name, rss, pss, processes, growth, pss_age))
            changed = True
    if not changed:
        return figures
    return NodeGroupFigures.from_rows(figures.sampled_at, tuple(rows), figures.node)


def _bound_oom(oom: NodeOomCounts, refusals: _Refusals) -> NodeOomCounts | None:
    evictions, kernel = oom.ray_evictions, oom.kernel_oom_kills
    if evictions is not None and not _count_ok(evictions, MAX_KILL_COUNT):
        refusals.add(RAY_WORKER_EVICTIONS, evictions)
        evictions = None
    if kernel is not None and not _count_ok(kernel, MAX_KILL_COUNT):
        refusals.add(RAY_NODE_OOM_KILLS, kernel)
        kernel = None
    if evictions is None and kernel is None:
        return None
    if (evictions, kernel) == (oom.ray_evictions, oom.kernel_oom_kills):
        return oom
    return oom._replace(ray_evictions=evictions, kernel_oom_kills=kernel)
