"""Every sample of the wanted names, with its labels, out of exposition text."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from raylens.telemetry.prometheus_text import (
    MAX_LABELS,
    LabelledSample,
    SampleExtractor,
    WantedLines,
    extract_labelled_samples,
    extract_samples,
)
from raylens_fakes.raylet import load_recorded_payload

GROUP = "ray_raylens_worker_group_memory_bytes"
USED = "ray_node_mem_used"
TOTAL = "ray_node_mem_total"

# What a Ray 2.60 metrics agent serves for a user gauge ``raylens_worker_group_memory_bytes``
# with tag keys ``memory_type`` and ``rl_worker_group`` set in a worker: written by Ray's own
# exporter (``OpenTelemetryMetricRecorder.set_metric_value`` with the tags its core workers send,
# then ``prometheus_client.generate_latest``). Ray prefixes ``ray_`` to the name, adds
# Component, NodeAddress, SessionName, Version, WorkerId and the three ``otel_scope_*`` labels,
# sorts the label names and escapes backslash, quote and newline in the values.
_HEAD = (
    'Component="core_worker",NodeAddress="192.0.2.2",'
    'SessionName="session_2026-11-29_15-07-04_874414_13768",Version="2.60.0",'
)
_W1 = 'WorkerId="c23cdcb93e667fb54cdb8d3ae0006f907192b03b5b90e597b668ca46",'
_W2 = 'WorkerId="e68f91eb341015f88d81e17aa9d383ea327ea9c9aa05ce953d5bd1eb",'
_SCOPE = (
    'otel_scope_name="ray._private.telemetry.open_telemetry_metric_recorder",'
    'otel_scope_schema_url="",otel_scope_version="",'
)
RAY_GROUP_LINES = (
    f"# HELP {GROUP} Host memory of one worker group's processes on this node.\n"
    f"# TYPE {GROUP} gauge\n"
    f'{GROUP}{{{_HEAD}{_W1}memory_type="rss",{_SCOPE}rl_worker_group="policy"}} 1.2345e+09\n'
    f'{GROUP}{{{_HEAD}{_W1}memory_type="uss",{_SCOPE}rl_worker_group="policy"}} 1.0345e+09\n'
    f'{GROUP}{{{_HEAD}{_W2}memory_type="rss",{_SCOPE}rl_worker_group="rollout"}} 2.5e+09\n'
    f'{GROUP}{{{_HEAD}{_W2}memory_type="uss",{_SCOPE}rl_worker_group="rollout"}} 7.0\n'
    f'{GROUP}{{{_HEAD}{_W2}memory_type="rss",{_SCOPE}'
    'rl_worker_group="ref \\"model\\"\\\\v2\\nnext"} 3.25e+08\n'
    f'{GROUP}{{{_HEAD}{_W2}memory_type="rss",{_SCOPE}rl_worker_group="politique é ☃"}} 42.0\n'
).encode()


def _reference(text: str, wanted: set[str]) -> list[LabelledSample]:
    return [
        LabelledSample(sample.name, tuple(sorted(sample.labels.items())), float(sample.value))
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name in wanted
    ]


def _labels(sample: LabelledSample) -> dict[str, str]:
    return dict(sample.labels)


# --- what Ray serves ------------------------------------------------------------------------


def test_ray_user_gauge_lines_appended_to_a_recorded_raylet_payload() -> None:
    payload = load_recorded_payload("head.prom") + RAY_GROUP_LINES

    got = extract_labelled_samples(payload, [GROUP])

    assert got == _reference(payload.decode("utf-8"), {GROUP})
    assert [(_labels(s)["rl_worker_group"], _labels(s)["memory_type"], s.value) for s in got] == [
        ("policy", "rss", 1.2345e09),
        ("policy", "uss", 1.0345e09),
        ("rollout", "rss", 2.5e09),
        ("rollout", "uss", 7.0),
        ('ref "model"\\v2\nnext', "rss", 3.25e08),
        ("politique é ☃", "rss", 42.0),
    ]
    assert _labels(got[0])["NodeAddress"] == "192.0.2.2"
    assert _labels(got[0])["otel_scope_schema_url"] == ""


def test_labels_come_sorted_by_name_whatever_the_line_order() -> None:
    payload = b'm{zeta="1",Alpha="2",mid="3"} 4\n'

    (sample,) = extract_labelled_samples(payload, ["m"])

    assert sample == LabelledSample("m", (("Alpha", "2"), ("mid", "3"), ("zeta", "1")), 4.0)


def test_every_recorded_series_matches_prometheus_client_with_its_labels() -> None:
    payload = load_recorded_payload("head.prom")
    text = payload.decode("utf-8")
    names = {s.name for f in text_string_to_metric_families(text) for s in f.samples}

    got = extract_labelled_samples(payload, names)

    # prometheus_client keeps NaN, infinite and negative samples; raylens does not.
    expected = [s for s in _reference(text, names) if 0 <= s.value < float("inf")]
    assert got == expected


# --- order, values, malformed lines ---------------------------------------------------------


def test_all_samples_in_payload_order_across_names_and_needles() -> None:
    payload = b'a_x{g="1"} 1\nzz{g="2"} 2\n# a_x 9\na_x{g="3"} 3\nzz 4\n a_x{} 5\nzz{g="1"} 6\n'

    got = extract_labelled_samples(payload, ["zz", "a_x"])

    assert [(s.name, s.labels, s.value) for s in got] == [
        ("a_x", (("g", "1"),), 1.0),
        ("zz", (("g", "2"),), 2.0),
        ("a_x", (("g", "3"),), 3.0),
        ("zz", (), 4.0),
        ("a_x", (), 5.0),
        ("zz", (("g", "1"),), 6.0),
    ]


@pytest.mark.parametrize("value", [b"NaN", b"+Inf", b"-Inf", b"-1", b"1e400"])
def test_non_finite_and_negative_values_are_dropped(value: bytes) -> None:
    payload = b'm{g="a"} 1\nm{g="b"} ' + value + b'\nm{g="c"} 3\n'

    got = extract_labelled_samples(payload, ["m"])

    assert [(_labels(s)["g"], s.value) for s in got] == [("a", 1.0), ("c", 3.0)]


@pytest.mark.parametrize(
    "line",
    [
        b'm{g="b} 2',
        b"m{g=b} 2",
        b'm{g="b" h="c"} 2',
        b'm{g="b"} 2 3 4',
        b'm{g="b"} 1_000',
        b'm{g="b",g="c"} 2',
        b'm{g="\\' + b'"} 2',
    ],
)
def test_malformed_line_costs_only_itself(line: bytes) -> None:
    payload = b'm{g="a"} 1\n' + line + b'\nm{g="c"} 3\n'

    got = extract_labelled_samples(payload, ["m"])

    assert [(_labels(s)["g"], s.value) for s in got] == [("a", 1.0), ("c", 3.0)]


def test_timestamp_exemplar_crlf_and_quoted_label_name() -> None:
    payload = (
        b'm{g="a"} 1 1700000000000\r\n'
        b'm{"odd name"="b"} 2 # {trace_id="x"} 1\r\n'
        b'm { g = "c" , } 3\r\n'
    )

    got = extract_labelled_samples(payload, ["m"])

    assert [(s.labels, s.value) for s in got] == [
        ((("g", "a"),), 1.0),
        ((("odd name", "b"),), 2.0),
        ((("g", "c"),), 3.0),
    ]


# --- unescaping and decoding ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        (b'\\"', '"'),
        (b"\\\\", "\\"),
        (b"\\n", "\n"),
        (b"\\\\n", "\\n"),
        (b'\\\\\\"', '\\"'),
        (b"a\\tb\\q", "a\\tb\\q"),  # not escapes of the format: kept as written
        (b"}, #=", "}, #="),
        (b"", ""),
    ],
)
def test_label_values_are_unescaped_like_prometheus_client(raw: bytes, value: str) -> None:
    payload = b'm{v="' + raw + b'"} 1\n'

    (sample,) = extract_labelled_samples(payload, ["m"])

    assert sample.labels == (("v", value),)
    assert _reference(payload.decode(), {"m"}) == [sample]


def test_label_values_that_are_not_utf8_are_decoded_with_replacement() -> None:
    payload = b'# HELP m \xff\xfe\nother{v="\xff"} 1\nm{v="caf\xe9 \xe2\x98\x83"} 2\n'

    (sample,) = extract_labelled_samples(payload, ["m"])

    assert sample.labels == (("v", "caf\ufffd \u2603"),)


def test_text_bytearray_and_memoryview_payloads_give_the_same_samples() -> None:
    payload = load_recorded_payload("head.prom") + RAY_GROUP_LINES
    expected = extract_labelled_samples(payload, [GROUP])

    assert extract_labelled_samples(payload.decode("utf-8"), [GROUP]) == expected
    assert extract_labelled_samples(bytearray(payload), [GROUP]) == expected
    assert extract_labelled_samples(memoryview(payload), [GROUP]) == expected


def test_agrees_with_extract_samples_on_the_last_value() -> None:
    payload = load_recorded_payload("head.prom") + RAY_GROUP_LINES
    names = [USED, TOTAL, GROUP]
    last = {s.name: s.value for s in extract_labelled_samples(payload, names)}

    assert last == extract_samples(payload, names)


def test_wanted_lines_keep_what_the_labelled_extraction_needs() -> None:
    payload = load_recorded_payload("worker.prom") + RAY_GROUP_LINES
    lines = WantedLines([GROUP])
    for start in range(0, len(payload), 4096):
        lines.feed(payload[start : start + 4096])

    assert extract_labelled_samples(lines.payload(), [GROUP]) == extract_labelled_samples(
        payload, [GROUP]
    )


# --- bounds ---------------------------------------------------------------------------------


def test_at_most_max_samples_are_returned_the_first_in_payload_order() -> None:
    payload = b"".join(b'm{i="%d"} %d\n' % (i, i) for i in range(50))

    got = extract_labelled_samples(payload, ["m"], max_samples=7)

    assert [s.value for s in got] == [float(i) for i in range(7)]
    assert len(extract_labelled_samples(payload, ["m"])) == 50


def test_default_sample_bound_is_ten_thousand() -> None:
    payload = b"m 1\n" * 10_050

    assert len(extract_labelled_samples(payload, ["m"])) == 10_000


@pytest.mark.parametrize(
    ("raw", "limit", "value"),
    [
        (b"abcdef", 3, "abc"),
        (b"abc", 3, "abc"),
        (b'\\"\\"\\"\\"', 3, '"""'),
        (b"\\\\\\\\\\n\\n", 3, "\\\\\n"),
        ("☃☃☃☃".encode(), 2, "☃☃"),
        (b"\xff\xff\xff\xff", 2, "\ufffd\ufffd"),
        (b"ab\\\\", 2, "ab"),
    ],
)
def test_label_values_are_cut_after_unescaping_and_decoding(
    raw: bytes, limit: int, value: str
) -> None:
    payload = b'm{v="' + raw + b'",w="xyzxyz"} 1\n'

    (sample,) = extract_labelled_samples(payload, ["m"], max_label_value_chars=limit)

    assert sample.labels == (("v", value), ("w", "xyzxyz"[:limit]))


