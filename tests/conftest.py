"""Every test starts from a clean raylens: no telemetry pipeline, no warnings remembered,
no host-memory monitor or worker-group placement, no profiler state.

Property tests (hypothesis) follow one of two profiles: ``quick``, the default, draws a
few examples so each interpreter's run stays short; ``ci``, chosen with
``HYPOTHESIS_PROFILE=ci`` (tox's slow env sets it), draws many, once. Neither has a
per-example deadline, so a busy machine cannot fail an example for being slow.

Temporary files (``tmp_path``, :mod:`tempfile`) go to ``/dev/shm`` when it is a writable
RAM disk with room, unless ``TMPDIR`` says otherwise: the unit tier writes some 12,000
small files (fake ``/proc`` trees), and on a virtual disk each file operation costs about
ten times what it costs in RAM.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import pytest
from hypothesis import settings

from raylens_fakes.pytest_plugin import reset_raylens_state

# A RAM disk is used only with this much room: a unit-tier run holds about 50 MB there.
_RAM_DISK_ROOM_BYTES = 512 * 2**20


def _temporary_files_in_ram() -> None:
    statvfs = getattr(os, "statvfs", None)  # absent on Windows
    if os.environ.get("TMPDIR") or statvfs is None:
        return
    ram_disk = "/dev/shm"
    try:
        stats = statvfs(ram_disk)
    except OSError:  # no such RAM disk (macOS)
        return
    if os.access(ram_disk, os.W_OK | os.X_OK) and (
        stats.f_bavail * stats.f_frsize >= _RAM_DISK_ROOM_BYTES
    ):
        tempfile.tempdir = ram_disk


_temporary_files_in_ram()

settings.register_profile("quick", max_examples=10, deadline=None)
settings.register_profile("ci", max_examples=200, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "quick"))


@pytest.fixture(autouse=True)
def _clean_raylens() -> Iterator[None]:
    reset_raylens_state()
    yield
    reset_raylens_state()
