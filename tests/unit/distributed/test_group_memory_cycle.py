"""Per-group memory wired end to end without Ray: worker groups register, the monitor's cycle collects.

The host-memory monitor runs a cycle hook. Asking, the hook calls per-node samplers
(a :class:`FakeRay` whose actors read a :class:`FakeProcFS` per node) and publishes
into the group snapshot the gauges read; publishing (the default), it keeps the
samplers running and publishes the figures the scrape carried. Worker groups are real
:class:`RayWorkerGroup` objects on a stand-in cluster and Ray seam.
"""

from __future__ import annotations

import gc
import itertools
import logging
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from raylens.distributed import group_memory_cycle as wiring
from raylens.distributed.group_memory_cycle import GroupMemoryCycle, attach_group_memory
from raylens.distributed.group_memory_sampler import (
    GroupMemorySamplerActor,
    GroupMemorySamplers,
    SamplerError,
    worker_identity,
)
from raylens.distributed.worker_groups import RayWorkerGroup
from raylens.driver import init_telemetry_driver
from raylens.lens import TelemetryConfig, shutdown_telemetry
from raylens.telemetry import host_memory as hm
from raylens.telemetry.group_memory import (
    DEFAULT_WORKER_REGISTRY,
    GroupMemorySnapshot,
    GroupWorkerRegistry,
    NodeGroupMemory,
    register_group_memory_gauges,
)
from raylens.telemetry.raylet_payload import GroupFigure, NodeFigures, NodeGroupFigures
from raylens_fakes import FakeCluster, FakeProcFS, MetricsProbe
from raylens_fakes.ray import FakeActor, FakeRay


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


class ClusterRay(FakeRay):
    """FakeRay over NODES with a FakeProcFS per node: each worker is a process on its node.

    Samplers read their node's procfs; killing a worker ends its process; a worker
    answers ``__ray_call__(worker_identity)`` with its node, pid and start time.
    ``before_read(node)`` runs as each sampler is asked to read.
    """

    def __init__(self, procfs: dict[str, FakeProcFS]) -> None:
        super().__init__(procfs)
        self.procfs = procfs
        self.pids = itertools.count(1000)
        self.before_read: Callable[[str], Any] = lambda node: None
        self._ended: set[int] = set()
        self.read_procfs(procfs)
        self.on_submit.append(self._submitted)
        self.on_kill.append(self._killed)

    def start_worker(self, node: str, name: str, rss: int) -> FakeActor:
        pid = next(self.pids)
        self.procfs[node].add_process(pid, rss_bytes=rss)
        worker = self.actor(name, node_id=node)
        worker.pid = pid  # type: ignore[attr-defined]
        worker.script("__ray_call__", lambda function: self._identity(worker, function))
        return worker

    @property
    def samplers(self) -> list[FakeActor]:
        return [a for a in self.actors if isinstance(a.instance, GroupMemorySamplerActor)]

    def live_samplers(self) -> set[str]:
        return {s.node_id for s in self.samplers if not s.dead}

    def _identity(self, worker: FakeActor, function: Any) -> tuple[str, int, int | None]:
        assert function is worker_identity
        pid = worker.pid  # type: ignore[attr-defined]
        return worker.node_id, pid, self.procfs[worker.node_id].start_ticks(pid)

    def _submitted(self, actor: FakeActor, method: str) -> None:
        if method == "read":
            self.before_read(actor.node_id)

    def _killed(self, actor: FakeActor) -> None:
        pid = vars(actor).get("pid")  # initializers and samplers have none
        if pid is not None and pid not in self._ended:
            self._ended.add(pid)
            self.procfs[actor.node_id].remove_process(pid)


def asked(worker: FakeActor) -> int:
    """How often the worker was asked where it runs."""
    return sum(1 for method, *_ in worker.calls if method == "__ray_call__")


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

    def __init__(self, ray: ClusterRay, rss: int) -> None:
        self.ray, self.rss = ray, rss

    def _create_initializer(self, group: Any, bundle_index: int, *rest: Any) -> Any:
        return self.ray.actor(f"init-{bundle_index}")

    def _submit_worker(self, initializer: Any, pg: Any, index: int, *rest: Any) -> Any:
        node = NODES[int(pg.id.hex()[2:])]
        return self.ray.put(self.ray.start_worker(node, rest[-1]["name"], self.rss))


