"""Read a few named samples out of Prometheus or OpenMetrics exposition text, quickly.

:func:`extract_samples` and :func:`extract_labelled_samples` find the wanted series without
parsing any other line; :class:`WantedLines` keeps, from a body arriving in chunks, only the
lines they could need. Invariants a maintainer must keep:

- time is linear in the payload whatever it holds: single ``find`` passes, and a regular
  expression that can match any part of a line in only one way (no backtracking);
- a sample counts only where a wanted name starts a line and is the whole metric name;
- the payload is never decoded, but for the label sets asked for;
- a bad line costs only its own sample, and what comes back is bounded.

The rules in full: ``docs/architecture.md``, *Reading exposition text*; the figures:
``docs/performance.md``, *Reading a raylet payload*.
"""

from __future__ import annotations

import functools
import heapq
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, NamedTuple, TypeVar

__all__ = [
    "MAX_LABELS",
    "LabelledSample",
    "SampleExtractor",
    "WantedLines",
    "clear_extractor_cache",
    "extract_labelled_samples",
    "extract_samples",
]

MAX_LABELS = 32
"""The most labels a sample may have for :func:`extract_labelled_samples`; more drops the line."""

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
#: A source label's value is cut to this many bytes (Ray's worker ids take 56).
_MAX_SOURCE_BYTES = 128
#: Sources given a share of their own; lines of any further source share one more.
_MAX_SOURCES = 64
_OTHER_SOURCES = b"\x00"  # no label value holds a NUL byte

# A prefix shared by every wanted name is searched for once instead of each name on its own when
# it is at least this long: long enough that its stray hits (help lines, sibling series such as
# ray_node_mem_available) cost less than another full pass over a few hundred kilobytes.
_SHARED_PREFIX_MIN = 8

_NUMBER = r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
_QUOTED_BODY = r'[^"\\\n]*(?:\\.[^"\\\n]*)*'
_QUOTED = f'"{_QUOTED_BODY}"'
_LABEL = rf"[ \t]*(?:[a-zA-Z_][a-zA-Z0-9_]*|{_QUOTED})[ \t]*=[ \t]*{_QUOTED}[ \t]*"
# An empty label set's blanks have a branch of their own: were they matched by a run before
# the first label, each blank could go to that run or to the label's leading one.
_LABELS = rf"\{{(?:{_LABEL}(?:,{_LABEL})*(?:,[ \t]*)?|[ \t]*)\}}"
# From the end of the metric name to the end of the value, which is group 2; group 1 is the
# label set, braces included.
_HEAD = rf"(?:[ \t]*({_LABELS})[ \t]*|[ \t]+)({_NUMBER})"
# One label inside a label set that _LABELS has matched: group 1 a plain name, group 2 the body
# of a quoted name, group 3 the body of the value. It can start only at a name character or a
# quote, never at the blanks and commas between labels, so a search moves from one label to the
# next; every run it repeats is followed by a character the run cannot hold, as above.
_LABEL_PARTS = rf'(?:([a-zA-Z_][a-zA-Z0-9_]*)|"({_QUOTED_BODY})")[ \t]*=[ \t]*"({_QUOTED_BODY})"'
# A label set up to this long is decoded whole and split by one call; a longer one is read label
# by label, decoding only the start of each name and value.
_WHOLE_SET_MAX = 4096
_SPLIT_LABELS = re.compile(_LABEL_PARTS)
# The escapes of the exposition formats, in label values and quoted label names.
_ESCAPE = re.compile(r'\\[\\n"]')
_UNESCAPED = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}
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
    label_parts: re.Pattern[_Text]
    number: re.Pattern[_Text]
    blank_run: re.Pattern[_Text]
    blanks: tuple[int | str, int | str]
    newline: int | str
    carriage_return: int | str
    hash: int | str
    brace: int | str
    decode: Callable[[_Text], str]


def _flavour(
    needles: tuple[str, ...],
    names: frozenset[str],
    text: Callable[[str], _Text],
    decode: Callable[[_Text], str],
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
        label_parts=pattern(_LABEL_PARTS),
        number=pattern(_NUMBER),
        blank_run=pattern(_BLANKS),
        blanks=(char(" "), char("\t")),
        newline=char("\n"),
        carriage_return=char("\r"),
        hash=char("#"),
        brace=char("{"),
        decode=decode,
    )


