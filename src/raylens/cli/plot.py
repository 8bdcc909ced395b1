"""``raylens plot``: a recorded run or an OOM post-mortem drawn as a PNG.

One panel per node; in it one curve per worker group (its RSS over time), the node's
used memory dashed, its kill line as a horizontal line, each phase shaded and named,
each kill a vertical line. matplotlib is an optional extra (``raylens[plot]``),
imported only here and only when the command runs; the figure is drawn on the Agg
canvas, so no display is needed.

Artists carry a ``gid`` saying what they show (``group:<name>``, ``node-used``,
``kill-line``, ``phase:<name>``, ``kill``), so a reader of the figure (a test) can find
them without relying on colours or order. Text from the file goes into the figure
made printable and with ``$`` escaped: matplotlib would read a pair of them as math.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import threading
from typing import TYPE_CHECKING, Any

from raylens.cli.parser import CliError
from raylens.safe_text import printable
from raylens.telemetry.memory_record import RecordedRun, read_record, run_from_postmortem

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["INSTALL_HINT", "MAX_NODES_DRAWN", "build_figure", "load_run", "run_plot"]

INSTALL_HINT = "raylens plot needs matplotlib; install it with: pip install 'raylens[plot]'"
MAX_NODES_DRAWN = 16
"""Most node panels one image holds; the rest are named in the title as left out."""
_GIB = 1024.0**3
_PHASE_COLOURS = ("tab:purple", "tab:olive", "tab:cyan", "tab:pink", "tab:brown", "tab:gray")
# A post-mortem is bounded well below this; a larger file is read as a record.
_MAX_WHOLE_JSON = 8 * 1024 * 1024


def _text(value: str, limit: int = 60) -> str:
    return printable(value[:limit]).replace("$", r"\$")


def load_run(path: str) -> RecordedRun:
    """The run in ``path``: an OOM post-mortem (one JSON document) or a memory record.

    CliError naming the file when it cannot be read or holds nothing to draw.
    """
    try:
        size = os.path.getsize(path)
        document: Any = None
        if size <= _MAX_WHOLE_JSON:
            with open(path, "rb") as handle:
                raw = handle.read()
            try:
                document = json.loads(raw)
            except (ValueError, RecursionError):
                document = None
        if isinstance(document, dict) and "schema" in document:
            try:
                return run_from_postmortem(document)
            except ValueError as error:
                raise CliError(f"{printable(path)!r}: {error}") from None
        run = read_record(path)
    except OSError as error:
        raise CliError(
            f"cannot read {printable(path)!r}: {printable(error.strerror or str(error))}"
        ) from None
    if not run.nodes:
        raise CliError(
            f"{printable(path)!r} holds no memory to draw: expected a file written by "
            f"'raylens watch --record' or init_telemetry_driver(record=...), or an OOM "
            f"post-mortem ({run.skipped} line(s) skipped as unreadable)"
        )
    return run


def build_figure(run: RecordedRun, *, title: str = "") -> Figure:
    """The picture of ``run``, on an Agg canvas (see the module docstring for its artists)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise CliError(INSTALL_HINT) from None
    node_ids = sorted(run.nodes)
    drawn = node_ids[:MAX_NODES_DRAWN]
    times = [t for node in run.nodes.values() for t in node.times]
    times += [t for node in run.nodes.values() for ts, _ in node.groups.values() for t in ts]
    origin = min(times) if times else 0.0
    figure = Figure(figsize=(11, 2.6 * len(drawn) + 0.8), layout="constrained")
    FigureCanvasAgg(figure)
    groups = sorted({name for node in run.nodes.values() for name in node.groups})
    group_colours = {name: f"C{i % 10}" for i, name in enumerate(groups)}  # one per group
    names = sorted({span.name for span in run.phases})
    colours = {name: _PHASE_COLOURS[i % len(_PHASE_COLOURS)] for i, name in enumerate(names)}
    axes_list = figure.subplots(len(drawn), 1, sharex=True, squeeze=False)[:, 0]
    for node_id, axes in zip(drawn, axes_list):
        track = run.nodes[node_id]
        for name in sorted(track.groups):
            group_times, values = track.groups[name]
            axes.plot(
                [t - origin for t in group_times],
                [v / _GIB for v in values],
                label=_text(name),
                gid=f"group:{name}",
                color=group_colours[name],
                linewidth=1.6,
            )
        used = [(t - origin, v / _GIB) for t, v in zip(track.times, track.used) if v is not None]
        if used:
            axes.plot(
                [t for t, _ in used],
                [v for _, v in used],
                linestyle="--",
                color="0.45",
                linewidth=1.0,
                label="node used",
                gid="node-used",
            )
        if track.limit is not None:
            axes.axhline(
                track.limit / _GIB,
                color="tab:red",
                linestyle=":",
                label="kill line",
                gid="kill-line",
            )
        labelled: set[str] = set()
        for span in run.phases:
            axes.axvspan(
                span.start - origin,
                span.end - origin,
                alpha=0.15,
                color=colours[span.name],
                gid=f"phase:{span.name}",
                label=None if span.name in labelled else f"phase {_text(span.name, 32)}",
            )
            labelled.add(span.name)
            if not span.start_known:
                axes.text(
                    span.start - origin,
                    0.98,
                    f" phase {_text(span.name, 32)} at the kill (its start is not recorded)",
                    transform=axes.get_xaxis_transform(),
                    fontsize=7,
                    va="top",
                )
        for kill in run.kills:
            if kill.node_id == node_id:
                axes.axvline(kill.time - origin, color="tab:red", linewidth=1.5, gid="kill")
                axes.text(
                    kill.time - origin,
                    0.02,
                    f" OOM kill ({_text(kill.killer, 20)}"
                    + (f", {_text(kill.group, 40)})" if kill.group else ")"),
                    transform=axes.get_xaxis_transform(),
                    fontsize=7,
                    color="tab:red",
                )
        axes.set_ylabel("GiB")
        axes.set_title(f"node {_text(node_id, 16)} ({_text(track.host)})", fontsize=9, loc="left")
        axes.grid(alpha=0.3)
        axes.legend(fontsize=7, loc="upper left", ncols=2)
    start = datetime.datetime.fromtimestamp(origin, tz=datetime.timezone.utc)
    axes_list[-1].set_xlabel(f"seconds since {start.isoformat(timespec='seconds')}")
    heading = title or ("OOM post-mortem" if run.source == "postmortem" else "raylens record")
    if len(node_ids) > len(drawn):
        heading += f" ({len(node_ids) - len(drawn)} more node(s) not drawn)"
    figure.suptitle(_text(heading, 200))
    return figure


def run_plot(args: argparse.Namespace, stop: threading.Event) -> int:
    """Draw ``args.file`` into ``args.output`` (default: the file's name plus ``.png``)."""
    run = load_run(args.file)
    output = args.output or f"{args.file}.png"
    figure = build_figure(run, title=f"{os.path.basename(args.file)}")
    try:
        figure.savefig(output, dpi=100)
    except OSError as error:
        raise CliError(
            f"cannot write {printable(output)!r}: {printable(error.strerror or str(error))}"
        ) from None
    groups = {name for node in run.nodes.values() for name in node.groups}
    print(
        f"wrote {printable(output)}: {len(run.nodes)} node(s), {len(groups)} group(s), "
        f"{len(run.phases)} phase(s), {len(run.kills)} kill(s)"
    )
    return 0
