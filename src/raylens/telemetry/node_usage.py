"""A node's used memory as Ray's memory monitor counts it, read locally by the node's sampler.

Ray 2.60 counts a node's used memory in one of two ways, and its memory monitor kills
workers when that figure crosses the line it draws from the matching total:

- in a container (the cgroup's memory files exist): the cgroup's usage less its page cache,
  ``memory.current - inactive_file - active_file`` (cgroup v2; v1 reads
  ``memory.usage_in_bytes`` and the ``total_`` keys), against the cgroup's limit capped at
  the machine's total;
- otherwise: ``MemTotal - MemAvailable`` from ``/proc/meminfo``.

:func:`read_node_usage` gives both totals (the machine's, and the container's limit where
there is one), so the kill line is drawn from the smaller. Files are read through the
sampler's procfs opener (the seam tests use), each in one bounded read. Nothing here raises
for a missing or malformed file: the figure it would have given is absent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from raylens.telemetry.procfs import read_small_file

__all__ = ["CGROUP_ROOT", "NodeUsage", "read_node_usage"]

CGROUP_ROOT = "/sys/fs/cgroup"
_KIB = 1024
#: A cgroup "limit" at or above this is no limit (v1 reports about 2**63 when unset).
_NO_LIMIT = 1 << 62

Opener = Callable[[str, int], int]


class NodeUsage(NamedTuple):
    """One reading of a node: ``used`` bytes (Ray's figure), the machine's total and the
    container's limit (None outside a container, or with no limit set)."""

    used: float
    host_total: float
    cgroup_total: float | None


def _number(raw: bytes) -> int | None:
    digits = raw.strip()
    return int(digits) if digits.isdigit() and len(digits) <= 20 else None


def _fields(text: bytes, wanted: tuple[bytes, ...]) -> dict[bytes, int]:
    """``{key: value}`` of the ``key value`` (or ``key: value kB``) lines named in ``wanted``."""
    found: dict[bytes, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(b" ")
        name = name.rstrip(b":")
        if name in wanted:
            value = _number(rest.strip().split(b" ")[0])
            if value is not None:
                found[name] = value
    return found


def _host(procfs_root: str, opener: Opener | None) -> tuple[int, int] | None:
    """``(used, total)`` from ``meminfo``, or None."""
    text = read_small_file(f"{procfs_root.rstrip('/')}/meminfo", opener)
    if text is None:
        return None
    found = _fields(text, (b"MemTotal", b"MemAvailable"))
    if b"MemTotal" not in found or b"MemAvailable" not in found:
        return None
    total = found[b"MemTotal"] * _KIB
    return max(0, total - found[b"MemAvailable"] * _KIB), total


def _cgroup(root: str, opener: Opener | None) -> tuple[int, int | None] | None:
    """``(used, limit or None)`` of the container, or None outside one (or unreadable)."""
    base = root.rstrip("/")
    for usage_file, stat_file, limit_file, keys in (
        (
            f"{base}/memory.current",
            f"{base}/memory.stat",
            f"{base}/memory.max",
            (b"inactive_file", b"active_file"),
        ),
        (
            f"{base}/memory/memory.usage_in_bytes",
            f"{base}/memory/memory.stat",
            f"{base}/memory/memory.limit_in_bytes",
            (b"total_inactive_file", b"total_active_file"),
        ),
    ):
        usage_text = read_small_file(usage_file, opener)
        stat_text = None if usage_text is None else read_small_file(stat_file, opener)
        if usage_text is None or stat_text is None:
            continue
        usage = _number(usage_text)
        stat = _fields(stat_text, keys)
        if usage is None or len(stat) != len(keys):
            return None
        limit_text = read_small_file(limit_file, opener)
        limit = None if limit_text is None else _number(limit_text)
        if limit is not None and (limit <= 0 or limit >= _NO_LIMIT):
            limit = None
        return max(0, usage - sum(stat.values())), limit
    return None


def read_node_usage(
    procfs_root: str = "/proc",
    *,
    cgroup_root: str | None = CGROUP_ROOT,
    opener: Opener | None = None,
) -> NodeUsage | None:
    """The node's used memory and totals, as the module docstring says; None when unreadable.

    ``cgroup_root`` None reads the machine's figure only. Never raises.
    """
    host = _host(procfs_root, opener)
    if host is None:
        return None
    host_used, host_total = host
    container = None if cgroup_root is None else _cgroup(cgroup_root, opener)
    if container is None:
        return NodeUsage(float(host_used), float(host_total), None)
    used, limit = container
    cgroup_total = None if limit is None else float(min(limit, host_total))
    return NodeUsage(float(used), float(host_total), cgroup_total)
