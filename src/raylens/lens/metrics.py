"""The vocabulary of metrics raylens records.

Every module that exports a series declares it once as a :class:`RecordedMetric`
and registers it with :func:`register_recorded_metrics`. The registry makes two
modules that both mean ``rl.host.memory.used`` agree on its kind, unit and
description, and fails loudly when they do not.

State: the registry of declared metrics; :func:`reset_recorded_metrics` clears it.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from raylens import forking

OBSERVABLE_GAUGE = "observable_gauge"
OBSERVABLE_COUNTER = "observable_counter"
GAUGE = "gauge"
COUNTER = "counter"
UP_DOWN_COUNTER = "up_down_counter"
HISTOGRAM = "histogram"

METRIC_KINDS = frozenset(
    {OBSERVABLE_GAUGE, OBSERVABLE_COUNTER, GAUGE, COUNTER, UP_DOWN_COUNTER, HISTOGRAM}
)


def registry_key(name: str) -> str:
    """The short key a metric is filed under: ``rl.host.memory.used`` -> ``host_memory_used``.

    A leading ``rl.`` is dropped and every remaining dot becomes an underscore.
    """
    if name.startswith("rl."):
        name = name[3:]
    return name.replace(".", "_")


@dataclass(frozen=True)
class RecordedMetric:
    """One metric raylens exports: its OpenTelemetry name, instrument kind, unit and meaning."""

    name: str
    kind: str
    unit: str
    description: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"metric name must be a non-empty string, got {self.name!r}")
        if self.kind not in METRIC_KINDS:
            raise ValueError(
                f"metric {self.name!r} has kind {self.kind!r}; "
                f"allowed kinds are {', '.join(sorted(METRIC_KINDS))}"
            )

    @property
    def key(self) -> str:
        """This metric's :func:`registry_key`."""
        return registry_key(self.name)


_REGISTRY: dict[str, RecordedMetric] = {}
_REGISTRY_LOCK = threading.Lock()
forking.renew_lock_in_child(sys.modules[__name__], "_REGISTRY_LOCK")


def register_recorded_metrics(rows: Iterable[RecordedMetric]) -> None:
    """Declare metrics. Declaring an identical row again is a no-op.

    Raises ValueError, naming both declarations, when a name is already declared
    with a different kind, unit or description. Nothing is registered then.
    """
    rows = list(rows)
    with _REGISTRY_LOCK:
        pending: dict[str, RecordedMetric] = {}
        for row in rows:
            if not isinstance(row, RecordedMetric):
                raise TypeError(f"expected RecordedMetric, got {type(row).__name__}: {row!r}")
            existing = pending.get(row.name) or _REGISTRY.get(row.name)
            if existing is not None and existing != row:
                raise ValueError(
                    f"metric {row.name!r} is already declared as {existing!r}; "
                    f"cannot redeclare it as {row!r}"
                )
            pending[row.name] = row
        _REGISTRY.update(pending)


def recorded_metrics() -> dict[str, RecordedMetric]:
    """A copy of every declared metric, by name."""
    with _REGISTRY_LOCK:
        return dict(_REGISTRY)


def reset_recorded_metrics() -> None:
    """Forget every declaration (tests only; modules re-declare on next use)."""
    with _REGISTRY_LOCK:
        _REGISTRY.clear()
