"""Figures the process-memory tests share: a mebibyte, and the host reading their profilers take."""

from __future__ import annotations

from raylens.telemetry.process_memory import HostMemory

MB = 2**20

# What every fake host collector here answers: 6 MiB used, 10 MiB available, 16 MiB in all.
HOST = HostMemory(used_bytes=6 * MB, available_bytes=10 * MB, total_bytes=16 * MB)
