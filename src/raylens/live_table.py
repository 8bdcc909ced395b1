"""What the ``raylens`` command shows: node and process-tree tables, and their JSON form.

Pure rendering: every function here takes plain rows and returns text, a
``rich`` renderable or a JSON-ready dict, so the command's output is tested
without a terminal, a cluster or a clock.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from rich.table import Table
from rich.text import Text

_SPARK = "▁▂▃▄▅▆▇█"
_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(value: float | None) -> str:
    """``1536`` -> ``1.5 KiB``; None (unknown) -> ``-``."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    amount = float(value)
    for unit in _UNITS:
        if abs(amount) < 1024 or unit == _UNITS[-1]:
            return f"{amount:.0f} {unit}" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1024
    return f"{amount:.1f} {_UNITS[-1]}"  # pragma: no cover - loop always returns


def format_age(seconds: float | None) -> str:
    """Age of a sample: ``0.4s``, ``12s``, ``3m05s``; None -> ``-``."""
    if seconds is None:
        return "-"
    if seconds < 10:
        return f"{seconds:.1f}s"
    if seconds < 60:
        return f"{seconds:.0f}s"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s"


def sparkline(values: Sequence[float], width: int = 12, *, min_span: float = 0.0) -> str:
    """The last ``width`` values as block characters, scaled between their min and max.

    ``min_span`` is the smallest range the full height stands for, so that noise
    (a few MiB on a 64 GiB host) is drawn flat instead of as a cliff.
    """
    recent = [v for v in values[-width:] if v is not None]
    if not recent:
        return ""
    low, high = min(recent), max(recent)
    span = max(high - low, min_span)
    if span <= 0:
        return _SPARK[len(_SPARK) // 2] * len(recent)
    scale = (len(_SPARK) - 1) / span
    return "".join(_SPARK[round((v - low) * scale)] for v in recent)


def _trend_span(reference: float | None) -> float:
    """The range a trend's full height stands for: at least 5% of ``reference``."""
    return 0.05 * reference if reference else 0.0


@dataclass
class NodeRow:
    """One node in the host-memory table."""

    node_id: str
    host: str
    used: float | None
    total: float | None
    worker_groups: str
    age_s: float | None
    error: str | None = None
    history: list[float] = field(default_factory=list)

    @property
    def used_percent(self) -> float | None:
        if self.used is None or not self.total:
            return None
        return 100.0 * self.used / self.total

    def to_json(self) -> dict[str, object]:
        return {
            "node_id": self.node_id,
            "host": self.host,
            "used_bytes": self.used,
            "total_bytes": self.total,
            "used_percent": None if self.used_percent is None else round(self.used_percent, 2),
            "worker_groups": self.worker_groups,
            "age_seconds": None if self.age_s is None else round(self.age_s, 3),
            "error": self.error,
        }


def node_table(rows: Iterable[NodeRow], *, title: str = "Ray host memory") -> Table:
    """The live host-memory table: one line per node, sorted by host then node id."""
    table = Table(title=title, title_justify="left", expand=False)
    table.add_column("node", style="cyan", no_wrap=True)
    table.add_column("host", no_wrap=True, max_width=24, overflow="ellipsis")
    table.add_column("used", justify="right", no_wrap=True)
    table.add_column("total", justify="right", no_wrap=True)
    table.add_column("used %", justify="right", no_wrap=True)
    table.add_column("worker groups")
    table.add_column("age", justify="right", no_wrap=True)
    table.add_column("trend", no_wrap=True)
    for row in sorted(rows, key=lambda r: (r.host, r.node_id)):
        percent = row.used_percent
        if row.error is not None:
            percent_cell = Text(row.error, style="bold red")
        elif percent is None:
            percent_cell = Text("-")
        else:
            style = "red" if percent >= 90 else "yellow" if percent >= 75 else "green"
            percent_cell = Text(f"{percent:.1f}%", style=style)
        table.add_row(
            row.node_id[:8],
            row.host,
            format_bytes(row.used),
            format_bytes(row.total),
            percent_cell,
            row.worker_groups,
            format_age(row.age_s),
            sparkline(row.history, min_span=_trend_span(row.total)),
        )
    return table


@dataclass
class ProcessTreeRow:
    """One profiled process tree in the ``raylens profile`` table."""

    name: str
    pid: int
    processes: int
    rss: float | None
    pss: float | None
    pss_age_s: float | None
    rss_peak: float | None
    pss_peak: float | None
    history: list[float] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "pid": self.pid,
            "processes": self.processes,
            "rss_bytes": self.rss,
            "pss_bytes": self.pss,
            "pss_age_seconds": None if self.pss_age_s is None else round(self.pss_age_s, 3),
            "rss_peak_bytes": self.rss_peak,
            "pss_peak_bytes": self.pss_peak,
        }


def process_table(rows: Iterable[ProcessTreeRow], *, title: str = "Process tree memory") -> Table:
    """The live ``profile`` table: RSS, PSS (with its age), process count, peaks, trend."""
    table = Table(title=title, title_justify="left", expand=False)
    table.add_column("command", style="cyan", no_wrap=True, max_width=32, overflow="ellipsis")
    table.add_column("pid", justify="right", no_wrap=True)
    table.add_column("procs", justify="right", no_wrap=True)
    table.add_column("rss", justify="right", no_wrap=True)
    table.add_column("pss", justify="right", no_wrap=True)
    table.add_column("pss age", justify="right", no_wrap=True)
    table.add_column("peak rss", justify="right", no_wrap=True)
    table.add_column("peak pss", justify="right", no_wrap=True)
    table.add_column("trend", no_wrap=True)
    for row in rows:
        table.add_row(
            row.name,
            str(row.pid),
            str(row.processes),
            format_bytes(row.rss),
            format_bytes(row.pss),
            format_age(row.pss_age_s),
            format_bytes(row.rss_peak),
            format_bytes(row.pss_peak),
            sparkline(row.history, min_span=_trend_span(row.rss_peak)),
        )
    return table
