"""Soak: 20,000 server restarts through one profiler leave it holding only the live servers.

Each restart gives a server a new pid and a new name (a new replica), so every structure keyed
by server or process would grow by one entry per restart if anything kept departed servers.
Entries are counted, not bytes: a count cannot be fooled by the allocator keeping freed memory.
"""

from __future__ import annotations

import pytest

from raylens.telemetry import process_memory as pm
from raylens.telemetry.process_memory import HostMemory, MemoryProfiler, ServerMemoryTarget
from raylens_fakes.otel import MetricsProbe
from raylens_fakes.procfs import PAGE_SIZE, FakeProcFS

RESTARTS = 20_000
LIVE = 4
CHECK_EVERY = 1_000  # restarts between two counts (and two collections)


def held_entries(profiler: MemoryProfiler) -> dict[str, int]:
    """Every per-server structure of the profiler and of the export snapshot, by size."""
    return {
        "targets": len(profiler.targets),
        "peaks": len(profiler._peaks),
        "carried pss": len(profiler._pss),
        "pss attempts": len(profiler._pss_attempted),
        "exported servers": pm.DEFAULT_SERIES.entry_count(),
        "latest servers": len(profiler.latest().servers),
    }


@pytest.mark.soak
def test_restarts_leave_only_live_servers_behind(tmp_path, raylens_state):
    fake = FakeProcFS(tmp_path / "proc")
    fake.add_process(10)  # the launcher the servers hang off
    pids = [
        fake.add_process(1000 + slot, parent=10, rss_bytes=8 * PAGE_SIZE) for slot in range(LIVE)
    ]
    targets = [
        ServerMemoryTarget(f"replica-{slot}", "vllm", pid, procfs=fake.procfs)
        for slot, pid in enumerate(pids)
    ]
    profiler = MemoryProfiler(
        targets,
        3600,
        host_collector=lambda: HostMemory(6, 10, 16),
        procfs=fake.procfs,
        pss_interval_seconds=3600,
    )
    next_pid = 1000 + LIVE
    largest: dict[str, int] = {}
    with MetricsProbe() as probe:
        for restart in range(RESTARTS):
            slot = restart % LIVE
            old = targets[slot]
            fake.restart(old.pid, next_pid)
            profiler.remove_target(old)
            targets[slot] = ServerMemoryTarget(
                f"replica-{restart + LIVE}", "vllm", next_pid, procfs=fake.procfs
            )
            profiler.add_target(targets[slot])
            next_pid += 1
            if slot == LIVE - 1:
                profiler.sample_once()  # one sample per round: every server restarted once
            if (restart + 1) % CHECK_EVERY == 0:
                for name, count in held_entries(profiler).items():
                    largest[name] = max(largest.get(name, 0), count)
                probe.collect()
                exported = probe.points("gym.server.processes")
                assert {dict(a)["process.pid"] for a in exported} == {t.pid for t in targets}

    assert largest == {
        "targets": LIVE,
        "peaks": 2 * LIVE,
        "carried pss": LIVE,
        "pss attempts": LIVE,
        "exported servers": LIVE,
        "latest servers": LIVE,
    }
