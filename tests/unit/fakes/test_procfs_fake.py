"""The fake /proc lays files out the way the kernel does and reproduces its failure modes."""

from __future__ import annotations

import errno
import os

import pytest

from raylens_fakes.procfs import PAGE_SIZE, FakeProcFS


@pytest.fixture
def fake(tmp_path) -> FakeProcFS:
    return FakeProcFS(tmp_path / "proc")


def _read(path) -> str:
    with open(path) as handle:
        return handle.read()


def test_process_files_have_kernel_layout(fake):
    fake.add_process(100, rss_bytes=10 * PAGE_SIZE, pss_bytes=4 * PAGE_SIZE, start_ticks=777)
    root = fake.root / "100"
    statm = _read(root / "statm").split()
    assert len(statm) == 7
    assert int(statm[1]) == 10
    rollup = _read(root / "smaps_rollup")
    assert f"Rss: {10 * PAGE_SIZE // 1024} kB" in " ".join(rollup.split())
    assert f"Pss: {4 * PAGE_SIZE // 1024} kB" in " ".join(rollup.split())
    stat = _read(root / "stat")
    fields_after_comm = stat.rpartition(")")[2].split()
    assert fields_after_comm[19] == "777"  # field 22 of the whole line
    assert _read(root / "task" / "100" / "children") == ""


def test_children_are_listed_under_the_thread_that_forked_them(fake):
    fake.add_process(100, threads=[101, 102])
    fake.add_process(200, parent=100)
    fake.add_process(300, parent=100, tid=102)
    assert sorted(os.listdir(fake.root / "100" / "task")) == ["100", "101", "102"]
    assert _read(fake.root / "100" / "task" / "100" / "children").split() == ["200"]
    assert _read(fake.root / "100" / "task" / "101" / "children").split() == []
    assert _read(fake.root / "100" / "task" / "102" / "children").split() == ["300"]


def test_start_ticks_increase_when_not_given(fake):
    fake.add_process(100)
    fake.add_process(101)
    assert fake.start_ticks(101) > fake.start_ticks(100)


def test_remove_process_drops_directory_and_listing(fake):
    fake.add_process(100)
    fake.add_process(200, parent=100)
    fake.remove_process(200)
    assert not (fake.root / "200").exists()
    assert _read(fake.root / "100" / "task" / "100" / "children") == ""


def test_remove_process_can_keep_a_stale_listing(fake):
    fake.add_process(100)
    fake.add_process(200, parent=100)
    fake.remove_process(200, keep_listing=True)
    assert not (fake.root / "200").exists()
    assert _read(fake.root / "100" / "task" / "100" / "children").split() == ["200"]


def test_zombie_has_zero_statm_and_refuses_smaps_rollup(fake):
    fake.add_process(100)
    fake.make_zombie(100)
    assert _read(fake.root / "100" / "statm").split() == ["0"] * 7
    with pytest.raises(ProcessLookupError):
        fake.open(str(fake.root / "100" / "smaps_rollup"), os.O_RDONLY)


def test_zombie_with_empty_rollup(fake):
    fake.add_process(100)
    fake.make_zombie(100, empty_smaps_rollup=True)
    fd = fake.open(str(fake.root / "100" / "smaps_rollup"), os.O_RDONLY)
    try:
        assert os.read(fd, 4096) == b""
    finally:
        os.close(fd)


def test_denied_file_raises_permission_error_even_for_root(fake):
    fake.add_process(100)
    fake.deny(100, "smaps_rollup")
    with pytest.raises(PermissionError) as raised:
        fake.open(str(fake.root / "100" / "smaps_rollup"), os.O_RDONLY)
    assert raised.value.errno == errno.EACCES
    fd = fake.open(str(fake.root / "100" / "statm"), os.O_RDONLY)
    os.close(fd)


def test_exit_on_open_removes_the_process_first(fake):
    fake.add_process(100)
    fake.add_process(200, parent=100)
    fake.exit_on_open(200, "statm")
    with pytest.raises(FileNotFoundError):
        fake.open(str(fake.root / "200" / "statm"), os.O_RDONLY)
    assert not (fake.root / "200").exists()
    assert _read(fake.root / "100" / "task" / "100" / "children") == ""


def test_reuse_pid_gives_a_new_start_time(fake):
    fake.add_process(100, start_ticks=5)
    fake.reuse_pid(100, start_ticks=9, rss_bytes=3 * PAGE_SIZE)
    assert fake.start_ticks(100) == 9
    assert int(_read(fake.root / "100" / "statm").split()[1]) == 3


def test_restart_moves_a_process_to_a_new_pid(fake):
    fake.add_process(100)
    fake.add_process(200, parent=100, rss_bytes=3 * PAGE_SIZE, comm="worker")
    ticks = fake.start_ticks(200)
    assert fake.restart(200, 201) == 201
    assert not (fake.root / "200").exists()
    assert _read(fake.root / "100" / "task" / "100" / "children").split() == ["201"]
    assert os.listdir(fake.root / "201" / "task") == ["201"]
    assert int(_read(fake.root / "201" / "statm").split()[1]) == 3
    stat = _read(fake.root / "201" / "stat")
    assert stat.startswith("201 (worker) ")
    assert fake.start_ticks(201) > ticks
    assert int(stat.rpartition(")")[2].split()[19]) == fake.start_ticks(201)
    fake.remove_process(201)
    assert _read(fake.root / "100" / "task" / "100" / "children") == ""


