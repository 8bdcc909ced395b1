"""Every test starts from a clean raylens: no telemetry pipeline, no warnings remembered,
no host-memory monitor or worker-group placement, no profiler state."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from raylens.lens import reset_warn_once, shutdown_telemetry

_STATE_RESETS = (
    ("raylens.telemetry.host_memory", "reset_host_memory_state"),
    ("raylens.telemetry.process_memory", "reset_process_memory_state"),
)


def _reset_raylens() -> None:
    shutdown_telemetry()
    for module_name, reset_name in _STATE_RESETS:
        module = sys.modules.get(module_name)
        if module is not None:
            getattr(module, reset_name)()
    reset_warn_once()


@pytest.fixture(autouse=True)
def _clean_raylens() -> Iterator[None]:
    _reset_raylens()
    yield
    _reset_raylens()
