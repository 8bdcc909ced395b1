"""Pytest fixtures for testing code that uses raylens, without a cluster.

Installed as the ``raylens`` pytest plugin (entry point ``pytest11``), so any
project with raylens installed can ask for these fixtures by name:

``metrics_probe``
    A :class:`raylens_fakes.otel.MetricsProbe` installed as lens' reader; every
    read takes a fresh collection. It stays installed through ``raylens_state``
    and :func:`reset_raylens_state`, whatever the order the fixtures are listed
    in; lens is shut down after the test.

``fake_cluster``
    An empty :class:`raylens_fakes.cluster.FakeCluster` (``is_initialized()`` True):
    add nodes and placement groups to it and pass it wherever raylens takes a
    ``cluster=`` argument. No sockets are opened.

``fake_default_cluster``
    An empty :class:`FakeCluster` that is also raylens' default cluster view for the
    test (:func:`raylens.cluster.use_cluster_view`), for code that takes no
    ``cluster=`` argument, such as a driver's start-up.

``fake_procfs``
    A :class:`raylens_fakes.procfs.FakeProcFS` under the test's ``tmp_path``: build
    process trees with ``add_process`` and pass ``fake_procfs.procfs`` wherever
    raylens takes ``procfs=``.

``fake_ray``
    A :class:`raylens_fakes.ray.FakeRay` over two nodes: pass ``fake_ray.seam()``
    wherever raylens takes ``ray_seam=`` (or ``fake_ray`` itself as ``ray=``), script
    actor deaths and hanging calls on its actors, and assert on what it recorded.
    Nothing is put in ``sys.modules`` unless the test calls ``fake_ray.install(monkeypatch)``.

``ray_absent``
    Makes ``ray`` absent for the test, whether or not it is installed: ``ray`` and its
    submodules leave ``sys.modules`` and importing any of them raises
    :class:`ModuleNotFoundError`, as in an environment without Ray; what was loaded
    before comes back after the test. The fixture's value is a :class:`BlockedImports`
    whose ``attempts`` lists every import of them the test's code tried, so a test can
    also prove that code never reached for Ray. Outside pytest, use
    :func:`modules_absent`.

``raylens_state``
    Resets raylens' process-wide state before and after the test: the worker-group
    placement map, the host-memory monitor, profiler snapshots, the telemetry
    pipeline and remembered warnings (:func:`reset_raylens_state`).

``simulated_cluster``
    A factory: ``simulated_cluster(n_nodes, **options)`` starts a
    :class:`raylens_fakes.simulated.SimulatedCluster` (real fake raylets on
    127.0.0.1 behind a FakeCluster, options as in its constructor) and returns it.
    The latest cluster made is raylens' default cluster view until the test ends, so
    code that takes no ``cluster=`` (a worker group's ``register_worker_group_placement``)
    reads it too. Call it as often as the test needs; every cluster it made is closed
    after the test, hung requests included. Typical use::

        def test_hung_node(simulated_cluster, metrics_probe):
            sim = simulated_cluster(3)
            sim.raylet(1).hang()
            monitor = HostMemoryMonitor(1.0, cluster=sim.cluster, scrape_timeout=0.2)
            monitor.collect_once()
            ...
"""

from __future__ import annotations

import contextlib
import importlib.abc
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pytest

# Every pytest run in an environment with raylens installed loads this plugin, so the
# fakes (and raylens and OpenTelemetry behind them) are imported by the fixtures that
# use them, not here.
if TYPE_CHECKING:
    from raylens_fakes.cluster import FakeCluster
    from raylens_fakes.otel import MetricsProbe
    from raylens_fakes.procfs import FakeProcFS
    from raylens_fakes.ray import FakeRay
    from raylens_fakes.simulated import SimulatedCluster

# The metrics_probe fixture's probe, reinstalled by every reset while its test runs.
_PINNED_PROBES: list[MetricsProbe] = []


@pytest.fixture
def metrics_probe() -> Iterator[MetricsProbe]:
    """Lens started with an in-memory reader; read points with ``metrics_probe.points(name)``."""
    from raylens.lens import shutdown_telemetry
    from raylens_fakes.otel import MetricsProbe

    shutdown_telemetry()
    probe = MetricsProbe().install()
    _PINNED_PROBES.append(probe)
    try:
        yield probe
    finally:
        _PINNED_PROBES.remove(probe)
        probe.uninstall()


@pytest.fixture
def fake_cluster() -> FakeCluster:
    """An empty, initialised :class:`FakeCluster`."""
    from raylens_fakes.cluster import FakeCluster

    return FakeCluster()


@pytest.fixture
def fake_default_cluster() -> Iterator[FakeCluster]:
    """An empty :class:`FakeCluster` that raylens uses as its default view during the test."""
    from raylens.cluster import use_cluster_view
    from raylens_fakes.cluster import FakeCluster

    cluster = FakeCluster()
    with use_cluster_view(cluster):
        yield cluster


