"""Reading one ``/api/v1/query`` answer: untrusted JSON in, bounded plain rows out.

Whatever the server sends, what comes out is bounded: the body is capped before it is
parsed (by the client), at most ``max_series`` series are kept, only the label keys a
query asked for are read, each label value is made encodable and cut to
:data:`MAX_LABEL_CHARS`, and a series whose value is not a finite, non-negative number
is skipped alone. A malformed answer as a whole raises :class:`QueryError`, naming what
was wrong in a printable line.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any, NamedTuple

from raylens.safe_text import encodable, printable

__all__ = ["MAX_LABEL_CHARS", "QueryError", "Vector", "parse_vector"]

#: Longest label value kept, in characters; a longer one is cut.
MAX_LABEL_CHARS = 256


class QueryError(ValueError):
    """An answer that is not a Prometheus instant-query vector, or says the query failed."""


class Vector(NamedTuple):
    """One instant vector: per series its wanted labels (in the asked order) then its value,
    as one flat tuple; when Prometheus evaluated it (Unix seconds, None when empty); and how
    many series were dropped."""

    rows: list[tuple[Any, ...]]
    evaluated_at: float | None
    dropped: int


def _number(raw: object) -> float | None:
    if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
        return None
    try:
        value = float(raw)
    except (ValueError, OverflowError):
        return None
    return value if math.isfinite(value) else None


def _label(value: object) -> str:
    if not isinstance(value, str):
        return ""
    return encodable(value[:MAX_LABEL_CHARS])


def _document(body: bytes) -> list[Any]:
    """The ``data.result`` list of a successful instant-vector answer; QueryError otherwise."""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError) as error:
        raise QueryError(f"the answer is not JSON ({printable(str(error))[:120]})") from None
    if not isinstance(document, dict):
        raise QueryError("the answer is not a JSON object")
    status = document.get("status")
    if status != "success":
        kind = _label(document.get("errorType"))[:60]
        said = _label(document.get("error"))[:200]
        raise QueryError(
            printable(f"the query failed: status {str(status)[:20]!r}, {kind or 'no type'}: {said}")
        )
    data = document.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "vector":
        raise QueryError("the answer holds no instant vector (data.resultType is not 'vector')")
    result = data.get("result")
    if not isinstance(result, list):
        raise QueryError("the answer's data.result is not a list")
    return result


def parse_vector(body: bytes, keys: Iterable[str], *, max_series: int) -> Vector:
    """The series of an instant vector answer, bounded; see the module docstring.

    ``keys`` are the labels read from each series (a missing one reads ``""``). Dropped
    are series past ``max_series`` and series without a usable value (not a finite
    number, or negative: Prometheus answers NaN for a gauge a sampler cleared).
    """
    wanted = tuple(keys)
    result = _document(body)
    rows: list[tuple[Any, ...]] = []
    dropped = max(0, len(result) - max_series)
    evaluated_at: float | None = None
    limit = MAX_LABEL_CHARS
    for series in result[:max_series]:
        try:
            metric = series["metric"]
            stamp, raw = series["value"]
            value = float(raw)
            labels = [metric.get(key, "") for key in wanted]
        except (TypeError, KeyError, ValueError, AttributeError, OverflowError):
            dropped += 1
            continue
        if not 0 <= value < math.inf:  # NaN fails both comparisons
            dropped += 1
            continue
        if evaluated_at is None:
            evaluated_at = _number(stamp)
        # Plain short ASCII (nearly every label) is kept as it is; anything else is checked.
        labels = [
            label
            if type(label) is str and len(label) <= limit and label.isascii()
            else _label(label)
            for label in labels
        ]
        labels.append(value)
        rows.append(tuple(labels))
    return Vector(rows, evaluated_at, dropped)
