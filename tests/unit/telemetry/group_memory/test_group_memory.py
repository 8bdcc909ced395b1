"""Memory of worker groups' process trees on one node, on a fake procfs and an injected clock."""

from __future__ import annotations

import pickle
from collections.abc import Callable

import pytest

from raylens.telemetry.group_memory import (
    GoneWorker,
    GroupMemory,
    GroupMemoryReader,
    GroupMemorySnapshot,
    GroupWorker,
    GroupWorkerRegistry,
    NodeGroupMemory,
    PublishedReading,
    WorkerFate,
    register_group_memory_gauges,
)
from raylens.telemetry.group_memory._snapshot import (
    GROUP_MEMORY_USAGE_METRIC,
    GROUP_PROCESSES_METRIC,
    GROUP_PSS_AGE_METRIC,
)
from raylens.telemetry.raylet_payload import GroupFigure, NodeGroupFigures
from raylens_fakes.clock import ManualClock
from raylens_fakes.procfs import PAGE_SIZE, FakeProcFS

MB = 2**20
assert MB % PAGE_SIZE == 0
NODE_A = "a" * 56
NODE_B = "b" * 56


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(100.0)


def _worker(fake: FakeProcFS, group: str, pid: int) -> GroupWorker:
    return GroupWorker(group, pid, fake.start_ticks(pid))


def _reader(fake: FakeProcFS, clock: ManualClock, **options: object) -> GroupMemoryReader:
    options.setdefault("host_name", "node-a")
    return GroupMemoryReader(fake.procfs, clock=clock, **options)  # type: ignore[arg-type]


def _group(reading: NodeGroupMemory, name: str) -> GroupMemory:
    found = {g.group: g for g in reading.groups}
    assert name in found, f"no reading for group {name!r}: {reading.groups}"
    return found[name]


# --------------------------------------------------------------------------- reading


def test_union_of_worker_trees_counts_each_process_once(
    fake_procfs: FakeProcFS, clock: ManualClock
):
    fake = fake_procfs
    fake.add_process(200, rss_bytes=10 * MB)
    fake.add_process(201, parent=200, rss_bytes=3 * MB)
    fake.add_process(300, rss_bytes=20 * MB)
    # Worker 201 is also registered on its own: its tree lies inside worker 200's.
    fake.add_process(400, rss_bytes=7 * MB)
    workers = [
        _worker(fake, "policy", 200),
        _worker(fake, "policy", 201),
        _worker(fake, "policy", 300),
        _worker(fake, "rollout", 400),
    ]

    reading = _reader(fake, clock).read(workers)

    policy = _group(reading, "policy")
    assert policy.rss_bytes == 33 * MB
    assert policy.process_count == 3
    assert policy.workers == 3
    rollout = _group(reading, "rollout")
    assert (rollout.rss_bytes, rollout.process_count) == (7 * MB, 1)
    assert reading.host_name == "node-a"
    assert reading.gone == ()


def test_busy_workers_are_read_without_their_cooperation(
    fake_procfs: FakeProcFS, clock: ManualClock
):
    # A worker deep in a long method still has its files in /proc; its memory moves
    # between readings and each reading sees the current figure.
    fake = fake_procfs
    fake.add_process(200, threads=[210, 211], rss_bytes=10 * MB)
    fake.add_process(220, parent=200, tid=211, rss_bytes=2 * MB)
    reader = _reader(fake, clock)
    workers = [_worker(fake, "policy", 200)]
    assert _group(reader.read(workers), "policy").rss_bytes == 12 * MB

    fake.set_memory(200, rss_bytes=300 * MB)
    clock.advance(1)
    policy = _group(reader.read(workers), "policy")
    assert policy.rss_bytes == 302 * MB
    assert policy.process_count == 2


def test_a_recreated_worker_with_a_new_pid_replaces_the_old_one(
    fake_procfs: FakeProcFS, clock: ManualClock
):
    fake = fake_procfs
    fake.add_process(200, rss_bytes=10 * MB)
    fake.add_process(201, rss_bytes=5 * MB)
    reader = _reader(fake, clock)
    old = [_worker(fake, "policy", 200), _worker(fake, "policy", 201)]
    assert _group(reader.read(old), "policy").rss_bytes == 15 * MB

    fake.remove_process(201)
    fake.add_process(250, rss_bytes=8 * MB)
    new = [_worker(fake, "policy", 200), _worker(fake, "policy", 250)]
    reading = reader.read(new)

    assert _group(reading, "policy").rss_bytes == 18 * MB
    assert reading.gone == ()


