"""extract_samples costs time in proportion to the payload, whatever a wanted line holds.

Each example builds one hostile line of about ``LINE_BYTES`` for a wanted name (long runs of
blanks where a label, a value or a line end is expected, unterminated quotes, backslash runs,
endless label sets, and so on) and compares the time extraction takes with the time of a plain
per-byte pass over the same bytes (``bytes.translate``). Both are the best of several runs, so a
busy machine slows both sides alike; the bound is a ratio, never a wall-clock figure.

Linear extraction stays within a few hundred plain passes on the worst of these lines; the
quadratic matcher this guards against needed about a million plain passes at 64 KiB, and its
ratio grows with the line, so lines of 256 KiB keep it hundreds of times past the bound.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raylens.telemetry.prometheus_text import extract_samples

USED = "ray_node_mem_used"
TOTAL = "ray_node_mem_total"
WANTED = (USED, TOTAL)

# Size of the hostile part of each line; read when an example is drawn.
LINE_BYTES = 1 << 18
# Extraction may take at most this many times as long as one plain pass over the payload.
MAX_RATIO = 5000
ROUNDS = 5

_IDENTITY = bytes(range(256))

# What follows the metric name before the long run starts.
LEADS = (
    "",
    " ",
    "{",
    "{ ",
    "{a",
    "{a=",
    "{a =",
    '{a="',
    '{a="b"',
    '{a="b",',
    '{a="b" ,',
    '{"',
    '{"a"=',
    "{}",
    '{a="b"}',
    " 1",
    "{} 1",
    " 1 ",
    " 1 2",
    " 1 #",
    " 1 # {",
    " 1 2 # {",
)
# Short pieces repeated (in turn) to fill the run.
PIECES = (
    " ",
    "\t",
    " \t",
    ",",
    ", ",
    "\\",
    "\\\\",
    '\\"',
    '"',
    "a",
    "1",
    "1.",
    "e",
    "=",
    "{",
    "#",
    "\r",
    'a="b",',
    ' a = "b" ,',
    '"a"="b",',
    "\nray_node_mem_used{",
    "\nray_node_mem_used ",
    "\n ray_node_mem_",
    "ray_node_mem_used ",
)
# What ends the line.
TRAILS = ("", "x", "}", "} 1", '"', '"} 1', " 1", "\r", "=")


def _plain_pass(payload: bytes) -> None:
    payload.translate(_IDENTITY)


def _best_seconds(func: Callable[[], object], rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        func()
        best = min(best, time.perf_counter() - start)
    return best


def _assert_linear(payload: bytes, call: Callable[[], object]) -> None:
    plain = _best_seconds(lambda: _plain_pass(payload), ROUNDS)
    allowed = MAX_RATIO * plain
    took = float("inf")
    # Best of up to ROUNDS runs, stopping at the first one inside the bound.
    for _ in range(ROUNDS):
        took = min(took, _best_seconds(call, 1))
        if took <= allowed:
            return
    raise AssertionError(
        f"extraction over {len(payload)} bytes took {took * 1e3:.1f} ms, "
        f"{took / plain:.0f} times a plain pass over them ({plain * 1e6:.0f} µs); "
        f"at most {MAX_RATIO} times is allowed"
    )


def _hostile_line(lead: str, unit: str, trail: str) -> str:
    return USED + lead + unit * (LINE_BYTES // len(unit)) + trail


@st.composite
def hostile_lines(draw: st.DrawFn) -> str:
    lead = draw(st.sampled_from(LEADS))
    unit = "".join(draw(st.lists(st.sampled_from(PIECES), min_size=1, max_size=3)))
    return _hostile_line(lead, unit, draw(st.sampled_from(TRAILS)))


def _payload(line: str, blanks_before: bool) -> str:
    indent = " " * LINE_BYTES if blanks_before else ""
    return f"# TYPE {TOTAL} gauge\n{TOTAL} 5\n{indent}{line}\n# EOF\n"


def _check(line: str, blanks_before: bool, as_text: bool) -> None:
    text = _payload(line, blanks_before)
    raw = text.encode("ascii")
    payload: bytes | str = text if as_text else raw

    got = extract_samples(payload, WANTED)

    # The good sample before the hostile line is always found.
    assert got.get(TOTAL) == 5.0
    _assert_linear(raw, lambda: extract_samples(payload, WANTED))


@settings(derandomize=True)
@given(line=hostile_lines(), blanks_before=st.booleans(), as_text=st.booleans())
def test_hostile_wanted_line_costs_linear_time(
    line: str, blanks_before: bool, as_text: bool
) -> None:
    _check(line, blanks_before, as_text)


@pytest.mark.parametrize(
    ("lead", "unit", "trail", "blanks_before"),
    [
        ("{", " ", "", False),
        ("{", "\t", "x", False),
        ('{a="b",', " ", "", False),
        ("{a=", " ", "", False),
        ('{a="', "\\", "", False),
        (" ", "1", "x", False),
        (" 1", " ", "x", False),
        ("{", 'a="b",', "", False),
        (" 1", "", "", True),
    ],
)
def test_known_hostile_shapes_cost_linear_time(
    lead: str, unit: str, trail: str, blanks_before: bool
) -> None:
    line = _hostile_line(lead, unit, trail) if unit else USED + lead + trail
    _check(line, blanks_before, as_text=False)


def test_blank_run_after_brace_from_the_report() -> None:
    # 16k blanks after the brace took over a second before extraction was made linear.
    _check(USED + "{" + " " * (1 << 14), blanks_before=False, as_text=False)
