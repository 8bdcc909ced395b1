"""Exact-name sample extraction from Prometheus / OpenMetrics exposition text."""

from __future__ import annotations

import math

import pytest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families as text_families

from raylens.telemetry.prometheus_text import (
    SampleExtractor,
    clear_extractor_cache,
    extract_samples,
)
from raylens_fakes.raylet import load_recorded_payload

USED = "ray_node_mem_used"
TOTAL = "ray_node_mem_total"
WANTED = (USED, TOTAL)

PAYLOADS = {
    "head.prom": text_families,
    "worker.prom": text_families,
    "head.openmetrics": openmetrics_families,
}


def _payload(name: str) -> bytes:
    return load_recorded_payload(name)


def _reference(families) -> dict[str, float]:
    """What prometheus_client reads, reduced the way extract_samples reduces it."""
    out: dict[str, float] = {}
    for family in families:
        for sample in family.samples:
            value = float(sample.value)
            if math.isfinite(value) and value >= 0:
                out[sample.name] = value
    return out


# --- real raylet payloads -------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PAYLOADS))
def test_memory_series_match_prometheus_client_on_recorded_payloads(name: str) -> None:
    payload = _payload(name)
    expected = _reference(PAYLOADS[name](payload.decode("utf-8")))

    got = extract_samples(payload, WANTED)

    assert got == {USED: expected[USED], TOTAL: expected[TOTAL]}
    # The near-miss series carry different numbers, so a prefix match would show up here.
    assert got[USED] != expected[f"{USED}_host"]


@pytest.mark.parametrize("name", sorted(PAYLOADS))
def test_every_series_in_recorded_payloads_matches_prometheus_client(name: str) -> None:
    payload = _payload(name)
    expected = _reference(PAYLOADS[name](payload.decode("utf-8")))
    all_names = {
        sample.name
        for family in PAYLOADS[name](payload.decode("utf-8"))
        for sample in family.samples
    }

    assert extract_samples(payload, all_names) == expected


def test_recorded_payload_as_text_gives_the_same_result() -> None:
    payload = _payload("head.prom")

    assert extract_samples(payload.decode("utf-8"), WANTED) == extract_samples(payload, WANTED)


# --- exact names ----------------------------------------------------------------------------


def test_longer_names_sharing_the_prefix_do_not_match() -> None:
    payload = (
        b"ray_node_mem_used 1\n"
        b"ray_node_mem_total 2\n"
        b"ray_node_mem_used_host 10\n"
        b"ray_node_mem_total_host 20\n"
        b"ray_node_mem_shared_bytes 30\n"
        b"ray_node_mem_used:rate 40\n"
    )

    assert extract_samples(payload, WANTED) == {USED: 1.0, TOTAL: 2.0}


def test_only_near_miss_names_gives_nothing() -> None:
    payload = b'ray_node_mem_used_host{a="b"} 10\nray_node_mem_total_host 20\n'

    assert extract_samples(payload, WANTED) == {}


def test_name_that_ends_with_a_wanted_name_does_not_match() -> None:
    payload = b"xray_node_mem_used 5\nmy:ray_node_mem_used 6\n"

    assert extract_samples(payload, [USED]) == {}


def test_wanted_name_inside_a_label_value_is_not_a_sample() -> None:
    payload = (
        b"ray_node_mem_used 1\n"
        b'other{a="ray_node_mem_used 7"} 3\n'
        b'other{a="x\\nray_node_mem_used 8"} 3\n'
        b'other{a="x", b=" ray_node_mem_used 9"} 3\n'
    )

    assert extract_samples(payload, [USED]) == {USED: 1.0}


