"""Process-tree memory of real processes on this Linux host.

Each test spawns small Python process trees (tens of MB) and kills whatever is
left of them in teardown.
"""

from __future__ import annotations

import mmap
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from raylens.telemetry.process_memory import (
    HostMemory,
    MemoryProfiler,
    ServerMemoryTarget,
    _descendant_pids,
    collect_process_tree_memory,
)

pytestmark = pytest.mark.usefixtures("real_process_trees")

MB = 2**20
PRIVATE_MB = 16
SHARED_MB = 32
HOST = HostMemory(1, 1, 2)

# A parent that maps SHARED_MB of shared anonymous memory and writes it, forks
# children that each write PRIVATE_MB of their own, writes PRIVATE_MB itself,
# then prints the children's pids. On a "touch" line the first child reads every
# page of the shared mapping (so it becomes resident there too). EOF on stdin
# ends the whole tree.
TREE = r"""
import mmap, os, sys
MB = 1 << 20
private_mb, shared_mb, children = (int(arg) for arg in sys.argv[1:4])
shared = mmap.mmap(-1, shared_mb * MB)
for offset in range(0, len(shared), mmap.PAGESIZE):
    shared[offset] = 1
ready_r, ready_w = os.pipe()
commands, pids = [], []
for _ in range(children):
    command_r, command_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        for fd in [command_w, ready_r, *commands]:
            os.close(fd)
        private = bytearray(b"\x01") * (private_mb * MB)
        os.write(ready_w, b"r")
        while True:
            command = os.read(command_r, 1)
            if not command:
                os._exit(0)
            total = sum(shared[o] for o in range(0, len(shared), mmap.PAGESIZE))
            os.write(ready_w, b"t" if total else b"?")
    os.close(command_r)
    commands.append(command_w)
    pids.append(pid)
private = bytearray(b"\x01") * (private_mb * MB)
for _ in range(children):
    os.read(ready_r, 1)
print(" ".join(map(str, pids)), flush=True)
for line in sys.stdin:
    if line.strip() == "touch":
        os.write(commands[0], b"t")
        print("touched" if os.read(ready_r, 1) == b"t" else "failed", flush=True)
for fd in commands:
    os.close(fd)
for pid in pids:
    os.waitpid(pid, 0)
"""

# Forks children that exit at once, as fast as it can, until stdin reaches EOF.
#: How long the churn test samples at most while waiting to catch a short-lived child.
CHURN_DEADLINE_S = 120.0
CHURN = r"""
import os, select, sys
print("ready", flush=True)
while not select.select([sys.stdin], [], [], 0)[0]:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
"""

# Starts a child from a second thread, prints "<child pid> <thread id>", waits for EOF.
# Starts a child from a second thread that stays alive (a thread's children move to
# another thread when it exits), prints "<child pid> <thread id>", waits for EOF.
THREADED = r"""
import subprocess, sys, threading
found, spawned, release = {}, threading.Event(), threading.Event()
def spawn():
    found["tid"] = threading.get_native_id()
    found["child"] = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    spawned.set()
    release.wait()
thread = threading.Thread(target=spawn)
thread.start()
spawned.wait()
print(found["child"].pid, found["tid"], flush=True)
sys.stdin.read()
release.set()
found["child"].stdin.close()
found["child"].wait()
"""


@pytest.mark.slow
def test_parent_and_three_children(spawn):
    tree = spawn(TREE, PRIVATE_MB, SHARED_MB, 3)
    children = {int(pid) for pid in tree.first_line.split()}
    assert _descendant_pids(tree.pid) == {tree.pid, *children}

    memory = collect_process_tree_memory(tree.pid)
    private_total = 4 * PRIVATE_MB * MB
    assert memory.process_count == 4
    assert memory.rss_bytes >= private_total + SHARED_MB * MB
    assert memory.pss_bytes is not None
    assert private_total <= memory.pss_bytes <= memory.rss_bytes

    rss_only = collect_process_tree_memory(tree.pid, include_pss=False)
    assert rss_only.pss_bytes is None
    assert rss_only.process_count == 4
    assert rss_only.rss_bytes >= private_total + SHARED_MB * MB


@pytest.mark.slow
def test_shared_mapping_counts_once_in_pss_and_twice_in_rss(spawn):
    tree = spawn(TREE, PRIVATE_MB, SHARED_MB, 3)
    shared = SHARED_MB * MB
    before = collect_process_tree_memory(tree.pid)
    assert tree.send("touch") == "touched"
    after = collect_process_tree_memory(tree.pid)

    # The shared pages are now resident in two processes: RSS counts them again...
    assert after.rss_bytes - before.rss_bytes >= 0.9 * shared
    assert after.rss_bytes - before.rss_bytes <= 1.1 * shared
    # ...while PSS splits them between the two, so the tree's sum holds them once.
    assert abs(after.pss_bytes - before.pss_bytes) <= 0.1 * shared
    assert after.pss_bytes >= 4 * PRIVATE_MB * MB + 0.9 * shared


