"""Process-tree memory on fake /proc trees: walking, reading, summing, pid reuse, support."""

from __future__ import annotations

import os
import sys

import pytest

from raylens.telemetry import process_memory as pm
from raylens.telemetry.process_memory import (
    ProcessTreeMemory,
    ProcFS,
    ServerMemoryTarget,
    _descendant_pids,
    _read_process_memory,
    collect_host_memory,
    collect_process_tree_memory,
    process_tree_memory_supported,
)
from raylens_fakes.procfs import PAGE_SIZE, FakeProcFS

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="procfs is Linux only")


@pytest.fixture
def fake(tmp_path) -> FakeProcFS:
    return FakeProcFS(tmp_path / "proc")


class RecordingOpener:
    """Delegates to the fake's opener and remembers every path opened."""

    def __init__(self, fake: FakeProcFS) -> None:
        self.fake = fake
        self.paths: list[str] = []

    def __call__(self, path: str, flags: int) -> int:
        self.paths.append(os.path.relpath(path, self.fake.root))
        return self.fake.open(path, flags)

    def opened(self, suffix: str) -> list[str]:
        return [p for p in self.paths if p.endswith(suffix)]


# ---------------------------------------------------------------- descendants


def test_walk_includes_root_children_and_grandchildren(fake):
    fake.add_process(100)
    fake.add_process(101, parent=100)
    fake.add_process(102, parent=100)
    fake.add_process(103, parent=102)
    fake.add_process(200)  # unrelated
    assert _descendant_pids(100, procfs=fake.procfs) == {100, 101, 102, 103}
    assert _descendant_pids(102, procfs=fake.procfs) == {102, 103}


def test_walk_finds_children_forked_by_a_non_main_thread(fake):
    fake.add_process(100, threads=[110, 111])
    fake.add_process(101, parent=100, tid=111)
    fake.add_process(102, parent=101)
    assert _descendant_pids(100, procfs=fake.procfs) == {100, 101, 102}


def test_walk_of_missing_root_is_empty(fake):
    assert _descendant_pids(4242, procfs=fake.procfs) == set()


def test_walk_skips_a_child_that_exited_after_being_listed(fake):
    fake.add_process(100)
    fake.add_process(101, parent=100)
    fake.add_process(102, parent=100)
    fake.remove_process(101, keep_listing=True)
    assert _descendant_pids(100, procfs=fake.procfs) == {100, 102}


def test_walk_skips_a_child_that_exits_while_its_threads_are_listed(fake):
    fake.add_process(100)
    fake.add_process(101, parent=100)
    fake.add_process(102, parent=101)
    fake.exit_on_open(101, "task")
    assert _descendant_pids(100, procfs=fake.procfs) == {100}


def test_walk_skips_unlistable_process_and_keeps_going(fake):
    fake.add_process(100)
    fake.add_process(101, parent=100)
    fake.add_process(102, parent=100)
    fake.deny(101, "task")
    assert _descendant_pids(100, procfs=fake.procfs) == {100, 102}


def test_walk_tolerates_an_unreadable_children_file(fake):
    fake.add_process(100, threads=[110])
    fake.add_process(101, parent=100)
    fake.add_process(102, parent=100, tid=110)
    fake.deny(100, "task/100/children")
    assert _descendant_pids(100, procfs=fake.procfs) == {100, 102}


def test_walk_terminates_on_a_listing_cycle(fake):
    fake.add_process(100)
    fake.add_process(101, parent=100)
    fake.list_child(101, 100)
    assert _descendant_pids(100, procfs=fake.procfs) == {100, 101}


def test_walk_accepts_a_mount_path(fake):
    fake.add_process(100)
    fake.add_process(101, parent=100)
    assert _descendant_pids(100, procfs=str(fake.root)) == {100, 101}


# ---------------------------------------------------------------- one process


def test_read_rss_and_pss_from_smaps_rollup(fake):
    fake.add_process(100, rss_bytes=10 * PAGE_SIZE, pss_bytes=3 * PAGE_SIZE)
    assert _read_process_memory(100, procfs=fake.procfs) == (10 * PAGE_SIZE, 3 * PAGE_SIZE)


def test_read_falls_back_to_statm_when_rollup_is_denied(fake):
    fake.add_process(100, rss_bytes=10 * PAGE_SIZE, pss_bytes=3 * PAGE_SIZE)
    fake.deny(100, "smaps_rollup")
    assert _read_process_memory(100, procfs=fake.procfs) == (10 * PAGE_SIZE, None)


def test_read_falls_back_to_statm_without_rollup_file(fake):
    fake.add_process(100, rss_bytes=7 * PAGE_SIZE, smaps_rollup=False)
    assert _read_process_memory(100, procfs=fake.procfs) == (7 * PAGE_SIZE, None)


