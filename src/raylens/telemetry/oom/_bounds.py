"""Keeping one post-mortem under its size bound, however many groups a node holds.

A node may carry hundreds of worker groups, each with ten minutes of samples; written
whole, one post-mortem would run to megabytes. :func:`fit_document` keeps the
:data:`MAX_GROUPS_SHOWN` groups that matter (the largest at the kill, then the fastest
growing), sums the rest into one ``other_groups`` series, and thins every series
(every other point, the last one always kept) until the JSON text is at most
:data:`MAX_POSTMORTEM_BYTES`. Pure: plain data in, plain data out.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["MAX_GROUPS_SHOWN", "MAX_POSTMORTEM_BYTES", "encode", "fit_document", "fit_groups"]

#: Largest post-mortem written, in bytes of JSON.
MAX_POSTMORTEM_BYTES = 256 * 1024
#: Most groups a post-mortem shows one by one; the rest are summed.
MAX_GROUPS_SHOWN = 16
_THINNINGS = 12
_SERIES_KEYS = ("node_used", "outside_groups", "other_groups")


def encode(document: dict[str, Any]) -> str:
    """The document as the file holds it (compact JSON, no NaN)."""
    return json.dumps(document, separators=(",", ":"), allow_nan=False)


def _last(series: dict[str, Any] | None) -> float:
    if not series:
        return 0.0
    samples = series.get("samples") or []
    if samples:
        return float(samples[-1][1])
    buckets = series.get("buckets") or []
    return float(buckets[-1][3]) if buckets else 0.0


def _growth(series: dict[str, Any] | None) -> float:
    samples = (series or {}).get("samples") or []
    return float(samples[-1][1]) - float(samples[0][1]) if len(samples) > 1 else 0.0


def _summed(series: list[dict[str, Any]]) -> dict[str, Any]:
    """Samples at the same moment added up (a node's groups are read together)."""
    totals: dict[float, float] = {}
    for one in series:
        for when, value in one.get("samples") or []:
            totals[when] = totals.get(when, 0.0) + value
    return {"samples": [[when, round(totals[when])] for when in sorted(totals)], "buckets": []}


def fit_groups(
    groups: dict[str, dict[str, Any]],
) -> tuple[dict[str, dict[str, Any]], dict[str, Any] | None]:
    """``(groups shown, other groups or None)``: the largest and fastest-growing kept."""
    if len(groups) <= MAX_GROUPS_SHOWN:
        return groups, None
    largest = sorted(groups, key=lambda name: (-_last(groups[name]), name))
    growing = sorted(groups, key=lambda name: (-_growth(groups[name]), name))
    half = MAX_GROUPS_SHOWN // 2
    chosen = list(dict.fromkeys([*largest[:half], *growing]))[:MAX_GROUPS_SHOWN]
    shown = {name: groups[name] for name in sorted(chosen)}
    rest = [groups[name] for name in groups if name not in shown]
    other = _summed(rest)
    other["groups"] = len(rest)
    return shown, other


def _thin(series: dict[str, Any] | None) -> None:
    if not series:
        return
    for key in ("samples", "buckets"):
        points = series.get(key) or []
        if len(points) > 2:
            series[key] = [*points[:-1:2], points[-1]]


def fit_document(document: dict[str, Any]) -> str:
    """The document's JSON text, its series thinned until it fits :data:`MAX_POSTMORTEM_BYTES`.

    ``document`` is changed in place. Past a dozen thinnings the histories are dropped
    (``history_dropped``), so the bound holds whatever the input.
    """
    text = encode(document)
    for _ in range(_THINNINGS):
        if len(text.encode("utf-8")) <= MAX_POSTMORTEM_BYTES:
            return text
        for key in _SERIES_KEYS:
            _thin(document.get(key))
        for series in (document.get("worker_groups") or {}).values():
            _thin(series)
        document["thinned"] = True
        text = encode(document)
    if len(text.encode("utf-8")) > MAX_POSTMORTEM_BYTES:
        for key in _SERIES_KEYS:
            document[key] = None
        document["worker_groups"] = {}
        document["history_dropped"] = True
        text = encode(document)
    return text
