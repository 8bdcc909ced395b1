"""Turning one cycle's answers into per-node figures, in the shapes direct scraping gives.

A node is a scrape target (``instance``). Its group and node figures come from its
freshest sampler only (the queries keep the ``WorkerId`` with the latest stamp), as
:func:`~raylens.telemetry.raylet_payload.parse_group_samples` does on a payload. At
most ``max_nodes`` nodes and :data:`MAX_GROUPS_PER_NODE` groups per node are kept.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
from collections.abc import Iterator, Mapping
from typing import Any

from raylens.telemetry.prometheus_source._client import Answer
from raylens.telemetry.prometheus_source._queries import (
    GROUP_KINDS,
    INSTANCE_LABEL,
    KIND_LABEL,
    NODE_KINDS,
    Query,
)
from raylens.telemetry.prometheus_source._response import QueryError, parse_vector
from raylens.telemetry.raylet_payload import (
    GROUP_LABEL,
    MAX_EVICTION_NAME_CHARS,
    MAX_EVICTION_NAMES,
    MAX_GROUPS_PER_NODE,
    SAMPLER_LABEL,
    STARTED_BY_LABEL,
    FigureRow,
    NodeFigures,
    NodeGroupFigures,
    NodeOomCounts,
)

__all__ = ["CycleFigures", "NodeFound", "assemble", "collector_paused"]

#: The labels read from each query's series, in order.
KEYS: dict[Query, tuple[str, ...]] = {
    Query.DOWN: (INSTANCE_LABEL,),
    Query.FRESH: (INSTANCE_LABEL,),
    Query.NODE_USED: (INSTANCE_LABEL, "ip"),
    Query.NODE_TOTAL: (INSTANCE_LABEL,),
    Query.SAMPLED_AT: (INSTANCE_LABEL,),
    Query.GROUPS: (INSTANCE_LABEL, GROUP_LABEL, KIND_LABEL),
    Query.GROUP_PSS: (INSTANCE_LABEL, GROUP_LABEL),
    Query.NODE_FIGURES: (INSTANCE_LABEL, KIND_LABEL),
    Query.GROWING: (INSTANCE_LABEL,),
    Query.WINDOW: (INSTANCE_LABEL, SAMPLER_LABEL, STARTED_BY_LABEL),
    Query.EVICTIONS: (INSTANCE_LABEL, "Name"),
    Query.KERNEL_KILLS: (INSTANCE_LABEL,),
}
QUERIES = tuple(KEYS)
_NODE_INDEX = {kind: index for index, kind in enumerate(NODE_KINDS)}
# Where each group figure goes in a FigureRow: (group, rss, pss, processes, growth, pss age).
_SLOT = dict(zip(GROUP_KINDS, (1, 3, 4, 5)))
_PSS_SLOT = 2


@dataclasses.dataclass
class NodeFound:
    """What one cycle's answers say about one target."""

    instance: str
    ip: str = ""
    used: float | None = None
    total: float | None = None
    #: Unix time of the node's latest raylet sample (``timestamp()``), None without one.
    fresh_at: float | None = None
    #: True when Prometheus says it cannot scrape the target (``up`` 0).
    down: bool = False
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
) -> tuple[dict[Query, list[tuple[Any, ...]]], float | None, dict[Query, str], int]:
    found: dict[Query, list[tuple[Any, ...]]] = {}
    errors: dict[Query, str] = {}
    dropped = 0
    evaluated_at: float | None = None
    for query in QUERIES:
        answer = answers.get(query)
        if answer is None or answer.body is None:
            errors[query] = "not asked" if answer is None else str(answer.error)
            continue
        try:
            vector = parse_vector(answer.body, KEYS[query], max_series=max_series)
        except QueryError as error:
            errors[query] = str(error)
            continue
        found[query] = vector.rows
        dropped += vector.dropped
        if vector.evaluated_at is not None:
            evaluated_at = vector.evaluated_at
    return found, evaluated_at, errors, dropped


