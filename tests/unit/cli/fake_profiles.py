"""The profiler ``raylens profile`` runs over a fake ``/proc``, for the CLI tests beside it."""

from __future__ import annotations

from typing import Any

from raylens.telemetry.process_memory import (
    HostMemory,
    MemoryProfiler,
    ServerMemoryTarget,
    collect_process_tree_memory,
)
from raylens_fakes.procfs import FakeProcFS


def profiler_over(fake: FakeProcFS, interval: float, **options: Any) -> MemoryProfiler:
    """The profiler ``raylens profile`` runs for a command at pid 100, every ``interval``
    seconds, reading nothing but ``fake``'s ``/proc``."""
    target = ServerMemoryTarget("train", "command", 100, procfs=fake.procfs)
    return MemoryProfiler(
        [target],
        interval,
        collector=lambda pid, **kw: collect_process_tree_memory(pid, procfs=fake.procfs, **kw),
        host_collector=lambda: HostMemory(1, 2, 3),
        procfs=fake.procfs,
        **options,
    )