class LabelledSample(NamedTuple):
    """One sample: the wanted metric name, its labels sorted by name, and its value."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


def _ascii(value: str) -> bytes:
    return value.encode("ascii")


def _same(value: str) -> str:
    return value


def _utf8(value: bytes) -> str:
    return value.decode("utf-8", "replace")


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


def _validated_bound(keyword: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{keyword} must be a positive int, got {value!r}")
    if value < 1:
        raise ValueError(f"{keyword} must be a positive int (1 or more), got {value!r}")
    return value


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

    Construction validates the names and works out what to search for; :meth:`extract` and
    :meth:`extract_labelled` are then pure functions of the payload, safe to call from several
    threads at once.
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
        self._str = _flavour(needles, self._names, _same, _same)
        self._bytes = _flavour(needles, self._names, _ascii, _utf8)

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
        raise _payload_type_error(payload)

    def extract_labelled(
        self,
        payload: bytes | bytearray | memoryview | str,
        *,
        max_samples: int = 10_000,
        max_label_value_chars: int = 256,
    ) -> list[LabelledSample]:
        """Return every valid sample of the wanted names in ``payload``, in payload order.

        See :func:`extract_labelled_samples`. Never raises on malformed text.

        Raises:
            TypeError: ``payload`` is not bytes-like or ``str``, or a bound is not an int.
            ValueError: a bound is less than 1.
        """
        max_samples = _validated_bound("max_samples", max_samples)
        limit = _validated_bound("max_label_value_chars", max_label_value_chars)
        if isinstance(payload, bytes):
            return _labelled_scan(payload, self._bytes, max_samples, limit)
        if isinstance(payload, str):
            return _labelled_scan(payload, self._str, max_samples, limit)
        if isinstance(payload, (bytearray, memoryview)):
            return _labelled_scan(bytes(payload), self._bytes, max_samples, limit)
        raise _payload_type_error(payload)


def _payload_type_error(payload: object) -> TypeError:
    return TypeError(
        f"payload must be bytes or str (bytearray and memoryview are accepted too), "
        f"not {type(payload).__name__}"
    )


def _scan(data: _Text, flavour: _Flavour[_Text]) -> dict[str, float]:
    found: dict[str, float] = {}
    find = data.find
    for needle in flavour.needles:
        step = len(needle)
        pos = find(needle)
        while pos != -1:
            sample = _sample_at(data, pos, flavour)
            if sample is not None:
                found[sample[0]] = sample[2]
            # A needle starts with a name character, so an occurrence overlapping this one
            # cannot start a line: skipping past the whole needle loses nothing.
            pos = find(needle, pos + step)
    return found


def _labelled_scan(
    data: _Text, flavour: _Flavour[_Text], max_samples: int, limit: int
) -> list[LabelledSample]:
    found: list[LabelledSample] = []
    find = data.find
    # The next hit of each needle, taken lowest first so that samples come in payload order.
    hits = [
        (at, index) for index, needle in enumerate(flavour.needles) if (at := find(needle)) >= 0
    ]
    heapq.heapify(hits)
    while hits and len(found) < max_samples:
        pos, index = hits[0]
        sample = _sample_at(data, pos, flavour)
        if sample is not None:
            labels = _labels(data, sample[1].span(1), flavour, limit)
            if labels is not None:
                found.append(LabelledSample(sample[0], labels, sample[2]))
        needle = flavour.needles[index]
        pos = find(needle, pos + len(needle))
        if pos == -1:
            heapq.heappop(hits)
        else:
            heapq.heapreplace(hits, (pos, index))
    return found


def _sample_at(
    data: _Text, pos: int, flavour: _Flavour[_Text]
) -> tuple[str, re.Match[_Text], float] | None:
    """The wanted name, match and kept value of the sample on the line a hit at ``pos`` starts."""
    start = pos
    while start and data[start - 1] in flavour.blanks:
        start -= 1
    if start and data[start - 1] != flavour.newline:
        return None
    # A hit that starts a line starts a metric name, so it always yields a token.
    token = flavour.name_token.match(data, pos)
    name = None if token is None else flavour.by_token.get(token.group())
    if token is None or name is None:
        return None
    sample = flavour.head.match(data, token.end())
    if sample is None or not _ends_line(data, sample.end(), flavour):
        return None
    value = float(sample.group(2))
    return (name, sample, value) if 0.0 <= value < math.inf else None


def _labels(
    data: _Text, span: tuple[int, int], flavour: _Flavour[_Text], limit: int
) -> tuple[tuple[str, str], ...] | None:
    """The labels of a label set that ``_LABELS`` matched at ``span``; None to drop the line.

    ``span`` is ``(-1, -1)`` for a sample written without braces.
    """
    start, end = span
    if start == -1:
        return ()
    if end - start <= _WHOLE_SET_MAX:
        # Splitting the decoded set is splitting then decoding: every delimiter is ASCII, and
        # decoding never takes an ASCII byte into an undecodable run.
        text = flavour.decode(data[start + 1 : end - 1])
        parts = _SPLIT_LABELS.findall(text)
        if len(parts) > MAX_LABELS:
            return None
        if "\\" in text:
            parts = [(plain, _unescaped(quoted), _unescaped(val)) for plain, quoted, val in parts]
    else:
        parts = []
        for part in flavour.label_parts.finditer(data, start + 1, end - 1):
            if len(parts) == MAX_LABELS:
                return None
            spans = part.span(1), part.span(2), part.span(3)
            plain, quoted, val = (_label_text(data, span, flavour, limit) for span in spans)
            parts.append((plain, quoted, val))
    labels = [(plain or quoted, val[:limit]) for plain, quoted, val in parts]
    if labels and max(len(name) for name, _ in labels) > limit:
        return None
    if len({name for name, _ in labels}) != len(labels):
        return None
    return tuple(sorted(labels))


def _label_text(data: _Text, span: tuple[int, int], flavour: _Flavour[_Text], limit: int) -> str:
    """The first ``limit + 1`` characters of a group's text, unescaped and decoded.

    Each character comes from at most four raw ones (a UTF-8 sequence, an undecodable run, an
    escape), so the first ``4 * limit + 8`` hold them whole, ahead of anything the cut splits.
    A group that did not match has the span ``(-1, -1)``, which slices to nothing.
    """
    start, end = span
    return _unescaped(flavour.decode(data[start : min(end, start + 4 * limit + 8)]))[: limit + 1]


def _unescaped(text: str) -> str:
    if "\\" not in text:
        return text
    return _ESCAPE.sub(lambda escape: _UNESCAPED[escape.group()], text)


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


def extract_labelled_samples(
    payload: bytes | bytearray | memoryview | str,
    names: Iterable[str],
    *,
    max_samples: int = 10_000,
    max_label_value_chars: int = 256,
) -> list[LabelledSample]:
    """Return every valid sample of ``names`` in ``payload``, with its labels, in payload order.

    The samples counted are those :func:`extract_samples` counts, so the last one of a name is
    the value it returns. Labels come sorted by name, unescaped and decoded; the module
    documentation gives the bounds on what comes back. Extractors are cached as for
    :func:`extract_samples`.

    Raises:
        TypeError: ``names`` is a single string or holds non-strings, ``payload`` is neither
            bytes-like nor ``str``, or a bound is not an int.
        ValueError: a name is not a valid Prometheus metric name, or a bound is less than 1.
    """
    return _cached_extractor(names).extract_labelled(
        payload, max_samples=max_samples, max_label_value_chars=max_label_value_chars
    )


def _cached_extractor(names: Iterable[str]) -> SampleExtractor:
    if isinstance(names, (str, bytes, bytearray)):
        _validated_names(names)  # raises, with a message saying how to pass one name
    try:
        key = frozenset(names)
    except TypeError as exc:
        raise TypeError(
            f"names must be an iterable of metric names (str), got {names!r}: {exc}"
        ) from None
    return _extractor_for(key)


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
    return _cached_extractor(names).extract(payload)


class WantedLines:
    """Keeps, from a payload that arrives in chunks, only the lines that may hold a wanted sample.

    A scrape then holds a chunk, one unfinished line and the few wanted lines, never the
    whole body, and :func:`extract_samples` (or :func:`extract_labelled_samples`) over
    :meth:`payload` finds what it would have found over the whole body. A line is kept only
    when a wanted name starts it and is its whole metric name (the rule the extraction
    applies), so look-alike lines (longer names, comments, the name inside a label) take no
    room. Lines longer than ``max_line_bytes`` are skipped unread, wanted or not: no raylet
    writes a memory sample that long.

    At most ``max_kept_bytes`` are kept, shared fairly between sources: with
    ``source_label``, a line's source is that label's value (``""`` without it), and when
    the room is full a line of a source holding less than the largest one takes that
    one's latest line's place. Whatever one source publishes, and in whatever order, every
    other source keeps its lines up to an equal share of the room; past 64 sources, further
    ones share one share (lines without the label always keep their own);
    :attr:`overflowed` says that some line was not kept.
    """

    def __init__(
        self,
        names: Iterable[str],
        *,
        max_line_bytes: int = 64 * 1024,
        max_kept_bytes: int = 1024 * 1024,
        source_label: str | None = None,
    ) -> None:
        wanted = _validated_names(names)
        self._needles = tuple(n.encode("ascii") for n in _needles(wanted))
        self._names = tuple(sorted(n.encode("ascii") for n in wanted))
        if source_label is not None and not _LABEL_NAME.fullmatch(source_label):
            raise ValueError(f"source_label must be a label name, got {source_label!r:.80}")
        self._source = None if source_label is None else f'{source_label}="'.encode("ascii")
        self._max_line = max_line_bytes
        self._max_kept = max_kept_bytes
        # Per source, its kept lines as (position in the payload, line).
        self._kept: dict[bytes, list[tuple[int, bytes]]] = {}
        self._bytes_by_source: dict[bytes, int] = {}
        self._kept_bytes = 0
        self._position = 0
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
            line = complete[start:end]
            if self._starts_with_wanted(line):
                self._keep(line)

    def _starts_with_wanted(self, line: bytes) -> bool:
        if line[:1] in (b" ", b"\t"):
            line = line.lstrip(b" \t")  # blanks before a name are allowed, as the extraction does
        for name in self._names:
            if line.startswith(name) and line[len(name) : len(name) + 1] in (b"{", b" ", b"\t"):
                return True
        return False

    def _source_of(self, line: bytes) -> bytes:
        needle = self._source
        if needle is None:
            return b""
        pos = line.find(needle)
        while pos > 0 and line[pos - 1 : pos] not in (b"{", b",", b" ", b"\t"):
            pos = line.find(needle, pos + 1)
        if pos <= 0:
            return b""
        start = pos + len(needle)
        end = line.find(b'"', start)
        return line[start : end if end != -1 else start][:_MAX_SOURCE_BYTES]

    def _keep(self, line: bytes) -> None:
        size = len(line)
        source = self._source_of(line)
        held = self._bytes_by_source
        if source and source not in held and len(held) >= _MAX_SOURCES:
            source = _OTHER_SOURCES  # beyond that many, the rest share one share
        while self._kept_bytes + size > self._max_kept:
            largest = max(held, key=held.__getitem__, default=None)
            if largest is None or largest == source or held[largest] <= held.get(source, 0) + size:
                self.overflowed = True
                return
            self.overflowed = True
            _, dropped = self._kept[largest].pop()
            held[largest] -= len(dropped)
            self._kept_bytes -= len(dropped)
            if not self._kept[largest]:
                del self._kept[largest], held[largest]
        self._kept.setdefault(source, []).append((self._position, line))
        held[source] = held.get(source, 0) + size
        self._kept_bytes += size
        self._position += 1

    def payload(self) -> bytes:
        """The kept lines, in payload order, and the last line if it had no newline."""
        tail = [] if self._skipping else [self._partial]
        if len(self._kept) == 1:
            (only,) = self._kept.values()
            kept = [line for _, line in only]
        else:
            kept = [line for _, line in heapq.merge(*self._kept.values())]
        return b"".join([*kept, *tail])