@pytest.fixture
def ray(tmp_path: Path, fake_default_cluster: FakeCluster) -> ClusterRay:
    # The groups register their placement through raylens' default cluster view: a fake
    # one, so that no test reaches (or starts) a real Ray.
    return ClusterRay({node: FakeProcFS(tmp_path / node[:1]) for node in NODES})


@pytest.fixture
def cycle(ray: ClusterRay) -> Iterator[GroupMemoryCycle]:
    made = GroupMemoryCycle(GroupMemorySamplers(ray=ray, timeout_s=1.0), mode="ask")
    yield made
    made.close()


def _group(ray: ClusterRay, name: str, rss: int) -> RayWorkerGroup:
    return RayWorkerGroup(
        StubCluster(),  # type: ignore[arg-type]
        StubBuilder(ray, rss),  # type: ignore[arg-type]
        name_prefix=name,
        ray_seam=ray.seam(),
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
    ray: ClusterRay, cycle: GroupMemoryCycle, metrics_probe: MetricsProbe
) -> None:
    policy = _group(ray, "policy", 30 * MB)
    rollout = _group(ray, "rollout", 5 * MB)
    workers = [*policy.workers, *rollout.workers]
    assert [asked(w) for w in workers] == [1, 1, 1, 1]  # once, when ready
    for worker in workers:
        worker.hung = True  # busy in a long method: anything asked of it waits

    monitor = _cycle_once(cycle)
    assert _rss(metrics_probe) == {
        ("policy", NODES[0]): 30 * MB,
        ("policy", NODES[1]): 30 * MB,
        ("rollout", NODES[0]): 5 * MB,
        ("rollout", NODES[1]): 5 * MB,
    }
    # A long method allocating: the next cycle sees it, still without asking the worker.
    busy = policy.workers[0]
    ray.procfs[busy.node_id].set_memory(busy.pid, rss_bytes=330 * MB)
    monitor.collect_once()
    assert _rss(metrics_probe)[("policy", NODES[0])] == 330 * MB
    assert _rss(metrics_probe)[("rollout", NODES[0])] == 5 * MB
    assert [asked(w) for w in workers] == [1, 1, 1, 1]
    assert ray.live_samplers() == set(NODES)
    assert all(s.options["num_cpus"] == 0 for s in ray.samplers)
    assert cycle.last_cost is not None and cycle.last_cost.nodes == 2


def test_a_recreated_worker_is_counted_by_its_new_pid_and_only_it_is_asked(
    ray: ClusterRay, cycle: GroupMemoryCycle, metrics_probe: MetricsProbe
) -> None:
    policy = _group(ray, "policy", 8 * MB)
    old, other = policy.workers
    other.hung = True  # busy in a long method: the recreate must not wait on it
    monitor = _cycle_once(cycle)

    new = policy.recreate_worker(0)
    ray.procfs[new.node_id].set_memory(new.pid, rss_bytes=20 * MB)

    assert new.pid != old.pid
    assert asked(other) == 1
    assert policy._processes is not None
    assert [i[1] for i in policy._processes.identities if i] == [new.pid, other.pid]
    monitor.collect_once()
    assert _rss(metrics_probe) == {("policy", NODES[0]): 20 * MB, ("policy", NODES[1]): 8 * MB}


def test_a_worker_killed_mid_cycle_costs_only_its_own_memory(
    ray: ClusterRay, cycle: GroupMemoryCycle, metrics_probe: MetricsProbe
) -> None:
    policy = _group(ray, "policy", 8 * MB)
    rollout = _group(ray, "rollout", 3 * MB)
    victim = policy.workers[0]
    # The worker dies after the cycle began and before its node's sampler reads.
    ray.before_read = lambda node: node == victim.node_id and ray.kill(victim)

    monitor = _cycle_once(cycle)

    assert _rss(metrics_probe) == {
        ("policy", NODES[1]): 8 * MB,
        ("rollout", NODES[0]): 3 * MB,
        ("rollout", NODES[1]): 3 * MB,
    }
    ray.before_read = lambda node: None
    monitor.collect_once()
    assert ("policy", NODES[0]) not in _rss(metrics_probe)
    assert asked(rollout.workers[0]) == 1