@pytest.mark.parametrize("empty_rollup", [False, True])
def test_zombie_holds_nothing_and_its_pss_is_known(fake, empty_rollup):
    fake.add_process(100, rss_bytes=10 * PAGE_SIZE)
    fake.make_zombie(100, empty_smaps_rollup=empty_rollup)
    assert _read_process_memory(100, procfs=fake.procfs) == (0, 0)
    assert fake.procfs.read_rss(100) == 0


def test_read_of_exited_process_is_none(fake):
    assert _read_process_memory(4242, procfs=fake.procfs) is None
    assert fake.procfs.read_rss(4242) is None


def test_exit_between_rollup_and_statm_is_none(fake):
    fake.add_process(100)
    fake.exit_on_open(100, "smaps_rollup")
    assert _read_process_memory(100, procfs=fake.procfs) is None


def test_exit_after_rollup_denied_is_none(fake):
    fake.add_process(100)
    fake.deny(100, "smaps_rollup")
    fake.exit_on_open(100, "statm")
    assert _read_process_memory(100, procfs=fake.procfs) is None


def test_nothing_readable_is_none(fake):
    fake.add_process(100)
    fake.deny(100, "smaps_rollup")
    fake.deny(100, "statm")
    assert _read_process_memory(100, procfs=fake.procfs) is None


def test_rollup_without_pss_line_reports_rss_only(tmp_path):
    fake = FakeProcFS(tmp_path / "proc")
    fake.add_process(100, rss_bytes=4 * PAGE_SIZE)
    (fake.root / "100" / "smaps_rollup").write_text(f"Rss: {4 * PAGE_SIZE // 1024} kB\n")
    assert _read_process_memory(100, procfs=fake.procfs) == (4 * PAGE_SIZE, None)


def test_start_ticks(fake):
    fake.add_process(100, start_ticks=123456)
    assert fake.procfs.start_ticks(100) == 123456
    assert fake.procfs.start_ticks(4242) is None
    (fake.root / "100" / "stat").write_text("100 (truncated")
    assert fake.procfs.start_ticks(100) is None
    (fake.root / "100" / "stat").write_text("100 (x) S 1" + " garbage" * 30)
    assert fake.procfs.start_ticks(100) is None


# ---------------------------------------------------------------- whole trees


def test_tree_sums_rss_and_pss(fake):
    fake.add_process(100, rss_bytes=10 * PAGE_SIZE, pss_bytes=6 * PAGE_SIZE)
    fake.add_process(101, parent=100, rss_bytes=20 * PAGE_SIZE, pss_bytes=8 * PAGE_SIZE)
    fake.add_process(102, parent=101, rss_bytes=5 * PAGE_SIZE, pss_bytes=5 * PAGE_SIZE)
    assert collect_process_tree_memory(100, procfs=fake.procfs) == ProcessTreeMemory(
        35 * PAGE_SIZE, 19 * PAGE_SIZE, 3
    )


def test_tree_pss_unknown_when_one_process_lacks_it(fake):
    fake.add_process(100, rss_bytes=10 * PAGE_SIZE)
    fake.add_process(101, parent=100, rss_bytes=20 * PAGE_SIZE)
    fake.deny(101, "smaps_rollup")
    assert collect_process_tree_memory(100, procfs=fake.procfs) == ProcessTreeMemory(
        30 * PAGE_SIZE, None, 2
    )


def test_tree_of_missing_root(fake):
    assert collect_process_tree_memory(4242, procfs=fake.procfs) == ProcessTreeMemory(0, 0, 0)


def test_tree_skips_a_process_exiting_while_read(fake):
    fake.add_process(100, rss_bytes=10 * PAGE_SIZE)
    fake.add_process(101, parent=100, rss_bytes=20 * PAGE_SIZE)
    fake.exit_on_open(101, "smaps_rollup")
    assert collect_process_tree_memory(100, procfs=fake.procfs) == ProcessTreeMemory(
        10 * PAGE_SIZE, 10 * PAGE_SIZE, 1
    )


def test_tree_counts_zombies_as_holding_nothing(fake):
    fake.add_process(100, rss_bytes=10 * PAGE_SIZE)
    fake.add_process(101, parent=100, rss_bytes=20 * PAGE_SIZE)
    fake.make_zombie(101)
    assert collect_process_tree_memory(100, procfs=fake.procfs) == ProcessTreeMemory(
        10 * PAGE_SIZE, 10 * PAGE_SIZE, 2
    )


