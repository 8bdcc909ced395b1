"""Fixtures for the lens tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from raylens.lens import RecordedMetric


@pytest.fixture
def gauge(declare_gauge: Callable[..., RecordedMetric]) -> RecordedMetric:
    """A gauge under a name of its own, not yet registered, unregistered after the test."""
    return declare_gauge()
