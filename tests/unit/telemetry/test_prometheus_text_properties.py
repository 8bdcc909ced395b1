"""extract_samples and extract_labelled_samples agree with prometheus_client's full parser.

Both are checked on generated exposition text, as bytes (UTF-8 or not) and as ``str``.
"""

from __future__ import annotations

import math
from unittest import mock

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from raylens.telemetry import prometheus_text
from raylens.telemetry.prometheus_text import (
    LabelledSample,
    WantedLines,
    extract_labelled_samples,
    extract_samples,
)

WANTED = ("ray_node_mem_used", "ray_node_mem_total")
# Wanted names, names that share a prefix with them on either side, and unrelated ones.
FAMILY_NAMES = (
    *WANTED,
    "ray_node_mem_used_host",
    "ray_node_mem_total_host",
    "ray_node_mem_shared_bytes",
    "ray_node_mem_available",
    "ray_node_mem",
    "xray_node_mem_used",
    "ray_node_mem_usedtotal",
    "node:ray_node_mem_used",
    "process_resident_memory_bytes",
)
# Raw text found in label values and help text, before escaping: quotes, backslashes, newlines,
# braces, commas, comment markers, things that look like whole sample lines, non-ASCII.
TEXT_PIECES = (
    "a",
    "Z9",
    " ",
    "\t",
    '"',
    "\\",
    "\n",
    "{",
    "}",
    ",",
    "=",
    "#",
    " # ",
    "\\n",
    '\\"',
    "ray_node_mem_used",
    "ray_node_mem_total 7",
    "\nray_node_mem_used 9",
    '"} 5',
    "} 3 1700000000000",
    "é",
    "\u2603",
)
BLANKS = st.sampled_from([" ", "\t", "  ", " \t"])

raw_text = st.lists(st.sampled_from(TEXT_PIECES), max_size=6).map("".join)


def _escape_label_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


values = st.one_of(
    st.integers(min_value=-(10**12), max_value=10**15).map(str),
    st.floats(min_value=-1e20, max_value=1e20, allow_nan=False).map(repr),
    st.floats(min_value=0, max_value=1e13, allow_nan=False).map(lambda x: f"{x:.9e}"),
    st.sampled_from(["NaN", "+Inf", "-Inf", "Inf", "0", "1.169268736e+09", "2.5E10", ".5"]),
)
timestamps = st.one_of(
    st.none(),
    st.integers(min_value=0, max_value=2**42).map(str),
    st.just("1700000000.5"),
)


@st.composite
def sample_lines(draw: st.DrawFn, name: str) -> str:
    labels = draw(
        st.one_of(
            st.none(),
            st.dictionaries(
                st.sampled_from(["a", "ip", "RayNodeType", "_le", "k9"]), raw_text, max_size=3
            ),
        )
    )
    line = draw(st.sampled_from(["", " ", "\t"])) + name
    if labels is None:
        line += draw(BLANKS)
    else:
        pairs = ",".join(f'{key}="{_escape_label_value(val)}"' for key, val in labels.items())
        line += draw(st.sampled_from(["", " "])) + "{" + pairs + "}" + draw(BLANKS)
    line += draw(values)
    timestamp = draw(timestamps)
    if timestamp is not None:
        line += draw(BLANKS) + timestamp
    return line + draw(st.sampled_from(["", " "]))


@st.composite
def families(draw: st.DrawFn) -> list[str]:
    # Half the families are wanted ones, so most examples have something to find.
    name = draw(st.one_of(st.sampled_from(WANTED), st.sampled_from(FAMILY_NAMES)))
    lines = []
    if draw(st.booleans()):
        help_text = _escape_help(draw(raw_text) + " " + draw(st.sampled_from(FAMILY_NAMES)))
        lines.append(f"# HELP {name} {help_text}")
    if draw(st.booleans()):
        lines.append(f"# TYPE {name} {draw(st.sampled_from(['gauge', 'untyped']))}")
    if draw(st.booleans()):
        lines.append(f"# UNIT {name} bytes")
    lines.extend(draw(st.lists(sample_lines(name), max_size=4)))
    if draw(st.booleans()):
        comment = _escape_help(draw(raw_text) + draw(st.sampled_from(FAMILY_NAMES)) + " 11")
        lines.append(f"# note {comment}")
    if draw(st.booleans()):
        lines.append("")
    return lines


@st.composite
def expositions(draw: st.DrawFn) -> str:
    lines = [line for family in draw(st.lists(families(), max_size=8)) for line in family]
    if draw(st.booleans()):
        lines.append("# EOF")
    newline = draw(st.sampled_from(["\n", "\r\n"]))
    text = newline.join(lines)
    return text + newline if draw(st.booleans()) else text


