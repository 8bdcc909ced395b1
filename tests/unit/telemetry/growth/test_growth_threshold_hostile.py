"""A malformed ``RAYLENS_MEMORY_USAGE_THRESHOLD``: an error naming it, never a silent fallback."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from raylens import driver
from raylens.telemetry.growth import resolve_kill_line_config
from raylens.telemetry.growth._limit import THRESHOLD_ENV

CLUSTER = {"memory_usage_threshold": 0.6, "min_memory_free_bytes": 1024}


@pytest.mark.parametrize("bad", ["abc", "\u0660.\u0665", "0.\u0665", "\uff10.5", "0_0.5", "0x1p-1"])
def test_a_malformed_threshold_variable_is_an_error_naming_it(bad: str) -> None:
    with pytest.raises(ValueError, match=THRESHOLD_ENV):
        resolve_kill_line_config(system_config=CLUSTER, env={THRESHOLD_ENV: bad})


@pytest.mark.parametrize("good", ["0.5", " 0.5 ", "1", "5e-1", ".5"])
def test_plain_ascii_decimals_are_read(good: str) -> None:
    config = resolve_kill_line_config(env={THRESHOLD_ENV: good})
    assert config.threshold == float(good) and config.source == THRESHOLD_ENV


def test_the_driver_logs_a_bad_threshold_and_keeps_the_clusters_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(THRESHOLD_ENV, "abc")
    monkeypatch.setattr(driver, "connected_system_config", lambda: dict(CLUSTER))
    attached: dict[str, Any] = {}

    def attach(_monitor: object, cycle: Any) -> Any:
        attached["cycle"] = cycle
        return cycle

    monkeypatch.setattr(driver, "attach_growth", attach)
    with caplog.at_level(logging.ERROR, logger="raylens.driver"):
        driver._attach_growth(object(), None, None)  # type: ignore[arg-type]
    line = attached["cycle"].kill_line
    assert line.threshold == 0.6 and line.min_free_bytes == 1024
    assert any(THRESHOLD_ENV in message for message in line.ignored)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and THRESHOLD_ENV in errors[0] and "0.6" in errors[0]