def test_a_gone_sampler_costs_only_its_node_and_is_replaced(
    ray: ClusterRay, cycle: GroupMemoryCycle, metrics_probe: MetricsProbe
) -> None:
    _group(ray, "policy", 8 * MB)
    monitor = _cycle_once(cycle)
    gone = next(s for s in ray.samplers if s.node_id == NODES[1])
    gone.dead = True

    monitor.collect_once()
    assert _rss(metrics_probe) == {("policy", NODES[0]): 8 * MB}

    monitor.collect_once()
    assert _rss(metrics_probe) == {("policy", NODES[0]): 8 * MB, ("policy", NODES[1]): 8 * MB}
    assert len([s for s in ray.samplers if s.node_id == NODES[1]]) == 2


def test_samplers_start_with_the_first_group_and_go_with_the_last(
    ray: ClusterRay, cycle: GroupMemoryCycle, metrics_probe: MetricsProbe
) -> None:
    monitor = _cycle_once(cycle)
    assert ray.samplers == []  # nothing registered: no Ray call at all

    policy = _group(ray, "policy", 8 * MB)
    monitor.collect_once()
    assert ray.live_samplers() == set(NODES)

    assert policy.shutdown()
    assert "policy" not in DEFAULT_WORKER_REGISTRY.groups()
    monitor.collect_once()
    assert ray.live_samplers() == set()
    assert _rss(metrics_probe) == {}


def test_shutdown_withdraws_the_workers_even_when_cleanup_fails(ray: ClusterRay) -> None:
    policy = _group(ray, "policy", 8 * MB)
    assert "policy" in DEFAULT_WORKER_REGISTRY.groups()

    def broken(*_args: Any, **_kwargs: Any) -> bool:
        raise RuntimeError("cleanup exploded")

    policy._stop_workers = broken  # type: ignore[method-assign]
    assert policy.shutdown(cleanup_method="close") is False
    assert "policy" not in DEFAULT_WORKER_REGISTRY.groups()


def test_a_worker_that_cannot_say_where_it_runs_leaves_the_group_working(
    ray: ClusterRay, caplog: pytest.LogCaptureFixture
) -> None:
    def hung_identity(node: str, name: str, rss: int) -> FakeActor:
        return ClusterRay.start_worker(ray, node, name, rss).script("__ray_call__", "hangs")

    ray.start_worker = hung_identity  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="raylens"):
        policy = _group(ray, "policy", 8 * MB)

    assert len(policy.workers) == 2
    assert "policy" not in DEFAULT_WORKER_REGISTRY.groups()
    assert any("per-group memory" in r.getMessage() for r in caplog.records)


def test_nothing_is_sampled_while_nobody_consumes(ray: ClusterRay, cycle: GroupMemoryCycle) -> None:
    _group(ray, "policy", 8 * MB)
    monitor = _monitor(consumer=False)
    attach_group_memory(monitor, cycle)
    monitor.collect_once()
    assert ray.samplers == []


def test_the_monitor_stop_removes_the_samplers(ray: ClusterRay, cycle: GroupMemoryCycle) -> None:
    _group(ray, "policy", 8 * MB)
    monitor = _cycle_once(cycle)
    assert ray.live_samplers() == set(NODES)
    monitor.stop()
    assert ray.live_samplers() == set()


# ---- the driver entry point --------------------------------------------------------------


@pytest.mark.slow
def test_the_driver_attaches_group_memory_to_its_monitor(
    ray: ClusterRay, cycle: GroupMemoryCycle, monkeypatch: pytest.MonkeyPatch
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
    ray: ClusterRay, cycle: GroupMemoryCycle
) -> None:
    from raylens.cli.cluster_views import NodeTable
    from raylens.telemetry.host_memory._snapshot import NodeSample

    _group(ray, "policy", 30 * MB)
    _group(ray, "rollout", 5 * MB)
    _cycle_once(cycle)
    samples = [
        NodeSample(node, f"host-{i}", "10.0.0.1", 1.0, 2.0, "policy,rollout", 0.0, None, "")
        for i, node in enumerate((*NODES, "c" * 56))
    ]
    table = NodeTable(
        SimpleNamespace(latest=lambda: samples, group_figures=dict), clock=lambda: 1.0
    )

    rows = {row.node_id: row.group_rss for row in table.rows()}

    assert rows == {
        NODES[0]: {"policy": 30 * MB, "rollout": 5 * MB},
        NODES[1]: {"policy": 30 * MB, "rollout": 5 * MB},
        "c" * 56: {},
    }