def _reference(text: str, wanted: frozenset[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            value = float(sample.value)
            if sample.name in wanted and math.isfinite(value) and value >= 0:
                out[sample.name] = value
    return out


def _labelled_reference(
    text: str, wanted: frozenset[str], form: str, limit: int
) -> list[LabelledSample]:
    """Every sample prometheus_client reads, kept, decoded and bounded as documented."""
    out = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            value = float(sample.value)
            if sample.name not in wanted or not math.isfinite(value) or value < 0:
                continue
            if any(len(name) > limit for name in sample.labels):
                continue
            labels = {
                name: (raw.replace("é", "\ufffd") if form == "not-utf-8" else raw)[:limit]
                for name, raw in sample.labels.items()
            }
            out.append(LabelledSample(sample.name, tuple(sorted(labels.items())), value))
    return out


def _payload_in(form: str, text: str) -> bytes | str:
    if form == "str":
        return text
    payload = text.encode("utf-8")
    if form == "not-utf-8":
        # A lone Latin-1 byte where the UTF-8 pair for 'é' was: invalid UTF-8, same meaning.
        payload = payload.replace("é".encode(), b"\xe9")
    return payload


wanted_names = st.one_of(
    st.just(frozenset(WANTED)),
    st.frozensets(st.sampled_from(FAMILY_NAMES), min_size=1),
)


# Each example is an exposition of up to eight families mixing every line shape above,
# so a disagreement with the reference shows within the hundreds the ci profile draws.
@given(
    text=expositions(),
    wanted=wanted_names,
    form=st.sampled_from(["utf-8", "not-utf-8", "str"]),
)
def test_matches_prometheus_client(text: str, wanted: frozenset[str], form: str) -> None:
    expected = _reference(text, wanted)

    assert extract_samples(_payload_in(form, text), wanted) == expected


# Small bounds are drawn as often as the defaults, so that cuts fall inside escapes, inside
# multi-byte characters and between samples. Label sets are read whole or label by label
# depending on their length; a threshold of 0 sends these short ones the long way.
@given(
    text=expositions(),
    wanted=wanted_names,
    form=st.sampled_from(["utf-8", "not-utf-8", "str"]),
    max_samples=st.one_of(st.just(10_000), st.integers(min_value=1, max_value=6)),
    limit=st.one_of(st.just(256), st.integers(min_value=1, max_value=12)),
    whole_set_max=st.sampled_from([prometheus_text._WHOLE_SET_MAX, 0]),
)
def test_labelled_samples_match_prometheus_client(
    text: str,
    wanted: frozenset[str],
    form: str,
    max_samples: int,
    limit: int,
    whole_set_max: int,
) -> None:
    expected = _labelled_reference(text, wanted, form, limit)[:max_samples]

    with mock.patch.object(prometheus_text, "_WHOLE_SET_MAX", whole_set_max):
        got = extract_labelled_samples(
            _payload_in(form, text), wanted, max_samples=max_samples, max_label_value_chars=limit
        )

    assert got == expected


@given(
    text=expositions(),
    wanted=wanted_names,
    cuts=st.lists(st.integers(min_value=0, max_value=4000), max_size=12),
)
def test_keeping_only_wanted_lines_from_any_chunking_finds_the_same_samples(
    text: str, wanted: frozenset[str], cuts: list[int]
) -> None:
    payload = text.encode("utf-8")
    lines = WantedLines(wanted)
    start = 0
    for cut in sorted({min(cut, len(payload)) for cut in cuts}):
        lines.feed(payload[start:cut])
        start = cut
    lines.feed(payload[start:])

    assert extract_samples(lines.payload(), wanted) == extract_samples(payload, wanted)
    assert extract_labelled_samples(lines.payload(), wanted) == extract_labelled_samples(
        payload, wanted
    )
    assert len(lines.payload()) <= len(payload)


def test_a_line_longer_than_the_bound_is_skipped_without_being_held() -> None:
    lines = WantedLines(WANTED, max_line_bytes=1024)
    lines.feed(b"ray_node_mem_used 1\n# " + b"x" * 500)
    for _ in range(100):
        lines.feed(b"y" * 1000)  # one 100 KB line, never held whole
        assert len(lines.payload()) < 2048
    lines.feed(b"\nray_node_mem_total 2\n")
    assert extract_samples(lines.payload(), WANTED) == {
        "ray_node_mem_used": 1.0,
        "ray_node_mem_total": 2.0,
    }