def test_a_worker_killed_mid_cycle_costs_only_its_own_contribution(
    fake_procfs: FakeProcFS, clock: ManualClock
):
    fake = fake_procfs
    fake.add_process(200, rss_bytes=10 * MB)
    fake.add_process(201, parent=200, rss_bytes=1 * MB)
    fake.add_process(300, rss_bytes=20 * MB)
    fake.add_process(400, rss_bytes=7 * MB)
    # Worker 300 dies just as its memory is read, after its tree was walked.
    fake.exit_on_open(300, "statm")
    fake.exit_on_open(300, "smaps_rollup")
    workers = [
        _worker(fake, "policy", 200),
        _worker(fake, "policy", 300),
        _worker(fake, "rollout", 400),
    ]

    reading = _reader(fake, clock).read(workers)

    policy = _group(reading, "policy")
    assert (policy.rss_bytes, policy.process_count) == (11 * MB, 2)
    assert _group(reading, "rollout").rss_bytes == 7 * MB


def test_a_worker_that_exited_before_the_reading_is_reported_gone(
    fake_procfs: FakeProcFS, clock: ManualClock
):
    fake = fake_procfs
    fake.add_process(200, rss_bytes=10 * MB)
    fake.add_process(300, rss_bytes=20 * MB)
    workers = [_worker(fake, "policy", 200), _worker(fake, "policy", 300)]
    fake.remove_process(300)

    reading = _reader(fake, clock).read(workers)

    policy = _group(reading, "policy")
    assert (policy.rss_bytes, policy.workers) == (10 * MB, 1)
    assert [(g.group, g.pid, g.fate) for g in reading.gone] == [("policy", 300, WorkerFate.EXITED)]


def test_a_reused_pid_is_not_measured_as_the_worker(fake_procfs: FakeProcFS, clock: ManualClock):
    fake = fake_procfs
    fake.add_process(200, rss_bytes=10 * MB)
    fake.add_process(300, rss_bytes=20 * MB)
    workers = [_worker(fake, "policy", 200), _worker(fake, "policy", 300)]
    fake.reuse_pid(300, rss_bytes=900 * MB)
    fake.add_process(301, parent=300, rss_bytes=100 * MB)

    reading = _reader(fake, clock).read(workers)

    policy = _group(reading, "policy")
    assert (policy.rss_bytes, policy.process_count) == (10 * MB, 1)
    assert [(g.pid, g.fate) for g in reading.gone] == [(300, WorkerFate.REUSED)]


def test_a_group_whose_every_worker_is_gone_has_no_reading(
    fake_procfs: FakeProcFS, clock: ManualClock
):
    fake = fake_procfs
    fake.add_process(200, rss_bytes=10 * MB)
    fake.add_process(300, rss_bytes=20 * MB)
    workers = [_worker(fake, "policy", 200), _worker(fake, "rollout", 300)]
    fake.remove_process(300)

    reading = _reader(fake, clock).read(workers)

    assert [g.group for g in reading.groups] == ["policy"]


def test_unknown_start_time_is_pinned_at_first_sight(fake_procfs: FakeProcFS, clock: ManualClock):
    fake = fake_procfs
    fake.add_process(200, rss_bytes=10 * MB)
    reader = _reader(fake, clock)
    workers = [GroupWorker("policy", 200, None)]
    assert _group(reader.read(workers), "policy").rss_bytes == 10 * MB

    fake.reuse_pid(200, rss_bytes=50 * MB)
    reading = reader.read(workers)

    assert reading.groups == ()
    assert [(g.pid, g.fate) for g in reading.gone] == [(200, WorkerFate.REUSED)]


def test_pss_is_read_at_its_own_rate_and_reported_with_its_age(
    fake_procfs: FakeProcFS, clock: ManualClock
):
    fake = fake_procfs
    fake.add_process(200, rss_bytes=10 * MB, pss_bytes=4 * MB)
    fake.add_process(201, parent=200, rss_bytes=2 * MB, pss_bytes=1 * MB)
    reader = _reader(fake, clock, pss_interval_seconds=30.0)
    workers = [_worker(fake, "policy", 200)]

    first = _group(reader.read(workers), "policy")
    assert (first.pss_bytes, first.pss_age_seconds) == (5 * MB, 0.0)

    fake.set_memory(200, rss_bytes=20 * MB, pss_bytes=9 * MB)
    clock.advance(10)
    # Between PSS reads only statm is opened: a denied smaps_rollup goes unnoticed.
    fake.deny(200, "smaps_rollup")
    carried = _group(reader.read(workers), "policy")
    assert carried.rss_bytes == 22 * MB
    assert (carried.pss_bytes, carried.pss_age_seconds) == (5 * MB, 10.0)

    clock.advance(20)
    # Due again, and now unreadable: no PSS rather than an old one.
    due = _group(reader.read(workers), "policy")
    assert (due.pss_bytes, due.pss_age_seconds) == (None, None)
    assert due.rss_bytes == 22 * MB


