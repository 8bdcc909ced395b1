"""What every unit test may rely on, and what it may not do.

Unit tests run in this interpreter against fakes and never load the installed ``ray``
(importing it costs seconds and, through Ray's auto-init, can start a local cluster):
an attempt is refused as in a Ray-free environment and fails the test at teardown, so
the suite behaves the same with or without Ray installed. Tests about Ray being absent
ask for the ``ray_absent`` fixture, which also lists what tried to import it.

A test that starts a process (an interpreter, a command, the scrape helper) belongs to
the slow tier, which tox runs once rather than per interpreter: unless it is marked
``@pytest.mark.slow``, starting one fails the test at teardown, naming the program.

Temporary files (``tmp_path``, :mod:`tempfile`) go to ``/dev/shm`` when it is a writable
RAM disk with room, unless ``TMPDIR`` says otherwise: the unit tier writes some 12,000
small files (fake ``/proc`` trees), and on a virtual disk each file operation costs about
ten times what it costs in RAM.
"""

from __future__ import annotations

import gc
import importlib.abc
import itertools
import multiprocessing.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from raylens.lens import (
    OBSERVABLE_GAUGE,
    RecordedMetric,
    register_observable_gauge,
    unregister_observable_gauge,
)
from raylens.telemetry import host_memory as hm
from raylens.telemetry.scraping import Job, Outcome

# ---- temporary files: in RAM where there is room -------------------------------------

# A RAM disk is used only with this much room: a unit-tier run holds about 50 MB there.
_RAM_DISK_ROOM_BYTES = 512 * 2**20


def _temporary_files_in_ram() -> None:
    statvfs = getattr(os, "statvfs", None)  # absent on Windows
    if os.environ.get("TMPDIR") or statvfs is None:
        return
    ram_disk = "/dev/shm"
    try:
        stats = statvfs(ram_disk)
    except OSError:  # no such RAM disk (macOS)
        return
    if os.access(ram_disk, os.W_OK | os.X_OK) and (
        stats.f_bavail * stats.f_frsize >= _RAM_DISK_ROOM_BYTES
    ):
        tempfile.tempdir = ram_disk


_temporary_files_in_ram()

# ---- processes: only in the slow tier ---------------------------------------------------

# What this process started since the current test began: the program of each.
_STARTED: list[str] = []


def _program(args: Any) -> str:
    first = args[0] if isinstance(args, (list, tuple)) and args else args
    return os.path.basename(os.fsdecode(first)) if isinstance(first, (str, bytes)) else "?"


def _recording(real: Callable[..., Any], describe: Callable[..., str]) -> Callable[..., Any]:
    def start(*args: Any, **kwargs: Any) -> Any:
        _STARTED.append(describe(*args, **kwargs))
        return real(*args, **kwargs)

    return start


# Every way the code under test starts a process: subprocess (and what is built on it),
# multiprocessing's spawn and forkserver starts, and a bare fork.
subprocess.Popen._execute_child = _recording(  # type: ignore[attr-defined]
    subprocess.Popen._execute_child,  # type: ignore[attr-defined]
    lambda _self, args, *rest, **kwargs: _program(args),
)
multiprocessing.util.spawnv_passfds = _recording(
    multiprocessing.util.spawnv_passfds,
    lambda path, args, passfds: f"{_program(args)} (multiprocessing)",
)
os.fork = _recording(os.fork, lambda: "fork()")


@pytest.fixture(autouse=True)
def _processes_only_in_the_slow_tier(request: pytest.FixtureRequest) -> Iterator[None]:
    _STARTED.clear()
    yield
    started, _STARTED[:] = list(_STARTED), []
    if started and request.node.get_closest_marker("slow") is None:
        pytest.fail(
            f"this unit test started a process ({', '.join(sorted(set(started)))}): "
            "mark it @pytest.mark.slow so it runs once, in the slow tier, or give the "
            "code under test a fake",
            pytrace=False,
        )


# ---- Ray: never the installed package ---------------------------------------------------


class _RayImports(importlib.abc.MetaPathFinder):
    """Refuses to load ``ray`` from the environment and notes each attempt.

    The refusal is the one a Ray-free environment gives, so a unit test sees the same
    thing with or without Ray installed, and the installed package is never loaded.
    Stand-ins a test puts in ``sys.modules`` are found there first and never reach this
    finder; ``ray_absent`` stands in front of it, so its refusals are not counted here.
    """

    def __init__(self) -> None:
        self.attempts: list[str] = []

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        if (fullname == "ray" or fullname.startswith("ray.")) and "ray" not in sys.modules:
            self.attempts.append(fullname)
            raise ModuleNotFoundError(
                f"No module named {fullname!r} (unit tests never load the installed Ray)",
                name=fullname,
            )
        return None


_RAY_IMPORTS = _RayImports()
sys.meta_path.insert(0, _RAY_IMPORTS)


@pytest.fixture(autouse=True)
def _never_the_real_ray() -> Iterator[None]:
    _RAY_IMPORTS.attempts.clear()
    yield
    attempts, _RAY_IMPORTS.attempts[:] = list(_RAY_IMPORTS.attempts), []
    if attempts:
        pytest.fail(
            f"this unit test reached for the installed ray package (import {attempts[0]}): "
            "give the code under test a fake (fake_ray, fake_cluster, fake_default_cluster), "
            "or ask for ray_absent where the test is about Ray being absent",
            pytrace=False,
        )


