"""Per-group memory wired end to end without Ray: worker groups register, the monitor's cycle collects.

The host-memory monitor runs a cycle hook; the hook asks per-node samplers (a
stand-in ``ray`` whose actors read a :class:`FakeProcFS` per node) and publishes
into the group snapshot the gauges read. Worker groups are real
:class:`RayWorkerGroup` objects on a stand-in cluster and Ray seam.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from raylens.distributed import _group_memory_wiring as wiring
from raylens.distributed._group_memory_wiring import GroupMemoryCycle, attach_group_memory
from raylens.distributed.group_memory_sampler import GroupMemorySamplers, worker_identity
from raylens.distributed.ray_seam import RaySeam
from raylens.distributed.worker_groups import RayWorkerGroup
from raylens.driver import init_telemetry_driver
from raylens.lens import TelemetryConfig, shutdown_telemetry
from raylens.telemetry import host_memory as hm
from raylens.telemetry.group_memory import DEFAULT_REGISTRY
from raylens_fakes import FakeCluster, FakeProcFS, MetricsProbe


def _monitor(**options: Any) -> hm.HostMemoryMonitor:
    options.setdefault("scrape_mode", "inprocess")
    options.setdefault("consumer", True)
    return hm.HostMemoryMonitor(1.0, cluster=FakeCluster(), **options)


# ---- the monitor's cycle hook ----------------------------------------------------------


def test_a_cycle_hook_runs_after_every_cycle_and_its_stop_at_stop() -> None:
    monitor = _monitor()
    seen: list[Any] = []
    stopped: list[bool] = []
    monitor.add_cycle_hook(seen.append, on_stop=lambda: stopped.append(True))
    monitor.add_cycle_hook(seen.append)  # the same hook twice runs once

    monitor.collect_once()
    monitor.collect_once()
    assert seen == [monitor, monitor]
    assert stopped == []

    monitor.stop()
    assert stopped == [True]
    monitor.remove_cycle_hook(seen.append)
    monitor.collect_once()
    assert seen == [monitor, monitor]


def test_a_failing_hook_is_logged_once_and_the_cycle_carries_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    monitor = _monitor()
    after: list[int] = []

    def broken(_monitor: hm.HostMemoryMonitor) -> None:
        raise RuntimeError("sampler manager exploded")

    monitor.add_cycle_hook(broken)
    monitor.add_cycle_hook(lambda _m: after.append(1))
    with caplog.at_level(logging.WARNING, logger="raylens"):
        for _ in range(3):
            monitor.collect_once()
        monitor.stop()

    assert after == [1, 1, 1]
    failures = [r for r in caplog.records if "cycle hook" in r.getMessage()]
    assert len(failures) == 1


# ---- stand-ins: a two-node cluster, its workers' processes, and just enough ray -----------

MB = 2**20
NODES = ("a" * 56, "b" * 56)


class FakeActorError(Exception):
    """Stands for ray.exceptions.RayActorError."""


class FakeTimeout(Exception):
    """Stands for ray.exceptions.GetTimeoutError."""


class Ref:
    def __init__(self, compute: Callable[[], Any], *, hung: bool = False) -> None:
        self.compute = compute
        self.hung = hung


class Call:
    def __init__(self, run: Callable[..., Ref]) -> None:
        self.remote = run


class Worker:
    """A worker actor: a process on a node's procfs, asked only through ``__ray_call__``."""

    def __init__(self, ray: FakeRay, node: str, pid: int, name: str) -> None:
        self.ray, self.node, self.pid, self.name = ray, node, pid, name
        self.busy = False  # in a long method: anything asked of it waits behind that
        self.dead = False
        self.asked = 0
        self.__ray_ready__ = Call(lambda: self._ref(lambda: None))
        self.__ray_call__ = Call(self._call)

    def _ref(self, compute: Callable[[], Any]) -> Ref:
        if self.dead:
            return Ref(lambda: (_ for _ in ()).throw(FakeActorError(f"{self.name} died")))
        return Ref(compute, hung=self.busy)

    def _call(self, function: Callable[..., Any]) -> Ref:
        assert function is worker_identity
        self.asked += 1
        procfs = self.ray.procfs[self.node]
        return self._ref(lambda: (self.node, self.pid, procfs.start_ticks(self.pid)))


class Sampler:
    """A sampler actor: the real GroupMemorySamplerActor reading its node's fake procfs."""

    def __init__(self, ray: FakeRay, node: str, instance: Any, options: dict[str, Any]) -> None:
        self.ray, self.node, self.instance, self.options = ray, node, instance, options
        self.dead = False
        self.read = Call(self._read)

    def _read(self, workers: list[Any]) -> Ref:
        if self.dead:
            return Ref(lambda: (_ for _ in ()).throw(FakeActorError("sampler died")))
        self.ray.before_read(self.node)
        return Ref(lambda: self.instance.read(workers))