@pytest.mark.parametrize(
    ("unit", "chars"),
    [
        (b"x", "x"),
        (b"\\\\", "\\"),
        (b'\\"', '"'),
        (b"a\\nb", "a\nb"),
        (b"a\\q", "a\\q"),
        ("\u2603".encode(), "\u2603"),
        (b"\xff", "\ufffd"),
        ("\u2603".encode()[:2], "\ufffd"),
    ],
)
def test_default_label_value_bound_is_256_characters(unit: bytes, chars: str) -> None:
    payload = b'm{v="' + unit * 100_000 + b'"} 1\n'

    (sample,) = extract_labelled_samples(payload, ["m"])

    assert sample.labels == (("v", (chars * 100_000)[:256]),)


def test_a_line_with_more_than_the_label_bound_is_dropped() -> None:
    def line(count: int, value: int) -> bytes:
        labels = ",".join(f'l{i}="{i}"' for i in range(count))
        return f"m{{{labels}}} {value}\n".encode()

    payload = line(MAX_LABELS, 1) + line(MAX_LABELS + 1, 2) + line(1000, 3) + line(0, 4)

    got = extract_labelled_samples(payload, ["m"])

    assert MAX_LABELS == 32
    assert [(len(s.labels), s.value) for s in got] == [(32, 1.0), (0, 4.0)]