def test_pss_refreshed_after_its_interval(fake_procfs: FakeProcFS, clock: ManualClock):
    fake = fake_procfs
    fake.add_process(200, rss_bytes=10 * MB, pss_bytes=4 * MB)
    reader = _reader(fake, clock, pss_interval_seconds=30.0)
    workers = [_worker(fake, "policy", 200)]
    reader.read(workers)
    fake.set_memory(200, rss_bytes=10 * MB, pss_bytes=6 * MB)
    clock.advance(30)

    policy = _group(reader.read(workers), "policy")

    assert (policy.pss_bytes, policy.pss_age_seconds) == (6 * MB, 0.0)


def test_carried_pss_is_dropped_when_the_group_loses_a_worker(
    fake_procfs: FakeProcFS, clock: ManualClock
):
    fake = fake_procfs
    fake.add_process(200, rss_bytes=10 * MB, pss_bytes=4 * MB)
    fake.add_process(300, rss_bytes=10 * MB, pss_bytes=4 * MB)
    reader = _reader(fake, clock, pss_interval_seconds=30.0)
    workers = [_worker(fake, "policy", 200), _worker(fake, "policy", 300)]
    assert _group(reader.read(workers), "policy").pss_bytes == 8 * MB

    fake.remove_process(300)
    clock.advance(5)
    policy = _group(reader.read(workers), "policy")

    assert policy.rss_bytes == 10 * MB
    assert policy.pss_bytes is None


def test_reading_without_pss_interval_reads_pss_every_time(
    fake_procfs: FakeProcFS, clock: ManualClock
):
    fake = fake_procfs
    fake.add_process(200, rss_bytes=10 * MB, pss_bytes=4 * MB)
    reader = _reader(fake, clock)
    workers = [_worker(fake, "policy", 200)]
    reader.read(workers)
    fake.set_memory(200, rss_bytes=10 * MB, pss_bytes=7 * MB)
    clock.advance(1)

    assert _group(reader.read(workers), "policy").pss_bytes == 7 * MB