class FakeRay:
    """What worker groups and sampler managers use of ``ray``, over one FakeProcFS per node."""

    def __init__(self, procfs: dict[str, FakeProcFS]) -> None:
        self.procfs = procfs
        self.pids = itertools.count(1000)
        self.samplers: list[Sampler] = []
        self.before_read: Callable[[str], None] = lambda node: None
        self.exceptions = SimpleNamespace(RayActorError=FakeActorError, GetTimeoutError=FakeTimeout)
        self.util = SimpleNamespace(
            scheduling_strategies=SimpleNamespace(
                NodeAffinitySchedulingStrategy=lambda node_id, soft: SimpleNamespace(
                    node_id=node_id, soft=soft
                )
            )
        )

    def start_worker(self, node: str, name: str, rss: int) -> Worker:
        pid = next(self.pids)
        self.procfs[node].add_process(pid, rss_bytes=rss)
        return Worker(self, node, pid, name)

    def get(self, ref: Any, timeout: float | None = None) -> Any:
        if isinstance(ref, list):
            return [self.get(item, timeout) for item in ref]
        if ref.hung:
            raise FakeTimeout("still running")
        return ref.compute()

    def wait(self, refs: list[Ref], *, num_returns: int = 1, timeout: float | None = None):
        ready = [ref for ref in refs if not ref.hung][:num_returns]
        return ready, [ref for ref in refs if ref not in ready]

    def kill(self, actor: Any, *, no_restart: bool = True) -> None:
        if isinstance(actor, Worker) and not actor.dead:
            actor.dead = True
            self.procfs[actor.node].remove_process(actor.pid)
        elif isinstance(actor, Sampler):
            actor.dead = True

    def remote(self, **class_options: Any) -> Any:
        fake = self

        def decorate(cls: type) -> Any:
            def options(**options: Any) -> Any:
                merged = {**class_options, **options}
                node = merged["scheduling_strategy"].node_id

                def remote(**kwargs: Any) -> Sampler:
                    kwargs["procfs_root"] = str(fake.procfs[node].root)
                    sampler = Sampler(fake, node, cls(**kwargs), merged)
                    fake.samplers.append(sampler)
                    return sampler

                return SimpleNamespace(remote=remote)

            return SimpleNamespace(options=options)

        return decorate

    def live_samplers(self) -> set[str]:
        return {s.node for s in self.samplers if not s.dead}


class StubCluster:
    """One bundle per node, one placement group per node."""

    use_gpus = False
    max_colocated_worker_groups = 1
    num_gpus_per_node = 0
    bundle_ct_per_node_list = [1, 1]

    def __init__(self) -> None:
        self.groups = [
            SimpleNamespace(id=SimpleNamespace(hex=lambda i=i: f"pg{i}")) for i in (0, 1)
        ]

    def node_and_local_index(self, node_idx: int, local_idx: int) -> tuple[int, int]:
        return node_idx, local_idx

    def get_master_address_and_port(self) -> tuple[str, int]:
        return "10.0.0.1", 29500

    def get_bundle_location(self, node_idx: int, local_idx: int) -> tuple[Any, int]:
        return self.groups[node_idx], local_idx

    def _addresses_and_ports(self, bundles: list[tuple[Any, int]]) -> list[tuple[str, int]]:
        return [("10.0.0.1", 41000 + i) for i in range(len(bundles))]


class StubBuilder:
    """Starts each worker as a new process on its bundle's node, holding ``rss`` bytes."""

    ray_actor_class_fqn = "pkg.workers.Policy"

    def __init__(self, ray: FakeRay, rss: int) -> None:
        self.ray, self.rss = ray, rss

    def _create_initializer(self, group: Any, bundle_index: int, *rest: Any) -> Any:
        return SimpleNamespace(group=group)

    def _submit_worker(self, initializer: Any, pg: Any, index: int, *rest: Any) -> Ref:
        node = NODES[int(pg.id.hex()[2:])]
        worker = self.ray.start_worker(node, rest[-1]["name"], self.rss)
        return Ref(lambda: worker)


class FakeSeam(RaySeam):
    def __init__(self, ray: FakeRay | None) -> None:
        super().__init__()
        self.fake = ray

    def connected_ray(self) -> FakeRay | None:
        return self.fake


@pytest.fixture
def ray(tmp_path: Path) -> FakeRay:
    return FakeRay({node: FakeProcFS(tmp_path / node[:1]) for node in NODES})


