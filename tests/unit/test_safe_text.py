"""Text from outside raylens is made exportable and printable."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from raylens.safe_text import encodable, printable


def test_lone_surrogate_becomes_the_replacement_character() -> None:
    assert encodable("node-\ud800-a") == "node-\ufffd-a"


def test_text_that_encodes_is_returned_unchanged() -> None:
    value = "policy-0 ünïcode"
    assert encodable(value) is value


@given(st.text())
def test_every_str_becomes_utf8_encodable(value: str) -> None:
    encodable(value).encode("utf-8")


def test_terminal_escape_sequences_are_escaped() -> None:
    hostile = "500 \x1b]0;PWNED\x07\x1b[2J"
    assert printable(hostile) == "500 \\x1b]0;PWNED\\x07\\x1b[2J"


def test_newlines_and_c1_controls_are_escaped() -> None:
    assert printable("a\nb\x9bc") == "a\\x0ab\\x9bc"


@given(st.text())
def test_printable_output_holds_no_control_character(value: str) -> None:
    shown = printable(value)
    assert not any(ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0 for ch in shown)
    shown.encode("utf-8")


def test_non_str_values_are_converted() -> None:
    assert printable(42) == "42"


def test_bidi_controls_and_zero_width_characters_are_escaped() -> None:
    # Right-to-left override, isolates, marks, zero-width space/joiners, BOM, line separator.
    hostile = "gpu\u202eloop\u2066x\u2069\u200e\u200f\u061c\u200b\u200c\u200d\ufeff\u2028\u2029"
    assert printable(hostile) == (
        "gpu\\u202eloop\\u2066x\\u2069\\u200e\\u200f\\u061c"
        "\\u200b\\u200c\\u200d\\ufeff\\u2028\\u2029"
    )


def test_letters_and_symbols_of_every_script_are_shown_as_written() -> None:
    value = "policy-0 ünïcode 政策 سياسة 🚀 —"
    assert printable(value) is value


@given(st.text())
def test_printable_output_holds_no_format_or_separator_character(value: str) -> None:
    import unicodedata

    assert not any(unicodedata.category(ch) in {"Cf", "Zl", "Zp"} for ch in printable(value))


def test_format_characters_beyond_the_basic_plane_are_escaped_as_python_writes_them() -> None:
    assert printable("flag\U000e0067") == "flag\\U000e0067"
