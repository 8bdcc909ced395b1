"""The one place lens reaches into the OpenTelemetry SDK's private state.

The SDK keeps one aggregation per attribute set an instrument has ever observed,
for as long as its meter provider lives, and counts every one of them against the
cardinality limit. No public call lets an application drop the ones that are gone
(a node that left, a process that restarted under a new pid). For an observable
gauge that is safe to do: its aggregation holds only the value of the current
collection and no start time, so an attribute set created again later exports
exactly what it would have exported had it never been dropped.

Everything here works on one asynchronous gauge instrument and touches, per reader
of its provider, the ``_ViewInstrumentMatch`` objects that hold its aggregations
(``_attributes_aggregation``, guarded by ``_lock``). What it relies on is checked by
looking for it, not by the SDK's version: :func:`layout_gap` names the first piece
missing, and lens then releases gone sets through public API instead (it renews the
pipeline, see ``raylens.lens.runtime``). :func:`cardinality_view` does the same for
the one keyword of a public constructor lens needs that older releases lack.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any

from opentelemetry.sdk.metrics.view import View

__all__ = [
    "cardinality_view",
    "forget_attribute_sets",
    "held_attribute_sets",
    "layout_gap",
    "supported",
]


def _key_function() -> Callable[[Mapping[str, Any]], Hashable] | None:
    """How this SDK turns an attribute dict into the key of its aggregation table."""
    try:
        from opentelemetry.sdk.metrics._internal import _view_instrument_match as module
    except ImportError:
        return None
    hash_attributes = getattr(module, "_hash_attributes", None)
    if callable(hash_attributes):
        return hash_attributes
    # Releases before tagged hashing keyed the table on the frozen items.
    return lambda attributes: frozenset(attributes.items())


_KEY = _key_function()


def _matches(instrument: Any) -> list[Any]:
    """Every ``_ViewInstrumentMatch`` holding aggregations of ``instrument``, over all readers."""
    consumer = instrument._measurement_consumer
    found: list[Any] = []
    for storage in list(consumer._reader_storages.values()):
        found.extend(storage._instrument_view_instrument_matches.get(instrument, ()))
    return found


def layout_gap(instrument: Any) -> str | None:
    """The first piece of SDK state this module uses that ``instrument``'s SDK lacks; None if none."""
    if _KEY is None:
        return "opentelemetry.sdk.metrics._internal._view_instrument_match"
    try:
        consumer = instrument._measurement_consumer
    except AttributeError:
        return "the instrument's _measurement_consumer"
    storages = getattr(consumer, "_reader_storages", None)
    if not isinstance(storages, dict):
        return "MeasurementConsumer._reader_storages"
    for storage in storages.values():
        matches = getattr(storage, "_instrument_view_instrument_matches", None)
        if not isinstance(matches, dict):
            return "MetricReaderStorage._instrument_view_instrument_matches"
        for match in matches.get(instrument, ()):
            if not isinstance(getattr(match, "_attributes_aggregation", None), dict):
                return "_ViewInstrumentMatch._attributes_aggregation"
            if not hasattr(getattr(match, "_lock", None), "__enter__"):
                return "_ViewInstrumentMatch._lock"
            if not hasattr(getattr(match, "_view", None), "_attribute_keys"):
                return "_ViewInstrumentMatch._view._attribute_keys"
    return None


def supported(instrument: Any) -> bool:
    """True when ``instrument``'s SDK state has everything this module uses."""
    return layout_gap(instrument) is None


#: The keyword of ``View`` that sets a cardinality limit (opentelemetry-sdk 1.45.2 on).
CARDINALITY_KEYWORD = "aggregation_cardinality_limit"


def cardinality_view(limit: int, view_type: Callable[..., View] = View) -> tuple[View, str | None]:
    """A view of every instrument with cardinality ``limit``, and a warning when that cannot be.

    Where this SDK's ``View`` takes no such keyword, the view is built without it
    (the SDK's own default limit applies) and the second item says so.
    """
    try:
        keywords = set(inspect.signature(view_type).parameters)
    except (TypeError, ValueError):
        keywords = set()
    if CARDINALITY_KEYWORD in keywords:
        return view_type(instrument_name="*", **{CARDINALITY_KEYWORD: limit}), None
    return view_type(instrument_name="*"), (
        f"this opentelemetry-sdk's View takes no {CARDINALITY_KEYWORD}; the SDK's own "
        f"cardinality limit applies instead of {limit}"
    )


def _table_key(match: Any, attributes: Mapping[str, Any]) -> Hashable:
    assert _KEY is not None
    keys = match._view._attribute_keys
    if keys is not None:
        attributes = {k: v for k, v in attributes.items() if k in keys}
    return _KEY(attributes)


def forget_attribute_sets(instrument: Any, attribute_sets: Iterable[Mapping[str, Any]]) -> int:
    """Drop the SDK's aggregations of ``attribute_sets`` for ``instrument``; return how many.

    Only for an observable gauge whose callbacks no longer report these sets: the
    caller decides which sets are gone. Must run while no collection of the same
    provider is in progress, or from inside the instrument's own callback (the SDK
    runs callbacks under its collection lock, before the new measurements land).
    """
    sets = list(attribute_sets)
    if not sets:
        return 0
    removed = 0
    for match in _matches(instrument):
        with match._lock:
            table = match._attributes_aggregation
            for attributes in sets:
                if table.pop(_table_key(match, attributes), None) is not None:
                    removed += 1
    return removed


def held_attribute_sets(instrument: Any) -> int:
    """How many aggregations the SDK holds for ``instrument``, summed over its readers."""
    return sum(len(match._attributes_aggregation) for match in _matches(instrument))
