"""Read a few named samples out of Prometheus or OpenMetrics exposition text, quickly.

A raylet's metrics endpoint answers with 50-400 KB of text covering hundreds of series, and
raylens wants two of them (``ray_node_mem_used`` and ``ray_node_mem_total``) from every node on
every collection tick. A full parser such as ``prometheus_client``'s tokenises every line, unescapes
every label value and builds an object per sample: around 75 ms for one head-node payload, which
is a real cost when multiplied by the nodes of a large cluster. Nearly all of that work is thrown
away, so this module never parses a line it was not asked about.

How a sample is found: the payload is searched, with the C-speed ``find`` of ``bytes``/``str``,
for each wanted name (or for a long prefix that all wanted names share, so a single pass serves
them all). A hit counts only if it starts a line, optionally after blanks, which is what rules
out a name quoted in a label value, in a ``# HELP``/``# TYPE``/``# UNIT`` line or in any other
comment: label values and help text cannot hold a raw newline, so nothing inside them starts a
line. The whole metric name at the hit must then equal a wanted name, so ``ray_node_mem_used_host``
is never read as ``ray_node_mem_used``. Only then is that one line parsed: a regular expression
walks from the name through the label set (quote- and escape-aware, so ``}``, ``,``, ``#``,
``\\"`` and ``\\\\`` inside values do not end it early) to the value, and a few forward steps
then accept an optional timestamp, an optional OpenMetrics exemplar and the line end.

Time is linear in the payload, whatever it holds. The searches are single passes; the blanks
walked back over from a hit lie between it and the previous hit, so none is visited twice; and
no parsing step reads past the end of its line. The expression is written so that any part of a
line can be matched in only one way: every run it repeats is followed by a character the run
cannot hold (a run of blanks by a name, a quote, ``=``, ``,`` or a brace; a quoted value by its
closing quote), and an empty label set's blanks have a branch of their own rather than also
being a possible start of a label. A line that does not match therefore costs a bounded number
of steps per character, never a retry of every way to split a run between two repetitions,
which is what turns a hostile line of blanks after ``{`` into quadratic time. The expression
stops at the value; what may follow it is checked by steps that only move forward.

What a caller may rely on:

* The payload is handled as raw bytes and never decoded, so bytes that are not UTF-8 anywhere
  (even in the wanted lines' label values) do no harm. ``str`` payloads are searched as they are.
* Both the Prometheus text format 0.0.4 and OpenMetrics are read; comments (``# EOF`` included)
  are skipped like any other line that does not start with a wanted name, and ``\\r\\n`` line ends
  are accepted.
* Samples with and without labels, and with an empty label set, are all samples of the name.
* Values are decimal or scientific-notation numbers. ``NaN``, ``Inf`` in any spelling, negative
  numbers and numbers too large for a float are not memory figures: such a sample is dropped.
* When a name has several samples, the last one in the payload that was kept wins (the order in
  which ``prometheus_client`` would report them). A dropped sample therefore never hides an
  earlier good one.
* A malformed line for a wanted name drops that sample and nothing else. What counts as
  malformed: an unterminated or unquoted label value, a missing comma between labels, anything
  other than one value and at most one timestamp after the labels (exemplars excepted), and
  values written other than in plain decimal or scientific notation (``1_000``, ``0x1p4``).
* Not recognised: a metric name given only inside the braces (``{__name__="x"}`` or the quoted
  ``{"x"}`` form of UTF-8 names). Raylets do not write them.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["SampleExtractor", "WantedLines", "clear_extractor_cache", "extract_samples"]

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")

# A prefix shared by every wanted name is searched for once instead of each name on its own when
# it is at least this long: long enough that its stray hits (help lines, sibling series such as
# ray_node_mem_available) cost less than another full pass over a few hundred kilobytes.
_SHARED_PREFIX_MIN = 8

_NUMBER = r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
_QUOTED = r'"[^"\\\n]*(?:\\.[^"\\\n]*)*"'
_LABEL = rf"[ \t]*(?:[a-zA-Z_][a-zA-Z0-9_]*|{_QUOTED})[ \t]*=[ \t]*{_QUOTED}[ \t]*"
# An empty label set's blanks have a branch of their own: were they matched by a run before
# the first label, each blank could go to that run or to the label's leading one.
_LABELS = rf"\{{(?:{_LABEL}(?:,{_LABEL})*(?:,[ \t]*)?|[ \t]*)\}}"
# From the end of the metric name to the end of the value, which is group 1.
_HEAD = rf"(?:[ \t]*{_LABELS}[ \t]*|[ \t]+)({_NUMBER})"
_BLANKS = r"[ \t]*"

# A payload's type: the scan runs the same on bytes and on str.
_Text = TypeVar("_Text", bytes, str)


@dataclass(frozen=True, slots=True)
class _Flavour(Generic[_Text]):
    """Everything the scan needs for one payload type (``bytes`` or ``str``).

    The characters are what indexing a payload of that type yields: ``int`` for ``bytes``,
    a one-character ``str`` for ``str``.
    """

    needles: tuple[_Text, ...]
    by_token: dict[_Text, str]
    name_token: re.Pattern[_Text]
    head: re.Pattern[_Text]
    number: re.Pattern[_Text]
    blank_run: re.Pattern[_Text]
    blanks: tuple[int | str, int | str]
    newline: int | str
    carriage_return: int | str
    hash: int | str
    brace: int | str


def _flavour(
    needles: tuple[str, ...], names: frozenset[str], text: Callable[[str], _Text]
) -> _Flavour[_Text]:
    """The search strings, patterns and characters for payloads of the type ``text`` returns."""

    def char(value: str) -> int | str:
        converted = text(value)
        return converted[0] if isinstance(converted, bytes) else converted

    def pattern(source: str) -> re.Pattern[_Text]:
        return re.compile(text(source))

    return _Flavour(
        needles=tuple(text(needle) for needle in needles),
        by_token={text(name): name for name in names},
        name_token=pattern(_METRIC_NAME.pattern),
        head=pattern(_HEAD),
        number=pattern(_NUMBER),
        blank_run=pattern(_BLANKS),
        blanks=(char(" "), char("\t")),
        newline=char("\n"),
        carriage_return=char("\r"),
        hash=char("#"),
        brace=char("{"),
    )


def _ascii(value: str) -> bytes:
    return value.encode("ascii")


def _same(value: str) -> str:
    return value


def _validated_names(names: Iterable[str]) -> frozenset[str]:
    if isinstance(names, (str, bytes, bytearray)):
        raise TypeError(
            f"names must be an iterable of metric names, not a single "
            f"{type(names).__name__} {names!r}; pass [{names!r}] for one name"
        )
    checked = set()
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"metric name {name!r} must be a str, not {type(name).__name__}")
        if _METRIC_NAME.fullmatch(name) is None:
            raise ValueError(
                f"metric name {name!r} is not valid: a name is made of ASCII letters, digits, "
                f"'_' and ':', and does not start with a digit"
            )
        checked.add(name)
    return frozenset(checked)


def _needles(names: frozenset[str]) -> tuple[str, ...]:
    """The strings to search for so that every line starting with a wanted name is hit once."""
    if len(names) > 1:
        # The smallest and largest names in sorted order share exactly the prefix all share.
        first, last = min(names), max(names)
        size = 0
        while size < len(first) and first[size] == last[size]:
            size += 1
        shared = first[:size]
        if len(shared) >= _SHARED_PREFIX_MIN:
            return (shared,)
    needles: list[str] = []
    # Sorted order puts a name before the longer names it is a prefix of; those longer names'
    # lines are already hit by the shorter needle.
    for name in sorted(names):
        if not any(name.startswith(needle) for needle in needles):
            needles.append(name)
    return tuple(needles)


class SampleExtractor:
    """Extracts the samples of a fixed set of metric names; build once, call many times.

    Construction validates the names and works out what to search for; :meth:`extract` is then
    a pure function of the payload, safe to call from several threads at once.
    """

    __slots__ = ("_bytes", "_names", "_str")

    def __init__(self, names: Iterable[str]) -> None:
        """Prepare to extract ``names``.

        Raises:
            TypeError: ``names`` is a single string, or holds something other than ``str``.
            ValueError: a name is not a valid Prometheus metric name.
        """
        self._names = _validated_names(names)
        needles = _needles(self._names)
        self._str = _flavour(needles, self._names, _same)
        self._bytes = _flavour(needles, self._names, _ascii)

    @property
    def names(self) -> frozenset[str]:
        """The metric names this extractor reads."""
        return self._names

    def __repr__(self) -> str:
        return f"SampleExtractor({sorted(self._names)!r})"

    def extract(self, payload: bytes | bytearray | memoryview | str) -> dict[str, float]:
        """Return ``{name: value}`` for each wanted name that has a valid sample in ``payload``.

        See the module documentation for which samples count and which one wins. Never raises
        on malformed text; raises ``TypeError`` only for a payload that is not bytes-like or
        ``str``.
        """
        if isinstance(payload, bytes):
            return _scan(payload, self._bytes)
        if isinstance(payload, str):
            return _scan(payload, self._str)
        if isinstance(payload, (bytearray, memoryview)):
            return _scan(bytes(payload), self._bytes)
        raise TypeError(
            f"payload must be bytes or str (bytearray and memoryview are accepted too), "
            f"not {type(payload).__name__}"
        )


def _scan(data: _Text, flavour: _Flavour[_Text]) -> dict[str, float]:
    found: dict[str, float] = {}
    find = data.find
    blanks = flavour.blanks
    newline = flavour.newline
    by_token = flavour.by_token
    name_token = flavour.name_token.match
    head = flavour.head.match
    inf = math.inf
    for needle in flavour.needles:
        step = len(needle)
        pos = find(needle)
        while pos != -1:
            start = pos
            while start and data[start - 1] in blanks:
                start -= 1
            token = name_token(data, pos) if not start or data[start - 1] == newline else None
            # A hit that starts a line starts a metric name, so it always yields a token.
            name = None if token is None else by_token.get(token.group())
            if token is not None and name is not None:
                sample = head(data, token.end())
                if sample is not None and _ends_line(data, sample.end(), flavour):
                    value = float(sample.group(1))
                    if 0.0 <= value < inf:
                        found[name] = value
            # A needle starts with a name character, so an occurrence overlapping this one
            # cannot start a line: skipping past the whole needle loses nothing.
            pos = find(needle, pos + step)
    return found


def _after_blanks(data: _Text, pos: int, flavour: _Flavour[_Text]) -> int:
    """Where the run of blanks starting at ``pos`` ends (``pos`` itself when there is none)."""
    run = flavour.blank_run.match(data, pos)
    return pos if run is None else run.end()


def _at_line_end(data: _Text, pos: int, flavour: _Flavour[_Text]) -> bool:
    if pos == len(data) or data[pos] == flavour.newline:
        return True
    return data[pos] == flavour.carriage_return and (
        pos + 1 == len(data) or data[pos + 1] == flavour.newline
    )


def _ends_line(data: _Text, pos: int, flavour: _Flavour[_Text]) -> bool:
    """Whether what follows a sample's value, from ``pos``, is allowed to end its line.

    That is blanks, an optional timestamp, an optional exemplar and the line end. Each step
    moves forward only: every run is taken whole and the character after it decides.
    """
    end = _after_blanks(data, pos, flavour)
    if _at_line_end(data, end, flavour):
        return True
    if end == pos:
        return False
    if data[end] != flavour.hash:
        timestamp = flavour.number.match(data, end)
        if timestamp is None:
            return False
        pos = timestamp.end()
        end = _after_blanks(data, pos, flavour)
        if _at_line_end(data, end, flavour):
            return True
        if end == pos or data[end] != flavour.hash:
            return False
    # An exemplar: '#', blanks, then a brace; the rest of the line is not read.
    brace = _after_blanks(data, end + 1, flavour)
    return brace > end + 1 and brace < len(data) and data[brace] == flavour.brace


@functools.lru_cache(maxsize=64)
def _extractor_for(names: frozenset[str]) -> SampleExtractor:
    return SampleExtractor(names)


def clear_extractor_cache() -> None:
    """Forget the extractors :func:`extract_samples` has compiled (for tests; never needed)."""
    _extractor_for.cache_clear()


def extract_samples(
    payload: bytes | bytearray | memoryview | str, names: Iterable[str]
) -> dict[str, float]:
    """Return ``{name: value}`` for each of ``names`` with a valid sample in ``payload``.

    ``payload`` is one scrape of a Prometheus (text 0.0.4) or OpenMetrics endpoint, preferably
    the raw response bytes. A name with no valid sample is absent from the result. When a name
    has several samples (several label sets), the last valid one in the payload wins; ``NaN``,
    infinite and negative values are not valid. The extractor for a set of names is compiled
    once and cached, so calling this on every scrape is cheap; :class:`SampleExtractor` does the
    same without the cache lookup.

    Raises:
        TypeError: ``names`` is a single string or holds non-strings, or ``payload`` is neither
            bytes-like nor ``str``.
        ValueError: a name is not a valid Prometheus metric name.
    """
    if isinstance(names, (str, bytes, bytearray)):
        _validated_names(names)  # raises, with a message saying how to pass one name
    try:
        key = frozenset(names)
    except TypeError as exc:
        raise TypeError(
            f"names must be an iterable of metric names (str), got {names!r}: {exc}"
        ) from None
    return _extractor_for(key).extract(payload)


class WantedLines:
    """Keeps, from a payload that arrives in chunks, only the lines that may hold a wanted sample.

    A scrape then holds a chunk, one unfinished line and the few wanted lines, never the
    whole body, and :func:`extract_samples` over :meth:`payload` finds what it would have
    found over the whole body. A line is kept when a wanted name (or the prefix all wanted
    names share) occurs anywhere in it, which every line that starts with one does; the
    extraction then applies the exact rule. Lines longer than ``max_line_bytes`` are
    skipped unread, wanted or not: no raylet writes a memory sample that long. Once
    ``max_kept_bytes`` are kept, later lines are not; :attr:`overflowed` says so.
    """

    def __init__(
        self,
        names: Iterable[str],
        *,
        max_line_bytes: int = 64 * 1024,
        max_kept_bytes: int = 1024 * 1024,
    ) -> None:
        self._needles = tuple(n.encode("ascii") for n in _needles(_validated_names(names)))
        self._max_line = max_line_bytes
        self._max_kept = max_kept_bytes
        self._kept: list[bytes] = []
        self._kept_bytes = 0
        self._partial = b""
        self._skipping = False
        self.overflowed = False

    def feed(self, chunk: bytes) -> None:
        """Take the next part of the payload."""
        if self._skipping:
            newline = chunk.find(b"\n")
            if newline == -1:
                return
            chunk, self._skipping = chunk[newline + 1 :], False
        data = self._partial + chunk if self._partial else chunk
        last = data.rfind(b"\n")
        complete, self._partial = (
            (b"", data) if last == -1 else (data[: last + 1], data[last + 1 :])
        )
        if len(self._partial) > self._max_line:
            self._partial, self._skipping = b"", True
        if complete:
            self._keep_from(complete)

    def _keep_from(self, complete: bytes) -> None:
        spans: set[tuple[int, int]] = set()
        for needle in self._needles:
            pos = complete.find(needle)
            while pos != -1:
                start = complete.rfind(b"\n", 0, pos) + 1
                end = complete.find(b"\n", pos) + 1  # complete ends with a newline
                if end - start <= self._max_line:
                    spans.add((start, end))
                pos = complete.find(needle, end)
        for start, end in sorted(spans):
            if self._kept_bytes + end - start > self._max_kept:
                self.overflowed = True
                return
            self._kept.append(complete[start:end])
            self._kept_bytes += end - start

    def payload(self) -> bytes:
        """The kept lines, in payload order, and the last line if it had no newline."""
        tail = [] if self._skipping else [self._partial]
        return b"".join([*self._kept, *tail])
