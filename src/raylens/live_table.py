"""What the ``raylens`` command shows: node and process-tree tables, and their JSON form.

Pure rendering: every function here takes plain rows and returns text, a
``rich`` renderable or a JSON-ready dict, so the command's output is tested
without a terminal, a cluster or a clock.

Titles, node ids, host names, group names, commands and errors come from users,
raylets and the GCS. They always enter a table as :class:`rich.text.Text` built
from :func:`~raylens.safe_text.printable`: never parsed as markup, and with
control characters shown as escapes instead of acted on by the terminal.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import groupby
from typing import Any

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.constrain import Constrain
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from raylens.safe_text import printable

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


def counted(count: int, noun: str) -> str:
    """``1 node``, ``3 nodes``: a count with its noun in the right number (nouns taking -s)."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def whole_bytes(value: float | None) -> int | None:
    """A byte count as JSON carries it: a whole number, or None when unknown or not finite."""
    if value is None or not math.isfinite(value):
        return None
    return round(value)


def format_growth(bytes_per_second: float | None) -> str:
    """A growth rate per hour with its sign: ``+1.2 GiB/h``, ``-300.0 MiB/h``; None -> ``-``."""
    if bytes_per_second is None or not math.isfinite(bytes_per_second):
        return "-"
    sign = "-" if bytes_per_second < 0 else "+"
    return f"{sign}{format_bytes(abs(bytes_per_second) * 3600)}/h"


