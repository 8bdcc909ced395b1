"""Group memory of real processes on this Linux host's /proc.

A stand-in worker process and a child it forks each allocate memory on command;
the group's RSS must grow by that much. Whatever is left is killed in teardown.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest

from raylens.telemetry.group_memory import GroupMemoryReader, GroupWorker, own_process_identity
from raylens.telemetry.process_memory import ProcFS

pytestmark = pytest.mark.usefixtures("real_process_trees")

MB = 2**20
ALLOCATED_MB = 50

# The worker forks a child at once, then says "ready". On "self" it allocates (and
# writes) ALLOCATED_MB itself; on "child" its child does. Each command answers
# "done" once the memory is resident. EOF on stdin ends the worker and its child.
WORKER = r"""
import os, sys
size = int(sys.argv[1]) << 20
held = []
command_r, command_w = os.pipe()
ack_r, ack_w = os.pipe()
if os.fork() == 0:
    os.close(command_w)
    while os.read(command_r, 1):
        held.append(b"\x01" * size)
        os.write(ack_w, b"x")
    os._exit(0)
os.close(command_r)
print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "self":
        held.append(b"\x01" * size)
    else:
        os.write(command_w, b"x")
        os.read(ack_r, 1)
    print("done", flush=True)
"""


def _rss(reader: GroupMemoryReader, workers: list[GroupWorker]) -> tuple[int, int]:
    (group,) = reader.read(workers).groups
    return group.rss_bytes, group.process_count


@pytest.mark.slow
def test_group_rss_grows_by_what_its_worker_tree_allocates(spawn: Callable[..., Any]):
    worker = spawn(WORKER, ALLOCATED_MB)
    assert worker.first_line == "ready"
    procfs = ProcFS()
    workers = [GroupWorker("policy", worker.pid, procfs.start_ticks(worker.pid))]
    reader = GroupMemoryReader(procfs, pss_interval_seconds=3600.0)
    before, processes_before = _rss(reader, workers)

    assert worker.send("self") == "done"
    after_self, _ = _rss(reader, workers)
    assert worker.send("child") == "done"
    after_child, processes_after = _rss(reader, workers)

    expected = ALLOCATED_MB * MB
    assert abs((after_self - before) - expected) <= 0.1 * expected, (before, after_self)
    assert abs((after_child - after_self) - expected) <= 0.1 * expected, (after_self, after_child)
    assert processes_before == processes_after == 2


def test_own_process_identity_matches_procfs():
    pid, ticks = own_process_identity()
    assert pid == os.getpid()
    assert ticks is not None and ticks == ProcFS().start_ticks(pid)
