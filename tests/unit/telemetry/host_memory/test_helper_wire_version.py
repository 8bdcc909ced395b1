"""A scrape helper that speaks another wire version is replaced, saying why (no process)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import cast

import pytest

from raylens.lens import reset_warn_once
from raylens.telemetry.host_memory._helper_engine import HelperEngine
from raylens.telemetry.scraping import READY_MESSAGE, WIRE_VERSION, DriverChannel, ScrapeLimits


class ReadyChannel:
    """A channel whose helper sends one ready message, then is closed by the engine."""

    def __init__(self, ready: object) -> None:
        self.ready = ready
        self.closed = False

    def exchange(
        self, wanted: Callable[[object], bool], _deadline: float, *_rest: object
    ) -> object | None:
        return self.ready if wanted(self.ready) else None

    def close(self) -> None:
        self.closed = True


@pytest.fixture(autouse=True)
def _fresh_warnings() -> None:
    reset_warn_once()


def test_a_helper_of_this_version_is_ready() -> None:
    engine = HelperEngine(ScrapeLimits(timeout=5.0))
    channel = ReadyChannel(READY_MESSAGE)
    engine._channel = cast(DriverChannel, channel)
    assert engine._await_ready(engine._channel, 0.0)
    assert not channel.closed


def test_a_helper_of_another_version_is_replaced_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = HelperEngine(ScrapeLimits(timeout=5.0))
    channel = ReadyChannel(("ready", WIRE_VERSION + 1))
    engine._channel = cast(DriverChannel, channel)
    with caplog.at_level(logging.WARNING, logger="raylens.telemetry.host_memory"):
        assert not engine._await_ready(engine._channel, 0.0)
    assert channel.closed
    (warned,) = [r.getMessage() for r in caplog.records if "wire version" in r.getMessage()]
    assert f"wire version {WIRE_VERSION + 1}, this driver {WIRE_VERSION}" in warned
