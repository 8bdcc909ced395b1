"""How a batch's outcomes cross from the helper to the driver: one flat tuple per node.

The driver's thread is the one a whole job waits on, so what it receives is shaped for
the cheapest decoding there: plain values in exact tuples (no class to call per node
while unpickling, and nothing the garbage collector keeps walking once a cycle is over),
decoded in one pass straight into the :class:`~raylens.telemetry.scraping.Outcome` the
monitor publishes. A row is::

    (index, values, error, wedged, asked, elapsed, error_type, duration, groups, oom)

- ``index`` is the node's position in the batch the driver sent: the driver holds the
  key already, so it is not sent back;
- ``groups`` is None (the payload carried no sampler's series), :data:`GROUPS_UNCHANGED`
  (the driver holds figures with this very ``sampled_at``:
  :func:`~raylens.telemetry.scraping.leave_out_known_groups`), or
  ``(sampled_at, group, rss, pss, processes, growth, group, rss, ...)``;
- ``oom`` is None or ``(ray_evictions, kernel_oom_kills)``.

The helper is the driver's own child, so a row is trusted like the driver's memory; one
that does not have this shape is still refused whole (:class:`MalformedRows`), never
half used.
"""

from __future__ import annotations

import operator
from collections.abc import Container, Hashable, Mapping, MutableMapping, Sequence
from itertools import chain
from typing import Any

from raylens.telemetry.raylet_payload import GroupFigure, NodeGroupFigures, NodeOomCounts
from raylens.telemetry.scraping._engine import Job, Outcome

__all__ = ["GROUPS_UNCHANGED", "MalformedRows", "Row", "decode_outcomes", "encode_outcomes"]

#: A row's ``groups`` when the driver already holds the node's figures.
GROUPS_UNCHANGED = True
#: One row per node; see the module docstring.
Row = tuple[Any, ...]
_ROW_WIDTH = 10
_FIGURE_WIDTH = len(GroupFigure._fields)
_OOM_WIDTH = len(NodeOomCounts._fields)


class MalformedRows(ValueError):
    """A result whose rows do not have the shape this module writes."""


def _flat_groups(figures: NodeGroupFigures) -> tuple[Any, ...]:
    return (figures.sampled_at, *chain.from_iterable(figures.groups))


def encode_outcomes(
    jobs: Sequence[Job], results: Mapping[Hashable, Outcome], unchanged: Container[Hashable]
) -> list[Row]:
    """The rows of ``results`` (keys of ``jobs``); keys in ``unchanged`` send no figures.

    A key that is not one of ``jobs`` is left out: the driver could not place it.
    """
    index = {job[0]: position for position, job in enumerate(jobs)}
    rows: list[Row] = []
    for key, outcome in results.items():
        position = index.get(key)
        if position is None:
            continue
        values, error, wedged, asked, elapsed, error_type, duration, groups, oom = outcome
        if key in unchanged:
            flat: object = GROUPS_UNCHANGED
        else:
            flat = None if groups is None else _flat_groups(groups)
        rows.append(
            (
                position,
                values,
                error,
                wedged,
                asked,
                elapsed,
                error_type,
                duration,
                flat,
                None if oom is None else tuple(oom),
            )
        )
    return rows


def _figures(flat: tuple[Any, ...], before: NodeGroupFigures | None) -> NodeGroupFigures:
    """The figures ``flat`` describes; a group's figure equal to ``before``'s is that object.

    Sharing what did not change keeps a new reading from leaving a new object per group
    for the collector to walk until the reading is replaced.
    """
    if type(flat) is not tuple:
        raise MalformedRows(f"group figures sent as a {type(flat).__name__}, not a tuple")
    count, rest = divmod(len(flat) - 1, _FIGURE_WIDTH)
    if rest or count < 0:
        raise MalformedRows(
            f"group figures of {len(flat)} items, not 1 + {_FIGURE_WIDTH} per group"
        )
    held = before.groups if before is not None else ()
    new = tuple.__new__
    figures = []
    for number in range(count):
        start = 1 + number * _FIGURE_WIDTH
        figure = flat[start : start + _FIGURE_WIDTH]
        if number < len(held) and held[number] == figure:
            figures.append(held[number])
        else:
            figures.append(new(GroupFigure, figure))
    shared = tuple(figures)
    if len(held) == count and all(map(operator.is_, held, shared)):
        shared = held
    return new(NodeGroupFigures, (flat[0], shared))


def decode_outcomes(
    rows: Sequence[Row],
    keys: Sequence[Hashable],
    offset: float,
    held: MutableMapping[Hashable, NodeGroupFigures],
) -> dict[Hashable, Outcome]:
    """``{key: Outcome}`` of ``rows``, ``keys`` being the batch's keys in the order sent.

    ``offset`` is added to each ``elapsed``. ``held`` is the figures the driver holds
    per key, updated here: figures that came are kept, a node whose payload carried
    none is forgotten, and :data:`GROUPS_UNCHANGED` takes what is held (None when
    nothing is).

    Raises:
        MalformedRows: a row is not shaped as :func:`encode_outcomes` writes it.
    """
    new = tuple.__new__
    outcomes: dict[Hashable, Outcome] = {}
    try:
        for row in rows:
            if type(row) is not tuple or len(row) != _ROW_WIDTH:
                raise MalformedRows(f"a row of {type(row).__name__}, not a {_ROW_WIDTH}-tuple")
            position, values, error, wedged, asked, elapsed, error_type, duration, flat, oom = row
            if type(position) is not int or position < 0:
                raise MalformedRows(f"row index {position!r} is not a position in the batch")
            key = keys[position]
            if flat is None:
                groups = None
                held.pop(key, None)
            elif flat is GROUPS_UNCHANGED:
                groups = held.get(key)
            else:
                groups = held[key] = _figures(flat, held.get(key))
            if oom is not None:
                if type(oom) is not tuple or len(oom) != _OOM_WIDTH:
                    raise MalformedRows(f"kill counters sent as {oom!r:.80}")
                oom = new(NodeOomCounts, oom)
            outcomes[key] = new(
                Outcome,
                (values, error, wedged, asked, elapsed + offset, error_type, duration, groups, oom),
            )
    except (TypeError, IndexError) as exc:
        raise MalformedRows(f"a result row could not be read: {exc}") from exc
    return outcomes
