"""Reading procfs files the way the kernel serves them, on this Linux host."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

import pytest

from raylens.telemetry.process_memory import (
    _descendant_pids,
    collect_process_tree_memory,
    process_tree_memory_supported,
)

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="procfs is Linux only"),
    pytest.mark.skipif(
        sys.platform.startswith("linux") and not process_tree_memory_supported(),
        reason="this kernel's procfs has no per-thread children files",
    ),
]

CHILDREN = 1000

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


def test_a_children_listing_longer_than_one_read_is_read_whole() -> None:
    # The kernel serves a children file record by record: a read may stop short of the
    # buffer at a record boundary with more still to come, so a short read is not the end.
    parent = subprocess.Popen(
        [sys.executable, "-c", MANY_CHILDREN, str(CHILDREN)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        children = {int(pid) for pid in parent.stdout.readline().split()}
        assert len(children) == CHILDREN
        listing = _read_whole(f"/proc/{parent.pid}/task/{parent.pid}/children")
        assert len(listing) > 4096, "the listing fits in one read; nothing was exercised"
        assert _descendant_pids(parent.pid) == {parent.pid, *children}
        memory = collect_process_tree_memory(parent.pid, include_pss=False)
        assert memory.process_count == CHILDREN + 1
    finally:
        parent.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            parent.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
        parent.stdout.close()
