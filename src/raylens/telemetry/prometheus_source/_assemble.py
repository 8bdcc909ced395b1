"""Turning one cycle's answers into per-node figures, in the shapes direct scraping gives.

A node is a scrape target (``instance``). Its group and node figures come from its
freshest sampler only (the ``WorkerId`` with the latest stamp), as
:func:`~raylens.telemetry.raylet_payload.parse_group_samples` does on a payload. At
most ``max_nodes`` nodes and :data:`MAX_GROUPS_PER_NODE` groups per node are kept.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from raylens.telemetry.prometheus_source._client import Answer
from raylens.telemetry.prometheus_source._queries import INSTANCE_LABEL, Query
from raylens.telemetry.prometheus_source._response import QueryError, Row, parse_vector
from raylens.telemetry.raylet_payload import (
    GROUP_LABEL,
    MAX_EVICTION_NAME_CHARS,
    MAX_EVICTION_NAMES,
    MAX_GROUPS_PER_NODE,
    MEMORY_TYPE_LABEL,
    NODE_SERIES,
    RAY_WORKER_ID_LABEL,
    SAMPLER_LABEL,
    STARTED_BY_LABEL,
    FigureRow,
    NodeFigures,
    NodeGroupFigures,
    NodeOomCounts,
)

__all__ = ["CycleFigures", "NodeFound", "assemble"]

#: The labels read from each query's series, in order.
KEYS: dict[Query, tuple[str, ...]] = {
    Query.UP: (INSTANCE_LABEL,),
    Query.FRESH: (INSTANCE_LABEL,),
    Query.NODE_USED: (INSTANCE_LABEL, "ip"),
    Query.NODE_TOTAL: (INSTANCE_LABEL,),
    Query.SAMPLED_AT: (INSTANCE_LABEL, RAY_WORKER_ID_LABEL),
    Query.GROUP_MEMORY: (INSTANCE_LABEL, RAY_WORKER_ID_LABEL, GROUP_LABEL, MEMORY_TYPE_LABEL),
    Query.GROUP_PROCESSES: (INSTANCE_LABEL, RAY_WORKER_ID_LABEL, GROUP_LABEL),
    Query.GROUP_GROWTH: (INSTANCE_LABEL, RAY_WORKER_ID_LABEL, GROUP_LABEL),
    Query.NODE_FIGURES: (INSTANCE_LABEL, RAY_WORKER_ID_LABEL, "__name__"),
    Query.WINDOW: (INSTANCE_LABEL, RAY_WORKER_ID_LABEL, SAMPLER_LABEL, STARTED_BY_LABEL),
    Query.EVICTIONS: (INSTANCE_LABEL, "Name"),
    Query.KERNEL_KILLS: (INSTANCE_LABEL,),
}
QUERIES = tuple(KEYS)
_NODE_INDEX = {name: index for index, name in enumerate(NODE_SERIES[:-1])}


@dataclasses.dataclass
class NodeFound:
    """What one cycle's answers say about one target."""

    instance: str
    ip: str = ""
    used: float | None = None
    total: float | None = None
    #: Unix time of the node's latest raylet sample (``timestamp()``), None without one.
    fresh_at: float | None = None
    #: ``up`` for the target: 1, 0, or None when Prometheus lists no such target.
    up: float | None = None
    groups: NodeGroupFigures | None = None
    oom: NodeOomCounts | None = None


@dataclasses.dataclass
class CycleFigures:
    """Every node found, when Prometheus evaluated the queries, and what went wrong."""

    nodes: dict[str, NodeFound]
    #: The evaluation time of the answers (Unix seconds), None when none came back.
    evaluated_at: float | None
    #: Per failed query, a printable line why.
    errors: dict[Query, str]
    #: Series dropped (unusable values, past the caps).
    dropped: int = 0


def _rows(
    answers: Mapping[Query, Answer], max_series: int
) -> tuple[dict[Query, list[Row]], dict[Query, str], int]:
    found: dict[Query, list[Row]] = {}
    errors: dict[Query, str] = {}
    dropped = 0
    for query in QUERIES:
        answer = answers.get(query)
        if answer is None or answer.body is None:
            errors[query] = "not asked" if answer is None else str(answer.error)
            continue
        try:
            rows, lost = parse_vector(answer.body, KEYS[query], max_series=max_series)
        except QueryError as error:
            errors[query] = str(error)
            continue
        found[query] = rows
        dropped += lost
    return found, errors, dropped