def test_a_label_name_longer_than_the_value_bound_drops_its_line() -> None:
    payload = b"m{" + b"n" * 300 + b'="v"} 1\nm{' + b"n" * 256 + b'="v"} 2\n'

    got = extract_labelled_samples(payload, ["m"])

    assert [(s.labels[0][0], s.value) for s in got] == [("n" * 256, 2.0)]


def test_a_quoted_label_name_is_measured_after_unescaping() -> None:
    payload = b'm{"a\\"b"="v"} 1\nm{"a\\"bc"="v"} 2\nm{"\xff\xff\xff\xff"="v"} 3\n'

    got = extract_labelled_samples(payload, ["m"], max_label_value_chars=3)

    assert [(s.labels[0][0], s.value) for s in got] == [('a"b', 1.0)]


# --- arguments ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("keyword", "bad"),
    [
        ("max_samples", 0),
        ("max_samples", -1),
        ("max_samples", 1.5),
        ("max_samples", True),
        ("max_label_value_chars", 0),
        ("max_label_value_chars", "256"),
    ],
)
def test_bounds_that_are_not_positive_integers_are_rejected(keyword: str, bad: object) -> None:
    with pytest.raises((TypeError, ValueError), match=rf"{keyword}.*{bad!r}"):
        extract_labelled_samples(b"m 1\n", ["m"], **{keyword: bad})  # type: ignore[arg-type]


def test_names_and_payload_are_checked_as_for_extract_samples() -> None:
    with pytest.raises(TypeError, match="single str"):
        extract_labelled_samples(b"m 1\n", "m")
    with pytest.raises(ValueError, match="'a-b'"):
        extract_labelled_samples(b"m 1\n", ["a-b"])
    with pytest.raises(TypeError, match="payload must be bytes or str"):
        extract_labelled_samples(42, ["m"])  # type: ignore[arg-type]


def test_extractor_method_is_what_the_function_uses() -> None:
    extractor = SampleExtractor([GROUP])
    payload = load_recorded_payload("head.prom") + RAY_GROUP_LINES

    assert extractor.extract_labelled(payload) == extract_labelled_samples(payload, [GROUP])
    assert (
        extractor.extract_labelled(payload, max_samples=2)
        == extractor.extract_labelled(payload)[:2]
    )