# ---- published through Ray's metrics pipeline (the default) ------------------------------


class _MaintainedSamplers:
    """Records what the cycle asks of the samplers; a node in ``failing`` reports an error."""

    def __init__(self, failing: dict[str, str] | None = None) -> None:
        self.maintained: list[dict[str, list[tuple[str, int, int | None]]]] = []
        self.versions: list[object] = []
        self.nodes: list[frozenset[str]] = []
        self.failing = failing or {}
        self.closed = 0

    def maintain(
        self, workers_by_node: Any, *, version: object = None, nodes: Any = ()
    ) -> dict[str, SamplerError]:
        self.versions.append(version)
        self.nodes.append(frozenset(nodes))
        self.maintained.append({node: list(ws) for node, ws in workers_by_node.items()})
        return {node: SamplerError(node, why) for node, why in self.failing.items()}

    def sample(self, workers_by_node: Any) -> dict[str, Any]:
        raise AssertionError("a publishing cycle never asks the samplers for readings")

    def close(self) -> None:
        self.closed += 1


class _ScrapedMonitor:
    has_consumer = True
    max_age = 30.0

    def __init__(self, figures: dict[str, tuple[str, NodeGroupFigures, float]]) -> None:
        self.figures = figures

    def group_figures(self) -> dict[str, tuple[str, NodeGroupFigures, float]]:
        return self.figures


def test_a_publishing_cycle_keeps_the_samplers_running_and_exports_what_the_scrape_carried(
    metrics_probe: MetricsProbe,
) -> None:
    registry = GroupWorkerRegistry()
    registry.register("policy", [(NODES[0], 101, 1), (NODES[0], 102, 1)])
    snapshot = GroupMemorySnapshot()
    samplers = _MaintainedSamplers(failing={NODES[1]: "sampler on node b cannot be reached"})
    cycle = GroupMemoryCycle(samplers, registry=registry, snapshot=snapshot)  # type: ignore[arg-type]
    register_group_memory_gauges(snapshot)
    carried = NodeGroupFigures(
        1.7e9,
        (GroupFigure("policy", 3e9, 2e9, 5.0), GroupFigure("other-job", 1e9, None, 1.0)),
    )
    monitor = _ScrapedMonitor({NODES[0]: ("vm", carried, 10.0), NODES[1]: ("vm", carried, 10.0)})

    cycle(monitor)  # type: ignore[arg-type]

    assert samplers.maintained == [{NODES[0]: [("policy", 101, 1), ("policy", 102, 1)]}]
    assert _rss(metrics_probe) == {
        ("policy", NODES[0]): 3e9,
        ("other-job", NODES[0]): 1e9,
    }
    reading, _age = snapshot.latest()[NODES[0]]
    assert [(g.group, g.workers, g.process_count, g.pss_bytes) for g in reading.groups] == [
        ("policy", 2, 5, 2_000_000_000),
        ("other-job", 0, 1, None),
    ]
    assert cycle.last_cost is not None and cycle.last_cost.nodes == 2


def test_a_stale_samplers_groups_are_not_exported_as_current(
    metrics_probe: MetricsProbe,
) -> None:
    registry = GroupWorkerRegistry()
    snapshot = GroupMemorySnapshot()
    cycle = GroupMemoryCycle(_MaintainedSamplers(), registry=registry, snapshot=snapshot)  # type: ignore[arg-type]
    register_group_memory_gauges(snapshot)
    node = NodeFigures(1e9, None, None, False, 2e9, None, 600.0, "s", "driver/1")
    fresh = NodeGroupFigures(1.7e9, (GroupFigure("policy", 3e9, None, 1.0),), node)
    stale = NodeGroupFigures(
        1.7e9, (GroupFigure("rollout", 1e9, None, 1.0),), node._replace(stale_for=300.0)
    )
    monitor = _ScrapedMonitor({NODES[0]: ("vm", fresh, 10.0), NODES[1]: ("vm", stale, 10.0)})

    cycle(monitor)  # type: ignore[arg-type]

    assert _rss(metrics_probe) == {("policy", NODES[0]): 3e9}
    assert set(snapshot.latest()) == {NODES[0]}


