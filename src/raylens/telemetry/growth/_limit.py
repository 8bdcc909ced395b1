"""The kill line of a node and the time left before memory reaches it.

The line is drawn as Ray's memory monitor draws it: the smaller of the host's and the
container's total times ``memory_usage_threshold``, raised by ``min_memory_free_bytes``,
the total itself when the monitor is off. The threshold, first match wins:

1. a value raylens is given (keyword, or ``RAYLENS_MEMORY_USAGE_THRESHOLD``), which raises
   when bad;
2. the cluster's system config, as the GCS holds it;
3. ``RAY_memory_usage_threshold`` in the driver's environment;
4. Ray's default, 0.95.

A value from 2 or 3 that Ray would refuse is skipped, never raised. Why each source, and the
other two settings: ``docs/architecture.md``, *Memory over time*, *The kill line*.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from raylens.safe_text import printable

__all__ = [
    "DEFAULT_MEMORY_USAGE_THRESHOLD",
    "RAY_THRESHOLD_ENV",
    "THRESHOLD_ENV",
    "KillLineConfig",
    "kill_line",
    "resolve_kill_line_config",
    "time_to_limit",
]

DEFAULT_MEMORY_USAGE_THRESHOLD = 0.95
#: raylens' own setting for the threshold; wins over what the cluster says.
THRESHOLD_ENV = "RAYLENS_MEMORY_USAGE_THRESHOLD"
#: The variable Ray's raylets read the threshold from.
RAY_THRESHOLD_ENV = "RAY_memory_usage_threshold"
_RAY_MIN_FREE_ENV = "RAY_min_memory_free_bytes"
_RAY_REFRESH_ENV = "RAY_memory_monitor_refresh_ms"


@dataclass(frozen=True)
class KillLineConfig:
    """How a node's kill line is drawn, and where each part was learnt.

    ``threshold`` is a fraction in (0, 1]; ``min_free_bytes`` is None unless Ray keeps a
    fixed amount free; ``monitor`` is False when Ray's memory monitor is off (the kernel's
    OOM killer at the total is then the line). ``source`` names where the threshold came
    from; ``ignored`` lists values that were refused, each with why (printable text).
    """

    threshold: float = DEFAULT_MEMORY_USAGE_THRESHOLD
    min_free_bytes: float | None = None
    monitor: bool = True
    source: str = "Ray's default"
    ignored: tuple[str, ...] = ()

    def limit(self, host_total: float | None, cgroup_total: float | None = None) -> float | None:
        """The kill line for a node with these totals; see :func:`kill_line`."""
        return kill_line(
            host_total,
            cgroup_total,
            threshold=self.threshold if self.monitor else 1.0,
            min_free_bytes=self.min_free_bytes if self.monitor else None,
        )


def _fraction(raw: object) -> float | None:
    if isinstance(raw, bool):
        return None
    try:
        value = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) and 0 < value <= 1 else None


#: What a threshold written in the environment may hold: ASCII decimal notation only
#: (``float`` alone also reads other scripts' digits, full-width digits and underscores).
_DECIMAL_CHARS = frozenset("0123456789.eE+-")


def _env_fraction(raw: str) -> float | None:
    text = raw.strip()
    if not text or not set(text) <= _DECIMAL_CHARS:
        return None
    return _fraction(text)


def _integer(raw: object) -> int | None:
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return raw
    if isinstance(raw, float) and raw.is_integer():
        return int(raw)
    if isinstance(raw, str):
        try:
            return int(raw.strip())
        except ValueError:
            return None
    return None


def resolve_kill_line_config(
    *,
    threshold: float | None = None,
    system_config: Mapping[str, object] | None = None,
    env: Mapping[str, str] | None = None,
    strict: bool = True,
) -> KillLineConfig:
    """Work out the kill line's parameters, in the order the module docstring gives.

    ``threshold`` and ``RAYLENS_MEMORY_USAGE_THRESHOLD`` are the user's: a bad value raises
    ValueError naming it and what is allowed (a number above 0 and at most 1, the variable
    in ASCII decimal notation). With ``strict`` False a bad variable is listed in
    ``ignored`` instead and the next source decides (a caller that has reported the error
    and carries on: the cluster's own line still holds). The cluster's
    system config and the driver's ``RAY_*`` variables are not raylens' to refuse: a value
    there that Ray itself would not accept is skipped and listed in ``ignored``.
    """
    environ = os.environ if env is None else env
    ignored: list[str] = []
    config = system_config or {}

    def cluster_or_env(key: str, variable: str) -> tuple[object, str] | None:
        if key in config:
            return config[key], "the cluster's system config"
        raw = environ.get(variable, "")
        if raw.strip():
            return raw, f"{variable} in the driver's environment"
        return None

    monitor = True
    refresh = cluster_or_env("memory_monitor_refresh_ms", _RAY_REFRESH_ENV)
    if refresh is not None:
        value = _integer(refresh[0])
        if value is None or value < 0:
            ignored.append(
                f"memory_monitor_refresh_ms={printable(repr(refresh[0]))[:80]} from {refresh[1]}"
            )
        else:
            monitor = value > 0

    min_free: float | None = None
    free = cluster_or_env("min_memory_free_bytes", _RAY_MIN_FREE_ENV)
    if free is not None:
        value = _integer(free[0])
        if value is None or value < -1:
            ignored.append(f"min_memory_free_bytes={printable(repr(free[0]))[:80]} from {free[1]}")
        elif value >= 0:
            min_free = float(value)

    if threshold is not None:
        chosen = _fraction(threshold)
        if chosen is None:
            raise ValueError(
                f"threshold must be a number above 0 and at most 1, got {threshold!r:.80}"
            )
        return KillLineConfig(
            chosen, min_free, monitor, "the threshold raylens was given", tuple(ignored)
        )
    raw = environ.get(THRESHOLD_ENV, "")
    if raw.strip():
        chosen = _env_fraction(raw)
        if chosen is not None:
            return KillLineConfig(chosen, min_free, monitor, THRESHOLD_ENV, tuple(ignored))
        if strict:
            raise ValueError(
                f"{THRESHOLD_ENV}={printable(repr(raw))[:80]} is not allowed; allowed: a "
                "number above 0 and at most 1, in ASCII decimal notation"
            )
        ignored.append(f"{THRESHOLD_ENV}={printable(repr(raw))[:80]}")
    candidates: list[tuple[object, str]] = []
    if "memory_usage_threshold" in config:
        candidates.append((config["memory_usage_threshold"], "the cluster's system config"))
    if environ.get(RAY_THRESHOLD_ENV, "").strip():
        candidates.append(
            (environ[RAY_THRESHOLD_ENV], f"{RAY_THRESHOLD_ENV} in the driver's environment")
        )
    for candidate, source in candidates:
        chosen = _fraction(candidate)
        if chosen is not None:
            return KillLineConfig(chosen, min_free, monitor, source, tuple(ignored))
        ignored.append(f"memory_usage_threshold={printable(repr(candidate))[:80]} from {source}")
    return KillLineConfig(
        DEFAULT_MEMORY_USAGE_THRESHOLD, min_free, monitor, "Ray's default", tuple(ignored)
    )


def _positive(value: float | None) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    number = float(value)
    return number if math.isfinite(number) and number > 0 else None


def kill_line(
    host_total: float | None,
    cgroup_total: float | None = None,
    *,
    threshold: float = DEFAULT_MEMORY_USAGE_THRESHOLD,
    min_free_bytes: float | None = None,
) -> float | None:
    """Bytes of used memory at which the node's workers get killed.

    ``min(host_total, cgroup_total) * threshold``, raised to ``total - min_free_bytes`` when
    that is higher, as Ray's memory monitor draws it. A total that is missing, not finite or
    not positive is left out; with neither there is no line (None). A cgroup "limit" larger
    than the host (an unlimited container reports a huge number) does not raise the line.
    """
    totals = [t for t in (_positive(host_total), _positive(cgroup_total)) if t is not None]
    if not totals:
        return None
    total = min(totals)
    line = total * threshold
    if min_free_bytes is not None and 0 <= min_free_bytes <= total:
        line = max(line, total - min_free_bytes)
    return line


def time_to_limit(
    limit: float | None, used: float | None, growth: float | None, growing: bool
) -> float | None:
    """Seconds until ``used`` reaches ``limit`` at ``growth`` bytes/s, only while growing.

    None when the series is not growing, when a figure is missing, or when the growth is not
    positive. 0 when memory is already at or past the line.
    """
    if not growing or limit is None or used is None or growth is None:
        return None
    if not (math.isfinite(limit) and math.isfinite(used) and math.isfinite(growth)) or growth <= 0:
        return None
    return max(0.0, (limit - used) / growth)
