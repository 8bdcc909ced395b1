"""Fixtures for the telemetry tests: real process trees, and whether this host can show them."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from raylens.telemetry import host_memory as hm
from raylens.telemetry.process_memory import process_tree_memory_supported
from raylens.telemetry.scraping import Outcome
from raylens_fakes import FakeCluster


@pytest.fixture
def real_process_trees() -> None:
    """Skips the test unless this host's ``/proc`` can show a real process tree.

    That takes Linux, and a kernel that lists each thread's children.
    """
    if not sys.platform.startswith("linux"):
        pytest.skip("procfs is Linux only")
    if not process_tree_memory_supported():
        pytest.skip("this kernel's procfs has no per-thread children files")


@dataclass
class Spawned:
    """A script started by ``spawn``, with the first line it printed."""

    process: subprocess.Popen
    first_line: str

    @property
    def pid(self) -> int:
        return self.process.pid

    def send(self, line: str) -> str:
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        return self.process.stdout.readline().strip()


@pytest.fixture
def spawn() -> Iterator[Callable[..., Spawned]]:
    """Start ``python -c script *args`` in its own session; every process of it dies in teardown."""
    started: list[subprocess.Popen] = []

    def start(script: str, *args: object) -> Spawned:
        process = subprocess.Popen(
            [sys.executable, "-c", script, *map(str, args)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        started.append(process)
        first = process.stdout.readline().strip()
        if not first:
            pytest.fail(f"spawned script exited early with code {process.wait(5)}")
        return Spawned(process, first)

    yield start
    for process in started:
        with contextlib.suppress(OSError):
            process.stdin.close()  # EOF: the script ends its tree and exits
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)  # the session's group: whatever is left
        process.wait(timeout=5)
        process.stdout.close()


# Node id of the one node ``one_node_monitor`` lists.
ONE_NODE = "a" * 56


@pytest.fixture
def one_node_monitor(
    make_monitor: Callable[..., hm.HostMemoryMonitor],
) -> Callable[[Outcome], hm.HostMemoryMonitor]:
    """``one_node_monitor(outcome)``: a monitor of one node (host ``vm``, id ``"a" * 56``)
    whose every scrape comes back as ``outcome``."""

    def make(outcome: Outcome) -> hm.HostMemoryMonitor:
        cluster = FakeCluster()
        cluster.add_node(node_id=ONE_NODE, port=8080, hostname="vm")
        return make_monitor(cluster, answering=outcome)

    return make


@pytest.fixture
def declared_on_import() -> Callable[..., list[str]]:
    """``declared_on_import(*modules, prefix=...)``: the metric names starting with ``prefix``
    that a fresh interpreter holds as declared once it has imported ``modules`` (slow tier)."""

    def run(*modules: str, prefix: str) -> list[str]:
        code = (
            f"import json, {', '.join(modules)}\n"
            "from raylens.lens import recorded_metrics\n"
            f"print(json.dumps(sorted(n for n in recorded_metrics() if n.startswith({prefix!r}))))\n"
        )
        result = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
        )
        assert result.returncode == 0, result.stderr
        names: list[str] = json.loads(result.stdout)
        return names

    return run
