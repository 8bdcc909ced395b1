"""Pytest fixtures for testing code that uses raylens, without a cluster.

Installed as the ``raylens`` pytest plugin (entry point ``pytest11``), so any
project with raylens installed can ask for these fixtures by name:

``metrics_probe``
    A :class:`raylens_fakes.otel.MetricsProbe` installed as lens' reader; lens is
    shut down after the test.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from raylens_fakes.otel import MetricsProbe


@pytest.fixture
def metrics_probe() -> Iterator[MetricsProbe]:
    """Lens started with an in-memory reader; read points with ``metrics_probe.points(name)``."""
    from raylens.lens import shutdown_telemetry

    shutdown_telemetry()
    probe = MetricsProbe().install()
    try:
        yield probe
    finally:
        probe.uninstall()
