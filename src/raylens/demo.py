"""The cluster behind ``raylens demo``: local Ray nodes, two worker groups, real memory.

:class:`DemoCluster` starts a multi-node ``ray.cluster_utils.Cluster`` on this
machine, reserves one bundle per node, and places two :class:`RayWorkerGroup` s
of :class:`MemoryHolder` workers on it: ``policy`` on every node but the last,
``rollout`` on the last. The groups register their placement, so the host-memory
monitor labels each node with the groups on it. Everything it started is torn
down on exit, including when start-up is interrupted.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol

from raylens.cluster import ray_call_errors
from raylens.lens import warn_once

if TYPE_CHECKING:
    from raylens.distributed.virtual_cluster import RayVirtualCluster
    from raylens.distributed.worker_groups import RayWorkerGroup

_MIB = 1024 * 1024
_PAGE = 4096

DEMO_PHASES: tuple[tuple[str, float], ...] = (("generation", 8.0), ("training", 4.0))
"""The demo's training loop: each phase's name and how long it lasts, in turn."""


class _Marker(Protocol):
    def enter(self, name: str) -> str: ...

    def leave(self, name: str, token: str | None = None) -> object: ...


class DemoPhases:
    """Marks the demo's phases in turn (:data:`DEMO_PHASES`), so its table shows a phase in
    progress and, under it, the last one ended with its peak and delta per group.

    :meth:`step` (called before each sample) ends the phase whose time is up and begins
    the next; :meth:`close` ends the one in progress. ``marker`` defaults to the driver's.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        phases: Sequence[tuple[str, float]] = DEMO_PHASES,
        marker: _Marker | None = None,
    ) -> None:
        self._clock = clock
        self._phases = tuple(phases)
        self._marker = marker
        self._index = -1
        self._running: tuple[str, str] | None = None
        self._ends_at = 0.0

    def _the_marker(self) -> _Marker:
        if self._marker is None:
            from raylens.distributed.phases import DEFAULT_MARKER

            self._marker = DEFAULT_MARKER
        return self._marker

    def step(self) -> None:
        if self._running is not None and self._clock() < self._ends_at:
            return
        self.close()
        self._index = (self._index + 1) % len(self._phases)
        name, seconds = self._phases[self._index]
        self._running = (name, self._the_marker().enter(name))
        self._ends_at = self._clock() + seconds

    def close(self) -> None:
        running, self._running = self._running, None
        if running is not None:
            self._the_marker().leave(*running)


@contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM back for the duration of the block, then act on them.

    Starting a Ray node spawns processes before the cluster object records the
    node, and shutting down stops them one by one: an exception in the middle of
    either leaves processes nobody stops, or an interrupted teardown that Ray then
    retries noisily at exit. Inside the block both signals are only noted. After
    it (unless the block raised), a SIGTERM is delivered again to whatever handler
    was in place before, then a Ctrl-C is raised as KeyboardInterrupt.
    Signals reach only the main thread, so elsewhere this changes nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def hold(signum: int, frame: object) -> None:
        received.append(signum)

    previous_int = signal.signal(signal.SIGINT, hold)
    previous_term = signal.signal(signal.SIGTERM, hold)
    try:
        yield
    finally:
        signal.signal(
            signal.SIGINT, previous_int if previous_int is not None else signal.default_int_handler
        )
        signal.signal(
            signal.SIGTERM, previous_term if previous_term is not None else signal.SIG_DFL
        )
    if signal.SIGTERM in received:
        signal.raise_signal(signal.SIGTERM)
    if signal.SIGINT in received:
        raise KeyboardInterrupt