def test_rss_comes_from_stat_when_it_holds_the_resident_pages(
    fake_procfs: FakeProcFS, clock: ManualClock
):
    # The fake leaves stat's resident-pages field (24) at 0; a kernel fills it in with
    # the same counter statm reports. Write it in by hand, different from statm.
    fake = fake_procfs
    fake.add_process(200, rss_bytes=10 * MB)
    stat = fake.root / "200" / "stat"
    head, _, tail = stat.read_text().rpartition(")")
    fields = tail.split()
    fields[21] = str(3 * MB // PAGE_SIZE)
    stat.write_text(f"{head}) {' '.join(fields)}\n")
    reader = _reader(fake, clock, pss_interval_seconds=300.0)
    workers = [_worker(fake, "policy", 200)]
    reader.read(workers)  # reads PSS (and RSS from smaps_rollup)

    clock.advance(1)
    assert _group(reader.read(workers), "policy").rss_bytes == 3 * MB


def test_trees_are_walked_at_their_own_rate(fake_procfs: FakeProcFS, clock: ManualClock):
    fake = fake_procfs
    fake.add_process(200, rss_bytes=10 * MB)
    reader = _reader(fake, clock, tree_interval_seconds=30.0, pss_interval_seconds=300.0)
    workers = [_worker(fake, "policy", 200)]
    reader.read(workers)

    # A child spawned after the walk is counted from the next walk on.
    fake.add_process(201, parent=200, rss_bytes=5 * MB)
    clock.advance(10)
    assert _group(reader.read(workers), "policy").rss_bytes == 10 * MB
    clock.advance(20)
    policy = _group(reader.read(workers), "policy")
    assert (policy.rss_bytes, policy.process_count) == (15 * MB, 2)


def test_a_remembered_process_that_exits_or_is_replaced_is_not_counted(
    fake_procfs: FakeProcFS, clock: ManualClock
):
    fake = fake_procfs
    fake.add_process(200, rss_bytes=10 * MB)
    fake.add_process(201, parent=200, rss_bytes=5 * MB)
    fake.add_process(202, parent=200, rss_bytes=3 * MB)
    reader = _reader(fake, clock, tree_interval_seconds=30.0, pss_interval_seconds=300.0)
    workers = [_worker(fake, "policy", 200)]
    assert _group(reader.read(workers), "policy").rss_bytes == 18 * MB

    fake.remove_process(201)
    fake.reuse_pid(202, rss_bytes=700 * MB)  # an unrelated process now holds 202
    clock.advance(1)
    policy = _group(reader.read(workers), "policy")

    assert (policy.rss_bytes, policy.process_count) == (10 * MB, 1)


def test_a_new_worker_is_walked_at_once(fake_procfs: FakeProcFS, clock: ManualClock):
    fake = fake_procfs
    fake.add_process(200, rss_bytes=10 * MB)
    reader = _reader(fake, clock, tree_interval_seconds=30.0, pss_interval_seconds=300.0)
    reader.read([_worker(fake, "policy", 200)])
    fake.add_process(300, rss_bytes=4 * MB)
    fake.add_process(301, parent=300, rss_bytes=2 * MB)
    clock.advance(1)

    reading = reader.read([_worker(fake, "policy", 200), _worker(fake, "policy", 300)])

    assert _group(reading, "policy").rss_bytes == 16 * MB


def test_a_pss_reading_walks_the_tree_first(fake_procfs: FakeProcFS, clock: ManualClock):
    fake = fake_procfs
    fake.add_process(200, rss_bytes=10 * MB, pss_bytes=6 * MB)
    reader = _reader(fake, clock, tree_interval_seconds=300.0, pss_interval_seconds=30.0)
    workers = [_worker(fake, "policy", 200)]
    reader.read(workers)
    fake.add_process(201, parent=200, rss_bytes=4 * MB, pss_bytes=2 * MB)
    clock.advance(30)

    policy = _group(reader.read(workers), "policy")

    assert (policy.pss_bytes, policy.process_count) == (8 * MB, 2)


def test_process_cap_skips_whole_groups_not_parts(fake_procfs: FakeProcFS, clock: ManualClock):
    fake = fake_procfs
    fake.add_process(200, rss_bytes=1 * MB)
    fake.add_process(201, parent=200, rss_bytes=1 * MB)
    fake.add_process(300, rss_bytes=1 * MB)
    fake.add_process(301, parent=300, rss_bytes=1 * MB)
    fake.add_process(302, parent=300, rss_bytes=1 * MB)
    workers = [_worker(fake, "a-group", 200), _worker(fake, "b-group", 300)]

    reading = _reader(fake, clock, max_processes=4).read(workers)

    assert [g.group for g in reading.groups] == ["a-group"]
    assert reading.skipped_groups == ("b-group",)


def test_the_process_cap_is_spent_on_small_groups_before_one_big_group(
    fake_procfs: FakeProcFS, clock: ManualClock
):
    # Name order would measure "a-big" (591) first and leave 9 of 600 for policy's 10.
    fake = fake_procfs
    fake.add_process(1000, rss_bytes=1 * MB)
    for pid in range(1001, 1591):
        fake.add_process(pid, parent=1000, rss_bytes=1 * MB)
    fake.add_process(200, rss_bytes=2 * MB)
    for pid in range(201, 210):
        fake.add_process(pid, parent=200, rss_bytes=1 * MB)
    workers = [_worker(fake, "a-big", 1000), _worker(fake, "policy", 200)]

    reading = _reader(fake, clock, max_processes=600).read(workers)

    assert [(g.group, g.process_count) for g in reading.groups] == [("policy", 10)]
    assert reading.skipped_groups == ("a-big",)


def test_the_process_cap_measures_as_many_groups_as_fit_ties_by_name(
    fake_procfs: FakeProcFS, clock: ManualClock
):
    fake = fake_procfs
    # Name order would spend all 6 on a-group; smallest first measures b and d.
    sizes = {"c-group": 3, "a-group": 6, "b-group": 3, "d-group": 1}
    workers = []
    for index, (group, size) in enumerate(sizes.items()):
        root = 100 * (index + 1)
        fake.add_process(root, rss_bytes=MB)
        for child in range(1, size):
            fake.add_process(root + child, parent=root, rss_bytes=MB)
        workers.append(_worker(fake, group, root))

    reading = _reader(fake, clock, max_processes=6).read(workers)

    assert [g.group for g in reading.groups] == ["b-group", "d-group"]
    assert reading.skipped_groups == ("a-group", "c-group")


def test_a_zombie_worker_is_gone_not_a_live_process_of_0_bytes(
    fake_procfs: FakeProcFS, clock: ManualClock
):
    fake = fake_procfs
    fake.add_process(200, rss_bytes=10 * MB)
    fake.add_process(300, rss_bytes=5 * MB)
    workers = [_worker(fake, "policy", 200), _worker(fake, "policy", 300)]
    fake.make_zombie(300)

    for pss_interval in (None, 60.0):  # the RSS-only path and the PSS path
        reading = _reader(fake, clock, pss_interval_seconds=pss_interval).read(workers)
        policy = _group(reading, "policy")
        assert (policy.rss_bytes, policy.process_count, policy.workers) == (10 * MB, 1, 1)
        assert reading.gone == (GoneWorker("policy", 300, WorkerFate.EXITED),)


def test_a_zombie_child_is_not_counted_in_its_workers_tree(
    fake_procfs: FakeProcFS, clock: ManualClock
):
    fake = fake_procfs
    fake.add_process(200, rss_bytes=10 * MB)
    fake.add_process(201, parent=200, rss_bytes=3 * MB)
    fake.add_process(202, parent=200, rss_bytes=3 * MB)
    fake.make_zombie(202)
    reader = _reader(fake, clock, pss_interval_seconds=60.0, tree_interval_seconds=30.0)
    workers = [_worker(fake, "policy", 200)]

    first = _group(reader.read(workers), "policy")
    clock.advance(5)
    fake.make_zombie(201)  # dies between two walks: the next reading drops it too
    second = _group(reader.read(workers), "policy")

    assert (first.rss_bytes, first.process_count) == (13 * MB, 2)
    assert (second.rss_bytes, second.process_count) == (10 * MB, 1)


def test_a_group_whose_only_worker_is_a_zombie_has_no_entry(
    fake_procfs: FakeProcFS, clock: ManualClock
):
    fake = fake_procfs
    fake.add_process(200, rss_bytes=10 * MB)
    workers = [_worker(fake, "policy", 200)]
    fake.make_zombie(200)

    reading = _reader(fake, clock).read(workers)

    assert reading.groups == ()
    assert reading.gone == (GoneWorker("policy", 200, WorkerFate.EXITED),)


def test_reading_measures_its_own_cost(fake_procfs: FakeProcFS, clock: ManualClock):
    fake = fake_procfs
    fake.add_process(200)
    reading = _reader(fake, clock).read([_worker(fake, "policy", 200)])
    assert reading.cpu_seconds >= 0.0
    assert reading.wall_seconds >= 0.0
    assert reading.wall_seconds < 60.0


@pytest.mark.parametrize(
    ("worker", "message"),
    [
        (("", 200, None), "group"),
        (("policy", 0, None), "pid"),
        (("policy", True, None), "pid"),
        (("policy", 200, -1), "start_ticks"),
        (("policy", 200), "(group, pid, start_ticks)"),
    ],
)
def test_bad_worker_entries_are_refused_by_name(
    fake_procfs: FakeProcFS, clock: ManualClock, worker: tuple, message: str
):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _reader(fake_procfs, clock).read([worker])


def test_bad_reader_options_are_refused_by_name(fake_procfs: FakeProcFS):
    with pytest.raises(ValueError, match="pss_interval_seconds"):
        GroupMemoryReader(fake_procfs.procfs, pss_interval_seconds=0)
    with pytest.raises(ValueError, match="tree_interval_seconds"):
        GroupMemoryReader(fake_procfs.procfs, tree_interval_seconds=float("inf"))
    with pytest.raises(ValueError, match="max_processes"):
        GroupMemoryReader(fake_procfs.procfs, max_processes=0)


# --------------------------------------------------------------------------- values


def test_reading_travels_as_builtins_and_comes_back_equal(
    fake_procfs: FakeProcFS, clock: ManualClock
):
    fake = fake_procfs
    fake.add_process(200, rss_bytes=10 * MB, pss_bytes=4 * MB)
    fake.add_process(300, rss_bytes=10 * MB)
    workers = [_worker(fake, "policy", 200), _worker(fake, "policy", 300)]
    fake.remove_process(300)
    reading = _reader(fake, clock).read(workers)

    plain = reading.as_plain()

    _assert_builtins_only(plain)
    assert NodeGroupMemory.from_plain(pickle.loads(pickle.dumps(plain))) == reading


def _assert_builtins_only(value: object) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            assert type(key) is str
            _assert_builtins_only(item)
    elif isinstance(value, (list, tuple)):
        assert type(value) in (list, tuple)
        for item in value:
            _assert_builtins_only(item)
    else:
        assert value is None or type(value) in (str, int, float), repr(value)


@pytest.mark.parametrize(
    "plain",
    [
        None,
        {},
        {"host_name": "h", "groups": [["g", -1, None, None, 1, 1]], "gone": [], "skipped": []},
        {"host_name": "h", "groups": [["g", 1, None, None, 1]], "gone": [], "skipped": []},
        {"host_name": 3, "groups": [], "gone": [], "skipped": []},
    ],
)
def test_malformed_plain_readings_are_refused(plain: object):
    with pytest.raises(ValueError, match="group-memory reading"):
        NodeGroupMemory.from_plain(plain)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- snapshot and series


def _reading(host: str, **groups: tuple[int, int | None, int]) -> NodeGroupMemory:
    return NodeGroupMemory(
        host_name=host,
        groups=tuple(
            GroupMemory(name, rss, pss, None if pss is None else 0.0, count, 1)
            for name, (rss, pss, count) in sorted(groups.items())
        ),
    )


def _by_attributes(points: dict) -> dict:
    return {tuple(sorted(dict(attributes).items())): value for attributes, value in points.items()}


def test_series_carry_group_node_host_and_memory_type(metrics_probe, clock: ManualClock):
    snapshot = GroupMemorySnapshot(clock=clock, max_age=30.0)
    register_group_memory_gauges(snapshot)
    snapshot.publish(
        {
            NODE_A: _reading("host-a", policy=(100, 60, 3), rollout=(50, None, 1)),
            NODE_B: _reading("host-b", policy=(70, 40, 2)),
        }
    )

    metrics_probe.collect()
    usage = metrics_probe.points(GROUP_MEMORY_USAGE_METRIC)
    processes = metrics_probe.points(GROUP_PROCESSES_METRIC)

    def key(group: str, node: str, host: str, memory_type: str | None = None) -> frozenset:
        attributes = {"rl.worker_group": group, "ray.node.id": node, "host.name": host}
        if memory_type is not None:
            attributes["memory.type"] = memory_type
        return frozenset(attributes.items())

    assert usage == {
        key("policy", NODE_A, "host-a", "rss"): 100,
        key("policy", NODE_A, "host-a", "pss"): 60,
        key("rollout", NODE_A, "host-a", "rss"): 50,
        key("policy", NODE_B, "host-b", "rss"): 70,
        key("policy", NODE_B, "host-b", "pss"): 40,
    }
    assert processes == {
        key("policy", NODE_A, "host-a"): 3,
        key("rollout", NODE_A, "host-a"): 1,
        key("policy", NODE_B, "host-b"): 2,
    }
    assert metrics_probe.metric(GROUP_MEMORY_USAGE_METRIC).unit == "By"
    assert metrics_probe.metric(GROUP_PROCESSES_METRIC).unit == "{process}"


def test_pss_is_exported_with_its_age_for_a_published_reading_and_a_local_one(
    metrics_probe, clock: ManualClock
):
    snapshot = GroupMemorySnapshot(clock=clock, max_age=30.0)
    register_group_memory_gauges(snapshot)
    published = NodeGroupFigures(
        1.7e9,
        (
            GroupFigure("policy", 100.0, 60.0, 3.0, None, 42.0),
            GroupFigure("rollout", 50.0, None, 1.0),
            GroupFigure("reward", 20.0, 10.0, 1.0),  # a sampler that gives no age
        ),
    )
    local = NodeGroupMemory("host-b", (GroupMemory("policy", 70, 40, 12.5, 2, 1),))
    snapshot.publish({NODE_A: PublishedReading("host-a", published, {}), NODE_B: local})

    metrics_probe.collect()

    ages = {
        (dict(attributes)["rl.worker_group"], dict(attributes)["ray.node.id"]): value
        for attributes, value in metrics_probe.points(GROUP_PSS_AGE_METRIC).items()
    }
    assert ages == {("policy", NODE_A): 42.0, ("reward", NODE_A): 0.0, ("policy", NODE_B): 12.5}
    assert metrics_probe.metric(GROUP_PSS_AGE_METRIC).unit == "s"


def test_a_failed_or_departed_node_has_no_point_next_export(metrics_probe, clock: ManualClock):
    snapshot = GroupMemorySnapshot(clock=clock, max_age=30.0)
    register_group_memory_gauges(snapshot)
    snapshot.publish({NODE_A: _reading("a", policy=(1, 1, 1)), NODE_B: _reading("b", x=(2, 2, 1))})
    metrics_probe.collect()
    assert len(metrics_probe.points(GROUP_PROCESSES_METRIC)) == 2

    snapshot.publish({NODE_A: RuntimeError("sampler unreachable")})
    metrics_probe.collect()

    assert metrics_probe.points(GROUP_PROCESSES_METRIC) == {}
    assert metrics_probe.points(GROUP_MEMORY_USAGE_METRIC) == {}


def test_a_reading_older_than_max_age_is_not_exported(metrics_probe, clock: ManualClock):
    snapshot = GroupMemorySnapshot(clock=clock, max_age=30.0)
    register_group_memory_gauges(snapshot)
    snapshot.publish({NODE_A: _reading("a", policy=(1, 1, 1))})

    clock.advance(30.0)
    metrics_probe.collect()
    assert len(metrics_probe.points(GROUP_PROCESSES_METRIC)) == 1

    clock.advance(0.001)
    metrics_probe.collect()
    assert metrics_probe.points(GROUP_PROCESSES_METRIC) == {}
    assert metrics_probe.points(GROUP_MEMORY_USAGE_METRIC) == {}


def test_publish_can_shorten_max_age_for_one_cycle(clock: ManualClock):
    snapshot = GroupMemorySnapshot(clock=clock, max_age=30.0)
    snapshot.publish({NODE_A: _reading("a", policy=(1, 1, 1))}, max_age=5.0)
    clock.advance(5.5)
    assert snapshot.observe_processes() == []


def test_latest_reports_fresh_readings_with_their_age(clock: ManualClock):
    snapshot = GroupMemorySnapshot(clock=clock, max_age=30.0)
    reading = _reading("a", policy=(1, 1, 1))
    snapshot.publish({NODE_A: reading, NODE_B: TimeoutError("late")})
    clock.advance(4)
    assert snapshot.latest() == {NODE_A: (reading, 4.0)}


def test_names_are_made_encodable(metrics_probe, clock: ManualClock):
    snapshot = GroupMemorySnapshot(clock=clock, max_age=30.0)
    register_group_memory_gauges(snapshot)
    snapshot.publish({NODE_A: _reading("h\ud800", **{"p\udcff": (1, None, 1)})})
    metrics_probe.collect()
    (attributes,) = metrics_probe.points(GROUP_PROCESSES_METRIC)
    assert dict(attributes)["rl.worker_group"] == "p\ufffd"
    assert dict(attributes)["host.name"] == "h\ufffd"


def _points(snapshot: GroupMemorySnapshot) -> tuple[set, set]:
    def flat(observations: list) -> set:
        return {(o.value, frozenset(dict(o.attributes).items())) for o in observations}

    return flat(snapshot.observe_usage()), flat(snapshot.observe_processes())


def test_points_kept_from_publish_to_publish_equal_those_of_a_fresh_snapshot(clock: ManualClock):
    """New readings reuse what still holds of the last ones; the points never differ."""
    kept = GroupMemorySnapshot(clock=clock, max_age=30.0)
    same = _reading("a", policy=(5, 5, 1))
    cycles = [
        {NODE_A: _reading("a", policy=(1, 1, 1), rollout=(2, None, 1)), NODE_B: same},
        {NODE_A: _reading("a", policy=(3, 2, 2), rollout=(4, None, 1)), NODE_B: same},
        {NODE_A: _reading("a", policy=(3, 2, 2), reward=(4, 1, 1)), NODE_B: same},
        {NODE_A: _reading("renamed", policy=(3, 2, 2), reward=(4, 1, 1)), NODE_B: same},
        {NODE_A: _reading("renamed", policy=(3, 2, 2)), NODE_B: TimeoutError("late")},
        {NODE_A: _reading("h\ud800", **{"p\udcff": (6, None, 1)}), NODE_B: same},
        {NODE_A: _reading("h\ud800", **{"p\udcff": (7, None, 1)})},
    ]
    for results in cycles:
        kept.publish(results)
        fresh = GroupMemorySnapshot(clock=clock, max_age=30.0)
        fresh.publish(results)
        assert _points(kept) == _points(fresh)
        assert kept.latest() == fresh.latest()


@pytest.mark.slow
def test_nothing_is_declared_at_import(declared_on_import: Callable[..., list[str]]):
    modules = ("raylens.telemetry.group_memory", "raylens.distributed.group_memory_sampler")
    assert declared_on_import(*modules, prefix="rl.worker_group") == []
    snapshot = GroupMemorySnapshot()
    register_group_memory_gauges(snapshot)
    from raylens.lens import recorded_metrics

    assert {GROUP_MEMORY_USAGE_METRIC, GROUP_PROCESSES_METRIC} <= set(recorded_metrics())


def test_bad_max_age_is_refused_by_name(clock: ManualClock):
    with pytest.raises(ValueError, match="max_age"):
        GroupMemorySnapshot(clock=clock, max_age=-1)
    with pytest.raises(ValueError, match="max_age"):
        GroupMemorySnapshot(clock=clock).publish({}, max_age=float("nan"))


# --------------------------------------------------------------------------- registry


def test_registered_workers_are_listed_by_node():
    registry = GroupWorkerRegistry()
    registry.register("policy", [(NODE_A, 200, 1000), (NODE_B, 300, 1001)])
    registry.register("rollout", [(NODE_A, 400, None)])

    assert registry.workers_by_node() == {
        NODE_A: [("policy", 200, 1000), ("rollout", 400, None)],
        NODE_B: [("policy", 300, 1001)],
    }
    assert registry.groups() == {"policy", "rollout"}


def test_registering_a_group_again_replaces_its_workers():
    # A recreated worker has a new pid, possibly on another node.
    registry = GroupWorkerRegistry()
    registry.register("policy", [(NODE_A, 200, 1000), (NODE_B, 300, 1001)])
    registry.register("policy", [(NODE_A, 200, 1000), (NODE_A, 350, 1005)])

    assert registry.workers_by_node() == {NODE_A: [("policy", 200, 1000), ("policy", 350, 1005)]}


def test_forgetting_the_last_group_of_a_node_drops_the_node():
    registry = GroupWorkerRegistry()
    registry.register("policy", [(NODE_A, 200, 1000)])
    registry.register("rollout", [(NODE_B, 300, 1001)])
    registry.forget("rollout")
    registry.forget("never-registered")

    assert registry.workers_by_node() == {NODE_A: [("policy", 200, 1000)]}


@pytest.mark.parametrize(
    ("group", "workers", "message"),
    [
        ("", [(NODE_A, 200, 1)], "group"),
        ("policy", [("", 200, 1)], "node id"),
        ("policy", [(NODE_A, -2, 1)], "pid"),
        ("policy", [(NODE_A, 200)], r"\(node_id, pid, start_ticks\)"),
    ],
)
def test_bad_registrations_are_refused_and_change_nothing(group, workers, message):
    registry = GroupWorkerRegistry()
    registry.register("policy", [(NODE_A, 100, 5)])
    with pytest.raises(ValueError, match=message):
        registry.register(group, workers)
    assert registry.workers_by_node() == {NODE_A: [("policy", 100, 5)]}


def test_module_functions_use_the_default_registry():
    from raylens.telemetry import group_memory

    try:
        group_memory.register_group_workers("policy", [(NODE_A, 200, 1000)])
        assert group_memory.DEFAULT_WORKER_REGISTRY.workers_by_node() == {
            NODE_A: [("policy", 200, 1000)]
        }
        group_memory.forget_group_workers("policy")
        assert group_memory.DEFAULT_WORKER_REGISTRY.workers_by_node() == {}
        group_memory.register_group_workers("policy", [(NODE_A, 200, 1000)])
    finally:
        group_memory.reset_group_memory_state()
    assert group_memory.DEFAULT_WORKER_REGISTRY.workers_by_node() == {}


# --------------------------------------------------------------------------- the opener seam


@pytest.mark.parametrize("race", ["deny", "exit_on_open"])
def test_a_worker_whose_stat_cannot_be_read_counts_as_exited(
    fake_procfs: FakeProcFS, clock: ManualClock, race: str
):
    # Every read goes through the reader's opener, stat included: a refusal there (a
    # process hidden from this user) or an exit racing the open counts the worker gone.
    fake = fake_procfs
    fake.add_process(200, rss_bytes=10 * MB)
    fake.add_process(300, rss_bytes=20 * MB)
    workers = [_worker(fake, "policy", 200), _worker(fake, "policy", 300)]
    getattr(fake, race)(300, "stat")

    reading = _reader(fake, clock).read(workers)

    policy = _group(reading, "policy")
    assert (policy.rss_bytes, policy.workers, policy.process_count) == (10 * MB, 1, 1)
    assert [(g.group, g.pid, g.fate) for g in reading.gone] == [("policy", 300, WorkerFate.EXITED)]
    assert (fake.root / "300").exists() == (race == "deny")


def test_a_descendant_whose_stat_is_refused_is_not_counted(
    fake_procfs: FakeProcFS, clock: ManualClock
):
    fake = fake_procfs
    fake.add_process(200, rss_bytes=10 * MB)
    fake.add_process(201, parent=200, rss_bytes=3 * MB)
    fake.add_process(202, parent=200, rss_bytes=5 * MB)
    fake.deny(201, "stat")

    reading = _reader(fake, clock).read([_worker(fake, "policy", 200)])

    policy = _group(reading, "policy")
    assert (policy.rss_bytes, policy.pss_bytes, policy.process_count) == (15 * MB, 15 * MB, 2)


def test_the_same_reading_published_again_stays_fresh_with_the_same_points(
    metrics_probe, clock: ManualClock
):
    snapshot = GroupMemorySnapshot(clock=clock, max_age=30.0)
    register_group_memory_gauges(snapshot)
    reading = _reading("host-a", policy=(100, 60, 3))
    snapshot.publish({NODE_A: reading})
    metrics_probe.collect()
    before = metrics_probe.points(GROUP_MEMORY_USAGE_METRIC)

    clock.advance(20.0)
    snapshot.publish({NODE_A: reading})  # the sampler published nothing new
    clock.advance(20.0)  # past the first publication's expiry, within the second's
    metrics_probe.collect()

    assert metrics_probe.points(GROUP_MEMORY_USAGE_METRIC) == before
    assert snapshot.latest()[NODE_A][0] is reading