def test_wanted_name_in_help_type_unit_and_comment_lines_is_not_a_sample() -> None:
    payload = (
        b"# HELP ray_node_mem_used 7\n"
        b"# TYPE ray_node_mem_used gauge\n"
        b"# UNIT ray_node_mem_used bytes\n"
        b"ray_node_mem_used 1\n"
        b"# HELP other says ray_node_mem_used 8\n"
        b"#ray_node_mem_used 9\n"
        b"# ray_node_mem_used 10\n"
    )

    assert extract_samples(payload, [USED]) == {USED: 1.0}


def test_name_at_the_very_start_of_the_payload() -> None:
    assert extract_samples(b"ray_node_mem_used 42", [USED]) == {USED: 42.0}
    assert extract_samples(b'ray_node_mem_used{a="b"} 43\n', [USED]) == {USED: 43.0}


# --- labels ---------------------------------------------------------------------------------


_LABEL_SETS = {
    "no_labels_and_empty_label_set": (
        b"ray_node_mem_used 1\nray_node_mem_total{} 2\n",
        {USED: 1.0, TOTAL: 2.0},
    ),
    "escaped_quote_in_label_value": (
        b'ray_node_mem_used{a="say \\"} 9\\" please"} 5\n',
        {USED: 5.0},
    ),
    # The quote after an escaped backslash closes the value; a scanner that treated it as an
    # escaped quote would run on into b's value and read 9.
    "escaped_backslash_before_closing_quote": (
        b'ray_node_mem_used{a="C:\\\\",b="} 9"} 5\n',
        {USED: 5.0},
    ),
    "escaped_newline_in_label_value": (
        b'ray_node_mem_used{a="line one\\nline two"} 5\n',
        {USED: 5.0},
    ),
    "brace_comma_space_hash_and_equals_in_label_values": (
        b'ray_node_mem_used{a="}", b=",", c="a b", d=" # 7", e="x=y{"} 5\n',
        {USED: 5.0},
    ),
    "spaces_around_label_parts_and_trailing_comma": (
        b'ray_node_mem_used { a = "1" , b="2", } 5\n',
        {USED: 5.0},
    ),
    "quoted_label_name": (b'ray_node_mem_used{"host.name"="n1"} 5\n', {USED: 5.0}),
}


@pytest.mark.parametrize("case", list(_LABEL_SETS))
def test_a_value_is_read_whatever_its_label_set_holds(case: str) -> None:
    payload, expected = _LABEL_SETS[case]

    assert extract_samples(payload, WANTED) == expected


# --- values and timestamps ------------------------------------------------------------------


_VALUE_LINES = {
    "scientific_notation_value": (
        b'ray_node_mem_used{ip="192.0.2.2"} 1.169268736e+09\nray_node_mem_total 2.5E10\n',
        {USED: 1169268736.0, TOTAL: 2.5e10},
    ),
    "integer_and_plain_decimal_values": (
        b"ray_node_mem_used 1169268736\nray_node_mem_total 25276063744.0\n",
        {USED: 1169268736.0, TOTAL: 25276063744.0},
    ),
    "trailing_timestamp_is_not_the_value": (
        b'ray_node_mem_used{a="b"} 3 1700000000000\nray_node_mem_total 4 1700000000.5\n',
        {USED: 3.0, TOTAL: 4.0},
    ),
    "tabs_and_extra_blanks_between_tokens": (
        b"ray_node_mem_used\t3\t1700000000000\nray_node_mem_total   4   \n",
        {USED: 3.0, TOTAL: 4.0},
    ),
    "leading_blanks_before_the_name": (b"other 1\n  \tray_node_mem_used 3\n", {USED: 3.0}),
    "openmetrics_exemplar_after_the_value": (
        b'ray_node_mem_used{a="b"} 3 # {trace_id="abc"} 1.0 1700000000.1\n',
        {USED: 3.0},
    ),
}


@pytest.mark.parametrize("case", list(_VALUE_LINES))
def test_a_value_is_read_as_a_float_whatever_surrounds_it(case: str) -> None:
    payload, expected = _VALUE_LINES[case]

    got = extract_samples(payload, WANTED)

    assert got == expected
    assert all(type(v) is float for v in got.values())