def test_rss_only_never_opens_smaps_rollup(fake):
    fake.add_process(100, rss_bytes=10 * PAGE_SIZE, pss_bytes=2 * PAGE_SIZE)
    fake.add_process(101, parent=100, rss_bytes=20 * PAGE_SIZE)
    opener = RecordingOpener(fake)
    procfs = ProcFS(fake.root, opener=opener)
    memory = collect_process_tree_memory(100, procfs=procfs, include_pss=False)
    assert memory == ProcessTreeMemory(30 * PAGE_SIZE, None, 2)
    assert opener.opened("smaps_rollup") == []
    assert sorted(opener.opened("statm")) == ["100/statm", "101/statm"]


def test_rss_only_skips_a_process_exiting_while_read(fake):
    fake.add_process(100, rss_bytes=10 * PAGE_SIZE)
    fake.add_process(101, parent=100, rss_bytes=20 * PAGE_SIZE)
    fake.exit_on_open(101, "statm")
    memory = collect_process_tree_memory(100, procfs=fake.procfs, include_pss=False)
    assert memory == ProcessTreeMemory(10 * PAGE_SIZE, None, 1)


def test_large_children_listing_is_read_whole(fake):
    fake.add_process(100)
    for pid in range(1000, 1900):  # listing longer than one read
        fake.add_process(pid, parent=100, rss_bytes=PAGE_SIZE)
    assert (fake.root / "100" / "task" / "100" / "children").stat().st_size > 4096
    memory = collect_process_tree_memory(100, procfs=fake.procfs, include_pss=False)
    assert memory.process_count == 901


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "100", None])
def test_root_pid_must_be_a_positive_int(fake, bad):
    with pytest.raises(ValueError, match="root_pid"):
        collect_process_tree_memory(bad, procfs=fake.procfs)


# ---------------------------------------------------------------- support


@linux_only
def test_supported_with_self_and_children_files(fake):
    assert process_tree_memory_supported(procfs=fake.procfs)


def test_unsupported_without_procfs(tmp_path):
    assert not process_tree_memory_supported(procfs=tmp_path / "nowhere")
    bare = FakeProcFS(tmp_path / "bare", self_pid=None)
    assert not process_tree_memory_supported(procfs=bare.procfs)


def test_unsupported_without_children_files(fake):
    fake.deny(1, "task/1/children")
    assert not process_tree_memory_supported(procfs=fake.procfs)


def test_unsupported_off_linux(fake, monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    assert not process_tree_memory_supported(procfs=fake.procfs)


@linux_only
def test_supported_on_this_linux_host():
    assert process_tree_memory_supported()


def test_procfs_root_must_be_a_path():
    with pytest.raises(ValueError, match="procfs root"):
        ProcFS("")
    assert ProcFS("/proc/").root == "/proc"
    assert repr(ProcFS("/proc")) == "ProcFS('/proc')"


# ---------------------------------------------------------------- targets


def test_target_records_start_time_at_construction(fake):
    fake.add_process(100, start_ticks=555)
    target = ServerMemoryTarget("policy", "vllm", 100, procfs=fake.procfs)
    assert target.start_ticks == 555
    fake.reuse_pid(100, start_ticks=999)
    assert target.start_ticks == 555


def test_target_of_unreadable_process_has_no_start_time(fake):
    target = ServerMemoryTarget("policy", "vllm", 4242, procfs=fake.procfs)
    assert target.start_ticks is None


def test_target_equality_ignores_start_time(fake):
    fake.add_process(100)
    assert ServerMemoryTarget("a", "b", 100, procfs=fake.procfs) == ServerMemoryTarget(
        "a", "b", 100, procfs=str(fake.root / "nothing")
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("", "vllm", 1), "server name"),
        (("a", "", 1), "server_type"),
        (("a", "vllm", 0), "pid of server 'a'"),
        (("a", "vllm", "12"), "pid of server 'a'"),
    ],
)
def test_target_validation(fake, args, message):
    with pytest.raises(ValueError, match=message):
        ServerMemoryTarget(*args, procfs=fake.procfs)


# ---------------------------------------------------------------- host


def test_host_memory_used_is_total_minus_available(monkeypatch):
    class VM:
        total = 64 * 2**30
        available = 40 * 2**30
        used = 1  # psutil's own "used" is not what raylens reports

    monkeypatch.setattr(pm.psutil, "virtual_memory", lambda: VM())
    assert collect_host_memory() == pm.HostMemory(24 * 2**30, 40 * 2**30, 64 * 2**30)


def test_host_memory_on_this_host_is_consistent():
    memory = collect_host_memory()
    assert memory.total_bytes > 0
    assert memory.used_bytes + memory.available_bytes == memory.total_bytes
