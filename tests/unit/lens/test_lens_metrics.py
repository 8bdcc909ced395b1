from __future__ import annotations

import dataclasses

import pytest

from raylens.lens import (
    COUNTER,
    GAUGE,
    OBSERVABLE_GAUGE,
    RecordedMetric,
    recorded_metrics,
    register_recorded_metrics,
    registry_key,
)
from raylens.lens.metrics import reset_recorded_metrics


@pytest.fixture(autouse=True)
def _fresh_registry():
    saved = recorded_metrics()
    reset_recorded_metrics()
    yield
    reset_recorded_metrics()
    register_recorded_metrics(saved.values())


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("rl.host.memory.used", "host_memory_used"),
        ("gym.server.memory.usage", "gym_server_memory_usage"),
        ("plain", "plain"),
        ("rlx.thing", "rlx_thing"),
        ("rl.", ""),
    ],
)
def test_registry_key_drops_rl_prefix_and_dots(name: str, key: str) -> None:
    assert registry_key(name) == key


def test_recorded_metric_is_frozen_and_has_key() -> None:
    metric = RecordedMetric("rl.host.memory.used", OBSERVABLE_GAUGE, "By", "used")
    assert metric.key == "host_memory_used"
    with pytest.raises(dataclasses.FrozenInstanceError):
        metric.unit = "kB"  # type: ignore[misc]


def test_recorded_metric_rejects_unknown_kind_naming_it() -> None:
    with pytest.raises(ValueError, match=r"'histogramm'.*allowed kinds are .*observable_gauge"):
        RecordedMetric("x", "histogramm", "1", "d")


def test_kinds_cover_gauges_and_counters() -> None:
    for kind in (OBSERVABLE_GAUGE, GAUGE, COUNTER):
        assert RecordedMetric("m", kind, "1", "d").kind == kind


def test_identical_redeclaration_is_accepted() -> None:
    row = RecordedMetric("rl.a", GAUGE, "By", "a")
    register_recorded_metrics([row])
    register_recorded_metrics([RecordedMetric("rl.a", GAUGE, "By", "a")])
    assert recorded_metrics() == {"rl.a": row}


@pytest.mark.parametrize(
    "other",
    [
        RecordedMetric("rl.a", COUNTER, "By", "a"),
        RecordedMetric("rl.a", GAUGE, "kBy", "a"),
        RecordedMetric("rl.a", GAUGE, "By", "something else"),
    ],
)
def test_conflicting_redeclaration_names_both(other: RecordedMetric) -> None:
    first = RecordedMetric("rl.a", GAUGE, "By", "a")
    register_recorded_metrics([first])
    with pytest.raises(ValueError) as error:
        register_recorded_metrics([other])
    assert repr(first) in str(error.value)
    assert repr(other) in str(error.value)
    assert recorded_metrics()["rl.a"] == first


def test_conflict_inside_one_batch_registers_nothing() -> None:
    with pytest.raises(ValueError):
        register_recorded_metrics(
            [RecordedMetric("rl.b", GAUGE, "By", "b"), RecordedMetric("rl.b", GAUGE, "1", "b")]
        )
    assert "rl.b" not in recorded_metrics()