def assemble(
    answers: Mapping[Query, Answer],
    *,
    max_series: int,
    max_nodes: int,
    known: frozenset[str] | set[str] = frozenset(),
) -> CycleFigures:
    """The figures of every node the answers name (at most ``max_nodes``, by instance).

    A node is a target with node memory series, or one of ``known`` (nodes seen before)
    that Prometheus still lists in ``up``: a node whose scrapes now fail has no series
    left, and is still reported, as failing.
    """
    rows, errors, dropped = _rows(answers, max_series)
    nodes: dict[str, NodeFound] = {}
    evaluated_at: float | None = None

    def node(instance: str) -> NodeFound | None:
        found = nodes.get(instance)
        if found is None and instance and len(nodes) < max_nodes:
            found = nodes[instance] = NodeFound(instance)
        return found

    for labels, value, at in rows.get(Query.NODE_USED, ()):
        evaluated_at = at
        found = node(labels[0])
        if found is not None:
            found.used, found.ip = value, labels[1]
    for labels, value, at in rows.get(Query.UP, ()):
        evaluated_at = at
        found = node(labels[0]) if labels[0] in known else nodes.get(labels[0])
        if found is not None:
            found.up = value
    for labels, value, _at in rows.get(Query.FRESH, ()):
        found = nodes.get(labels[0])
        if found is not None:
            found.fresh_at = value
    for labels, value, _at in rows.get(Query.NODE_TOTAL, ()):
        found = nodes.get(labels[0])
        if found is not None:
            found.total = value
    _groups(rows, nodes)
    _kills(rows, nodes)
    return CycleFigures(nodes, evaluated_at, errors, dropped)


def _freshest(
    rows: dict[Query, list[Row]], nodes: dict[str, NodeFound]
) -> dict[str, tuple[str, float]]:
    """Per node, its freshest sampler's worker id and stamp."""
    freshest: dict[str, tuple[str, float]] = {}
    for (instance, worker), value, _at in rows.get(Query.SAMPLED_AT, ()):
        if instance in nodes:
            held = freshest.get(instance)
            if held is None or value > held[1]:
                freshest[instance] = (worker, value)
    return freshest


def _groups(rows: dict[Query, list[Row]], nodes: dict[str, NodeFound]) -> None:
    freshest = _freshest(rows, nodes)
    rss: dict[str, dict[str, float]] = {}
    pss: dict[str, dict[str, float]] = {}
    processes: dict[str, dict[str, float]] = {}
    growth: dict[str, dict[str, float]] = {}
    figures: dict[str, list[float | None]] = {}
    identity: dict[str, tuple[str, str, float]] = {}

    def ours(instance: str, worker: str) -> bool:
        held = freshest.get(instance)
        return held is not None and held[0] == worker

    for (instance, worker, group, kind), value, _at in rows.get(Query.GROUP_MEMORY, ()):
        if ours(instance, worker):
            (rss if kind == "rss" else pss if kind == "pss" else {}).setdefault(instance, {})[
                group
            ] = value
    for target, query in ((processes, Query.GROUP_PROCESSES), (growth, Query.GROUP_GROWTH)):
        for (instance, worker, group), value, _at in rows.get(query, ()):
            if ours(instance, worker):
                target.setdefault(instance, {})[group] = value
    for (instance, worker, name), value, _at in rows.get(Query.NODE_FIGURES, ()):
        index = _NODE_INDEX.get(name)
        if index is not None and ours(instance, worker):
            figures.setdefault(instance, [None] * len(_NODE_INDEX))[index] = value
    for (instance, worker, sampler, started_by), value, _at in rows.get(Query.WINDOW, ()):
        if ours(instance, worker):
            identity[instance] = (sampler, started_by, value)
    for instance, (_worker, stamp) in freshest.items():
        by_group = rss.get(instance, {})
        group_rows: tuple[FigureRow, ...] = tuple(
            [
                (
                    name,
                    by_group[name],
                    pss.get(instance, {}).get(name),
                    processes.get(instance, {}).get(name),
                    growth.get(instance, {}).get(name),
                )
                for name in sorted(by_group)[:MAX_GROUPS_PER_NODE]
            ]
        )
        node_figures = None
        held = identity.get(instance)
        if held is not None:
            used, rate, outside, growing, limit, left = figures.get(
                instance, [None] * len(_NODE_INDEX)
            )
            node_figures = NodeFigures(
                used, rate, outside, bool(growing), limit, left, held[2], held[0], held[1]
            )
        nodes[instance].groups = NodeGroupFigures.from_rows(stamp, group_rows, node_figures)


def _kills(rows: dict[Query, list[Row]], nodes: dict[str, NodeFound]) -> None:
    evictions: dict[str, dict[str, float]] = {}
    for (instance, name), value, _at in rows.get(Query.EVICTIONS, ()):
        if instance in nodes:
            by_name = evictions.setdefault(instance, {})
            key = name[:MAX_EVICTION_NAME_CHARS]
            by_name[key] = by_name.get(key, 0.0) + value
    kernel = {
        instance: value
        for (instance,), value, _at in rows.get(Query.KERNEL_KILLS, ())
        if instance in nodes
    }
    for instance in evictions.keys() | kernel.keys():
        counted = evictions.get(instance)
        names = sorted(counted.items()) if counted else []
        if len(names) > MAX_EVICTION_NAMES:
            kept = [item for item in names if item[0]][: MAX_EVICTION_NAMES - 1]
            rest = sum(value for _name, value in names) - sum(value for _n, value in kept)
            names = [("", rest), *kept]
        nodes[instance].oom = NodeOomCounts(
            None if counted is None else sum(counted.values()), kernel.get(instance), tuple(names)
        )