def assemble(
    answers: Mapping[Query, Answer],
    *,
    max_series: int,
    max_nodes: int,
    known: frozenset[str] | set[str] = frozenset(),
) -> CycleFigures:
    """The figures of every node the answers name (at most ``max_nodes``, by instance).

    A node is a target with node memory series, or one of ``known`` (nodes seen before)
    that Prometheus lists as down: a node whose scrapes now fail has no series left, and
    is still reported, as failing.
    """
    with collector_paused():
        return _assemble(answers, max_series, max_nodes, known)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Keep the cyclic garbage collector out while a cycle's answers are read.

    Reading 10,000 nodes builds some 200,000 short-lived dicts and tuples, none of them in a
    cycle: left on, the collector would walk the whole heap several times for them, which
    doubles the cost of the read. It is restored as it was, also on an error.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _assemble(
    answers: Mapping[Query, Answer],
    max_series: int,
    max_nodes: int,
    known: frozenset[str] | set[str],
) -> CycleFigures:
    rows, evaluated_at, errors, dropped = _rows(answers, max_series)
    nodes: dict[str, NodeFound] = {}
    for instance, ip, value in rows.get(Query.NODE_USED, ()):
        if instance and len(nodes) < max_nodes:
            found = nodes.get(instance)
            if found is None:
                found = nodes[instance] = NodeFound(instance)
            found.used, found.ip = value, ip
    for instance, _value in rows.get(Query.DOWN, ()):
        found = nodes.get(instance)
        if found is None and instance in known and len(nodes) < max_nodes:
            found = nodes[instance] = NodeFound(instance)
        if found is not None:
            found.down = True
    for instance, value in rows.get(Query.FRESH, ()):
        found = nodes.get(instance)
        if found is not None:
            found.fresh_at = value
    for instance, value in rows.get(Query.NODE_TOTAL, ()):
        found = nodes.get(instance)
        if found is not None:
            found.total = value
    _groups(rows, nodes)
    _kills(rows, nodes)
    return CycleFigures(nodes, evaluated_at, errors, dropped)


def _groups(rows: dict[Query, list[tuple[Any, ...]]], nodes: dict[str, NodeFound]) -> None:
    stamps = {
        instance: value for instance, value in rows.get(Query.SAMPLED_AT, ()) if instance in nodes
    }
    figures: dict[str, dict[str, list[Any]]] = {}

    def put(instance: str, group: str, slot: int, value: float) -> None:
        by_group = figures.get(instance)
        if by_group is None:
            by_group = figures[instance] = {}
        row = by_group.get(group)
        if row is None:
            row = by_group[group] = [group, None, None, None, None, None]
        row[slot] = value

    for instance, group, kind, value in rows.get(Query.GROUPS, ()):
        slot = _SLOT.get(kind)
        if slot is not None and instance in stamps:
            put(instance, group, slot, value)
    for instance, group, value in rows.get(Query.GROUP_PSS, ()):
        if instance in stamps:
            put(instance, group, _PSS_SLOT, value)
    node_values: dict[str, list[float | None]] = {}
    for instance, kind, value in rows.get(Query.NODE_FIGURES, ()):
        index = _NODE_INDEX.get(kind)
        if index is not None and instance in stamps:
            held = node_values.get(instance)
            if held is None:
                held = node_values[instance] = [None] * len(_NODE_INDEX)
            held[index] = value
    growing = {instance for instance, _value in rows.get(Query.GROWING, ())}
    identity = {
        instance: (sampler, started_by, window)
        for instance, sampler, started_by, window in rows.get(Query.WINDOW, ())
    }
    nothing: dict[str, list[Any]] = {}
    for instance, stamp in stamps.items():
        by_group = figures.get(instance, nothing)
        group_rows: tuple[FigureRow, ...] = tuple(
            [
                (name, row[1], row[2], row[3], row[4], None if row[2] is None else row[5])
                for name, row in sorted(by_group.items())[:MAX_GROUPS_PER_NODE]
                if row[1] is not None
            ]
        )
        node_figures = None
        held_identity = identity.get(instance)
        if held_identity is not None:
            used, rate, outside, limit, left = node_values.get(instance) or [None] * 5
            sampler, started_by, window = held_identity
            node_figures = NodeFigures(
                used, rate, outside, instance in growing, limit, left, window, sampler, started_by
            )
        nodes[instance].groups = NodeGroupFigures.from_rows(stamp, group_rows, node_figures)


def _kills(rows: dict[Query, list[tuple[Any, ...]]], nodes: dict[str, NodeFound]) -> None:
    evictions: dict[str, dict[str, float]] = {}
    for instance, name, value in rows.get(Query.EVICTIONS, ()):
        if instance in nodes:
            by_name = evictions.setdefault(instance, {})
            key = name[:MAX_EVICTION_NAME_CHARS]
            by_name[key] = by_name.get(key, 0.0) + value
    kernel = {
        instance: value for instance, value in rows.get(Query.KERNEL_KILLS, ()) if instance in nodes
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
