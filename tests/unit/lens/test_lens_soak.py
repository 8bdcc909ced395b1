"""Soak: a quarter of a million attribute sets churn through one lens gauge, a thousand live at a time.

Without releasing the sets that are gone, the SDK would hold every one of them and,
past the cardinality limit, replace every live series by one overflow point.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.metrics import Observation

from raylens.lens import (
    IDLE_COLLECTIONS,
    OBSERVABLE_GAUGE,
    RecordedMetric,
    get_telemetry_handle,
    register_observable_gauge,
    unregister_observable_gauge,
)
from raylens_fakes import MetricsProbe

pytestmark = pytest.mark.soak

_GAUGE = RecordedMetric("test.soak.memory", OBSERVABLE_GAUGE, "By", "churning gauge")
LIVE = 1_000
DISTINCT = 250_000


@pytest.fixture
def live_window() -> Iterator[list[int]]:
    window = [0]  # the first live id; ids window[0] .. window[0] + LIVE - 1 are live

    def observe(options: object) -> list[Observation]:
        start = window[0]
        return [
            Observation(float(i), {"ray.node.id": f"node-{i}", "rl.worker_groups": f"g{i % 7}"})
            for i in range(start, start + LIVE)
        ]

    register_observable_gauge(_GAUGE, observe)
    yield window
    unregister_observable_gauge(_GAUGE.name)


def test_churning_sets_never_overflow_and_what_is_held_stays_bounded(
    live_window: list[int], metrics_probe: MetricsProbe
) -> None:
    handle = get_telemetry_handle()
    assert handle is not None
    held_most = 0
    for start in range(0, DISTINCT - LIVE + 1, LIVE):
        live_window[0] = start
        snapshot = metrics_probe.snapshot()
        points = snapshot.points(_GAUGE.name)

        exported = {dict(attributes)["ray.node.id"]: value for attributes, value in points.items()}
        assert len(points) == LIVE, start
        assert exported == {f"node-{i}": float(i) for i in range(start, start + LIVE)}
        assert not any("otel.metric.overflow" in dict(a) for a in points), start
        held_most = max(held_most, handle.held_attribute_sets(_GAUGE.name))

    assert start + LIVE == DISTINCT  # every distinct set went through
    assert held_most <= LIVE * IDLE_COLLECTIONS
