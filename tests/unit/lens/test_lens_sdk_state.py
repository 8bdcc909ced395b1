"""What the SDK holds for a lens gauge follows what is live; the SDK-internals module on its own."""

from __future__ import annotations

import itertools

import opentelemetry.sdk
import pytest
from opentelemetry.metrics import Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from raylens.lens import (
    IDLE_COLLECTIONS,
    RecordedMetric,
    _sdk_state,
    get_telemetry_handle,
    register_observable_gauge,
    unregister_observable_gauge,
)
from raylens.lens._live_sets import LiveAttributeSets
from raylens_fakes import MetricsProbe

# LiveAttributeSets ----------------------------------------------------------------------


def _obs(*nodes: str) -> list[Observation]:
    return [Observation(1.0, {"node": n}) for n in nodes]


def test_a_set_expires_after_idle_collections_in_a_row() -> None:
    live = LiveAttributeSets(3)
    assert live.collected(_obs("a", "b")) == []
    assert live.collected(_obs("b")) == []
    assert live.collected(_obs("b")) == []
    assert live.collected(_obs("b")) == [{"node": "a"}]
    assert len(live) == 1
    assert live.collected([]) == []


def test_a_set_reported_again_before_expiry_is_kept() -> None:
    live = LiveAttributeSets(2)
    live.collected(_obs("a"))
    live.collected([])
    assert live.collected(_obs("a")) == []
    assert live.collected([]) == []
    assert live.collected([]) == [{"node": "a"}]


def test_list_values_are_tracked() -> None:
    live = LiveAttributeSets(1)
    live.collected([Observation(1, {"ids": ["x", "y"]})])
    assert live.collected([]) == [{"ids": ["x", "y"]}]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "3"])
def test_idle_collections_must_be_a_positive_int(bad: object) -> None:
    with pytest.raises(ValueError, match=repr(bad).strip("'")):
        LiveAttributeSets(bad)  # type: ignore[arg-type]


# _sdk_state, straight against the installed SDK -----------------------------------------


def test_the_installed_sdk_has_everything_lens_reaches_for() -> None:
    _readers, instrument, current = _sdk_gauge(1)
    current[:] = _obs("a")
    _readers[0].get_metrics_data()

    assert _sdk_state.layout_gap(instrument) is None
    assert _sdk_state.cardinality_view(7)[1] is None
    assert opentelemetry.sdk is not None


def _sdk_gauge(readers: int) -> tuple[list[InMemoryMetricReader], object, list[Observation]]:
    current: list[Observation] = []
    reader_list = [InMemoryMetricReader() for _ in range(readers)]
    provider = MeterProvider(metric_readers=reader_list, shutdown_on_exit=False)
    instrument = provider.get_meter("t").create_observable_gauge(
        "g", callbacks=[lambda options: list(current)]
    )
    return reader_list, instrument, current


def test_forget_drops_only_the_named_sets_from_every_reader() -> None:
    readers, instrument, current = _sdk_gauge(2)
    current[:] = _obs("a", "b", "c")
    for reader in readers:
        reader.get_metrics_data()
    assert _sdk_state.supported(instrument)
    assert _sdk_state.held_attribute_sets(instrument) == 6

    removed = _sdk_state.forget_attribute_sets(instrument, [{"node": "a"}, {"node": "zz"}])

    assert removed == 2
    assert _sdk_state.held_attribute_sets(instrument) == 4
    current[:] = _obs("a", "b")
    points = readers[0].get_metrics_data().resource_metrics[0].scope_metrics[0].metrics[0]
    assert sorted(p.attributes["node"] for p in points.data.data_points) == ["a", "b"]


def test_forget_nothing_is_free() -> None:
    _readers, instrument, _current = _sdk_gauge(1)
    assert _sdk_state.forget_attribute_sets(instrument, []) == 0


def test_an_unexpected_layout_is_reported_as_unsupported() -> None:
    class Foreign:
        pass

    assert _sdk_state.supported(Foreign()) is False
    assert _sdk_state.layout_gap(Foreign()) == "the instrument's _measurement_consumer"


def test_the_gap_named_is_the_first_piece_missing() -> None:
    readers, instrument, current = _sdk_gauge(1)
    current[:] = _obs("a")
    readers[0].get_metrics_data()
    (match,) = _sdk_state._matches(instrument)
    del match._view

    assert _sdk_state.layout_gap(instrument) == "_ViewInstrumentMatch._view._attribute_keys"


def test_a_view_without_the_cardinality_keyword_is_built_without_it_and_says_so() -> None:
    from opentelemetry.sdk.metrics.view import View

    made: list[dict[str, object]] = []

    def older_view(instrument_name: str | None = None) -> View:
        made.append({"instrument_name": instrument_name})
        return View(instrument_name=instrument_name)

    view, problem = _sdk_state.cardinality_view(500, older_view)

    assert made == [{"instrument_name": "*"}] and isinstance(view, View)
    assert problem is not None and "aggregation_cardinality_limit" in problem and "500" in problem
    real, none = _sdk_state.cardinality_view(500)
    assert none is None and real._aggregation_cardinality_limit == 500


# Through lens ----------------------------------------------------------------------------


def _held(name: str) -> int:
    handle = get_telemetry_handle()
    assert handle is not None
    return handle.held_attribute_sets(name)


def test_sets_no_longer_reported_stop_being_held(
    gauge: RecordedMetric, metrics_probe: MetricsProbe
) -> None:
    current = _obs("a", "b")
    register_observable_gauge(gauge, lambda options: current)
    metrics_probe.collect()
    assert _held(gauge.name) == 2

    current = _obs("b", "c")
    for _ in range(IDLE_COLLECTIONS - 1):
        metrics_probe.collect()
        assert _held(gauge.name) == 3
    points = metrics_probe.points(gauge.name)  # the IDLE_COLLECTIONS-th without "a"

    assert _held(gauge.name) == 2
    assert points == {frozenset({("node", "b")}): 1.0, frozenset({("node", "c")}): 1.0}


def test_a_live_series_keeps_its_value_every_collection_while_others_churn(
    gauge: RecordedMetric, metrics_probe: MetricsProbe
) -> None:
    counter = itertools.count()
    register_observable_gauge(
        gauge,
        lambda options: [Observation(7.0, {"node": "steady"}), *_obs(f"n{next(counter)}")],
    )
    for _ in range(20):
        data = metrics_probe.collect()
        assert data is not None
        (metric,) = [
            m
            for rm in data.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
            if m.name == gauge.name
        ]
        steady = [p for p in metric.data.data_points if p.attributes["node"] == "steady"]
        assert [p.value for p in steady] == [7.0]  # exactly one point, never reset
        assert len(metric.data.data_points) == 2
    assert _held(gauge.name) <= IDLE_COLLECTIONS + 1


def test_an_unregistered_gauge_releases_everything(
    gauge: RecordedMetric, metrics_probe: MetricsProbe
) -> None:
    register_observable_gauge(gauge, lambda options: _obs("a", "b"))
    metrics_probe.collect()
    unregister_observable_gauge(gauge.name)
    for _ in range(IDLE_COLLECTIONS):
        metrics_probe.collect()
    assert _held(gauge.name) == 0
