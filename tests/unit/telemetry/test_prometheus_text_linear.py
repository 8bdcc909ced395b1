"""Extraction costs time in proportion to the payload, whatever a wanted line holds.

Each example builds one hostile line of about ``LINE_BYTES`` for a wanted name (long runs of
blanks where a label, a value or a line end is expected, unterminated quotes, backslash runs,
endless label sets, and so on) and compares the time extraction takes with the time of a plain
per-byte pass over the same bytes (``bytes.translate``). Both are the best of several runs, so a
busy machine slows both sides alike; the bound is a ratio, never a wall-clock figure.

Linear extraction stays within a few hundred plain passes on the worst of these lines; the
quadratic matcher this guards against needed about a million plain passes at 64 KiB, and its
ratio grows with the line, so lines of 256 KiB keep it hundreds of times past the bound.

``extract_labelled_samples`` is held to the same bound on the same lines, and on valid lines
built to make reading the labels costly: endless label sets, huge names and values made of
escapes or undecodable bytes, and payloads of nothing but short wanted lines.

The drawn lines (the two property tests) wait on wall-clock measurements of quarter-megabyte
payloads dozens of times over, so they run once, in the slow tier; the fixed shapes below run
in every tier.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raylens.telemetry.prometheus_text import (
    LabelledSample,
    extract_labelled_samples,
    extract_samples,
)

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


@pytest.mark.slow
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


# --- with labels ----------------------------------------------------------------------------


def _check_labelled(line: bytes, blanks_before: bool, as_text: bool) -> None:
    indent = b" " * LINE_BYTES if blanks_before else b""
    raw = b"# TYPE %s gauge\n%s 5\n%s%s\n# EOF\n" % (TOTAL.encode(), TOTAL.encode(), indent, line)
    payload: bytes | str = raw.decode("utf-8", "replace") if as_text else raw

    got = extract_labelled_samples(payload, WANTED)

    assert got[0] == LabelledSample(TOTAL, (), 5.0)
    _assert_linear(raw, lambda: extract_labelled_samples(payload, WANTED))


@pytest.mark.slow
@settings(max_examples=30, deadline=None, derandomize=True)
@given(line=hostile_lines(), blanks_before=st.booleans(), as_text=st.booleans())
def test_hostile_wanted_line_costs_linear_time_with_labels(
    line: str, blanks_before: bool, as_text: bool
) -> None:
    _check_labelled(line.encode("ascii"), blanks_before, as_text)


def _repeat(unit: bytes) -> bytes:
    return unit * (LINE_BYTES // len(unit))


@pytest.mark.parametrize(
    "line",
    [
        b"{" + _repeat(b'a="b",') + b"} 1",
        b"{" + _repeat(b' a = "b" ,') + b"} 1",
        b"{" + _repeat(b'"a"="b",') + b"} 1",
        b'{a="b",' + _repeat(b" ") + b"} 1",
        b'{a="' + _repeat(b"\\\\") + b'"} 1',
        b'{a="' + _repeat(b'\\"') + b'"} 1',
        b'{a="' + _repeat(b"\\n\\q") + b'"} 1',
        b'{a="' + _repeat(b"\xff") + b'"} 1',
        b'{a="' + _repeat("\u2603".encode()) + b'"} 1',
        b"{" + _repeat(b"a") + b'="b"} 1',
        b'{"' + _repeat(b'\\"') + b'"="b"} 1',
        b'{a="b",' + _repeat(b"c") + b'="d"} 1',
    ],
    ids=lambda line: repr(line[:12]),
)
@pytest.mark.parametrize("as_text", [False, True])
def test_costly_valid_label_sets_cost_linear_time(line: bytes, as_text: bool) -> None:
    _check_labelled(USED.encode() + line, blanks_before=False, as_text=as_text)


@pytest.mark.parametrize(
    "line",
    [
        b'{a="b"} 1',  # a sample on every line, until the sample bound
        b'{a="b"} NaN',  # a dropped sample on every line
        b'{a="b",a="c"} 1',  # a repeated label on every line
        b' 1 # {a="b"} 1',  # an exemplar on every line
        b"_host 1",  # a near miss on every line
    ],
)
def test_payload_of_short_wanted_lines_costs_linear_time(line: bytes) -> None:
    many = (USED.encode() + line + b"\n") * (LINE_BYTES // (len(USED) + len(line) + 1))
    _check_labelled(many, blanks_before=False, as_text=False)
