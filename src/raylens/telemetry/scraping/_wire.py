"""The messages on the helper's socket, and how a batch's outcomes cross it: a flat tuple per node.

Four messages, each a plain tuple whose first item names it; :data:`MESSAGE_FIELDS` names
every item, in order, and the builders below are the only places either end makes one:

- :func:`scrape_message`, driver to helper: ``("scrape", batch, jobs, deadline, known)``,
  the jobs ``(key, url, wedged)``, the deadline on the monotonic clock the two processes
  share, and ``known``, ``{key: sampled_at}`` of the group figures the driver holds;
- :func:`trust_message`, driver to helper: ``("trust", ids)``, the sampler ids whose series
  to believe from then on (None: any), sent before the first batch and after a restart;
- :data:`READY_MESSAGE`, helper to driver, once: ``("ready", version)``, the
  :data:`WIRE_VERSION` the helper speaks (a driver meeting another one replaces the helper);
- :func:`result_message`, helper to driver, per batch: ``("result", batch, rows)``.

The driver's thread is the one a whole job waits on, so what it receives is shaped for
the cheapest decoding there: plain values in exact tuples (no class to call per node
while unpickling, and nothing the garbage collector keeps walking once a cycle is over),
decoded in one pass straight into the :class:`~raylens.telemetry.scraping.Outcome` the
monitor publishes. A row is::

    (index, values, error, wedged, asked, elapsed, error_type, duration, groups, oom, refused)

- ``index`` is the node's position in the batch the driver sent: the driver holds the
  key already, so it is not sent back;
- ``groups`` is None (the payload carried no sampler's series), :data:`GROUPS_UNCHANGED`
  (the driver holds figures with this very ``sampled_at``:
  :func:`~raylens.telemetry.scraping.leave_out_known_groups`), or
  ``(sampled_at, node, (group, rss, pss, processes, growth, pss age), ...)``: the node's own
  figures (a :class:`~raylens.telemetry.raylet_payload.NodeFigures`, or None), then a
  plain tuple per group;
- ``oom`` is None or ``(ray_evictions, kernel_oom_kills, ray_victims)``, the last a
  tuple of ``(name, count)`` pairs;
- ``refused`` is None or ``(count, (named value, ...))``: what the helper refused as
  physically impossible, for the driver to warn about.

The helper is the driver's own child, so a row is trusted like the driver's memory; one
that does not have this shape is still refused whole (:class:`MalformedRows`), never
half used.
"""

from __future__ import annotations

from collections.abc import Container, Hashable, Iterable, Mapping, Sequence
from typing import Any

from raylens.telemetry.raylet_payload import (
    GroupFigure,
    NodeFigures,
    NodeGroupFigures,
    NodeOomCounts,
)
from raylens.telemetry.scraping._engine import Job, Outcome

__all__ = [
    "GROUPS_UNCHANGED",
    "MESSAGE_FIELDS",
    "READY_MESSAGE",
    "ROW_FIELDS",
    "WIRE_VERSION",
    "HeldFigures",
    "MalformedRows",
    "Row",
    "decode_outcomes",
    "encode_outcomes",
    "is_ready_message",
    "is_result_of",
    "is_trust_message",
    "result_message",
    "scrape_message",
    "trust_message",
]

#: Every message's items, in order, by its kind (its first item).
MESSAGE_FIELDS: Mapping[str, tuple[str, ...]] = {
    "scrape": ("scrape", "batch", "jobs", "deadline", "known"),
    "trust": ("trust", "ids"),
    "ready": ("ready", "version"),
    "result": ("result", "batch", "rows"),
}
#: A row's items, in order; see the module docstring.
ROW_FIELDS = (
    "index",
    "values",
    "error",
    "wedged",
    "asked",
    "elapsed",
    "error_type",
    "duration",
    "groups",
    "oom",
    "refused",
)
#: The version of these messages and rows; raised whenever either changes shape.
WIRE_VERSION = 2
#: What the helper sends once, when it is ready for batches.
READY_MESSAGE = ("ready", WIRE_VERSION)


def is_ready_message(message: object) -> bool:
    """Whether ``message`` is a helper's ready message, of any version."""
    return isinstance(message, tuple) and len(message) == 2 and message[0] == "ready"


def scrape_message(
    batch: int, jobs: list[Job], deadline: float, known: Mapping[Hashable, float]
) -> tuple[str, int, list[Job], float, Mapping[Hashable, float]]:
    """The driver's request for one batch (see the module docstring)."""
    return ("scrape", batch, jobs, deadline, known)


def trust_message(ids: object) -> tuple[str, object]:
    """The driver's word on which samplers' series the helper believes (see the module docstring)."""
    return ("trust", ids)


def is_trust_message(message: object) -> bool:
    """Whether ``message`` is a :func:`trust_message`."""
    return isinstance(message, tuple) and len(message) == 2 and message[0] == "trust"


def result_message(batch: int, rows: list[Row]) -> tuple[str, int, list[Row]]:
    """The helper's answer to batch ``batch``."""
    return ("result", batch, rows)


def is_result_of(message: object, batch: int) -> bool:
    """Whether ``message`` is the answer to batch ``batch``."""
    return isinstance(message, tuple) and message[:2] == ("result", batch)