def test_the_collection_mode_is_checked() -> None:
    with pytest.raises(ValueError, match="mode must be one of 'publish', 'ask', got 'pull'"):
        GroupMemoryCycle(_MaintainedSamplers(), mode="pull")  # type: ignore[arg-type]


def test_a_reading_the_sampler_has_not_renewed_is_not_rebuilt() -> None:
    registry = GroupWorkerRegistry()
    snapshot = GroupMemorySnapshot()
    cycle = GroupMemoryCycle(_MaintainedSamplers(), registry=registry, snapshot=snapshot)  # type: ignore[arg-type]
    figures = NodeGroupFigures(5.0, (GroupFigure("policy", 3e9, None, 2.0),))
    monitor = _ScrapedMonitor({NODES[0]: ("vm", figures, 1.0)})

    cycle(monitor)  # type: ignore[arg-type]
    first = snapshot.latest()[NODES[0]][0]
    cycle(monitor)  # type: ignore[arg-type]
    assert snapshot.latest()[NODES[0]][0] is first

    monitor.figures = {NODES[0]: ("vm", figures._replace(sampled_at=15.0), 2.0)}
    cycle(monitor)  # type: ignore[arg-type]
    assert snapshot.latest()[NODES[0]][0] is not first


def test_the_samplers_get_the_registry_version_with_its_lists() -> None:
    registry = GroupWorkerRegistry()
    registry.register("policy", [(NODES[0], 101, 1)])
    samplers = _MaintainedSamplers()
    cycle = GroupMemoryCycle(samplers, registry=registry, snapshot=GroupMemorySnapshot())  # type: ignore[arg-type]
    monitor = _ScrapedMonitor({})

    cycle(monitor)  # type: ignore[arg-type]
    cycle(monitor)  # type: ignore[arg-type]
    registry.register("rollout", [(NODES[1], 201, 1)])
    cycle(monitor)  # type: ignore[arg-type]

    first, second, third = samplers.versions
    assert first == second and first != third
    assert [version[0] for version in (first, third)] == [registry.version - 1, registry.version]
    assert samplers.maintained[-1] == {
        NODES[0]: [("policy", 101, 1)],
        NODES[1]: [("rollout", 201, 1)],
    }


def _readings(snapshot: GroupMemorySnapshot) -> dict[str, NodeGroupMemory]:
    return {node: reading for node, (reading, _age) in snapshot.latest().items()}


def test_readings_kept_from_cycle_to_cycle_equal_a_rebuild_from_scratch() -> None:
    """Whatever changes between cycles, the kept readings are those a fresh cycle builds."""
    registry = GroupWorkerRegistry()
    registry.register("policy", [(NODES[0], 101, 1), (NODES[1], 102, 1)])
    kept_snapshot = GroupMemorySnapshot()
    kept = GroupMemoryCycle(_MaintainedSamplers(), registry=registry, snapshot=kept_snapshot)  # type: ignore[arg-type]

    def figures(stamp: float, rss: float) -> NodeGroupFigures:
        return NodeGroupFigures(stamp, (GroupFigure("policy", rss, None, 1.0),))

    steps: list[Callable[[dict[str, tuple[str, NodeGroupFigures, float]]], None]] = [
        lambda f: None,  # nothing new
        lambda f: f.update({NODES[0]: ("vm", figures(15.0, 4e9), 2.0)}),  # one node renewed
        lambda f: f.update({NODES[1]: ("vm-renamed", f[NODES[1]][1], 3.0)}),  # host changed
        lambda f: registry.register("rollout", [(NODES[1], 201, 1)]),  # registration changed
        lambda f: f.pop(NODES[0]),  # a node no longer answered
        lambda f: f.update({NODES[0]: ("vm", figures(25.0, 5e9), 4.0)}),  # and came back
    ]
    carried = {NODES[0]: ("vm", figures(5.0, 3e9), 1.0), NODES[1]: ("vm", figures(5.0, 2e9), 1.0)}
    kept(_ScrapedMonitor(dict(carried)))  # type: ignore[arg-type]
    for step in steps:
        step(carried)
        kept(_ScrapedMonitor(dict(carried)))  # type: ignore[arg-type]
        rebuilt_snapshot = GroupMemorySnapshot()
        rebuilt = GroupMemoryCycle(
            _MaintainedSamplers(), registry=registry, snapshot=rebuilt_snapshot
        )  # type: ignore[arg-type]
        rebuilt(_ScrapedMonitor(dict(carried)))  # type: ignore[arg-type]
        assert _readings(kept_snapshot) == _readings(rebuilt_snapshot)