def test_restart_refuses_what_it_cannot_move(fake):
    fake.add_process(100)
    fake.add_process(101, parent=100)
    fake.add_process(102)
    fake.add_process(300, threads=[301])
    with pytest.raises(ValueError, match="pid 102 already exists"):
        fake.restart(101, 102)
    with pytest.raises(ValueError, match="pid 100 has children"):
        fake.restart(100, 400)
    with pytest.raises(ValueError, match="pid 300 has threads"):
        fake.restart(300, 400)
    with pytest.raises(ValueError, match="no pid 999"):
        fake.restart(999, 400)


def test_self_points_at_a_process_with_children_file(fake):
    tid = os.listdir(fake.root / "self" / "task")[0]
    assert (fake.root / "self" / "task" / tid / "children").exists()
    assert (fake.root / "self" / "statm").exists()


def test_without_self(tmp_path):
    fake = FakeProcFS(tmp_path / "proc", self_pid=None)
    assert not (fake.root / "self").exists()


def test_memory_must_be_whole_pages(fake):
    with pytest.raises(ValueError, match="rss_bytes"):
        fake.add_process(100, rss_bytes=PAGE_SIZE + 1)


def test_duplicate_pid_is_refused(fake):
    fake.add_process(100)
    with pytest.raises(ValueError, match="100"):
        fake.add_process(100)


def test_unknown_parent_is_refused(fake):
    with pytest.raises(ValueError, match="parent 55"):
        fake.add_process(100, parent=55)


def test_reader_uses_the_fake_opener(fake):
    fake.add_process(100)
    fake.deny(100, "statm")
    assert fake.procfs.root == str(fake.root)
    assert fake.procfs.read_rss(100) is None


def test_comm_with_parentheses_and_spaces(fake):
    fake.add_process(100, comm="a) b (c", start_ticks=42)
    assert fake.procfs.start_ticks(100) == 42


def test_status_carries_the_high_water_mark_the_kernel_keeps(fake):
    fake.add_process(100, rss_bytes=10 * PAGE_SIZE)
    status = _read(fake.root / "100" / "status")
    assert f"VmHWM:\t{10 * PAGE_SIZE // 1024:>8} kB" in status
    fake.set_memory(100, rss_bytes=30 * PAGE_SIZE)
    fake.set_memory(100, rss_bytes=5 * PAGE_SIZE)  # the mark stays at the highest RSS
    assert fake.procfs.read_peak_rss(100) == 30 * PAGE_SIZE
    fake.set_memory(100, rss_bytes=5 * PAGE_SIZE, hwm_bytes=90 * PAGE_SIZE)  # a spike unseen
    assert fake.procfs.read_peak_rss(100) == 90 * PAGE_SIZE


def test_a_high_water_mark_below_rss_is_refused(fake):
    with pytest.raises(ValueError, match="hwm_bytes"):
        fake.add_process(100, rss_bytes=10 * PAGE_SIZE, hwm_bytes=2 * PAGE_SIZE)


def test_a_zombie_has_no_high_water_mark(fake):
    fake.add_process(100, rss_bytes=10 * PAGE_SIZE)
    fake.make_zombie(100)
    assert "VmHWM" not in _read(fake.root / "100" / "status")
    assert fake.procfs.read_peak_rss(100) is None


def test_tree_peak_is_the_largest_single_process_mark(fake):
    fake.add_process(100, rss_bytes=10 * PAGE_SIZE, hwm_bytes=50 * PAGE_SIZE)
    fake.add_process(101, parent=100, rss_bytes=20 * PAGE_SIZE, hwm_bytes=70 * PAGE_SIZE)
    fake.add_process(102, parent=101, rss_bytes=4 * PAGE_SIZE)
    fake.deny(102, "status")  # unreadable processes are left out, not fatal
    assert fake.procfs.tree_peak_rss(100) == 70 * PAGE_SIZE
    assert fake.procfs.tree_peak_rss(999) is None


def test_peak_of_a_gone_or_unreadable_process_is_unknown(fake):
    fake.add_process(100)
    fake.deny(100, "status")
    assert fake.procfs.read_peak_rss(100) is None
    assert fake.procfs.read_peak_rss(4242) is None


def test_a_clear_refs_write_resets_the_high_water_mark(fake):
    fake.add_process(200, rss_bytes=4 * PAGE_SIZE, hwm_bytes=64 * PAGE_SIZE)
    assert fake.procfs.read_peak_rss(200) == 64 * PAGE_SIZE
    assert fake.procfs.reset_peak_rss(200) is True
    assert fake.procfs.read_peak_rss(200) == fake.hwm_bytes(200) == 4 * PAGE_SIZE
    assert fake.peak_resets(200) == 1
    fake.deny(200, "clear_refs")
    assert fake.procfs.reset_peak_rss(200) is False
    assert fake.procfs.reset_peak_rss(999) is False
    fake.add_process(201)
    fake.make_zombie(201)
    assert fake.procfs.reset_peak_rss(201) is False
