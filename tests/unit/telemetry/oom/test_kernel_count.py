"""The kernel's OOM-kill count: the container's memory.events first, else /proc/vmstat."""

from __future__ import annotations

import os
from pathlib import Path

from raylens.telemetry.oom import SOURCE_CGROUP, SOURCE_VMSTAT, read_kernel_oom_count

VMSTAT = b"nr_free_pages 1\noom_kill 3\nnr_zone_inactive_anon 2\n"


def test_the_machine_count_is_read_from_vmstat(tmp_path: Path) -> None:
    (tmp_path / "vmstat").write_bytes(VMSTAT)
    assert read_kernel_oom_count(str(tmp_path), cgroup_root=str(tmp_path / "none")) == (
        3,
        SOURCE_VMSTAT,
    )


def test_a_containers_count_wins_over_the_machines(tmp_path: Path) -> None:
    (tmp_path / "vmstat").write_bytes(VMSTAT)
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "memory.events").write_bytes(b"low 0\nhigh 0\nmax 4\noom 2\noom_kill 1\n")
    assert read_kernel_oom_count(str(tmp_path), cgroup_root=str(cgroup)) == (1, SOURCE_CGROUP)


def test_reads_go_through_the_opener_and_a_refusal_or_garbage_is_no_count(tmp_path: Path) -> None:
    (tmp_path / "vmstat").write_bytes(VMSTAT)
    opened: list[str] = []

    def refusing(path: str, flags: int) -> int:
        opened.append(path)
        raise PermissionError(path)

    assert read_kernel_oom_count(str(tmp_path), cgroup_root=None, opener=refusing) is None
    assert opened == [f"{tmp_path}/vmstat"]
    (tmp_path / "vmstat").write_bytes(b"oom_kill -1\n")
    assert read_kernel_oom_count(str(tmp_path), cgroup_root=None, opener=os.open) is None