@pytest.mark.slow
def test_children_started_by_a_non_main_thread_are_found(spawn):
    parent = spawn(THREADED)
    child, tid = (int(value) for value in parent.first_line.split())
    assert tid != parent.pid
    with open(f"/proc/{parent.pid}/task/{tid}/children") as listing:
        assert str(child) in listing.read().split()
    assert _descendant_pids(parent.pid) == {parent.pid, child}
    assert collect_process_tree_memory(parent.pid).process_count == 2


@pytest.mark.slow
def test_processes_exiting_during_sampling_never_raise(spawn):
    churn = spawn(CHURN)
    target = ServerMemoryTarget("churn", "test", churn.pid)
    profiler = MemoryProfiler([target], 3600, host_collector=lambda: HOST)
    seen_children = rounds = 0
    # At least 300 rounds, and on until a short-lived child was caught: on a loaded machine
    # the churner may fork seldom. The deadline only bounds a run where it never forks.
    deadline = time.monotonic() + CHURN_DEADLINE_S
    while rounds < 300 or (seen_children == 0 and time.monotonic() < deadline):
        memory = collect_process_tree_memory(churn.pid, include_pss=bool(rounds % 2))
        assert memory.process_count >= 1
        seen_children += memory.process_count > 1
        profiler.sample_once()
        assert profiler.latest().servers[0].status == "live"
        rounds += 1
    assert seen_children > 0, "no short-lived child was ever caught; the race was not exercised"


@pytest.mark.slow
def test_profiler_follows_a_real_tree_until_it_exits(spawn):
    tree = spawn(TREE, PRIVATE_MB, SHARED_MB, 3)
    target = ServerMemoryTarget("tree", "test", tree.pid)
    assert target.start_ticks is not None
    sampled = threading.Event()
    samples: list[int] = []

    class Watching(MemoryProfiler):
        def sample_once(self) -> None:
            super().sample_once()
            samples.append(self.latest().servers[0].process_count or 0)
            if len(samples) >= 3:
                sampled.set()

    profiler = Watching([target], 0.01, host_collector=lambda: HOST, pss_interval_seconds=60)
    profiler.start()
    try:
        assert sampled.wait(10)
    finally:
        profiler.stop()
    assert set(samples) == {4}
    live = profiler.latest().servers[0]
    assert live.pss_bytes is not None and live.pss_age_seconds is not None

    tree.process.stdin.close()
    tree.process.wait(timeout=10)
    profiler.sample_once()
    gone = profiler.latest().servers[0]
    assert gone.status in ("exited", "reused")
    assert gone.rss_bytes is None
    assert gone.peak_rss_bytes >= 4 * PRIVATE_MB * MB


def test_page_size_matches_the_kernel():
    assert os.sysconf("SC_PAGE_SIZE") == mmap.PAGESIZE


# The kernel serves a children file record by record; this many children need several reads.
MANY_CHILDREN_COUNT = 1000

# Forks argv[1] children that wait on a pipe, prints their pids, and releases them at EOF.
MANY_CHILDREN = r"""
import os, sys
release_r, release_w = os.pipe()
pids = []
for _ in range(int(sys.argv[1])):
    pid = os.fork()
    if pid == 0:
        os.close(release_w)
        os.read(release_r, 1)
        os._exit(0)
    pids.append(pid)
os.close(release_r)
print(" ".join(map(str, pids)), flush=True)
sys.stdin.read()
os.close(release_w)
for pid in pids:
    os.waitpid(pid, 0)
"""


def _read_whole(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        parts = []
        while chunk := os.read(fd, 65536):
            parts.append(chunk)
        return b"".join(parts)
    finally:
        os.close(fd)


@pytest.mark.slow
def test_a_children_listing_longer_than_one_read_is_read_whole(spawn: Callable[..., Any]) -> None:
    # The kernel serves a children file record by record: a read may stop short of the
    # buffer at a record boundary with more still to come, so a short read is not the end.
    parent = spawn(MANY_CHILDREN, MANY_CHILDREN_COUNT)
    children = {int(pid) for pid in parent.first_line.split()}
    assert len(children) == MANY_CHILDREN_COUNT
    listing = _read_whole(f"/proc/{parent.pid}/task/{parent.pid}/children")
    assert len(listing) > 4096, "the listing fits in one read; nothing was exercised"
    assert _descendant_pids(parent.pid) == {parent.pid, *children}
    memory = collect_process_tree_memory(parent.pid, include_pss=False)
    assert memory.process_count == MANY_CHILDREN_COUNT + 1
