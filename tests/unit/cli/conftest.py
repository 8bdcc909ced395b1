"""Fixtures for the CLI tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from raylens.telemetry.process_memory import (
    HostMemory,
    MemoryProfiler,
    ServerMemoryTarget,
    collect_process_tree_memory,
)
from raylens_fakes.procfs import FakeProcFS


def _profiler_over(fake: FakeProcFS, interval: float, **options: Any) -> MemoryProfiler:
    target = ServerMemoryTarget("train", "command", 100, procfs=fake.procfs)
    return MemoryProfiler(
        [target],
        interval,
        collector=lambda pid, **kw: collect_process_tree_memory(pid, procfs=fake.procfs, **kw),
        host_collector=lambda: HostMemory(1, 2, 3),
        procfs=fake.procfs,
        **options,
    )


@pytest.fixture
def profiler_over() -> Callable[..., MemoryProfiler]:
    """``profiler_over(fake, interval, **options)``: the profiler ``raylens profile`` runs for
    a command at pid 100, reading nothing but ``fake``'s ``/proc``."""
    return _profiler_over
