"""`raylens profile`'s peaks (sampled and the kernel's) and the age of its PSS."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fake_profiles import profiler_over

from raylens.cli.profile import ProcessTable, pss_max_age
from raylens_fakes.clock import ManualClock
from raylens_fakes.procfs import PAGE_SIZE, FakeProcFS

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="process trees need Linux /proc"
)

MIB = 1024 * 1024


def test_a_spike_between_samples_shows_in_the_kernel_peak_only(tmp_path: Path) -> None:
    fake = FakeProcFS(tmp_path / "proc")
    fake.add_process(100, rss_bytes=2 * MIB)
    fake.add_process(101, parent=100, rss_bytes=4 * MIB)
    clock = ManualClock()
    profiler = profiler_over(fake, 1.0, pss_interval_seconds=None, clock=clock)
    table = ProcessTable(profiler, label="train", pid=100, procfs=fake.procfs, clock=clock)
    profiler.sample_once()
    # Between two samples the child rose to 400 MiB and fell back.
    fake.set_memory(101, rss_bytes=4 * MIB, hwm_bytes=400 * MIB)
    profiler.sample_once()
    (row,) = table.rows()
    assert row.rss_peak == 6 * MIB
    assert (row.kernel_peak, row.kernel_peak_source) == (400 * MIB, "VmHWM")
    # The child exits: its mark goes with it, but the figure shown never falls.
    fake.remove_process(101)
    profiler.sample_once()
    (row,) = table.rows()
    assert (row.kernel_peak, row.kernel_peak_source) == (400 * MIB, "VmHWM")


def test_after_exit_the_kernel_peak_comes_from_getrusage(tmp_path: Path) -> None:
    fake = FakeProcFS(tmp_path / "proc")
    fake.add_process(100, rss_bytes=2 * MIB, hwm_bytes=50 * MIB)
    clock = ManualClock()
    profiler = profiler_over(fake, 1.0, pss_interval_seconds=None, clock=clock)
    table = ProcessTable(profiler, label="train", pid=100, procfs=fake.procfs, clock=clock)
    profiler.sample_once()
    table.rows()
    fake.remove_process(100)
    fake.add_process(100, rss_bytes=900 * MIB)  # the pid, reused by another process
    table.command_ended(children_peak_rss=300 * MIB)
    (row,) = table.rows()
    assert (row.kernel_peak, row.kernel_peak_source) == (300 * MIB, "ru_maxrss")
    unknown = ProcessTable(profiler, label="train", pid=100, procfs=fake.procfs, clock=clock)
    unknown.command_ended(children_peak_rss=None)
    (row,) = unknown.rows()
    assert (row.kernel_peak, row.kernel_peak_source) == (None, None)


def test_a_pss_older_than_its_interval_is_shown_stale(tmp_path: Path) -> None:
    fake = FakeProcFS(tmp_path / "proc")
    fake.add_process(100, rss_bytes=10 * PAGE_SIZE, pss_bytes=8 * PAGE_SIZE)
    clock = ManualClock()
    profiler = profiler_over(fake, 1.0, pss_interval_seconds=10.0, clock=clock)
    limit = pss_max_age(1.0, 10.0)
    assert limit == 11.0
    table = ProcessTable(
        profiler, label="train", pid=100, procfs=fake.procfs, clock=clock, pss_max_age_s=limit
    )
    profiler.sample_once()  # PSS read at 0
    fake.set_memory(100, rss_bytes=500 * PAGE_SIZE)
    clock.now = 5.0
    profiler.sample_once()  # RSS only; PSS carried from 0
    clock.now = 5.5
    (row,) = table.rows()
    assert (row.rss, row.pss, row.pss_age_s, row.pss_stale) == (
        500 * PAGE_SIZE,
        8 * PAGE_SIZE,
        5.5,
        False,
    )
    clock.now = 11.5  # no sample since 5: the reading is now 11.5 s old
    (row,) = table.rows()
    assert (row.pss, row.pss_age_s, row.pss_stale) == (None, 11.5, True)
    assert row.to_json()["pss_bytes"] is None and row.to_json()["pss_stale"] is True
    profiler.sample_once()  # due again: read afresh
    (row,) = table.rows()
    assert (row.pss, row.pss_age_s, row.pss_stale) == (500 * PAGE_SIZE, 0.0, False)


def test_pss_is_stale_one_interval_past_the_time_it_is_due() -> None:
    assert pss_max_age(2.0, None) == 4.0  # read at every sample
    assert pss_max_age(1.0, 30.0) == 31.0
    assert pss_max_age(5.0, 1.0) == 6.0


_SPIKE = """
import pathlib, sys, time
from raylens_fakes.clock import ManualClock
block = bytearray(200 * 1024 * 1024)
block[::4096] = b"x" * len(block[::4096])
del block
release = pathlib.Path(sys.argv[1])
deadline = time.monotonic() + 60
while not release.exists() and time.monotonic() < deadline:
    time.sleep(0.01)
"""


def _caught(server: dict) -> bool:
    return (
        server["kernel_peak_rss_source"] == "VmHWM" and server["kernel_peak_rss_bytes"] >= 200 * MIB
    )


@pytest.mark.slow
def test_a_real_spike_is_caught_by_the_kernel_figures(tmp_path: Path) -> None:
    """The spike is freed before any sample; the command then runs until a live sample
    has shown it (or a minute has passed, and the check below fails)."""
    release = tmp_path / "release"
    raylens = subprocess.Popen(
        [
            *(sys.executable, "-m", "raylens", "profile", "--json", "--interval", "0.5", "--"),
            *(sys.executable, "-c", _SPIKE, str(release)),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    records = []
    try:
        for line in raylens.stdout:
            records.append(json.loads(line))
            if any(_caught(s) for s in records[-1]["servers"]) and not release.exists():
                release.write_text("go")
        err = raylens.stderr.read()
        assert raylens.wait(timeout=60) == 0, err
    finally:
        raylens.kill()
        raylens.wait()
        raylens.stdout.close()
        raylens.stderr.close()
    *running, summary = records
    live = [r["servers"][0] for r in running if r["servers"]]
    assert any(_caught(s) for s in live), live
    (server,) = summary["servers"]
    assert server["kernel_peak_rss_source"] == "ru_maxrss"
    assert server["kernel_peak_rss_bytes"] >= 200 * MIB


def test_the_help_says_when_a_pss_is_shown_stale(capsys: pytest.CaptureFixture[str]) -> None:
    from raylens.cli.parser import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["profile", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "stale" in text and "plus one --interval" in text, text


def test_the_real_proc_gives_a_mark_no_lower_than_the_resident_size() -> None:
    import os

    from raylens.telemetry.process_memory import ProcFS

    procfs = ProcFS()
    me = os.getpid()
    rss = procfs.read_rss(me)
    peak = procfs.read_peak_rss(me)
    assert rss is not None and peak is not None and peak >= rss
