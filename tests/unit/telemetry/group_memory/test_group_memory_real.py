"""Group memory of real processes on this Linux host's /proc.

A stand-in worker process and a child it forks each allocate memory on command;
the group's RSS must grow by that much. Whatever is left is killed in teardown.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

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


def _expect(worker: subprocess.Popen[str], answer: str, timeout: float = 30.0) -> None:
    assert worker.stdout is not None
    deadline = time.monotonic() + timeout
    ready: list = []
    while not ready and time.monotonic() < deadline:
        ready, _, _ = select.select([worker.stdout], [], [], max(0.0, deadline - time.monotonic()))
    assert ready, f"the worker did not say {answer!r} within {timeout} s"
    assert worker.stdout.readline().strip() == answer


def _ask(worker: subprocess.Popen[str], command: str) -> None:
    assert worker.stdin is not None
    worker.stdin.write(command + "\n")
    worker.stdin.flush()
    _expect(worker, "done")


@pytest.fixture
def worker() -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(ALLOCATED_MB)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


def _rss(reader: GroupMemoryReader, workers: list[GroupWorker]) -> tuple[int, int]:
    (group,) = reader.read(workers).groups
    return group.rss_bytes, group.process_count


@pytest.mark.slow
def test_group_rss_grows_by_what_its_worker_tree_allocates(worker: subprocess.Popen[str]):
    procfs = ProcFS()
    workers = [GroupWorker("policy", worker.pid, procfs.start_ticks(worker.pid))]
    reader = GroupMemoryReader(procfs, pss_interval_seconds=3600.0)
    _expect(worker, "ready")
    before, processes_before = _rss(reader, workers)

    _ask(worker, "self")
    after_self, _ = _rss(reader, workers)
    _ask(worker, "child")
    after_child, processes_after = _rss(reader, workers)

    expected = ALLOCATED_MB * MB
    assert abs((after_self - before) - expected) <= 0.1 * expected, (before, after_self)
    assert abs((after_child - after_self) - expected) <= 0.1 * expected, (after_self, after_child)
    assert processes_before == processes_after == 2


def test_own_process_identity_matches_procfs():
    pid, ticks = own_process_identity()
    assert pid == os.getpid()
    assert ticks is not None and ticks == ProcFS().start_ticks(pid)
