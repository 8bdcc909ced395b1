"""Which attribute sets an observable gauge still reports, and which it has stopped reporting.

A gauge's callback is called once per collection. :class:`LiveAttributeSets` counts
those calls and remembers, for every attribute set, the last call that reported it.
A set missing from ``idle_collections`` calls in a row is *expired*: handed back
once, then forgotten. What it holds is therefore bounded by the sets reported in
the last ``idle_collections`` collections, however many have come and gone before.

Before the count, every observation of a gauge not declared ``attributes_encodable`` is
made exportable: a ``str`` key or value holding a lone surrogate would make an exporter
refuse the whole batch, so it is replaced by one whose text encodes (see
:mod:`raylens.safe_text`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable, Mapping

from opentelemetry.metrics import Observation
from opentelemetry.util.types import AttributeValue

from raylens.safe_text import encodable

__all__ = ["LiveAttributeSets", "exportable"]


def _encodable_value(value: AttributeValue) -> AttributeValue:
    if isinstance(value, str):
        return encodable(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_encodable_value(item) for item in value)
    return value


def _needs_repair(attributes: Mapping[str, AttributeValue]) -> bool:
    for key, value in attributes.items():
        # isascii() is a flag lookup: the common all-ASCII label costs no encode.
        if isinstance(value, str) and value.isascii() and isinstance(key, str) and key.isascii():
            continue
        if isinstance(key, str) and encodable(key) is not key:
            return True
        if isinstance(value, str):
            if encodable(value) is not value:
                return True
        elif isinstance(value, (list, tuple)) and _encodable_value(value) != value:
            return True
    return False


def exportable(observation: Observation) -> Observation:
    """``observation`` itself, or a copy whose attribute keys and values encode as UTF-8."""
    attributes = observation.attributes
    if not attributes or not _needs_repair(attributes):
        return observation
    repaired = {
        encodable(key) if isinstance(key, str) else key: _encodable_value(value)
        for key, value in attributes.items()
    }
    context = getattr(observation, "context", None)
    if context is not None:
        return Observation(observation.value, repaired, context)
    return Observation(observation.value, repaired)


def _frozen(value: AttributeValue) -> Hashable:
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(item) for item in value)
    return value


def attribute_key(attributes: Mapping[str, AttributeValue] | None) -> Hashable:
    """A hashable key equal for equal attribute mappings (sequence values included)."""
    if not attributes:
        return frozenset()
    try:
        return frozenset(attributes.items())
    except TypeError:  # a list value
        return frozenset((key, _frozen(value)) for key, value in attributes.items())


class LiveAttributeSets:
    """The attribute sets one gauge reported in its last ``idle_collections`` collections."""

    def __init__(self, idle_collections: int) -> None:
        if isinstance(idle_collections, bool) or not isinstance(idle_collections, int):
            raise ValueError(f"idle_collections must be an int, got {idle_collections!r}")
        if idle_collections < 1:
            raise ValueError(f"idle_collections={idle_collections} must be at least 1")
        self.idle_collections = idle_collections
        self._collection = 0
        # key -> (last collection that reported it, its attributes); oldest first.
        self._last_seen: OrderedDict[Hashable, tuple[int, Mapping[str, AttributeValue]]] = (
            OrderedDict()
        )

    def __len__(self) -> int:
        return len(self._last_seen)

    def collected(self, observations: Iterable[Observation]) -> list[Mapping[str, AttributeValue]]:
        """Record one collection's observations; return the attribute sets that just expired."""
        self._collection += 1
        now = self._collection
        last_seen = self._last_seen
        for observation in observations:
            attributes = observation.attributes or {}
            key = attribute_key(attributes)
            last_seen[key] = (now, attributes)
            last_seen.move_to_end(key)
        expired: list[Mapping[str, AttributeValue]] = []
        oldest_kept = now - self.idle_collections + 1
        while last_seen:
            key, (seen, attributes) = next(iter(last_seen.items()))
            if seen >= oldest_kept:
                break
            last_seen.popitem(last=False)
            expired.append(attributes)
        return expired
