"""The growth window comes from RAYLENS_GROWTH_WINDOW; bad values and settings are refused by name."""

from __future__ import annotations

import pytest

from raylens.telemetry.growth import DEFAULT_GROWTH_WINDOW_S, GrowthSettings
from raylens.telemetry.growth._settings import GROWTH_WINDOW_ENV, growth_window_from_env


def test_window_defaults_to_five_minutes_when_unset_or_blank() -> None:
    assert growth_window_from_env({}) == DEFAULT_GROWTH_WINDOW_S == 300.0
    assert growth_window_from_env({GROWTH_WINDOW_ENV: "  "}) == 300.0


@pytest.mark.parametrize(("raw", "seconds"), [("30", 30.0), (" 90.5 ", 90.5), ("1e3", 1000.0)])
def test_window_is_read_in_seconds(raw: str, seconds: float) -> None:
    assert growth_window_from_env({GROWTH_WINDOW_ENV: raw}) == seconds


@pytest.mark.parametrize("raw", ["abc", "0", "-30", "9", "nan", "inf", "86401", "10m", "\x1b[31m"])
def test_bad_window_names_the_variable_the_value_and_the_range(raw: str) -> None:
    with pytest.raises(ValueError) as caught:
        growth_window_from_env({GROWTH_WINDOW_ENV: raw})
    message = str(caught.value)
    assert GROWTH_WINDOW_ENV in message
    assert repr(raw) in message
    assert "10 to 86400" in message
    assert "\x1b" not in message


def test_settings_from_env_take_the_window_and_keep_the_horizon_at_least_as_long() -> None:
    settings = GrowthSettings.from_env({GROWTH_WINDOW_ENV: "30"})
    assert settings.window_s == 30.0
    assert settings.horizon_s == 3600.0
    assert settings.fit_interval_s == 1.5  # a twentieth of the window: one slice
    assert GrowthSettings.from_env({GROWTH_WINDOW_ENV: "7200"}).horizon_s == 7200.0
    assert GrowthSettings.from_env({GROWTH_WINDOW_ENV: "30"}, window_s=60.0).window_s == 60.0


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"window_s": True}, "window_s"),
        ({"window_s": 5.0}, "window_s"),
        ({"window_s": 600.0, "horizon_s": 300.0}, "horizon_s"),
        ({"buckets": 0}, "buckets"),
        ({"levels": 0}, "levels"),
        ({"grow_slow": float("nan")}, "grow_slow"),
        ({"calm": 0.0}, "0 < calm <= grow_slow"),
        ({"calm": 10.0, "grow_slow": 5.0}, "calm <= grow_slow"),
    ],
)
def test_bad_settings_are_refused_by_name(fields: dict[str, object], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        GrowthSettings(**fields)  # type: ignore[arg-type]
