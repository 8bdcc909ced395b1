"""The kernel's peak on this Linux host's /proc: a reset brings VmHWM down to the current RSS."""

from __future__ import annotations

import subprocess
import sys

import pytest

from raylens.telemetry.process_memory import ProcFS

MB = 2**20
SPIKE = """
import sys
block = b"\\x01" * (96 * 2**20)
del block
print("freed", flush=True)
sys.stdin.read()
"""

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="procfs is Linux only")


@pytest.mark.slow
def test_a_reset_forgets_a_spike_and_the_next_one_is_the_peak_again():
    child = subprocess.Popen(
        [sys.executable, "-c", SPIKE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "freed"
        procfs = ProcFS()
        peak = procfs.read_peak_rss(child.pid)
        rss = procfs.read_rss(child.pid)
        assert peak is not None and rss is not None and peak - rss >= 90 * MB, (peak, rss)
        assert procfs.reset_peak_rss(child.pid) is True
        after = procfs.read_peak_rss(child.pid)
        assert after is not None and after - rss < 8 * MB, (after, rss)
    finally:
        child.kill()
        child.wait(timeout=30)
    assert ProcFS().reset_peak_rss(child.pid) is False  # gone
