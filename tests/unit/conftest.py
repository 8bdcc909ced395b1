"""What every unit test may rely on, and what it may not do.

Unit tests run in this interpreter against fakes: none of them may import the real
``ray`` (importing it costs seconds and, through Ray's auto-init, can start a local
cluster), with or without Ray installed. Tests about Ray being absent ask for the
``ray_absent`` fixture, which makes it so.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from raylens.telemetry import host_memory as hm


def _real_ray_loaded() -> bool:
    """Whether the installed ``ray`` package (not a stand-in a test put there) is loaded."""
    module = sys.modules.get("ray")
    spec = getattr(module, "__spec__", None)
    return spec is not None and spec.origin is not None


@pytest.fixture(autouse=True)
def _never_the_real_ray() -> Iterator[None]:
    already = _real_ray_loaded()
    yield
    if not already and _real_ray_loaded():
        pytest.fail(
            "this unit test imported the installed ray package; give the code under test "
            "a fake (fake_ray, fake_cluster, fake_default_cluster) or use ray_absent",
            pytrace=False,
        )


# ---- the host-memory monitor tests ----------------------------------------------------


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