@pytest.mark.parametrize("value", [b"NaN", b"+Inf", b"-Inf", b"Inf", b"-1", b"-2.5e3", b"1e400"])
def test_non_finite_and_negative_values_are_dropped(value: bytes) -> None:
    payload = b"ray_node_mem_used " + value + b"\nray_node_mem_total 2\n"

    assert extract_samples(payload, WANTED) == {TOTAL: 2.0}


@pytest.mark.parametrize("value", [b"NaN", b"+Inf", b"-1"])
def test_dropped_sample_leaves_the_earlier_valid_one(value: bytes) -> None:
    payload = b'ray_node_mem_used{a="1"} 7\nray_node_mem_used{a="2"} ' + value + b"\n"

    assert extract_samples(payload, [USED]) == {USED: 7.0}


def test_last_valid_sample_wins() -> None:
    payload = (
        b'ray_node_mem_used{node="a"} 1\n'
        b"ray_node_mem_total 5\n"
        b'ray_node_mem_used{node="b"} 2\n'
        b"ray_node_mem_used 3\n"
    )

    assert extract_samples(payload, WANTED) == {USED: 3.0, TOTAL: 5.0}


def test_zero_is_a_valid_value() -> None:
    assert extract_samples(b"ray_node_mem_used 0\n", [USED]) == {USED: 0.0}


# --- malformed input ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        b'ray_node_mem_used{a="unterminated} 9',
        b'ray_node_mem_used{a="escaped quote is not a close\\"} 9',
        b'ray_node_mem_used{a="b" 9',
        b"ray_node_mem_used{a=b} 9",
        b'ray_node_mem_used{a="1" b="2"} 9',
        b"ray_node_mem_used",
        b"ray_node_mem_used ",
        b"ray_node_mem_used 9 9 9",
        b"ray_node_mem_used 9 x",
        b"ray_node_mem_used nine",
        b"ray_node_mem_used 1_000",
        b"ray_node_mem_used 0x10",
        b"ray_node_mem_used 9e",
        b"ray_node_mem_used{} 9}",
    ],
)
def test_malformed_wanted_line_drops_only_that_sample(line: bytes) -> None:
    payload = b"ray_node_mem_used 1\n" + line + b"\nray_node_mem_total 2\nother 3\n"

    assert extract_samples(payload, [USED, TOTAL, "other"]) == {
        USED: 1.0,
        TOTAL: 2.0,
        "other": 3.0,
    }


def test_label_value_may_not_span_a_raw_newline() -> None:
    payload = b'ray_node_mem_used{a="x\nray_node_mem_total 2"} 9\n'

    assert extract_samples(payload, WANTED) == {}


# --- framing and encodings ------------------------------------------------------------------


_FRAMINGS = {
    "crlf_line_ends": (
        (
            b"# HELP ray_node_mem_used Memory usage\r\n"
            b"# TYPE ray_node_mem_used gauge\r\n"
            b'ray_node_mem_used{a="b"} 3 1700000000000\r\n'
            b"ray_node_mem_total 4\r\n"
        ),
        {USED: 3.0, TOTAL: 4.0},
    ),
    "openmetrics_framing": (
        (
            b"# TYPE ray_node_mem_used gauge\n"
            b"# UNIT ray_node_mem_used bytes\n"
            b"# HELP ray_node_mem_used Memory usage.\n"
            b'ray_node_mem_used{a="b"} 3.0\n'
            b"# EOF\n"
        ),
        {USED: 3.0},
    ),
    "bytes_that_are_not_utf8_elsewhere_in_the_payload": (
        (
            b"# HELP junk \xff\xfe not utf-8 \xc3\n"
            b'junk{a="\x80\x81"} 1\n'
            b'ray_node_mem_used{a="caf\xe9"} 3\n'
            b"\xff\xff\xff\n"
            b"ray_node_mem_total 4\n"
        ),
        {USED: 3.0, TOTAL: 4.0},
    ),
}


