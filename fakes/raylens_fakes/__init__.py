"""A simulated Ray cluster and an in-memory metric reader, for testing raylens and code built on it.

Installed with raylens and registered as a pytest plugin, so its fixtures
(``metrics_probe``, ``fake_cluster``, ``fake_default_cluster``, ``simulated_cluster``,
``fake_procfs``, ``fake_ray``, ``raylens_state``) are available in any project that installs
raylens. See :mod:`raylens_fakes.pytest_plugin`.

The simulated cluster (``FakeRaylet``, ``FakeCluster``, ``SimulatedCluster``) ships
with the product as :mod:`raylens.simulation`, since ``raylens simulate`` runs it;
it is re-exported here and from ``raylens_fakes.raylet``, ``raylens_fakes.cluster``
and ``raylens_fakes.simulated``. ``MetricsProbe``, ``FakeProcFS`` and ``FakeRay`` (an
in-process stand-in for the ``ray`` module, handed to raylens through its Ray seam)
live here only, as do ``ManualClock`` and ``ClockedStop`` (simulated time for code that
takes a clock and a stop event).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from raylens_fakes.clock import ClockedStop, ManualClock
    from raylens_fakes.cluster import FakeCluster, FakePlacementGroup
    from raylens_fakes.otel import MetricsProbe, Snapshot
    from raylens_fakes.procfs import FakeProcFS
    from raylens_fakes.ray import FakeRay
    from raylens_fakes.raylet import FakeRaylet
    from raylens_fakes.simulated import SimulatedCluster

# Where each name lives. The package is imported by the pytest plugin in every pytest run
# of an environment with raylens installed, so its names (and raylens and OpenTelemetry
# behind them) load on first use rather than here.
_HOMES = {
    "ClockedStop": "raylens_fakes.clock",
    "FakeCluster": "raylens_fakes.cluster",
    "FakePlacementGroup": "raylens_fakes.cluster",
    "FakeProcFS": "raylens_fakes.procfs",
    "FakeRay": "raylens_fakes.ray",
    "FakeRaylet": "raylens_fakes.raylet",
    "ManualClock": "raylens_fakes.clock",
    "MetricsProbe": "raylens_fakes.otel",
    "SimulatedCluster": "raylens_fakes.simulated",
    "Snapshot": "raylens_fakes.otel",
}

__all__ = [
    "ClockedStop",
    "FakeCluster",
    "FakePlacementGroup",
    "FakeProcFS",
    "FakeRay",
    "FakeRaylet",
    "ManualClock",
    "MetricsProbe",
    "SimulatedCluster",
    "Snapshot",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'raylens_fakes' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
