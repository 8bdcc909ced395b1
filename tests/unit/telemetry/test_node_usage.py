"""A node's used memory as Ray's memory monitor counts it, from files laid out as the kernel does."""

from __future__ import annotations

from pathlib import Path

import pytest

from raylens.telemetry.node_usage import NodeUsage, read_node_usage

KIB = 1024
GIB = 1024**3


def _meminfo(root: Path, total_kib: int, available_kib: int) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "meminfo").write_text(
        f"MemTotal:       {total_kib} kB\nMemFree:         1000 kB\n"
        f"MemAvailable:   {available_kib} kB\nBuffers:          10 kB\n"
    )
    return root


def test_outside_a_container_used_is_total_less_available(tmp_path: Path) -> None:
    proc = _meminfo(tmp_path / "proc", 64 * GIB // KIB, 48 * GIB // KIB)
    usage = read_node_usage(str(proc), cgroup_root=str(tmp_path / "no-cgroup"))
    assert usage == NodeUsage(16.0 * GIB, 64.0 * GIB, None)


@pytest.mark.parametrize(
    ("limit", "expected_total"), [("34359738368\n", 32.0 * GIB), ("max\n", None)]
)
def test_in_a_cgroup_v2_container_used_leaves_out_the_page_cache(
    tmp_path: Path, limit: str, expected_total: float | None
) -> None:
    proc = _meminfo(tmp_path / "proc", 64 * GIB // KIB, 10 * GIB // KIB)
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "memory.current").write_text(f"{20 * GIB}\n")
    (cgroup / "memory.stat").write_text(
        f"anon 1\nfile 2\nactive_file {3 * GIB}\ninactive_file {5 * GIB}\nactive_anon 4\n"
    )
    (cgroup / "memory.max").write_text(limit)
    usage = read_node_usage(str(proc), cgroup_root=str(cgroup))
    assert usage == NodeUsage(12.0 * GIB, 64.0 * GIB, expected_total)


def test_in_a_cgroup_v1_container_the_total_keys_are_read_and_a_limit_above_the_host_is_capped(
    tmp_path: Path,
) -> None:
    proc = _meminfo(tmp_path / "proc", 16 * GIB // KIB, 10 * GIB // KIB)
    memory = tmp_path / "cgroup" / "memory"
    memory.mkdir(parents=True)
    (memory / "memory.usage_in_bytes").write_text(f"{9 * GIB}\n")
    (memory / "memory.stat").write_text(
        f"inactive_file 1\ntotal_inactive_file {GIB}\ntotal_active_file {GIB}\n"
    )
    (memory / "memory.limit_in_bytes").write_text(f"{32 * GIB}\n")
    usage = read_node_usage(str(proc), cgroup_root=str(tmp_path / "cgroup"))
    assert usage == NodeUsage(7.0 * GIB, 16.0 * GIB, 16.0 * GIB)


@pytest.mark.parametrize(
    "meminfo",
    ["", "MemTotal: 100 kB\n", "MemTotal: lots kB\nMemAvailable: 1 kB\n", "\x00\xff garbage"],
)
def test_a_missing_or_malformed_meminfo_gives_no_reading(tmp_path: Path, meminfo: str) -> None:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "meminfo").write_text(meminfo, errors="surrogateescape")
    assert read_node_usage(str(proc), cgroup_root=None) is None
    assert read_node_usage(str(tmp_path / "absent"), cgroup_root=None) is None


def test_a_malformed_cgroup_gives_no_container_figure_but_the_host_s(tmp_path: Path) -> None:
    proc = _meminfo(tmp_path / "proc", 8 * GIB // KIB, 6 * GIB // KIB)
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "memory.current").write_text("not a number\n")
    (cgroup / "memory.stat").write_text("inactive_file 1\nactive_file 1\n")
    assert read_node_usage(str(proc), cgroup_root=str(cgroup)) == NodeUsage(
        2.0 * GIB, 8.0 * GIB, None
    )