def format_duration(seconds: float) -> str:
    """A time left, coarsely: ``45 s``, ``12 min``, ``3.5 h``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


#: A node whose kill line is this close at its current growth gets a warning line.
WARN_WITHIN_S = 3600.0


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
    #: RSS of each worker group's processes on the node (see raylens.telemetry.group_memory).
    group_rss: dict[str, float] = field(default_factory=dict)
    #: Growth of the node's used memory and of each group's RSS, bytes per second
    #: (see raylens.telemetry.growth_outlook); None until the growth window is full.
    growth: float | None = None
    group_growth: dict[str, float] = field(default_factory=dict)
    #: The node's kill line, and the seconds left to it while the node grows.
    limit: float | None = None
    time_to_limit: float | None = None
    fastest_group: str | None = None
    #: Why the node has no growth figures (one line), None when it has them.
    growth_unavailable: str | None = None
    #: Seconds since the node's latest scrape (``age_s`` is the ``used`` figure's own
    #: age: it counts from the scrape that first returned that value).
    scrape_age_s: float | None = None
    #: Seconds since the node's sampler took the group figures shown.
    group_age_s: float | None = None

    @property
    def shown_age_s(self) -> float | None:
        """The age of the oldest figure in the row: ``used``'s, or the groups' when shown."""
        ages = [
            age
            for age in (self.age_s, self.group_age_s if self.group_rss else None)
            if age is not None
        ]
        return max(ages) if ages else None

    @property
    def warning(self) -> str | None:
        """One line when the node reaches its kill line within :data:`WARN_WITHIN_S`."""
        if self.time_to_limit is None or self.time_to_limit > WARN_WITHIN_S:
            return None
        line = (
            f"node {self.node_id[:8]} ({self.host}) reaches its kill line "
            f"({format_bytes(self.limit)}) in about {format_duration(self.time_to_limit)} "
            f"at {format_growth(self.growth)}"
        )
        if self.fastest_group is not None:
            rate = self.group_growth.get(self.fastest_group)
            line += f"; {self.fastest_group} grows fastest there ({format_growth(rate)})"
        return line

    @property
    def used_percent(self) -> float | None:
        if self.used is None or not self.total:
            return None
        return 100.0 * self.used / self.total

    def to_json(self) -> dict[str, object]:
        return {
            "node_id": self.node_id,
            "host": self.host,
            "used_bytes": whole_bytes(self.used),
            "total_bytes": whole_bytes(self.total),
            "used_percent": None if self.used_percent is None else round(self.used_percent, 2),
            "worker_groups": self.worker_groups,
            "age_seconds": None if self.age_s is None else round(self.age_s, 3),
            "scrape_age_seconds": None
            if self.scrape_age_s is None
            else round(self.scrape_age_s, 3),
            "worker_group_age_seconds": None
            if self.group_age_s is None
            else round(self.group_age_s, 3),
            "error": self.error,
            "worker_group_rss_bytes": {
                group: whole_bytes(value) for group, value in self.group_rss.items()
            },
            "growth_bytes_per_second": _rate(self.growth),
            "worker_group_growth_bytes_per_second": {
                group: _rate(value) for group, value in self.group_growth.items()
            },
            "limit_bytes": whole_bytes(self.limit),
            "time_to_limit_seconds": None
            if self.time_to_limit is None
            else round(self.time_to_limit, 1),
            "fastest_growing_group": self.fastest_group,
            "growth_unavailable": self.growth_unavailable,
            "warning": self.warning,
        }


def _rate(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, 1)


# Cut-down widths of the cells that shrink, used to decide which columns a width has room for.
_SHORT_HOST = 12
_SHORT_ERROR = 20
_SHORT_COMMAND = 12
_UNBOUNDED = 100_000
# Columns kept free at the right: a terminal echoes Ctrl-C as "^C" after the last
# line, and on a line that fills the width that wraps and shifts a live redraw.
_SPARE_COLUMNS = 2


def _plain(text: str) -> Text:
    """Outside text as it reads: no markup, control characters escaped."""
    return Text(printable(text))


def _shrinkable(text: str, style: str = "", *, short: int | None = None) -> Text:
    """A cell cut short with an ellipsis, never wrapped, when its column must narrow."""
    cell = Text(printable(text), style=style, no_wrap=True, overflow="ellipsis")
    if short is not None:
        cell.truncate(short, overflow="ellipsis")
    return cell


class _FitToWidth:
    """A table built for the width it is drawn at.

    ``build(left_out, short)`` returns the table without the columns named in
    ``left_out``; with ``short`` its long cells are cut down. Optional columns are
    left out, in order, until the cut-down table fits; the table drawn is then the
    full-text one, whose long cells rich narrows to what remains.
    """

    def __init__(
        self, build: Callable[[frozenset[str], bool], Table], optional: Sequence[str]
    ) -> None:
        self._build = build
        self._optional = tuple(optional)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        room = max(1, options.max_width - _SPARE_COLUMNS)
        left_out: frozenset[str] = frozenset()
        unbounded = options.update_width(_UNBOUNDED)
        for name in self._optional:
            sketch = self._build(left_out, True)
            if Measurement.get(console, unbounded, sketch).maximum <= room:
                break
            left_out = left_out | {name}
        yield Constrain(self._build(left_out, False), width=room)


def _table(
    title: str,
    columns: Sequence[tuple[str, dict[str, Any]]],
    rows: Sequence[dict[str, Any]],
    left_out: frozenset[str],
) -> Table:
    table = Table(title=_plain(title), title_justify="left", expand=False)
    kept = [(name, options) for name, options in columns if name not in left_out]
    for name, options in kept:
        table.add_column(name, **options)
    for cells in rows:
        table.add_row(*(cells[name] for name, _ in kept))
    return table


# Columns that may wrap are the ones rich narrows when a table is too wide; their
# cells are built not to wrap but to end in an ellipsis.
_NODE_COLUMNS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("node", {"style": "cyan", "no_wrap": True}),
    ("host", {"max_width": 24}),
    ("used", {"justify": "right", "no_wrap": True}),
    ("total", {"justify": "right", "no_wrap": True}),
    ("used %", {"justify": "right"}),
    ("kill line", {"justify": "right", "no_wrap": True}),
    ("worker groups", {}),
    ("group rss", {}),
    ("growth", {"justify": "right", "no_wrap": True}),
    ("age", {"justify": "right", "no_wrap": True}),
    ("trend", {"no_wrap": True}),
)


def _node_cells(row: NodeRow, short: bool) -> dict[str, Any]:
    percent = row.used_percent
    if row.error is not None:
        percent_cell = _shrinkable(row.error, "bold red", short=_SHORT_ERROR if short else None)
    elif percent is None:
        percent_cell = Text("-")
    else:
        style = "red" if percent >= 90 else "yellow" if percent >= 75 else "green"
        percent_cell = Text(f"{percent:.1f}%", style=style, no_wrap=True)
    return {
        "node": _plain(row.node_id[:8]),
        "host": _shrinkable(row.host, short=_SHORT_HOST if short else None),
        "used": format_bytes(row.used),
        "total": format_bytes(row.total),
        "used %": percent_cell,
        "kill line": format_bytes(row.limit),
        "worker groups": _shrinkable(row.worker_groups),
        "group rss": _shrinkable(
            ", ".join(
                f"{name} {format_bytes(row.group_rss[name])}"
                for name in sorted(row.group_rss, key=natural_key)
            )
            or "-"
        ),
        "growth": Text(
            format_growth(row.growth),
            style="bold red" if row.warning else "yellow" if row.time_to_limit else "",
            no_wrap=True,
        ),
        "age": format_age(row.shown_age_s),
        "trend": sparkline(row.history, min_span=_trend_span(row.total)),
    }


_DIGITS = frozenset("0123456789")


def natural_key(text: str) -> tuple[tuple[int, int, str], ...]:
    """A sort key that orders ``sim-node-2`` before ``sim-node-10``.

    Runs of ASCII digits compare as numbers (by length once leading zeros are
    dropped, then digit by digit, so any length works), other runs as text.
    Linear in the length of ``text``.
    """
    key = []
    for is_digit, group in groupby(text, key=_DIGITS.__contains__):
        run = "".join(group)
        if is_digit:
            number = run.lstrip("0") or "0"
            key.append((0, len(number), number))
        else:
            key.append((1, 0, run))
    return tuple(key)


@dataclass(frozen=True)
class NodeSummary:
    """The line under the node table: nodes, the hosts they run on, failing nodes, memory.

    ``used`` and ``total`` count each host once, however many nodes share it
    (``ray.cluster_utils.Cluster`` starts several on one machine, each reporting the
    machine's figure): per host, the largest figure any of its answering nodes
    reported, summed over hosts. That is the sum the dashboards take
    (``sum(max by (host_name) (...))``).
    """

    nodes: int
    failing: int
    used: float | None
    total: float | None
    hosts: int = 0

    @property
    def used_percent(self) -> float | None:
        if self.used is None or not self.total:
            return None
        return 100.0 * self.used / self.total

    def to_json(self) -> dict[str, object]:
        percent = self.used_percent
        return {
            "nodes": self.nodes,
            "hosts": self.hosts,
            "failing": self.failing,
            "used_bytes": whole_bytes(self.used),
            "total_bytes": whole_bytes(self.total),
            "used_percent": None if percent is None else round(percent, 2),
        }

    def __str__(self) -> str:
        line = counted(self.nodes, "node")
        if self.nodes:
            line += f" on {counted(self.hosts, 'host')}"
        line += f", {self.failing} failing"
        percent = self.used_percent
        if self.used is not None and self.total is not None and percent is not None:
            line += (
                f", {format_bytes(self.used)} of {format_bytes(self.total)} used ({percent:.1f}%)"
            )
        return line


def node_summary(rows: Iterable[NodeRow]) -> NodeSummary:
    """Count nodes, hosts and failing nodes; add up memory once per host (see :class:`NodeSummary`).

    A node without a host name counts as a host of its own.
    """
    nodes = failing = 0
    hosts: set[tuple[bool, str]] = set()
    per_host: dict[tuple[bool, str], tuple[float, float]] = {}
    for row in rows:
        nodes += 1
        host = (True, row.host) if row.host else (False, row.node_id)
        hosts.add(host)
        if row.error is not None:
            failing += 1
        elif row.used is not None and row.total is not None:
            used, total = per_host.get(host, (row.used, row.total))
            per_host[host] = (max(used, row.used), max(total, row.total))
    if not per_host:
        return NodeSummary(nodes, failing, None, None, len(hosts))
    used = sum(figures[0] for figures in per_host.values())
    total = sum(figures[1] for figures in per_host.values())
    return NodeSummary(nodes, failing, used, total, len(hosts))


#: Node ids one "growth unavailable" line names before it only counts the rest.
_UNAVAILABLE_NAMED = 3


def growth_unavailable_lines(rows: Iterable[NodeRow]) -> list[str]:
    """One line per reason some nodes have no growth figures, naming the first few nodes."""
    by_reason: dict[str, list[str]] = {}
    for row in rows:
        if row.growth_unavailable is not None:
            by_reason.setdefault(row.growth_unavailable, []).append(row.node_id[:8])
    lines = []
    for reason, nodes in sorted(by_reason.items()):
        named = ", ".join(nodes[:_UNAVAILABLE_NAMED])
        more = (
            f" and {len(nodes) - _UNAVAILABLE_NAMED} more"
            if len(nodes) > _UNAVAILABLE_NAMED
            else ""
        )
        lines.append(f"growth unavailable on {len(nodes)} node(s) ({named}{more}): {reason}")
    return lines


#: Most recent OOM kills the node table lists under it.
KILLS_SHOWN = 5


def format_kill(kill: Mapping[str, Any], *, now: float | None = None) -> str:
    """One line for an OOM kill as :meth:`KillRecord.as_plain` gives it (text is untrusted)."""
    group = kill.get("worker_group")
    who = "unknown group" if group is None else f"worker group {printable(str(group)[:80])}"
    if kill.get("worker_rank") is not None:
        who += f" rank {kill['worker_rank']}"
    if kill.get("pid") is not None:
        who += f" pid {kill['pid']}"
    when = ""
    stamp = kill.get("unix_time")
    if now is not None and isinstance(stamp, (int, float)):
        when = f" {max(0.0, now - stamp):.0f}s ago"
    killer = "Ray's memory monitor" if kill.get("killer") == "ray" else "the kernel"
    path = kill.get("postmortem")
    where = f"; post-mortem {printable(str(path))}" if path else ""
    node = printable(str(kill.get("node_id", ""))[:8])
    return f"OOM kill{when} on {node}: {who}, by {killer}{where}"


def node_table(
    rows: Iterable[NodeRow],
    *,
    title: str = "Ray host memory",
    kills: Sequence[str] = (),
    notes: Sequence[str] = (),
) -> RenderableType:
    """The live host-memory table: one line per node in natural order of host then node id.

    A summary line (nodes, failing, memory used of total) sits under it. Where the
    terminal is too narrow for every column, the trend and then the host are left
    out and a long error is cut short, so that the node id, the figures and the
    worker groups stay whole. The ``group rss`` column, each worker group's RSS on
    the node, is shown when some row has one, and is the last column left out.
    ``kills`` (lines from :func:`format_kill`) are listed under it, the latest
    :data:`KILLS_SHOWN`. ``notes`` (a lost cluster, say) come right under the summary.
    """
    ordered = sorted(rows, key=lambda r: (natural_key(r.host), natural_key(r.node_id)))
    caption = Text(str(node_summary(ordered)))
    for note in notes:
        caption.append("\n")
        caption.append(Text(printable(note), style="bold red"))
    for row in ordered:
        if row.warning:
            caption.append("\n")
            caption.append(Text(f"warning: {printable(row.warning)}", style="bold red"))
    for line in growth_unavailable_lines(ordered):
        caption.append("\n")
        caption.append(Text(printable(line)))
    for line in list(kills)[-KILLS_SHOWN:]:
        caption.append("\n")
        caption.append(Text(printable(line), style="bold red"))
    absent = frozenset() if any(row.group_rss for row in ordered) else frozenset({"group rss"})
    if not any(row.growth is not None for row in ordered):
        absent |= {"growth"}
    if not any(row.limit is not None for row in ordered):
        absent |= {"kill line"}

    def build(left_out: frozenset[str], short: bool) -> Table:
        cells = [_node_cells(row, short) for row in ordered]
        table = _table(title, _NODE_COLUMNS, cells, left_out | absent)
        table.caption = caption
        table.caption_justify = "left"
        return table

    return _FitToWidth(build, ("trend", "host", "kill line", "growth", "group rss"))


@dataclass
class ProcessTreeRow:
    """One profiled process tree in the ``raylens profile`` table.

    ``rss_peak`` and ``pss_peak`` are the highest values the samples saw; a spike
    between two samples is missed. ``kernel_peak`` is the kernel's own high-water
    mark of one process of the tree (the largest), and ``kernel_peak_source`` says
    where it came from: ``"VmHWM"`` (read from the live processes) or
    ``"ru_maxrss"`` (``getrusage`` once the command has ended). ``pss_stale``
    marks a PSS reading too old to show: ``pss`` is then None and ``pss_age_s``
    the age of the reading that was left out.
    """

    name: str
    pid: int
    processes: int
    rss: float | None
    pss: float | None
    pss_age_s: float | None
    rss_peak: float | None
    pss_peak: float | None
    history: list[float] = field(default_factory=list)
    kernel_peak: float | None = None
    kernel_peak_source: str | None = None
    pss_stale: bool = False

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "pid": self.pid,
            "processes": self.processes,
            "rss_bytes": whole_bytes(self.rss),
            "pss_bytes": None if self.pss_stale else whole_bytes(self.pss),
            "pss_age_seconds": None if self.pss_age_s is None else round(self.pss_age_s, 3),
            "pss_stale": self.pss_stale,
            "rss_peak_bytes": whole_bytes(self.rss_peak),
            "pss_peak_bytes": whole_bytes(self.pss_peak),
            "kernel_peak_rss_bytes": whole_bytes(self.kernel_peak),
            "kernel_peak_rss_source": self.kernel_peak_source,
        }


# What each source of the kernel's peak stands for, in the table's caption.
_KERNEL_PEAK_MEANING = {
    "VmHWM": "largest VmHWM of the tree's live processes (one process, not a tree total)",
    "ru_maxrss": "getrusage ru_maxrss after exit, the largest peak of any one waited-for "
    "process (not a tree total)",
}


def _process_caption(rows: Sequence[ProcessTreeRow]) -> str:
    sources = sorted({row.kernel_peak_source for row in rows if row.kernel_peak_source})
    parts = ["peak rss/pss: highest sampled value"]
    parts += [f"kernel peak: {_KERNEL_PEAK_MEANING.get(s, printable(s))}" for s in sources]
    return "; ".join(parts)


def _pss_cell(row: ProcessTreeRow) -> str:
    return "- stale" if row.pss_stale else format_bytes(row.pss)


_PROCESS_COLUMNS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("command", {"style": "cyan", "max_width": 32}),
    ("pid", {"justify": "right", "no_wrap": True}),
    ("procs", {"justify": "right", "no_wrap": True}),
    ("rss", {"justify": "right", "no_wrap": True}),
    ("pss", {"justify": "right", "no_wrap": True}),
    ("pss age", {"justify": "right", "no_wrap": True}),
    ("peak rss", {"justify": "right", "no_wrap": True}),
    ("peak pss", {"justify": "right", "no_wrap": True}),
    ("kernel peak", {"justify": "right", "no_wrap": True}),
    ("trend", {"no_wrap": True}),
)


def process_table(
    rows: Iterable[ProcessTreeRow], *, title: str = "Process tree memory"
) -> RenderableType:
    """The live ``profile`` table: RSS, PSS with its age, process count, peaks, trend.

    A caption says what each peak is. A stale PSS shows as ``- stale`` beside the
    age of the reading left out. Where the terminal is too narrow, the trend, the
    pid, the process count and the sampled PSS peak are left out, in that order,
    and the command is cut short; the PSS age stays, so that a PSS is never shown
    without it.
    """
    listed = list(rows)
    caption = _process_caption(listed)

    def build(left_out: frozenset[str], short: bool) -> Table:
        cells = [
            {
                "command": _shrinkable(row.name, short=_SHORT_COMMAND if short else None),
                "pid": str(row.pid),
                "procs": str(row.processes),
                "rss": format_bytes(row.rss),
                "pss": _pss_cell(row),
                "pss age": format_age(row.pss_age_s),
                "peak rss": format_bytes(row.rss_peak),
                "peak pss": format_bytes(row.pss_peak),
                "kernel peak": format_bytes(row.kernel_peak),
                "trend": sparkline(row.history, min_span=_trend_span(row.rss_peak)),
            }
            for row in listed
        ]
        table = _table(title, _PROCESS_COLUMNS, cells, left_out)
        table.caption = Text(caption)
        table.caption_justify = "left"
        return table

    return _FitToWidth(build, ("trend", "pid", "procs", "peak pss"))
