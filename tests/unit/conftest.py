"""Fixtures shared by the host-memory monitor tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from raylens.telemetry import host_memory as hm


@pytest.fixture
def make_monitor() -> Iterator[Callable[..., hm.HostMemoryMonitor]]:
    """Monitors with short timeouts (scrape 0.5 s, interval 1 s unless given), stopped after the test.

    They scrape in this process and count as consumers unless a test says otherwise.
    """
    made: list[hm.HostMemoryMonitor] = []

    def make(cluster: Any, **options: Any) -> hm.HostMemoryMonitor:
        options.setdefault("scrape_timeout", 0.5)
        options.setdefault("scrape_mode", "inprocess")
        options.setdefault("consumer", True)
        monitor = hm.HostMemoryMonitor(options.pop("interval", 1.0), cluster=cluster, **options)
        made.append(monitor)
        return monitor

    yield make
    for monitor in made:
        monitor.stop()