@pytest.fixture
def cycle(ray: FakeRay) -> Iterator[GroupMemoryCycle]:
    made = GroupMemoryCycle(GroupMemorySamplers(ray=ray, timeout_s=1.0))
    yield made
    made.close()


def _group(ray: FakeRay, name: str, rss: int) -> RayWorkerGroup:
    return RayWorkerGroup(
        StubCluster(),  # type: ignore[arg-type]
        StubBuilder(ray, rss),  # type: ignore[arg-type]
        name_prefix=name,
        ray_seam=FakeSeam(ray),
    )


def _rss(probe: MetricsProbe) -> dict[tuple[str, str], float]:
    probe.collect()
    return {
        (dict(a)["rl.worker_group"], dict(a)["ray.node.id"]): value
        for a, value in probe.points("rl.worker_group.memory.usage").items()
        if dict(a)["memory.type"] == "rss"
    }


def _cycle_once(cycle: GroupMemoryCycle) -> hm.HostMemoryMonitor:
    monitor = _monitor()
    attach_group_memory(monitor, cycle)
    monitor.collect_once()
    return monitor


# ---- through the wiring ----------------------------------------------------------------


def test_busy_workers_are_read_on_their_nodes_without_being_asked(
    ray: FakeRay, cycle: GroupMemoryCycle, metrics_probe: MetricsProbe
) -> None:
    policy = _group(ray, "policy", 30 * MB)
    rollout = _group(ray, "rollout", 5 * MB)
    workers = [*policy.workers, *rollout.workers]
    assert [w.asked for w in workers] == [1, 1, 1, 1]  # once, when ready
    for worker in workers:
        worker.busy = True

    monitor = _cycle_once(cycle)
    assert _rss(metrics_probe) == {
        ("policy", NODES[0]): 30 * MB,
        ("policy", NODES[1]): 30 * MB,
        ("rollout", NODES[0]): 5 * MB,
        ("rollout", NODES[1]): 5 * MB,
    }
    # A long method allocating: the next cycle sees it, still without asking the worker.
    busy = policy.workers[0]
    ray.procfs[busy.node].set_memory(busy.pid, rss_bytes=330 * MB)
    monitor.collect_once()
    assert _rss(metrics_probe)[("policy", NODES[0])] == 330 * MB
    assert _rss(metrics_probe)[("rollout", NODES[0])] == 5 * MB
    assert [w.asked for w in workers] == [1, 1, 1, 1]
    assert ray.live_samplers() == set(NODES)
    assert all(s.options["num_cpus"] == 0 for s in ray.samplers)
    assert cycle.last_cost is not None and cycle.last_cost.nodes == 2


def test_a_recreated_worker_is_counted_by_its_new_pid_and_only_it_is_asked(
    ray: FakeRay, cycle: GroupMemoryCycle, metrics_probe: MetricsProbe
) -> None:
    policy = _group(ray, "policy", 8 * MB)
    old, other = policy.workers
    other.busy = True  # busy in a long method: the recreate must not wait on it
    monitor = _cycle_once(cycle)

    new = policy.recreate_worker(0)
    ray.procfs[new.node].set_memory(new.pid, rss_bytes=20 * MB)

    assert new.pid != old.pid
    assert other.asked == 1
    assert policy._processes is not None
    assert [i[1] for i in policy._processes.identities if i] == [new.pid, other.pid]
    monitor.collect_once()
    assert _rss(metrics_probe) == {("policy", NODES[0]): 20 * MB, ("policy", NODES[1]): 8 * MB}


def test_a_worker_killed_mid_cycle_costs_only_its_own_memory(
    ray: FakeRay, cycle: GroupMemoryCycle, metrics_probe: MetricsProbe
) -> None:
    policy = _group(ray, "policy", 8 * MB)
    rollout = _group(ray, "rollout", 3 * MB)
    victim = policy.workers[0]
    # The worker dies after the cycle began and before its node's sampler reads.
    ray.before_read = lambda node: node == victim.node and ray.kill(victim)

    monitor = _cycle_once(cycle)

    assert _rss(metrics_probe) == {
        ("policy", NODES[1]): 8 * MB,
        ("rollout", NODES[0]): 3 * MB,
        ("rollout", NODES[1]): 3 * MB,
    }
    ray.before_read = lambda node: None
    monitor.collect_once()
    assert ("policy", NODES[0]) not in _rss(metrics_probe)
    assert rollout.workers[0].asked == 1


