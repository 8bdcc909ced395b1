"""The kernel's OOM-kill count for the node (or container) a sampler runs on.

Two places hold it: a cgroup v2 container's ``memory.events`` (``oom_kill N``: kills
inside this cgroup and below it) and ``/proc/vmstat`` (``oom_kill N``: every kill on
the machine since boot). The container's figure is preferred where it exists, since a
kill elsewhere on the machine did not touch this node's workers; the root cgroup has
no ``memory.events``, so on a plain host the machine's count is read. Both files are
read through the opener of the sampler's procfs reader, the seam tests use to refuse
or fake reads; the files are small and read in one call, with a size cap.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from raylens.telemetry.procfs import read_small_file

__all__ = [
    "CGROUP_ROOT",
    "SOURCE_CGROUP",
    "SOURCE_VMSTAT",
    "KernelOomCount",
    "read_kernel_oom_count",
]

CGROUP_ROOT = "/sys/fs/cgroup"
SOURCE_CGROUP = "cgroup"
SOURCE_VMSTAT = "vmstat"
_KEY = b"oom_kill"

Opener = Callable[[str, int], int]


class KernelOomCount(NamedTuple):
    """The kernel's count of OOM kills and where it was read (:data:`SOURCE_CGROUP` or ``_VMSTAT``)."""

    kills: int
    source: str


def _field(text: bytes) -> int | None:
    for line in text.splitlines():
        name, _, value = line.partition(b" ")
        if name == _KEY:
            digits = value.strip()
            return int(digits) if digits.isdigit() and len(digits) <= 20 else None
    return None


def read_kernel_oom_count(
    procfs_root: str = "/proc",
    *,
    cgroup_root: str | None = CGROUP_ROOT,
    opener: Opener | None = None,
) -> KernelOomCount | None:
    """The kernel's OOM-kill count here, or None when neither file gives one. Never raises.

    ``cgroup_root`` None skips the container's figure.
    """
    if cgroup_root is not None:
        events = read_small_file(f"{cgroup_root.rstrip('/')}/memory.events", opener)
        kills = None if events is None else _field(events)
        if kills is not None:
            return KernelOomCount(kills, SOURCE_CGROUP)
    vmstat = read_small_file(f"{procfs_root.rstrip('/')}/vmstat", opener)
    kills = None if vmstat is None else _field(vmstat)
    return None if kills is None else KernelOomCount(kills, SOURCE_VMSTAT)
