"""Every test starts from a clean raylens: no telemetry pipeline, no warnings remembered,
no host-memory monitor or worker-group placement, no profiler state."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from raylens_fakes.pytest_plugin import reset_raylens_state


@pytest.fixture(autouse=True)
def _clean_raylens() -> Iterator[None]:
    reset_raylens_state()
    yield
    reset_raylens_state()