@contextmanager
def keep_sigterm_handler() -> Iterator[None]:
    """Undo, after the block, the SIGTERM handler ``ray.init`` installs in a driver.

    Ray's handler exits with status 15 at once; the process that connects (the demo,
    ``raylens watch``) decides what SIGTERM does, for example stop what it started
    and exit with 143.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


class MemoryHolder:
    """A demo worker that holds ``megabytes`` of touched (resident) memory."""

    def __init__(self, megabytes: int = 64) -> None:
        self._block = bytearray(megabytes * _MIB)
        for offset in range(0, len(self._block), _PAGE):
            self._block[offset] = 1

    @staticmethod
    def configure_worker(
        num_gpus: float | int, bundle_indices: Any = None
    ) -> tuple[dict[str, Any], dict[str, str], dict[str, Any]]:
        # Two groups share each bundle's CPUs, so each worker asks for half a CPU.
        return {"num_cpus": 0.5}, {}, {}

    def describe(self) -> dict[str, Any]:
        """Where this worker runs and what it holds."""
        import ray

        return {
            "rank": int(os.environ.get("RANK", "-1")),
            "node_id": ray.get_runtime_context().get_node_id(),
            "held_bytes": len(self._block),
        }


class DemoCluster:
    """A local Ray cluster with the ``policy`` and ``rollout`` worker groups on it.

    Use as a context manager. ``n_nodes`` must be at least 2 so that the two groups
    sit on different nodes.
    """

    def __init__(
        self, n_nodes: int = 3, *, worker_megabytes: int = 64, cpus_per_node: int = 2
    ) -> None:
        if n_nodes < 2:
            raise ValueError(f"n_nodes={n_nodes} must be at least 2 for two worker groups")
        self.n_nodes = n_nodes
        self.worker_megabytes = worker_megabytes
        self.cpus_per_node = cpus_per_node
        self.ray_cluster: Any = None
        self.virtual_cluster: RayVirtualCluster | None = None
        self.groups: dict[str, RayWorkerGroup] = {}

    def __enter__(self) -> DemoCluster:
        started = False
        try:
            self.start()
            started = True
        finally:
            if not started:  # interrupted or failed half way: what did start is stopped
                self.close()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Start the nodes, connect, reserve bundles and place both worker groups."""
        import ray
        from ray.cluster_utils import Cluster

        from raylens.distributed.virtual_cluster import RayVirtualCluster
        from raylens.distributed.worker_groups import RayWorkerBuilder, RayWorkerGroup

        node_args = {
            "num_cpus": self.cpus_per_node,
            "object_store_memory": 80 * _MIB,
            "include_dashboard": False,
            # Every node's agent serves what the samplers publish within a second (Ray's
            # default is 10 s), so the table shows each group's memory from its first frame.
            "_system_config": {"metrics_report_interval_ms": 1000},
        }
        # Each node is started with Ctrl-C held back, so that one typed meanwhile is
        # raised only once the cluster knows the node and close() can stop it.
        with _interrupts_deferred():
            self.ray_cluster = Cluster(initialize_head=False)
            self.ray_cluster.add_node(**node_args)
        for _ in range(self.n_nodes - 1):
            with _interrupts_deferred():
                self.ray_cluster.add_node(
                    num_cpus=self.cpus_per_node, object_store_memory=80 * _MIB
                )
        self.ray_cluster.wait_for_nodes()
        with keep_sigterm_handler():
            ray.init(address=self.ray_cluster.address, logging_level="ERROR", log_to_driver=False)

        self.virtual_cluster = RayVirtualCluster(
            [1] * self.n_nodes,
            use_gpus=False,
            max_colocated_worker_groups=2,
            name="raylens-demo",
            placement_group_strategy="STRICT_SPREAD",
            placement_timeout_s=120.0,
        )
        builder = RayWorkerBuilder(f"{__name__}.MemoryHolder", self.worker_megabytes)
        last = self.n_nodes - 1
        layout = {
            "policy": [1] * last + [0],
            "rollout": [0] * last + [1],
        }
        for name, per_node in layout.items():
            self.groups[name] = RayWorkerGroup(
                self.virtual_cluster, builder, workers_per_node=per_node, name_prefix=name
            )
        for group in self.groups.values():
            ray.get(group.run_all_workers_single_data("describe"), timeout=120)

    def describe(self) -> str:
        """One line per worker group: how many workers and how much each holds."""
        lines = []
        for name, group in self.groups.items():
            count = len(group.workers)
            each = "" if count == 1 else " each"
            lines.append(
                f"worker group {name!r}: {count} worker{'' if count == 1 else 's'} holding "
                f"{self.worker_megabytes} MiB{each}"
            )
        return "\n".join(lines)

    def close(self) -> None:
        """Shut the groups, the reservation and every Ray process down. Idempotent.

        Ctrl-C is held back until everything is down (then raised), and a step
        that fails does not keep the later ones, the Ray nodes last, from running.
        """
        with _interrupts_deferred():
            try:
                for group in self.groups.values():
                    try:
                        group.shutdown(timeout=10.0)
                    except ray_call_errors():
                        warn_once(
                            f"demo.shutdown.{group.name_prefix}",
                            "demo worker group shutdown failed",
                        )
                self.groups = {}
                if self.virtual_cluster is not None:
                    try:
                        self.virtual_cluster.shutdown()
                    except ray_call_errors():
                        warn_once("demo.shutdown.reservation", "demo reservation removal failed")
                    self.virtual_cluster = None
                try:
                    import ray

                    ray.shutdown()
                except ImportError:
                    pass
                except ray_call_errors():
                    warn_once("demo.shutdown.driver", "disconnecting the demo driver failed")
            finally:
                if self.ray_cluster is not None:
                    cluster, self.ray_cluster = self.ray_cluster, None
                    cluster.shutdown()
