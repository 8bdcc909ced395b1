"""Outside a terminal, a running `watch`/`simulate`/`profile` writes one line per sample."""

from __future__ import annotations

import io
import threading

from rich.console import Console
from rich.text import Text

from raylens.cli.output import Output, sample_loop
from raylens.cli.sample_lines import node_line, process_line
from raylens.live_table import NodeRow, ProcessTreeRow

GIB = 1024**3


def _console(terminal: bool) -> Console:
    return Console(file=io.StringIO(), width=80, force_terminal=terminal, color_system=None)


def _row(node: str, used: float, *, error: str | None = None) -> NodeRow:
    return NodeRow(node, "host-a", used, 8 * GIB, "policy", 0.5, error=error)


def test_a_live_session_outside_a_terminal_writes_each_sample_as_its_line() -> None:
    console = _console(terminal=False)
    output = Output(as_json=False, console=console)
    shown = iter(["first line", "second line"])

    with output.session(live=True):
        sample_loop(
            lambda: output.show(lambda: Text("A\nWHOLE\nTABLE"), {}, line=lambda: next(shown)),
            interval=0.0,
            once=False,
            duration=0.0,
            stop=threading.Event(),
        )
        output.show(lambda: Text("A\nWHOLE\nTABLE"), {}, line=lambda: next(shown))

    assert console.file.getvalue() == "first line\nsecond line\n"


def test_once_and_a_terminal_still_draw_the_table() -> None:
    for live, terminal in ((False, False), (True, True)):
        console = _console(terminal)
        output = Output(as_json=False, console=console)
        with output.session(live=live):
            output.show(lambda: Text("A WHOLE TABLE"), {}, line=lambda: "one line")
        assert "A WHOLE TABLE" in console.file.getvalue()
        assert "one line" not in console.file.getvalue()


def test_a_long_line_is_not_wrapped() -> None:
    console = _console(terminal=False)
    output = Output(as_json=False, console=console)
    with output.session(live=True):
        output.show(lambda: Text("t"), {}, line=lambda: "x" * 200)
    assert console.file.getvalue() == "x" * 200 + "\n"


def test_the_node_line_carries_the_summary_notes_warnings_and_kills() -> None:
    rows = [_row("a" * 56, 2 * GIB), _row("b" * 56, 3 * GIB, error="cluster unreachable")]

    line = node_line(
        rows, title="Ray\x1b[2J", kills=["OOM kill on bbbb"], notes=["lost since 10:00"]
    )

    assert line.startswith("Ray\\x1b[2J: 2 nodes on 1 host, 1 failing, 2.0 GiB of 8.0 GiB")
    assert line.endswith("; lost since 10:00; OOM kill on bbbb")
    assert "\n" not in line


def test_the_process_line_carries_rss_pss_with_its_age_and_the_peaks() -> None:
    row = ProcessTreeRow(
        "python train.py", 10, 3, 1.5 * GIB, 1.25 * GIB, 0.4, 2 * GIB, 1.5 * GIB, kernel_peak=GIB
    )
    stale = ProcessTreeRow("x", 11, 1, GIB, None, 9.0, GIB, None, pss_stale=True)

    assert process_line([row], title="raylens profile: python train.py") == (
        "raylens profile: python train.py: rss 1.5 GiB, pss 1.2 GiB (age 0.4s), 3 procs, "
        "peak rss 2.0 GiB, kernel peak 1.0 GiB"
    )
    assert "pss - stale (age 9.0s), 1 proc," in process_line([stale], title="t")
    assert process_line([], title="t") == "t: no process"