# ---- the terminal: never the developer's ----------------------------------------------


@pytest.fixture(autouse=True)
def _no_terminal_size_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # Tables printed to a pipe are COLUMNS wide when it is set: a shell that exports it
    # (pytest-xdist's workers set 80) would otherwise change what the CLI tests read.
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)


# ---- Ctrl-C: Python's usual handler when a test asks --------------------------------


@pytest.fixture
def usual_ctrl_c() -> Iterator[None]:
    """During the test, SIGINT raises KeyboardInterrupt, whatever the process inherited.

    A shell starts background jobs with SIGINT ignored, and Python then leaves it ignored,
    so a test that interrupts itself sets the handler it means to test against.
    """
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


# ---- collections that see only what the test made ------------------------------------


@pytest.fixture
def young_heap() -> Iterator[None]:
    """During the test, ``gc.collect()`` walks only the objects made since the test began.

    A test that collects to show an object is let go pays for the whole session's heap on
    every call (a fifth of a second late in the unit tier). What existed before is moved to
    the collector's permanent generation for the test and handed back after it, so the
    collections still free whatever the test made and dropped.
    """
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


# ---- the host-memory monitor tests ----------------------------------------------------


class _Answering:
    """A scrape engine whose every job comes back with one outcome."""

    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome

    def scrape(self, jobs: Sequence[Job], timeout: float | None = None) -> dict[Hashable, Outcome]:
        return {job[0]: self.outcome for job in jobs}

    def close(self, timeout: float = 1.0) -> None:
        pass


@pytest.fixture
def make_monitor() -> Iterator[Callable[..., hm.HostMemoryMonitor]]:
    """Monitors with short timeouts (scrape 0.5 s, interval 1 s unless given), stopped after the test.

    They scrape in this process and count as consumers unless a test says otherwise. With
    ``answering=outcome`` nothing is scraped: every node's scrape comes back as ``outcome``.
    """
    made: list[hm.HostMemoryMonitor] = []

    def make(
        cluster: Any, *, answering: Outcome | None = None, **options: Any
    ) -> hm.HostMemoryMonitor:
        options.setdefault("scrape_timeout", 0.5)
        options.setdefault("scrape_mode", "inprocess")
        options.setdefault("consumer", True)
        monitor = hm.HostMemoryMonitor(options.pop("interval", 1.0), cluster=cluster, **options)
        if answering is not None:
            monitor._engine = _Answering(answering)  # the engine seam
        made.append(monitor)
        return monitor

    yield make
    for monitor in made:
        monitor.stop()


# ---- lens gauges a test declares -------------------------------------------------------

_GAUGE_NUMBERS = itertools.count()


@pytest.fixture
def declare_gauge() -> Iterator[Callable[..., RecordedMetric]]:
    """Declares lens gauges (unit ``By``) for one test and unregisters them after it.

    Each gets a name of its own unless ``name`` is given; with a callback it is
    registered at once, without one the test registers it when it means to.
    """
    declared: list[str] = []

    def declare(
        callback: Callable[..., Any] | None = None,
        *,
        name: str | None = None,
        unit: str = "By",
        description: str = "a test gauge",
        attributes_encodable: bool = False,
    ) -> RecordedMetric:
        metric = RecordedMetric(
            name or f"test.gauge.{next(_GAUGE_NUMBERS)}", OBSERVABLE_GAUGE, unit, description
        )
        declared.append(metric.name)
        if callback is not None:
            register_observable_gauge(metric, callback, attributes_encodable=attributes_encodable)
        return metric

    yield declare
    for name in declared:
        unregister_observable_gauge(name)


# ---- polling a condition with a real deadline (slow tier) --------------------------------


def _poll(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)  # polling a condition with a deadline, not synchronising by sleep
    return condition()


@pytest.fixture
def wait_until() -> Callable[..., bool]:
    """``wait_until(condition, timeout=5.0)``: whether ``condition()`` held by the deadline.

    For what real threads and processes do on their own time: the condition is polled
    every 10 ms until it holds or ``timeout`` seconds pass.
    """
    return _poll


# ---- Prometheus' own rule tests (slow tier) ---------------------------------------------


@pytest.fixture
def promtool_test_rules() -> Callable[..., None]:
    """``promtool_test_rules(path, document=None)``: ``promtool test rules`` on ``path``.

    ``document``, when given, is first written to ``path`` as YAML. promtool runs in the
    file's folder, so the rule files it names are found beside it. The test fails with
    promtool's report unless every case passes, and is skipped where promtool is absent.
    """
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip(
            "promtool is not installed (Debian/Ubuntu: apt-get install prometheus; .ci/run does)"
        )

    def run(path: Path, document: Mapping[str, Any] | None = None) -> None:
        if document is not None:
            path.write_text(yaml.safe_dump(dict(document), sort_keys=False), encoding="utf-8")
        result = subprocess.run(
            [promtool, "test", "rules", path.name],
            cwd=path.parent,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode == 0, result.stdout + result.stderr

    return run
