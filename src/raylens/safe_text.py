"""Make text that came from outside raylens safe to export, show and log.

Host names, node ids, worker-group names, command lines and HTTP reason phrases all reach
raylens from places it does not control: a raylet, the GCS, the environment, ``argv``. Two
things can go wrong with such a ``str`` even though Python accepts it:

* it can hold lone surrogates (``'\\ud800'``, which ``os.fsdecode`` produces for bytes that are
  not UTF-8), and every exporter that encodes to UTF-8 then fails, taking the other points of
  the export down with it: :func:`encodable` replaces them at the point where text enters;
* it can hold terminal control sequences (``ESC ] 0 ; ... BEL`` retitles a terminal, ``ESC [ 2 J``
  clears it): :func:`printable` escapes every control character before text is shown or logged;
  so too the invisible characters that change how a line reads without showing themselves:
  bidi overrides and isolates (U+202E makes the rest of a line read right to left), zero-width
  spaces and joiners, and the other Unicode format characters (category Cf), and the line and
  paragraph separators U+2028 and U+2029.

Both functions run in time linear in their input and never raise for any ``str``.
"""

from __future__ import annotations

import unicodedata

__all__ = ["encodable", "printable"]

_REPLACEMENT = "\ufffd"


def encodable(value: str) -> str:
    """Return ``value`` with every lone surrogate replaced by U+FFFD, so it encodes as UTF-8.

    Text that already encodes is returned unchanged (the same object).
    """
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "".join(_REPLACEMENT if "\ud800" <= ch <= "\udfff" else ch for ch in value)
    return value


def _escaped(ch: str) -> str:
    code = ord(ch)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


# Unicode categories shown escaped: format characters (bidi controls, zero-width spaces and
# joiners, the byte-order mark, soft hyphen) and the line and paragraph separators.
_INVISIBLE_CATEGORIES = frozenset({"Cf", "Zl", "Zp"})


def _is_control(ch: str) -> bool:
    code = ord(ch)
    # C0 controls, DEL, C1 controls, and the surrogate range (not printable as text).
    if code < 0x20 or 0x7F <= code < 0xA0 or 0xD800 <= code <= 0xDFFF:
        return True
    return code > 0xA0 and unicodedata.category(ch) in _INVISIBLE_CATEGORIES


def printable(value: object) -> str:
    """Return ``str(value)`` with control characters written as ``\\xNN`` escapes.

    Tabs, newlines and escape sequences alike are escaped, so the result is one line that a
    terminal shows as it reads and that cannot move the cursor, retitle or clear the screen.
    Bidi controls, zero-width and other format characters, and U+2028/U+2029 are written as
    ``\\uNNNN``, so what is shown reads in the order it is stored, with nothing hidden.
    """
    text = value if isinstance(value, str) else str(value)
    if text.isascii():
        if text.isprintable():
            return text
    elif not any(_is_control(ch) for ch in text):
        return text
    return "".join(_escaped(ch) if _is_control(ch) else ch for ch in text)
