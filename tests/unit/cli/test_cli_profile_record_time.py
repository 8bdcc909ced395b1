"""`raylens profile` records hold the tree's figures at their own time, not one interval earlier.

The first-use report saw a 400 MiB spike from 704.31 to 704.86 missing from the
record stamped 704.7 and showing in the one stamped 705.71: each record showed the
sample the profiler's thread had taken up to an interval before.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fake_profiles import profiler_over

from raylens.cli.profile import ProcessTable
from raylens.telemetry.process_memory import (
    MemoryProfiler,
)
from raylens_fakes.procfs import FakeProcFS

PAGE = 4096
MIB = 1024 * 1024
WALL_AT_ZERO = 1_800_000_000.0


def _table(tmp_path: Path, clock: list[float]) -> tuple[FakeProcFS, MemoryProfiler, ProcessTable]:
    fake = FakeProcFS(tmp_path / "proc")
    fake.add_process(100, rss_bytes=100 * MIB, pss_bytes=100 * MIB)
    profiler = profiler_over(fake, 1.0, clock=lambda: clock[0])
    table = ProcessTable(
        profiler,
        label="python train.py",
        pid=100,
        clock=lambda: clock[0],
        wall=lambda: WALL_AT_ZERO + clock[0],
    )
    return fake, profiler, table


def test_a_record_taken_inside_a_spike_shows_it_stamped_with_its_own_time(tmp_path: Path) -> None:
    clock = [703.7]
    fake, profiler, table = _table(tmp_path, clock)
    profiler.sample_once()  # the sample a background thread would have taken at 703.7
    clock[0] = 704.31
    fake.set_memory(100, rss_bytes=500 * MIB, pss_bytes=500 * MIB)
    clock[0] = 704.7

    (row,), stamp = table.take()

    assert row.rss == 500 * MIB
    assert stamp == pytest.approx(WALL_AT_ZERO + 704.7)
    clock[0] = 704.86
    fake.set_memory(100, rss_bytes=100 * MIB, pss_bytes=100 * MIB)
    clock[0] = 705.7
    (row,), stamp = table.take()
    assert row.rss == 100 * MIB and row.rss_peak == 500 * MIB
    assert stamp == pytest.approx(WALL_AT_ZERO + 705.7)


def test_a_child_started_between_records_is_in_the_next_one(tmp_path: Path) -> None:
    clock = [704.7]
    fake, profiler, table = _table(tmp_path, clock)
    profiler.sample_once()
    clock[0] = 704.86
    fake.add_process(101, parent=100, rss_bytes=50 * MIB, pss_bytes=50 * MIB)
    clock[0] = 705.7

    (row,), _stamp = table.take()

    assert row.processes == 2 and row.rss == 150 * MIB


def test_the_summary_shows_the_last_sample_again_with_its_own_stamp(tmp_path: Path) -> None:
    clock = [10.0]
    _fake, _profiler, table = _table(tmp_path, clock)
    table.take()
    clock[0] = 12.5

    (row,) = table.rows()

    assert row.rss == 100 * MIB
    assert table.sampled_at() == pytest.approx(WALL_AT_ZERO + 10.0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process trees need Linux /proc")
@pytest.mark.slow
def test_a_record_stamped_inside_a_3_s_hold_of_400_mb_shows_it(tmp_path: Path) -> None:
    # The command writes when its hold starts and ends; every record stamped in
    # between must show the 400 MB (RSS of the tree at least that much).
    marks = tmp_path / "marks"
    script = (
        "import time, pathlib\n"
        f"marks = pathlib.Path({str(marks)!r})\n"
        "time.sleep(1.5)\n"
        "block = bytearray(400 * 1000 * 1000)\n"
        "for i in range(0, len(block), 4096): block[i] = 1\n"
        "marks.write_text(f'{time.time()}\\n')\n"
        "time.sleep(3.0)\n"
        "with marks.open('a') as f: f.write(f'{time.time()}\\n')\n"
        "del block\n"
        "time.sleep(1.0)\n"
    )
    result = subprocess.run(
        [
            *(sys.executable, "-m", "raylens", "profile", "--json", "--interval", "0.5", "--"),
            *(sys.executable, "-c", script),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    held_from, held_to = (float(line) for line in marks.read_text().split())
    records = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    inside = [
        record
        for record in records
        if not record.get("summary") and held_from <= record["time"] <= held_to
    ]
    assert len(inside) >= 3, [record["time"] for record in records]
    for record in inside:
        (server,) = record["servers"]
        assert server["rss_bytes"] >= 400 * 1000 * 1000, (record["time"], server)