@pytest.mark.parametrize("case", list(_FRAMINGS))
def test_samples_are_read_whatever_frames_them(case: str) -> None:
    payload, expected = _FRAMINGS[case]

    assert extract_samples(payload, WANTED) == expected


def test_text_payload_gives_the_same_result_as_bytes() -> None:
    payload = 'ray_node_mem_used{a="caf\u00e9 \u2603"} 3\nray_node_mem_used_host 9\n'

    assert extract_samples(payload, [USED]) == {USED: 3.0}
    assert extract_samples(payload.encode("utf-8"), [USED]) == {USED: 3.0}


def test_text_payload_with_lone_surrogates() -> None:
    payload = b'x{a="\xff"} 1\nray_node_mem_used 3\n'.decode("utf-8", "surrogateescape")

    assert extract_samples(payload, [USED]) == {USED: 3.0}


def test_bytearray_and_memoryview_payloads() -> None:
    payload = b"ray_node_mem_used 3\n"

    assert extract_samples(bytearray(payload), [USED]) == {USED: 3.0}
    assert extract_samples(memoryview(payload), [USED]) == {USED: 3.0}


def test_empty_payload_and_no_names() -> None:
    assert extract_samples(b"", WANTED) == {}
    assert extract_samples(b"ray_node_mem_used 3\n", []) == {}


def test_names_without_a_shared_prefix() -> None:
    payload = b'a 1\nbb{x="y"} 2\nccc 3\n'

    assert extract_samples(payload, ["a", "ccc", "missing"]) == {"a": 1.0, "ccc": 3.0}


def test_wanted_name_that_prefixes_another_wanted_name() -> None:
    payload = b"mem 1\nmem_host 2\nmem 3\nmem_host -1\n"

    assert extract_samples(payload, ["mem", "mem_host"]) == {"mem": 3.0, "mem_host": 2.0}


# --- the API --------------------------------------------------------------------------------


def test_extractor_is_reusable_and_reports_its_names() -> None:
    extractor = SampleExtractor([TOTAL, USED, USED])

    assert extractor.names == frozenset(WANTED)
    assert extractor.extract(b"ray_node_mem_used 1\n") == {USED: 1.0}
    assert extractor.extract(b"ray_node_mem_total 2\n") == {TOTAL: 2.0}


def test_extract_samples_reuses_a_compiled_extractor() -> None:
    clear_extractor_cache()
    extract_samples(b"", [USED, TOTAL])
    extract_samples(b"", (TOTAL, USED))

    from raylens.telemetry import prometheus_text

    info = prometheus_text._extractor_for.cache_info()
    assert (info.hits, info.misses) == (1, 1)
    clear_extractor_cache()
    assert prometheus_text._extractor_for.cache_info().currsize == 0


@pytest.mark.parametrize("bad", ["", "1abc", "ray-node", "mem used", "mém", "a{b}"])
def test_invalid_metric_name_is_rejected_with_the_value(bad: str) -> None:
    with pytest.raises(ValueError, match="metric name") as info:
        extract_samples(b"", [bad])

    assert repr(bad) in str(info.value)


def test_single_string_instead_of_names_is_rejected() -> None:
    with pytest.raises(TypeError, match="iterable of metric names"):
        extract_samples(b"", USED)


def test_non_string_name_is_rejected() -> None:
    with pytest.raises(TypeError, match="b'ray_node_mem_used'"):
        extract_samples(b"", [USED.encode()])
    with pytest.raises(TypeError, match="metric name"):
        extract_samples(b"", [["nested"]])


def test_payload_of_the_wrong_type_is_rejected() -> None:
    with pytest.raises(TypeError, match="bytes or str"):
        extract_samples(42, [USED])  # type: ignore[arg-type]