class _FiguresOnly:
    """A monitor seen only through ``group_figures()``, the copies it hands out."""

    has_consumer = True

    def __init__(self, monitor: hm.HostMemoryMonitor) -> None:
        self._monitor = monitor
        self.max_age = monitor.max_age

    def group_figures(self) -> dict[str, tuple[str, NodeGroupFigures, float]]:
        return self._monitor.group_figures()


def test_reading_the_monitor_s_records_gives_the_readings_its_figures_give(
    simulated_cluster: Callable[..., Any], make_monitor: Callable[..., hm.HostMemoryMonitor]
) -> None:
    rss = {"policy": 3e9, "rollout": 1e9}
    sim = simulated_cluster(3, groups=lambda index, _t: rss if index else {})
    registry = GroupWorkerRegistry()
    registry.register("policy", [(sim.node_id(1), 101, 1), (sim.node_id(2), 102, 1)])
    monitor = make_monitor(sim.cluster)
    snapshots = GroupMemorySnapshot(), GroupMemorySnapshot()
    from_records, from_figures = (
        GroupMemoryCycle(_MaintainedSamplers(), registry=registry, snapshot=snapshot)  # type: ignore[arg-type]
        for snapshot in snapshots
    )

    for step in range(3):
        if step == 2:
            rss["policy"] = 4e9
        monitor.collect_once()
        from_records(monitor)
        from_figures(_FiguresOnly(monitor))  # type: ignore[arg-type]
        assert _readings(snapshots[0]) == _readings(snapshots[1])

    readings = _readings(snapshots[0])
    # Node 0 hosts no group; its sampler publishes the node alone, with no group figures.
    assert set(readings) == {sim.node_id(0), sim.node_id(1), sim.node_id(2)}
    assert readings[sim.node_id(0)].groups == ()


class _QuietSamplers(_MaintainedSamplers):
    """Samplers that all stand, and keep no record of what they were told."""

    def maintain(
        self, workers_by_node: Any, *, version: object = None, nodes: Any = ()
    ) -> dict[str, SamplerError]:
        return {}


def _alive_since(before: set[int]) -> list[object]:
    gc.collect()
    return [o for o in gc.get_objects() if id(o) not in before]


def test_a_new_reading_leaves_the_driver_at_most_two_lasting_objects_per_node() -> None:
    """The collector's full passes come as often as objects outlive a cycle, so few may."""
    nodes = [f"{n:056x}" for n in range(200)]
    registry = GroupWorkerRegistry()
    registry.register("policy", [(node, 101, 1) for node in nodes])
    snapshot = GroupMemorySnapshot()
    cycle = GroupMemoryCycle(_QuietSamplers(), registry=registry, snapshot=snapshot)  # type: ignore[arg-type]

    def carried(stamp: float) -> dict[str, tuple[str, NodeGroupFigures, float]]:
        groups = (
            GroupFigure("policy", 3e9 + stamp, 2e9, 5.0),
            GroupFigure("rollout", 1e9, None, 1.0),
        )
        return {
            node: (f"host-{n}", NodeGroupFigures(stamp, groups), stamp)
            for n, node in enumerate(nodes)
        }

    cycle(_ScrapedMonitor(carried(1.0)))  # type: ignore[arg-type]
    monitor = _ScrapedMonitor(carried(2.0))
    gc.collect()
    before = {id(o) for o in gc.get_objects()}

    cycle(monitor)  # type: ignore[arg-type]

    lasting = _alive_since(before)
    assert len(lasting) <= 2 * len(nodes) + 8, Counter(type(o).__name__ for o in lasting)
    reading, _age = snapshot.latest()[nodes[7]]
    assert [(g.group, g.rss_bytes, g.pss_bytes, g.workers) for g in reading.groups] == [
        ("policy", 3_000_000_002, 2_000_000_000, 1),
        ("rollout", 1_000_000_000, None, 0),
    ]
