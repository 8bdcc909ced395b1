"""The shortest growth window follows from how often a node is read, and a shorter one is refused."""

from __future__ import annotations

import pytest

from raylens.telemetry.growth import (
    check_growth_window,
    growth_window_for_sampling,
    shortest_growth_window,
)
from raylens.telemetry.growth._sampling import READINGS_PER_WINDOW
from raylens.telemetry.growth._settings import GROWTH_WINDOW_ENV


def test_the_shortest_window_holds_two_readings_a_slice() -> None:
    assert READINGS_PER_WINDOW == 40
    assert shortest_growth_window() == 40.0  # at the default 1 s
    assert shortest_growth_window(10.0) == 400.0
    assert shortest_growth_window(0.1) == 10.0  # never below the absolute floor


@pytest.mark.parametrize("raw", ["10", "39.5"])
def test_a_window_shorter_than_the_sampling_allows_is_refused_in_one_line(raw: str) -> None:
    with pytest.raises(ValueError) as refused:
        growth_window_for_sampling({GROWTH_WINDOW_ENV: raw})
    message = str(refused.value)
    assert "\n" not in message
    assert GROWTH_WINDOW_ENV in message and raw in message
    assert "shortest growth window allowed at 1 s sampling: 40 s" in message


def test_windows_the_sampling_allows_pass_and_the_default_stands() -> None:
    assert growth_window_for_sampling({}) == 300.0
    assert growth_window_for_sampling({GROWTH_WINDOW_ENV: "120"}) == 120.0
    assert growth_window_for_sampling({GROWTH_WINDOW_ENV: "40"}) == 40.0
    with pytest.raises(ValueError, match="400 s"):
        growth_window_for_sampling({GROWTH_WINDOW_ENV: "120"}, sample_interval_s=10.0)


@pytest.mark.parametrize("bad", ["soon", True, float("nan"), 1e9])
def test_a_window_that_is_no_number_of_seconds_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="number of seconds"):
        check_growth_window(bad)  # type: ignore[arg-type]
