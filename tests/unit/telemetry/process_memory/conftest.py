"""Fixtures for the process-memory tests: a fake ``/proc`` with one server's tree, and that server.

A module whose tests need another tree defines its own ``fake``; ``policy`` then names pid 100
in that one.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from raylens.telemetry.process_memory import ServerMemoryTarget
from raylens_fakes.procfs import PAGE_SIZE, FakeProcFS


@pytest.fixture
def fake(tmp_path: Path) -> FakeProcFS:
    """A fake ``/proc`` with server 100 (300 pages RSS, 200 PSS) and its child 101 (100, 50)."""
    fake = FakeProcFS(tmp_path / "proc")
    fake.add_process(100, rss_bytes=300 * PAGE_SIZE, pss_bytes=200 * PAGE_SIZE)
    fake.add_process(101, parent=100, rss_bytes=100 * PAGE_SIZE, pss_bytes=50 * PAGE_SIZE)
    return fake


@pytest.fixture
def policy(fake: FakeProcFS) -> ServerMemoryTarget:
    """The server of ``fake``'s tree: the vLLM policy at pid 100."""
    return ServerMemoryTarget("policy", "vllm", 100, procfs=fake.procfs)


@pytest.fixture
def two_servers(tmp_path: Path) -> FakeProcFS:
    """A fake ``/proc`` with two unrelated servers: 100 (300 pages RSS, 200 PSS) and 200 (40, 30)."""
    fake = FakeProcFS(tmp_path / "proc")
    fake.add_process(100, rss_bytes=300 * PAGE_SIZE, pss_bytes=200 * PAGE_SIZE)
    fake.add_process(200, rss_bytes=40 * PAGE_SIZE, pss_bytes=30 * PAGE_SIZE)
    return fake
