"""Fixtures for the telemetry tests."""

from __future__ import annotations

import sys

import pytest

from raylens.telemetry.process_memory import process_tree_memory_supported


@pytest.fixture
def real_process_trees() -> None:
    """Skips the test unless this host's ``/proc`` can show a real process tree.

    That takes Linux, and a kernel that lists each thread's children.
    """
    if not sys.platform.startswith("linux"):
        pytest.skip("procfs is Linux only")
    if not process_tree_memory_supported():
        pytest.skip("this kernel's procfs has no per-thread children files")
