"""One line per sample: what a running ``watch``, ``simulate`` or ``profile`` writes outside a terminal.

A log or a pipe gets one line a sample rather than a whole table each interval.
Text from outside (titles, commands, notes) is escaped with
:func:`~raylens.safe_text.printable`, so a line stays one line.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from raylens.live_table import (
    KILLS_SHOWN,
    NodeRow,
    ProcessTreeRow,
    counted,
    format_age,
    format_bytes,
    node_summary,
)
from raylens.safe_text import printable

__all__ = ["node_line", "process_line"]


def process_line(rows: Iterable[ProcessTreeRow], *, title: str) -> str:
    """One line for a ``profile`` sample, as written outside a terminal.

    ``title: rss 1.2 GiB, pss 1.1 GiB (age 0.4s), 3 procs, peak rss 1.5 GiB``; a
    stale PSS reads ``pss - stale``. Several trees are joined with `` | ``.
    """
    parts = []
    for row in rows:
        pss = "- stale" if row.pss_stale else format_bytes(row.pss)
        age = "" if row.pss_age_s is None else f" (age {format_age(row.pss_age_s)})"
        line = (
            f"rss {format_bytes(row.rss)}, pss {pss}{age}, {counted(row.processes, 'proc')}, "
            f"peak rss {format_bytes(row.rss_peak)}"
        )
        if row.kernel_peak is not None:
            line += f", kernel peak {format_bytes(row.kernel_peak)}"
        parts.append(line)
    return printable(f"{title}: {' | '.join(parts) or 'no process'}")


def node_line(
    rows: Iterable[NodeRow], *, title: str, kills: Sequence[str] = (), notes: Sequence[str] = ()
) -> str:
    """One line for a node-table sample, as written outside a terminal.

    The title and the summary under the table, then the notes, warnings and kills
    it would list, each after ``; ``.
    """
    listed = list(rows)
    extras = [*notes, *(row.warning for row in listed if row.warning), *list(kills)[-KILLS_SHOWN:]]
    return printable("; ".join([f"{title}: {node_summary(listed)}", *(e for e in extras if e)]))
