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
(``_attributes_aggregation``, guarded by ``_lock``). It was written against, and is
tested with, the SDK versions in :data:`TESTED_SDK_VERSIONS`. On any other layout
:func:`supported` says so and lens falls back to the cardinality limit alone.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any

__all__ = [
    "TESTED_SDK_VERSIONS",
    "forget_attribute_sets",
    "held_attribute_sets",
    "supported",
]

# The opentelemetry-sdk releases this module was checked against (pyproject pins the same range).
TESTED_SDK_VERSIONS = ">=1.45,<1.46"


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


def supported(instrument: Any) -> bool:
    """True when ``instrument``'s SDK state has the layout this module expects."""
    if _KEY is None:
        return False
    try:
        consumer = instrument._measurement_consumer
        storages = consumer._reader_storages
        for storage in storages.values():
            if not isinstance(storage._instrument_view_instrument_matches, dict):
                return False
            for match in storage._instrument_view_instrument_matches.get(instrument, ()):
                if not isinstance(match._attributes_aggregation, dict):
                    return False
                if not hasattr(match._lock, "__enter__") or not hasattr(match, "_view"):
                    return False
    except AttributeError:
        return False
    return True


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