@contextlib.contextmanager
def simulated_clusters() -> Iterator[Callable[..., SimulatedCluster]]:
    """The ``simulated_cluster`` factory outside pytest.

    The latest cluster made is raylens' default cluster view until the block ends;
    then the view in effect before comes back and every cluster made closes.
    """
    from raylens.cluster import use_cluster_view

    started: list[SimulatedCluster] = []
    with contextlib.ExitStack() as views:

        def start(n_nodes: int = 3, **options: Any) -> SimulatedCluster:
            from raylens_fakes.simulated import SimulatedCluster

            cluster = SimulatedCluster(n_nodes, **options)
            started.append(cluster)
            views.enter_context(use_cluster_view(cluster.cluster))
            return cluster

        try:
            yield start
        finally:
            for cluster in started:
                cluster.close()


@pytest.fixture
def simulated_cluster() -> Iterator[Callable[..., SimulatedCluster]]:
    """Factory ``(n_nodes=3, **options) -> SimulatedCluster``; every cluster is closed afterwards."""
    with simulated_clusters() as start:
        yield start


@pytest.fixture
def fake_procfs(tmp_path: Path) -> FakeProcFS:
    """A fake ``/proc`` under the test's tmp_path; pass ``fake_procfs.procfs`` as ``procfs=``."""
    from raylens_fakes.procfs import FakeProcFS

    return FakeProcFS(tmp_path / "proc")


class BlockedImports(importlib.abc.MetaPathFinder):
    """A meta-path finder that answers "no such module" for some names and remembers who asked.

    ``attempts`` holds, in order, each blocked name an import statement (or
    :func:`importlib.import_module`) tried while the block was in force.
    """

    def __init__(self, names: Sequence[str]) -> None:
        self.names = tuple(names)
        self.attempts: list[str] = []
        self._lock = threading.Lock()

    def blocks(self, name: str) -> bool:
        """Whether ``name`` is one of the blocked modules or lies under one of them."""
        return any(name == top or name.startswith(top + ".") for top in self.names)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        if self.blocks(fullname):
            with self._lock:
                self.attempts.append(fullname)
            raise ModuleNotFoundError(
                f"No module named {fullname!r} (made absent for this test)", name=fullname
            )
        return None


def _is_module_name(name: object) -> bool:
    return isinstance(name, str) and all(part.isidentifier() for part in name.split("."))


@contextlib.contextmanager
def modules_absent(*names: str) -> Iterator[BlockedImports]:
    """Within the block, ``names`` and every module under them cannot be imported.

    They are taken out of ``sys.modules`` on entry, so code that looks there finds
    nothing either; on exit the finder goes, whatever the block put under those names
    is dropped, and the modules that were loaded before are put back as they were.
    """
    bad = [name for name in names if not _is_module_name(name)]
    if not names or bad:
        raise ValueError(
            f"modules_absent takes one or more dotted module names such as 'ray'; got {bad or '()'}"
        )
    blocker = BlockedImports(names)
    saved: dict[str, ModuleType] = {
        name: module for name, module in list(sys.modules.items()) if blocker.blocks(name)
    }
    for name in saved:
        del sys.modules[name]
    sys.meta_path.insert(0, blocker)
    try:
        yield blocker
    finally:
        sys.meta_path[:] = [finder for finder in sys.meta_path if finder is not blocker]
        for name in [name for name in list(sys.modules) if blocker.blocks(name)]:
            del sys.modules[name]
        sys.modules.update(saved)


@pytest.fixture
def ray_absent() -> Iterator[BlockedImports]:
    """``ray`` cannot be imported during the test; ``ray_absent.attempts`` lists who tried."""
    with modules_absent("ray") as blocked:
        yield blocked


@pytest.fixture
def fake_ray() -> FakeRay:
    """A :class:`FakeRay` over two nodes; hand it to raylens with ``fake_ray.seam()``."""
    from raylens_fakes.ray import FakeRay

    return FakeRay()


def reset_raylens_state() -> None:
    """Return raylens to a fresh process: no telemetry, monitor, placements, profiler state,
    group workers or readings, or remembered warnings.

    The one exception: while a ``metrics_probe`` fixture is active, lens is started
    again with that probe's reader, so the probe keeps seeing what raylens exports.
    """
    from raylens.lens import reset_warn_once, shutdown_telemetry

    shutdown_telemetry()
    for module_name, reset_name in (
        ("raylens.telemetry.host_memory", "reset_host_memory_state"),
        ("raylens.telemetry.process_memory", "reset_process_memory_state"),
        ("raylens.telemetry.group_memory", "reset_group_memory_state"),
        ("raylens.telemetry.phases.memory", "reset_phase_memory_state"),
        ("raylens.distributed.phases", "reset_phase_state"),
        ("raylens.telemetry.oom", "reset_oom_state"),
    ):
        module = sys.modules.get(module_name)
        if module is not None:
            getattr(module, reset_name)()
    reset_warn_once()
    if _PINNED_PROBES:
        _PINNED_PROBES[-1].reinstall()


@pytest.fixture
def raylens_state() -> Iterator[None]:
    """Resets raylens' process-wide state (worker-group placements, the host-memory monitor,
    profiler snapshots, telemetry, warn_once) before and after the test."""
    reset_raylens_state()
    yield
    reset_raylens_state()