def test_a_gone_sampler_costs_only_its_node_and_is_replaced(
    ray: FakeRay, cycle: GroupMemoryCycle, metrics_probe: MetricsProbe
) -> None:
    _group(ray, "policy", 8 * MB)
    monitor = _cycle_once(cycle)
    gone = next(s for s in ray.samplers if s.node == NODES[1])
    gone.dead = True

    monitor.collect_once()
    assert _rss(metrics_probe) == {("policy", NODES[0]): 8 * MB}

    monitor.collect_once()
    assert _rss(metrics_probe) == {("policy", NODES[0]): 8 * MB, ("policy", NODES[1]): 8 * MB}
    assert len([s for s in ray.samplers if s.node == NODES[1]]) == 2


def test_samplers_start_with_the_first_group_and_go_with_the_last(
    ray: FakeRay, cycle: GroupMemoryCycle, metrics_probe: MetricsProbe
) -> None:
    monitor = _cycle_once(cycle)
    assert ray.samplers == []  # nothing registered: no Ray call at all

    policy = _group(ray, "policy", 8 * MB)
    monitor.collect_once()
    assert ray.live_samplers() == set(NODES)

    assert policy.shutdown()
    assert "policy" not in DEFAULT_REGISTRY.groups()
    monitor.collect_once()
    assert ray.live_samplers() == set()
    assert _rss(metrics_probe) == {}


def test_shutdown_withdraws_the_workers_even_when_cleanup_fails(ray: FakeRay) -> None:
    policy = _group(ray, "policy", 8 * MB)
    assert "policy" in DEFAULT_REGISTRY.groups()

    def broken(*_args: Any, **_kwargs: Any) -> bool:
        raise RuntimeError("cleanup exploded")

    policy._stop_workers = broken  # type: ignore[method-assign]
    assert policy.shutdown(cleanup_method="close") is False
    assert "policy" not in DEFAULT_REGISTRY.groups()


def test_a_worker_that_cannot_say_where_it_runs_leaves_the_group_working(
    ray: FakeRay, caplog: pytest.LogCaptureFixture
) -> None:
    def hung_identity(node: str, name: str, rss: int) -> Worker:
        worker = FakeRay.start_worker(ray, node, name, rss)
        worker.__ray_call__ = Call(lambda _fn: Ref(lambda: None, hung=True))
        return worker

    ray.start_worker = hung_identity  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="raylens"):
        policy = _group(ray, "policy", 8 * MB)

    assert len(policy.workers) == 2
    assert "policy" not in DEFAULT_REGISTRY.groups()
    assert any("per-group memory" in r.getMessage() for r in caplog.records)


def test_nothing_is_sampled_while_nobody_consumes(ray: FakeRay, cycle: GroupMemoryCycle) -> None:
    _group(ray, "policy", 8 * MB)
    monitor = _monitor(consumer=False)
    attach_group_memory(monitor, cycle)
    monitor.collect_once()
    assert ray.samplers == []


def test_the_monitor_stop_removes_the_samplers(ray: FakeRay, cycle: GroupMemoryCycle) -> None:
    _group(ray, "policy", 8 * MB)
    monitor = _cycle_once(cycle)
    assert ray.live_samplers() == set(NODES)
    monitor.stop()
    assert ray.live_samplers() == set()


# ---- the driver entry point --------------------------------------------------------------


def test_the_driver_attaches_group_memory_to_its_monitor(
    ray: FakeRay, cycle: GroupMemoryCycle, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wiring, "_DEFAULT_CYCLE", cycle)
    _group(ray, "policy", 8 * MB)
    try:
        init_telemetry_driver(TelemetryConfig(exporter="none"), host_memory_interval=600.0)
        monitor = hm._MONITOR
        assert monitor is not None
        monitor.declare_consumer()
        monitor.collect_once()
        assert ray.live_samplers() == set(NODES)
    finally:
        shutdown_telemetry()
    assert ray.live_samplers() == set()


# ---- the CLI's node table ----------------------------------------------------------------


def test_the_node_table_shows_each_group_rss_on_its_node(
    ray: FakeRay, cycle: GroupMemoryCycle
) -> None:
    from raylens.cli.cluster_views import NodeTable
    from raylens.telemetry._snapshot import NodeSample

    _group(ray, "policy", 30 * MB)
    _group(ray, "rollout", 5 * MB)
    _cycle_once(cycle)
    samples = [
        NodeSample(node, f"host-{i}", "10.0.0.1", 1.0, 2.0, "policy,rollout", 0.0, None, "")
        for i, node in enumerate((*NODES, "c" * 56))
    ]
    table = NodeTable(SimpleNamespace(latest=lambda: samples), clock=lambda: 1.0)

    rows = {row.node_id: row.group_rss for row in table.rows()}

    assert rows == {
        NODES[0]: {"policy": 30 * MB, "rollout": 5 * MB},
        NODES[1]: {"policy": 30 * MB, "rollout": 5 * MB},
        "c" * 56: {},
    }
