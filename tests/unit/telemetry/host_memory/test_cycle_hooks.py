"""The hooks a cluster reader runs after each cycle and at stop (no Ray, no threads)."""

from __future__ import annotations

import logging

import pytest

from raylens.lens import reset_warn_once
from raylens.telemetry.host_memory import CycleHooks

LOGGER = logging.getLogger("raylens.tests.cycle_hooks")


@pytest.fixture(autouse=True)
def _fresh_warnings() -> None:
    reset_warn_once()


def test_hooks_run_in_order_once_each_and_stops_only_at_stop() -> None:
    calls: list[str] = []
    hooks = CycleHooks("test", "tests.hook", LOGGER)

    def first(reader: object) -> None:
        calls.append(f"first {reader}")

    hooks.add(first, on_stop=lambda: calls.append("first stops"))
    hooks.add(first)  # already there: still once
    hooks.add(lambda reader: calls.append(f"second {reader}"))

    hooks.run("r", stopping=False)
    hooks.run("r", stopping=True)

    assert calls == ["first r", "second r", "first stops"]


def test_a_failing_hook_is_warned_once_and_the_others_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ran: list[int] = []
    hooks = CycleHooks("test", "tests.hook", LOGGER)

    def broken(_reader: object) -> None:
        raise RuntimeError("boom")

    hooks.add(broken)
    hooks.add(lambda _reader: ran.append(1))
    with caplog.at_level(logging.WARNING, logger=LOGGER.name):
        for _ in range(3):
            hooks.run(None, stopping=False)

    assert ran == [1, 1, 1]
    warned = [r for r in caplog.records if "a test cycle hook" in r.getMessage()]
    assert len(warned) == 1


def test_removed_and_cleared_hooks_no_longer_run() -> None:
    calls: list[str] = []
    hooks = CycleHooks("test", "tests.hook", LOGGER)

    def hook(_reader: object) -> None:
        calls.append("ran")

    hooks.add(hook, on_stop=lambda: calls.append("stopped"))
    hooks.remove(hook)
    hooks.remove(hook)  # unknown now: ignored
    hooks.run(None, stopping=False)
    hooks.add(hook)
    hooks.clear()
    hooks.run(None, stopping=True)
    assert calls == []
