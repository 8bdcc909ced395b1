"""What a node's sampler keeps for OOM post-mortems: the kernel's kill count and its largest processes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from raylens.distributed._group_memory_publishing import PublishingLoop
from raylens.distributed.group_memory_sampler import GroupMemorySamplerActor
from raylens.telemetry.group_memory import GroupMemoryReader
from raylens.telemetry.oom import SOURCE_VMSTAT, KernelOomCount
from raylens.telemetry.process_memory import ProcFS
from raylens_fakes.procfs import FakeProcFS

MB = 2**20


class Recording:
    def __init__(self) -> None:
        self.kernel: list[tuple[int, str]] = []

    def set_group(self, group: str, rss: int, pss: int | None, processes: int) -> None:
        pass

    def forget_group(self, group: str) -> None:
        pass

    def set_sampled_at(self, seconds: float) -> None:
        pass

    def set_kernel_oom_kills(self, kills: int, source: str) -> None:
        self.kernel.append((kills, source))


def _workers(procfs: FakeProcFS) -> list[tuple[str, int, int]]:
    procfs.add_process(200, rss_bytes=10 * MB)
    procfs.add_process(210, parent=200, rss_bytes=30 * MB)
    procfs.add_process(300, rss_bytes=20 * MB)
    return [("policy", 200, procfs.start_ticks(200)), ("rollout", 300, procfs.start_ticks(300))]


def test_the_kernel_count_is_published_and_a_kill_keeps_the_reading_before_it(
    tmp_path: Path,
) -> None:
    procfs = FakeProcFS(tmp_path / "node")
    kills = [KernelOomCount(5, SOURCE_VMSTAT)]
    stamps = iter(float(t) for t in range(1000, 2000, 10))
    publisher = Recording()
    loop = PublishingLoop(
        GroupMemoryReader(ProcFS(procfs.root)),
        publisher,
        wall_clock=lambda: next(stamps),
        kernel_oom_count=lambda: kills[-1],
    )
    loop.set_workers(_workers(procfs))
    assert loop.largest_processes() is None
    loop.sample_and_publish_once()
    assert loop.largest_processes() == {
        "sampled_at": 1000.0,
        "processes": [
            [210, "policy", 30 * MB],
            [300, "rollout", 20 * MB],
            [200, "policy", 10 * MB],
        ],
    }

    procfs.remove_process(210)  # the kernel killed it between two readings
    kills.append(KernelOomCount(6, SOURCE_VMSTAT))
    loop.sample_and_publish_once()
    assert publisher.kernel == [(5, SOURCE_VMSTAT), (6, SOURCE_VMSTAT)]
    before: Any = loop.largest_processes()
    assert before["sampled_at"] == 1000.0 and before["processes"][0][0] == 210

    loop.sample_and_publish_once()  # no new kill: the latest reading again
    latest: Any = loop.largest_processes()
    assert latest["sampled_at"] == 1020.0 and [p[0] for p in latest["processes"]] == [300, 200]


def test_the_actor_answers_its_largest_processes(tmp_path: Path) -> None:
    procfs = FakeProcFS(tmp_path / "node")
    actor = GroupMemorySamplerActor(
        procfs_root=str(procfs.root), host_name="node-a", publisher=Recording()
    )
    actor.set_workers(_workers(procfs))
    actor.sample_and_publish_once()
    answer: Any = actor.largest_processes()
    assert [p[0] for p in answer["processes"]] == [210, 300, 200]


def test_workers_lost_between_readings_keep_the_reading_before_them_for_a_while(
    tmp_path: Path,
) -> None:
    """Ray's memory monitor kills whole workers: the reading after the kill no longer shows
    them, so a post-mortem asking then gets the last reading that did, for a while."""
    procfs = FakeProcFS(tmp_path / "node")
    stamps = iter(float(t) for t in range(1000, 2000, 1))
    loop = PublishingLoop(
        GroupMemoryReader(ProcFS(procfs.root)), Recording(), wall_clock=lambda: next(stamps)
    )
    loop.set_workers(_workers(procfs))
    loop.sample_and_publish_once()
    procfs.remove_process(210)
    procfs.remove_process(200)  # the policy worker, killed between two readings
    loop.sample_and_publish_once()
    loop.sample_and_publish_once()
    kept: Any = loop.largest_processes()
    assert kept["sampled_at"] == 1000.0 and [p[0] for p in kept["processes"]] == [210, 300, 200]
    for _ in range(120):  # long after the loss, the latest reading again
        loop.sample_and_publish_once()
    latest: Any = loop.largest_processes()
    assert latest["sampled_at"] > 1100.0 and [p[0] for p in latest["processes"]] == [300]