#: A row's ``groups`` when the driver already holds the node's figures.
GROUPS_UNCHANGED = True
#: One row per node; see the module docstring.
Row = tuple[Any, ...]
_ROW_WIDTH = len(ROW_FIELDS)
_FIGURE_WIDTH = len(GroupFigure._fields)
_OOM_WIDTH = len(NodeOomCounts._fields)
_NODE_WIDTH = len(NodeFigures._fields)


class MalformedRows(ValueError):
    """A result whose rows do not have the shape this module writes."""


class HeldFigures:
    """The group figures the driver holds per key. Not thread-safe.

    Their rows are the plain tuples they came in, so a new reading equal in every group
    is recognised with one comparison.
    """

    __slots__ = ("figures",)

    def __init__(self) -> None:
        self.figures: dict[Hashable, NodeGroupFigures] = {}

    def keep_only(self, keys: Iterable[Hashable]) -> None:
        """Forget the figures of every key not in ``keys``."""
        figures = self.figures
        kept = {key: figures[key] for key in keys if key in figures}
        if len(kept) != len(figures):
            self.figures = kept

    def forget(self, key: Hashable) -> None:
        self.figures.pop(key, None)


def _plain_groups(figures: NodeGroupFigures) -> tuple[Any, ...]:
    return (figures.sampled_at, figures.node, *figures.rows)


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
        values, error, wedged, asked, elapsed, error_type, duration, groups, oom, refused = outcome
        if key in unchanged:
            flat: object = GROUPS_UNCHANGED
        else:
            flat = None if groups is None else _plain_groups(groups)
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
                refused,
            )
        )
    return rows


def _figures(key: Hashable, plain: tuple[Any, ...], held: HeldFigures) -> NodeGroupFigures:
    """The figures ``plain`` describes, now held for ``key``.

    The groups stay the plain tuples that came (the collector stops tracking them); a
    reading equal in every group to the one held shares its rows.
    """
    if type(plain) is not tuple or len(plain) < 2:
        raise MalformedRows(f"group figures sent as {plain!r:.80}, not a tuple of two or more")
    node = plain[1]
    body = plain[2:]
    before = held.figures.get(key)
    if before is not None and before.rows == body:
        rows = before.rows
    else:
        for part in body:
            if type(part) is not tuple or len(part) != _FIGURE_WIDTH:
                raise MalformedRows(f"a group's figures sent as {part!r:.80}")
        rows = body
    if node is not None and (not isinstance(node, tuple) or len(node) != _NODE_WIDTH):
        raise MalformedRows(f"a node's figures sent as {node!r:.80}")
    if node is not None and type(node) is not NodeFigures:
        node = NodeFigures._make(node)
    result = held.figures[key] = NodeGroupFigures.from_rows(plain[0], rows, node)
    return result


def _refused(refused: object) -> tuple[int, tuple[str, ...]] | None:
    if refused is None:
        return None
    if (
        type(refused) is not tuple
        or len(refused) != 2
        or type(refused[0]) is not int
        or type(refused[1]) is not tuple
        or not all(type(name) is str for name in refused[1])
    ):
        raise MalformedRows(f"refused values sent as {refused!r:.80}")
    return refused


def decode_outcomes(
    rows: Sequence[Row],
    keys: Sequence[Hashable],
    offset: float,
    held: HeldFigures,
) -> dict[Hashable, Outcome]:
    """``{key: Outcome}`` of ``rows``, ``keys`` being the batch's keys in the order sent.

    ``offset`` is added to each ``elapsed``. ``held`` is what the driver holds, updated
    here: figures that came are kept, a node whose payload carried
    none is forgotten, and :data:`GROUPS_UNCHANGED` takes what is held (None when
    nothing is).

    Raises:
        MalformedRows: a row is not shaped as :func:`encode_outcomes` writes it.
    """
    new = tuple.__new__
    held_figures = held.figures
    outcomes: dict[Hashable, Outcome] = {}
    try:
        for row in rows:
            if type(row) is not tuple or len(row) != _ROW_WIDTH:
                raise MalformedRows(f"a row of {type(row).__name__}, not a {_ROW_WIDTH}-tuple")
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
                oom,
                refused,
            ) = row
            if type(position) is not int or position < 0:
                raise MalformedRows(f"row index {position!r} is not a position in the batch")
            key = keys[position]
            if flat is None:
                groups = None
                if key in held_figures:
                    held.forget(key)
            elif flat is GROUPS_UNCHANGED:
                groups = held_figures.get(key)
            else:
                groups = _figures(key, flat, held)
            if oom is not None:
                if type(oom) is not tuple or len(oom) != _OOM_WIDTH:
                    raise MalformedRows(f"kill counters sent as {oom!r:.80}")
                oom = new(NodeOomCounts, oom)
            outcomes[key] = new(
                Outcome,
                (
                    values,
                    error,
                    wedged,
                    asked,
                    elapsed + offset,
                    error_type,
                    duration,
                    groups,
                    oom,
                    _refused(refused),
                ),
            )
    except (TypeError, IndexError) as exc:
        raise MalformedRows(f"a result row could not be read: {exc}") from exc
    return outcomes
